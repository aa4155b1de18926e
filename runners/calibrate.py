"""``replaysim-calibrate``: fit named simulator parameters to a measured serving run.

    replaysim-calibrate MEASURED [KEY=VALUE ...] --fit KEY[=LOW:HIGH] [--fit ...]
        [--fit-fraction 0.5] [--loss quantiles] [--out DIR] [--max-evals 2400] [--seed 0] [--format auto]

The measured run gives the workload (send instants, prompt and output lengths)
and the per-request latencies; the ``KEY=VALUE`` overrides describe the
deployment, as for ``replaysim``.  Where prompts share blocks (later turns of a
conversation, a common system prompt) and prefix caching is on, the lengths
alone replay every prompt as its own: a trace of the measured run may then
replace them (``workload.source=mooncake workload.path=TRACE
workload.block_size=B``, its ``hash_ids`` the prompts' blocks), matched to the
measured requests by ``request_id``, whose lengths it must repeat.

The requests are ordered by send instant; the first ``--fit-fraction`` of them
(default one half) are the fit part, the rest the held-out part.  Every
candidate replays the whole workload; the loss is computed on the fit part
only.  Losses (``--loss``):

- ``quantiles`` (default): the sum over TTFT, TPOT and E2E of ``sum_i
  (p_(i) - m_(i))^2 / sum_i m_i^2``, the i-th smallest predicted value against
  the i-th smallest measured one (a squared 2-Wasserstein distance between
  the two distributions, relative to the measured values' size).  It asks
  the replay for as many slow requests as the run had, not for the same ones:
  the replay cannot tell which request a real engine happens to preempt or
  queue behind another.
- ``requests``: request by request least squares, the same sum without the
  sorting, ``(p_i - m_i)^2``.  Per metric it is ``n`` times the squared bias
  of the mean plus ``n (s_p^2 - 2 r s_p s_m + s_m^2)``, with ``s`` the spreads
  and ``r`` the request-by-request correlation: it is least where the
  predicted spread is ``r s_m``, so where the replay cannot pair requests
  with the run (``r`` well under 1) it buys a smaller spread with a biased
  mean.  On the RTX 4090 run of ``docs/accuracy.md``, which preempts,
  replayed without its prompts' shared blocks (TPOT correlation 0.76), its
  fit lowered the decode scale to 0.91 and left the fit part's mean TPOT at
  -2.1%, the uncalibrated replay's at -0.5%.  It was the default until
  ``quantiles``.
- ``bench``: the sum of the squared relative errors of the mean,
  median and p90 of TTFT, TPOT and E2E (nine terms of equal weight).  It
  fits what a user of ``vllm bench serve`` reads (its report gives each
  metric's mean, median and a tail percentile), each metric counting alike
  whatever its size; p90 is the tail, as p99 of a fit part of 150 requests
  rests on one or two of them.  The median and p90 also pin the parameters
  where the three means alone cannot (four fitted parameters, three means).
  A relative error weighs a small statistic as much as a large one: where
  most requests are admitted at once, the median TTFT is one prefill and a
  few ms on it cost as much as percents of a mean (``docs/accuracy.md``,
  Calibration losses).
  On the three measured runs of ``docs/accuracy.md`` it does worse held
  out than ``requests`` and ``quantiles``.
- ``summary``: as ``bench`` without the median (mean and p90).

The optimiser is SciPy's differential evolution (derivative-free), each
generation one ``simcore.run_batch`` call over the whole population.

Written to ``--out`` (atomically, only on success): ``calibrated.yaml``, a Hydra
config of the deployment overrides plus the fitted values (``replaysim
--config-dir DIR --config-name calibrated``), and ``calibration.json``: the
fitted values, the loss, and per part (fit, held out) the measured, the
uncalibrated and the calibrated metrics with their errors.

Measured formats (``--format``, default: from the content):

- ``jsonl``: one request per line with ``input_toks, output_toks,
  arrival_time`` (s) and ``queued_ts, first_token_ts, last_token_ts`` (engine
  clock, s), as LLMServingSim's vLLM runs; sends are ``arrival_time`` minus
  the first, latencies start at ``queued_ts``.
- ``vllm``: ``vllm bench serve --save-result --save-detailed`` JSON
  (``vllm/benchmarks/serve.py``): ``input_lens``, ``output_lens``, ``ttfts``
  (s), ``itls`` (s per chunk), ``start_times`` (perf_counter s, vLLM 0.15+),
  ``errors``; E2E = ``latencies`` when saved (0.33+), else TTFT + sum(ITL);
  failed requests (an error, or no output) are left out of the replay.

Fitted keys must take real values (time scales, overheads, bandwidths, stage
costs); an integer key fails at its first fractional candidate.

Bad input (an unreadable file, a field of the wrong type, sign or size, lists of
different lengths, a repeated ``request_id``, an unknown key, a bad bound, a
``--seed`` outside 0 to 2**32 - 1, ``--max-evals`` x requests above
:data:`MAX_SIMULATED_REQUESTS`) prints one line ``replaysim-calibrate: error:
...`` naming the file and line (or JSON path) or the option, and exits with
code 2, writing nothing; an ``--out`` that cannot be written exits 74 with one
line, checked before the fit; Ctrl-C and SIGTERM exit 130 and 143 with one line.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

import simcore
from runners.rundir import missing_ancestors
from runners.writer import check_writable, text_file, write_atomic
from simcore.config import ConfigError, dotted_keys, load_config
from simcore.metrics.registry import DISTRIBUTIONS
from simcore.units import MAX_INSTANT_NS
from simcore.workload.api import MAX_LENGTH

#: Metrics compared (requests-table column, label): the registry's per-request metrics with a
#: calibration label.  :func:`_latencies` gives each from a measured run's TTFT and E2E latency.
METRICS = tuple((m.column, m.calibration) for m in DISTRIBUTIONS if m.column and m.calibration)
#: Statistics of each metric reported (``p50``: the median, ``vllm bench serve``'s own).
STATS = ("mean", "p50", "p90")
#: The losses (``--loss``): the statistics each compares, None for all values (request by
#: request, or sorted for ``quantiles``).
LOSSES = {"bench": ("mean", "p50", "p90"), "quantiles": None, "requests": None, "summary": ("mean", "p90")}
DEFAULT_LOSS = "quantiles"
#: Search ranges of the parameters that have a natural one (others need KEY=LOW:HIGH).
DEFAULT_BOUNDS = {
    "timing.prefill_scale": (0.5, 2.0),
    "timing.decode_scale": (0.5, 2.0),
    "timing.pass_overhead_us": (0.0, 5000.0),
    "timing.allreduce.latency_us": (0.0, 200.0),
    "timing.allreduce.bandwidth_gb_per_second": (1.0, 400.0),
    "timing.moe.alltoall.latency_us": (0.0, 200.0),
    "timing.moe.alltoall.bandwidth_gb_per_second": (1.0, 400.0),
    "timing.moe.imbalance": (1.0, 2.0),
    # timing.type=roofline: shares of the datasheet peaks, (0, 1]
    "timing.roofline.flops_efficiency": (0.05, 1.0),
    "timing.roofline.bandwidth_efficiency": (0.05, 1.0),
    "timing.roofline.attention_flops_efficiency": (0.05, 1.0),
    "timing.roofline.attention_bandwidth_efficiency": (0.05, 1.0),
    "tokenization.base_ms": (0.0, 50.0),
    "tokenization.per_input_us": (0.0, 100.0),
    "detokenization.base_ms": (0.0, 50.0),
    "detokenization.per_output_us": (0.0, 500.0),
}
#: The workload keys that name a trace of the measured run (:func:`trace_rows`).
TRACE_KEYS = ("workload.source", "workload.path", "workload.block_size")
POPSIZE = 10  # scipy's multiplier: population = POPSIZE x parameters


@dataclass(frozen=True)
class Measured:
    """A measured run, requests ordered by send instant (ms from the first send)."""

    request_id: list[str]
    input_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    send_ms: np.ndarray  # float64
    latency: dict[str, np.ndarray]  # ttft_ms, tpot_ms (NaN with <= 1 output), e2el_ms
    format: str
    dropped: int  # failed requests left out

    def requests_table(self) -> pa.Table:
        return pa.table(
            {
                "request_id": self.request_id,
                "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens,
                "send_ms": self.send_ms,
            }
        )


# ------------------------------------------------------------------ readers

#: The largest clock reading (s) and latency a measured run may hold: a replayed
#: instant is an int64 ns count below ``MAX_INSTANT_NS`` (about 146 years).
MAX_CLOCK_S = MAX_INSTANT_NS / 1e9


def read_measured(path: str, fmt: str = "auto") -> Measured:
    """Read a measured run (see the module docstring for the formats).

    Parameters
    ----------
    path : str
        The file.
    fmt : str
        ``auto``, ``jsonl`` or ``vllm``.

    Returns
    -------
    Measured

    Raises
    ------
    ConfigError
        Unreadable, not UTF-8 text, malformed, a field of the wrong type, sign
        or size, per-request lists of different lengths, a repeated
        ``request_id``, or no request: one line naming the file and the line
        (``<file>:<line>``, JSONL) or the JSON path (``<file>: ttfts[3]``).
    """
    text = _read_text(path)
    if fmt == "auto":
        fmt = "vllm" if text.lstrip().startswith("{") and '"ttfts"' in text else "jsonl"
    if fmt == "vllm":
        return _read_vllm(path, text)
    if fmt == "jsonl":
        return _read_jsonl(path, text)
    raise ConfigError(f"--format must be auto, jsonl or vllm, got {fmt!r}")


def _read_text(path: str) -> str:
    """The file as UTF-8 text; a NUL byte or bytes that are not UTF-8 name their line."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the measured run ({exc.strerror or exc})") from None
    nul = raw.find(b"\0")
    if nul >= 0:
        line = raw.count(b"\n", 0, nul) + 1
        raise ConfigError(f"{path}:{line}: a NUL byte: not a text file")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}:{line}: byte 0x{raw[exc.start]:02x} is not UTF-8 text") from None


def _json(path: str, text: str, line: int | None = None) -> Any:
    """``json.loads`` with every failure (syntax, a 4,300-digit integer, deep nesting) as one line."""
    where = f"{path}:{line}" if line is not None else path
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        at = f"{path}:{exc.lineno if line is None else line}"
        raise ConfigError(f"{at}: not valid JSON ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{where}: not valid JSON ({' '.join(str(exc).split())[:120]})") from None


def _number(where: str, key: str, value: Any, *, low: float = -MAX_CLOCK_S, high: float = MAX_CLOCK_S) -> float:
    """``value`` as a float in [low, high]; ``where`` names the file and line or JSON path."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: {key} must be a number, got {_shown(value)}")
    number = float(value) if isinstance(value, float) or abs(value) <= 2**1023 else math.inf
    if not (math.isfinite(number) and low <= number <= high):
        raise ConfigError(f"{where}: {key} must be a number from {low:.6g} to {high:.6g} (seconds), got {_shown(value)}")
    return number


def _count(where: str, key: str, value: Any, minimum: int) -> int:
    """``value`` as an integer from ``minimum`` to :data:`MAX_LENGTH` (an integral float is taken)."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_LENGTH:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_LENGTH:
        raise ConfigError(f"{where}: {key} must be an integer from {minimum} to {MAX_LENGTH}, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    """``repr(value)`` cut to 40 characters (a 400-digit integer, a long list)."""
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else f"an integer of {len(str(abs(value)))} digits"
    return text if len(text) <= 40 else text[:37] + "..."


def _request_id(where: str, value: Any, seen: dict[str, str]) -> str:
    """A string or integer id, not repeated (``seen``: id -> where it was first)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ConfigError(f"{where}: request_id must be a string or an integer, got {_shown(value)}")
    rid = str(value)
    if rid in seen:
        raise ConfigError(f"{where}: request_id {_shown(value)} repeats the request of {seen[rid]}")
    seen[rid] = where
    return rid


def _check_span(path: str, key: str, values: list[float], where: list[str]) -> None:
    """The sends (``key``, s) must span less than a run can (:data:`MAX_CLOCK_S`)."""
    first = min(values)
    last = int(np.argmax(values))
    if values[last] - first >= MAX_CLOCK_S:
        raise ConfigError(f"{where[last]}: {key} is {values[last] - first:.4g} s after the first request's, "
                          f"beyond the {MAX_CLOCK_S:.4g} s (about 146 years) a replay can span")


def _read_jsonl(path: str, text: str) -> Measured:
    rows = []
    seen: dict[str, str] = {}
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        row = _json(path, line, line_no)
        where = f"{path}:{line_no}"
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: not a JSON object")
        queued = _number(where, "queued_ts", row.get("queued_ts"))
        first = _number(where, "first_token_ts", row.get("first_token_ts"))
        last = _number(where, "last_token_ts", row.get("last_token_ts"))
        if not queued <= first <= last:
            raise ConfigError(f"{where}: need queued_ts <= first_token_ts <= last_token_ts, got "
                              f"{queued!r}, {first!r}, {last!r}")
        if last - queued >= MAX_CLOCK_S:
            raise ConfigError(f"{where}: last_token_ts is {last - queued:.4g} s after queued_ts, beyond the "
                              f"{MAX_CLOCK_S:.4g} s a replay can span")
        rid = row.get("request_id", f"r{len(rows)}")
        rows.append(
            (
                _number(where, "arrival_time", row.get("arrival_time")),
                _request_id(where, rid, seen),
                _count(where, "input_toks", row.get("input_toks"), 1),
                _count(where, "output_toks", row.get("output_toks"), 1),
                queued,
                first,
                last,
                where,
            )
        )
    if not rows:
        raise ConfigError(f"{path}: no requests")
    _check_span(path, "arrival_time", [r[0] for r in rows], [r[-1] for r in rows])
    rows.sort(key=lambda r: r[0])  # stable: equal arrivals keep file order
    arrival, ids, inputs, outputs, queued, first, last, _ = (list(c) for c in zip(*rows))
    queued_s = np.array(queued)
    return _measured("jsonl", 0, arrival, ids, inputs, outputs,
                     (np.array(first) - queued_s) * 1e3, (np.array(last) - queued_s) * 1e3)


#: The per-request lists of ``vllm bench serve --save-detailed`` read here (``errors`` and
#: ``latencies`` optional), each with one entry a request.
VLLM_LISTS = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "errors", "latencies")


def _read_vllm(path: str, text: str) -> Measured:
    doc = _json(path, text)
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: not a vllm bench serve result (a JSON object), got a {type(doc).__name__}")
    for key in ("input_lens", "output_lens", "ttfts", "itls"):
        if not isinstance(doc.get(key), list):
            raise ConfigError(f"{path}: {key} is missing or not a list "
                              "(save with vllm bench serve --save-result --save-detailed)")
    if not isinstance(doc.get("start_times"), list):
        raise ConfigError(f"{path}: start_times is missing or not a list (saved by vLLM 0.15+): "
                          "the sends cannot be replayed")
    n = len(doc["input_lens"])
    for key in VLLM_LISTS:
        value = doc.get(key)
        if key in ("errors", "latencies") and value is None:
            continue
        if not isinstance(value, list):
            raise ConfigError(f"{path}: {key} must be a list (one entry a request), got {_shown(value)}")
        if len(value) != n:
            raise ConfigError(f"{path}: {key} has {len(value)} entries, input_lens {n}: "
                              "every per-request list has one entry a request")
    errors = doc.get("errors") or [""] * n
    latencies = doc.get("latencies")
    rows = []
    dropped = 0
    for i in range(n):
        at = f"{path}: "
        error = errors[i]
        if error is not None and not isinstance(error, str):
            raise ConfigError(f"{at}errors[{i}] must be a string, got {_shown(error)}")
        output = _count(path, f"output_lens[{i}]", doc["output_lens"][i], 0)
        length = _count(path, f"input_lens[{i}]", doc["input_lens"][i], 0 if error or not output else 1)
        if error or not output:  # a failed request: not replayed (counted in dropped_failed_requests)
            dropped += 1
            continue
        ttft = _number(path, f"ttfts[{i}]", doc["ttfts"][i], low=0.0)
        itls = doc["itls"][i]
        if not isinstance(itls, list):
            raise ConfigError(f"{at}itls[{i}] must be a list of numbers, got {_shown(itls)}")
        gaps = [_number(path, f"itls[{i}][{j}]", x, low=0.0) for j, x in enumerate(itls)]
        if latencies is None:
            e2e = ttft + math.fsum(gaps)
        else:
            e2e = _number(path, f"latencies[{i}]", latencies[i], low=0.0)
            if e2e < ttft:
                raise ConfigError(f"{at}latencies[{i}] must be at least ttfts[{i}] ({ttft!r} s), got {e2e!r}")
        if e2e >= MAX_CLOCK_S:
            raise ConfigError(f"{at}itls[{i}]: the request lasts {e2e:.4g} s, beyond the {MAX_CLOCK_S:.4g} s "
                              "a replay can span")
        start = _number(path, f"start_times[{i}]", doc["start_times"][i])
        rows.append((start, f"r{i}", length, output, ttft, e2e, f"{at}start_times[{i}]"))
    if not rows:
        raise ConfigError(f"{path}: no successful requests")
    _check_span(path, "start_times", [r[0] for r in rows], [r[-1] for r in rows])
    rows.sort(key=lambda r: r[0])
    start, ids, inputs, outputs, ttft, e2e, _ = (list(c) for c in zip(*rows))
    return _measured("vllm", dropped, start, ids, inputs, outputs, np.array(ttft) * 1e3, np.array(e2e) * 1e3)


def _measured(fmt: str, dropped: int, send_s: list, ids: list, inputs: list, outputs: list,
              ttft_ms: np.ndarray, e2el_ms: np.ndarray) -> Measured:
    """The :class:`Measured` run of requests sorted by send (seconds), sends shifted to start at 0."""
    outputs_arr = np.array(outputs, dtype=np.int64)
    return Measured(
        request_id=ids,
        input_tokens=np.array(inputs, dtype=np.int64),
        output_tokens=outputs_arr,
        send_ms=(np.array(send_s) - send_s[0]) * 1e3,
        latency=_latencies(ttft_ms, e2el_ms, outputs_arr),
        format=fmt,
        dropped=dropped,
    )


def _latencies(ttft_ms: np.ndarray, e2el_ms: np.ndarray, outputs: np.ndarray) -> dict[str, np.ndarray]:
    """TPOT = (E2E - TTFT) / (output - 1), NaN for one output token (vllm bench serve)."""
    many = outputs > 1
    tpot = np.full(outputs.shape[0], np.nan)
    tpot[many] = (e2el_ms[many] - ttft_ms[many]) / (outputs[many] - 1)
    return {"ttft_ms": ttft_ms, "tpot_ms": tpot, "e2el_ms": e2el_ms}


# ------------------------------------------------------------------ metrics and loss


def part_metrics(latency: dict[str, np.ndarray], rows: slice) -> dict[str, float]:
    """:data:`STATS` of each metric over ``rows``, percentiles linear as numpy's (NaNs, TPOT of
    1-token requests, left out)."""
    out = {}
    for column, _ in METRICS:
        values = latency[column][rows]
        values = values[~np.isnan(values)]
        for stat in STATS:
            key = f"{stat}_{column}"
            if values.size == 0:
                out[key] = float("nan")
            else:
                out[key] = float(np.mean(values) if stat == "mean" else np.percentile(values, float(stat[1:])))
    return out


def request_loss(predicted: dict[str, np.ndarray], measured: dict[str, np.ndarray], rows: slice,
                 *, sort: bool = False) -> float:
    """Per metric ``sum (p - m)^2 / sum m^2`` over the requests measured (a request the
    replay did not finish counts as predicted 0), summed over the metrics.

    ``sort``: compare the i-th smallest predicted with the i-th smallest measured (the
    ``quantiles`` loss: a squared 2-Wasserstein distance between the two distributions).
    """
    total = 0.0
    for column, _ in METRICS:
        m = measured[column][rows]
        known = ~np.isnan(m)
        p = np.nan_to_num(predicted[column][rows][known], nan=0.0)
        m = m[known]
        if sort:
            p, m = np.sort(p), np.sort(m)
        if m.size:
            total += float(np.sum((p - m) ** 2) / np.sum(m * m))
    return total


def loss_of(predicted: dict[str, float], measured: dict[str, float], stats: Sequence[str]) -> float:
    """Sum of squared relative errors of the ``stats`` of every metric, where both sides have one."""
    total = 0.0
    for column, _ in METRICS:
        for stat in stats:
            key = f"{stat}_{column}"
            value = measured[key]
            if math.isfinite(value) and value > 0 and math.isfinite(predicted[key]):
                total += (predicted[key] / value - 1.0) ** 2
    return total


def loss_value(loss: str, predicted: dict[str, np.ndarray], measured: Measured, rows: slice) -> float:
    """The loss named ``loss`` (:data:`LOSSES`) of per-request ``predicted`` latencies over ``rows``."""
    stats = LOSSES[loss]
    if stats is None:
        return request_loss(predicted, measured.latency, rows, sort=loss == "quantiles")
    return loss_of(part_metrics(predicted, rows), part_metrics(measured.latency, rows), stats)


def errors_of(predicted: dict[str, float], measured: dict[str, float]) -> dict[str, dict[str, float]]:
    return {
        key: {"measured": measured[key], "predicted": predicted[key], "error": predicted[key] / measured[key] - 1.0}
        for key in measured
    }


def predicted_latency(result, rows_of: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per-request TTFT, TPOT, E2E (ms) of a run, NaN where the run gives none; ``rows_of``:
    the run's row of each measured request (:func:`trace_rows`), None for the same order."""
    table = result.requests
    latency = {
        column: np.asarray(table[column].to_numpy(zero_copy_only=False), dtype=np.float64)
        for column, _ in METRICS
    }
    return latency if rows_of is None else {column: values[rows_of] for column, values in latency.items()}


def replay_inputs(cfg: dict, measured: Measured) -> tuple[pa.Table | None, np.ndarray | None]:
    """What replays ``measured`` under ``cfg``: its lengths-only request table, or (``cfg``
    naming a workload: a trace of the run that also gives the prompts' blocks) None and the
    trace's row of each measured request (:func:`trace_rows`)."""
    if cfg.get("workload", {}).get("source") is None:
        return measured.requests_table(), None
    return None, trace_rows(load_config(cfg), measured)


def trace_rows(cfg, measured: Measured) -> np.ndarray:
    """The row of each measured request in the configured trace (``workload.source`` and
    ``workload.path`` among the overrides: a trace of the measured run whose ``hash_ids``
    give the prompts' shared blocks), matched by ``request_id``; the lengths must agree."""
    from simcore.config import TRACE_SOURCES
    from simcore.workload.traces import read_trace

    if cfg.workload.source not in TRACE_SOURCES:
        raise ConfigError(f"workload.source: the measured run is the workload; a trace of it may replace it "
                          f"({', '.join(TRACE_SOURCES)}), got {cfg.workload.source!r}")
    trace = read_trace(cfg.workload, send_times=True)
    row = {rid: i for i, rid in enumerate(trace.request_id.to_pylist())}
    if len(row) != len(measured.request_id):
        raise ConfigError(f"{cfg.workload.path}: {len(row)} requests replayed, the measured run has "
                          f"{len(measured.request_id)}")
    rows_of = np.empty(len(measured.request_id), dtype=np.int64)
    for i, rid in enumerate(measured.request_id):
        if rid not in row:
            raise ConfigError(f"{cfg.workload.path}: no request_id {rid!r} of the measured run")
        rows_of[i] = row[rid]
        lengths = (int(trace.input_tokens[rows_of[i]]), int(trace.output_tokens[rows_of[i]]))
        if lengths != (int(measured.input_tokens[i]), int(measured.output_tokens[i])):
            raise ConfigError(f"{cfg.workload.path}: request_id {rid!r} has input/output lengths {lengths}, "
                              f"the measured run {int(measured.input_tokens[i])}/{int(measured.output_tokens[i])}")
    return rows_of


# ------------------------------------------------------------------ overrides


def parse_overrides(tokens: Sequence[str]) -> dict[str, Any]:
    """``key=value`` tokens (YAML values, as on the replaysim command line) as a nested mapping."""
    from omegaconf import OmegaConf

    known = set(dotted_keys())
    for token in tokens:
        key = token.split("=", 1)[0]
        if "=" not in token or key not in known:
            raise ConfigError(f"override {token!r}: expected KEY=VALUE with a replaysim key")
        if (key.startswith(("workload.", "load.")) and key not in TRACE_KEYS) or key == "output.dir":
            raise ConfigError(f"override {token!r}: the workload and load come from the measured run "
                              f"(a trace of it may give the prompts' blocks: {', '.join(TRACE_KEYS)})")
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist(list(tokens)))
    except Exception as exc:  # omegaconf's grammar errors
        raise ConfigError(f"overrides: {exc}") from None


def set_dotted(tree: dict, key: str, value: Any) -> None:
    node = tree
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def parse_fit(specs: Sequence[str]) -> list[tuple[str, float, float]]:
    """``KEY`` or ``KEY=LOW:HIGH`` -> (key, low, high)."""
    out = []
    known = set(dotted_keys())
    for spec in specs:
        key, _, bounds = spec.partition("=")
        if key not in known:
            raise ConfigError(f"--fit {spec!r}: {key!r} is not a replaysim key")
        if any(key == k for k, _, _ in out):
            raise ConfigError(f"--fit {spec!r}: {key} is fitted twice")
        if bounds:
            try:
                low, high = (float(x) for x in bounds.split(":"))
            except ValueError:
                raise ConfigError(f"--fit {spec!r}: bounds must be LOW:HIGH numbers") from None
        elif key in DEFAULT_BOUNDS:
            low, high = DEFAULT_BOUNDS[key]
        else:
            raise ConfigError(f"--fit {spec!r}: {key} has no default range; give {key}=LOW:HIGH")
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ConfigError(f"--fit {spec!r}: need finite LOW < HIGH")
        out.append((key, low, high))
    if not out:
        raise ConfigError("--fit: name at least one parameter to fit")
    return out


# ------------------------------------------------------------------ the fit


class _Refused(Exception):
    """A :class:`ConfigError` raised by a candidate's run, carried through SciPy's optimiser unwrapped.

    SciPy re-raises a ``ValueError`` (which ``ConfigError`` is) of the
    objective as its own ``RuntimeError`` about map-like callables; this type
    is not one it wraps.
    """

    def __init__(self, error: ConfigError):
        super().__init__(str(error))
        self.error = error


@dataclass
class Calibration:
    values: dict[str, float]
    loss: float
    evaluations: int
    generations: int
    seconds: float
    report: dict


def calibrate(
    measured: Measured,
    overrides: dict[str, Any],
    fit: list[tuple[str, float, float]],
    *,
    fit_fraction: float = 0.5,
    loss: str = DEFAULT_LOSS,
    max_evals: int = 2400,
    seed: int = 0,
) -> Calibration:
    """Fit the parameters ``fit`` to the fit part of ``measured`` (see the module docstring).

    Parameters
    ----------
    measured : Measured
    overrides : dict
        Nested deployment overrides (the workload and load are set here).
    fit : list of (key, low, high)
    fit_fraction : float
        Share of the requests (by send instant) in the fit part, (0, 1]; 1: no held-out part.
    loss : str
        A name in :data:`LOSSES` (see the module docstring).
    max_evals : int
        Upper bound on simulated candidates (the optimiser may stop earlier).
    seed : int
        The optimiser's seed (same inputs and seed: the same result).

    Returns
    -------
    Calibration
    """
    from scipy.optimize import differential_evolution

    if not 0 < fit_fraction <= 1:
        raise ConfigError(f"--fit-fraction must be in (0, 1], got {fit_fraction!r}")
    if loss not in LOSSES:
        raise ConfigError(f"--loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    n = len(measured.request_id)
    n_fit = max(1, int(math.floor(n * fit_fraction)))
    parts = {"fit": slice(0, n_fit)}
    if n_fit < n:
        parts["held_out"] = slice(n_fit, n)
    targets = {name: part_metrics(measured.latency, rows) for name, rows in parts.items()}
    base = json.loads(json.dumps(overrides))
    base.setdefault("load", {})["type"] = "trace"
    workload = base.setdefault("workload", {})
    workload.setdefault("num_requests", n)
    requests, rows_of = replay_inputs(base, measured)
    load_config(base)  # a bad deployment fails before any fitting
    for key, low, high in fit:
        for value in (low, high):
            trial = json.loads(json.dumps(base))
            set_dotted(trial, key, value)
            load_config(trial)

    def configs_for(points: np.ndarray) -> list[dict]:
        out = []
        for x in points:
            cfg = json.loads(json.dumps(base))
            for (key, _, _), value in zip(fit, x):
                set_dotted(cfg, key, float(value))
            out.append(cfg)
        return out

    evaluations = 0
    generations = 0

    def population_loss(x: np.ndarray) -> np.ndarray:
        nonlocal evaluations, generations
        points = np.atleast_2d(x.T)  # scipy (vectorized): x is (parameters, candidates)
        try:
            results = simcore.run_batch(configs_for(points), requests=requests)
        except ConfigError as exc:  # SciPy would wrap a ValueError in its own RuntimeError
            raise _Refused(exc) from None
        evaluations += len(results)
        generations += 1
        return np.array([loss_value(loss, predicted_latency(r, rows_of), measured, parts["fit"]) for r in results])

    population = 1 << (POPSIZE * len(fit) - 1).bit_length()  # Sobol initialisation: a power of two
    maxiter = max(1, max_evals // population - 1)  # the initial population is one generation more
    start = time.perf_counter()
    try:
        found = differential_evolution(
            population_loss,
            bounds=[(low, high) for _, low, high in fit],
            popsize=POPSIZE,
            maxiter=maxiter,
            tol=1e-3,
            seed=seed,
            polish=False,
            init="sobol",
            updating="deferred",
            vectorized=True,
        )
    except _Refused as exc:  # the user's one line, not SciPy's
        raise exc.error from None
    if not math.isfinite(float(found.fun)):
        raise ConfigError(f"the loss of every candidate is {found.fun}: the measured latencies cannot be compared "
                          "(see the measured run's values)")
    seconds = time.perf_counter() - start
    values = {key: float(v) for (key, _, _), v in zip(fit, found.x)}
    best, initial = simcore.run_batch(configs_for(np.array([found.x]))[:1] + [base], requests=requests)
    report = {}
    for name, rows in parts.items():
        report[name] = {
            "requests": rows.stop - rows.start,
            "calibrated": errors_of(part_metrics(predicted_latency(best, rows_of), rows), targets[name]),
            "uncalibrated": errors_of(part_metrics(predicted_latency(initial, rows_of), rows), targets[name]),
        }
    return Calibration(values, float(found.fun), evaluations, generations, seconds, report)


# ------------------------------------------------------------------ output


def calibrated_yaml(overrides: dict[str, Any], values: dict[str, float]) -> str:
    """A Hydra config: the app's ``config`` plus the deployment overrides and the fitted values."""
    from omegaconf import OmegaConf

    tree = json.loads(json.dumps(overrides))
    for key, value in values.items():
        set_dotted(tree, key, value)
    body = OmegaConf.to_yaml(OmegaConf.create(tree)) if tree else ""
    return (
        "# Written by replaysim-calibrate; run it with\n"
        "#   replaysim --config-dir <this directory> --config-name calibrated [overrides]\n"
        "defaults:\n  - config\n  - _self_\n\n" + body
    )


PROG = "replaysim-calibrate"
#: The optimiser's seed: SciPy seeds NumPy's legacy generator, which takes 0 to 2**32 - 1.
MAX_SEED = 2**32 - 1
#: Most candidates (``--max-evals``) and most simulated requests (candidates x measured
#: requests) a calibration may ask for.  Batched runs go at about 1e5 requests/s on 2 cores
#: (docs/performance.md: 804 runs of 100 requests a second), so 1e9 requests is some hours:
#: past it a typo (an extra zero or three) would start a fit of days; the message gives the estimate.
MAX_EVALS = 10**7
MAX_SIMULATED_REQUESTS = 10**9
EXIT_BAD_INPUT = 2
EXIT_ENVIRONMENT = 74


class _ArgumentsError(Exception):
    """argparse's message (its own error() prints the usage too: two lines)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (main)
        raise _ArgumentsError(message)


def _int_text(text: str) -> int:
    """An integer option's value (argparse's ``int`` refuses what Python's ``int`` refuses: 4,300 digits)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer value: {text[:40]!r}") from None


def check_cost(max_evals: int, requests: int) -> None:
    """Refuse a calibration whose candidates x requests exceed :data:`MAX_SIMULATED_REQUESTS`."""
    if not 1 <= max_evals <= MAX_EVALS:
        raise ConfigError(f"--max-evals must be an integer from 1 to {MAX_EVALS}, got {_shown(max_evals)}")
    cost = max_evals * requests
    if cost > MAX_SIMULATED_REQUESTS:
        raise ConfigError(f"--max-evals {max_evals} x {requests} measured requests = {cost:.3g} simulated requests, "
                          f"above the bound of {MAX_SIMULATED_REQUESTS:.0e}: lower --max-evals")


def _stop_on_signals() -> None:
    """Ctrl-C and SIGTERM end the command with one line, exit 130 and 143 (no result file: written last, atomically)."""
    import signal

    def stop(signum: int, frame: object) -> None:
        name, code = ("SIGTERM", 143) if signum == signal.SIGTERM else ("SIGINT (Ctrl-C)", 130)
        os.write(2, f"{PROG}: stopped by {name}; nothing was written\n".encode())
        os._exit(code)

    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


def _error(message: object, code: int = EXIT_BAD_INPUT) -> int:
    text = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """The command: bad input prints one line and returns 2, an unwritable ``--out`` 74; nothing is written."""
    if argv is None:
        _stop_on_signals()
        argv = sys.argv[1:]
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("measured", help="the measured run (JSONL per request, or vllm bench serve JSON)")
    parser.add_argument("overrides", nargs="*", help="replaysim KEY=VALUE overrides of the deployment")
    parser.add_argument("--fit", action="append", default=[], metavar="KEY[=LOW:HIGH]", help="a parameter to fit")
    parser.add_argument("--fit-fraction", type=float, default=0.5, help="share of requests (by send) fitted")
    parser.add_argument("--loss", default=DEFAULT_LOSS, choices=tuple(LOSSES),
                        help="what the fit minimises (default %(default)s; see the module docstring)")
    parser.add_argument("--out", default="calibration", help="output directory")
    parser.add_argument("--max-evals", type=_int_text, default=2400, help="most simulated candidates")
    parser.add_argument("--seed", type=_int_text, default=0,
                        help=f"seed of the optimiser (differential evolution), 0 to {MAX_SEED}; the same inputs and "
                             "seed give the same fit (default %(default)s)")
    parser.add_argument("--format", default="auto", choices=("auto", "jsonl", "vllm"),
                        help="format of the measured run: jsonl (one JSON object per request), vllm (vllm bench serve "
                             "--save-result --save-detailed JSON), or auto: vllm when the file is one JSON "
                             "object with 'ttfts', else jsonl (default %(default)s)")
    try:
        args = parser.parse_intermixed_args(list(argv))  # overrides before or after the flags
    except _ArgumentsError as exc:
        return _error(exc)
    out = os.path.abspath(args.out)
    created = [str(d) for d in missing_ancestors(Path(out))]
    try:
        if not 0 <= args.seed <= MAX_SEED:
            raise ConfigError(f"--seed must be an integer from 0 to {MAX_SEED}, got {_shown(args.seed)}")
        if not 1 <= args.max_evals <= MAX_EVALS:
            raise ConfigError(f"--max-evals must be an integer from 1 to {MAX_EVALS}, got {_shown(args.max_evals)}")
        if not 0 < args.fit_fraction <= 1:
            raise ConfigError(f"--fit-fraction must be in (0, 1], got {args.fit_fraction!r}")
        measured = read_measured(args.measured, args.format)
        check_cost(args.max_evals, len(measured.request_id))
        overrides = parse_overrides(args.overrides)
        fit = parse_fit(args.fit)
        try:
            check_writable(out)  # before the fit, not after it
        except OSError as exc:
            _remove_created(created)
            return _error(f"cannot write results to {exc.filename or out}: {_reason(exc)}", EXIT_ENVIRONMENT)
        result = calibrate(
            measured, overrides, fit, fit_fraction=args.fit_fraction, loss=args.loss,
            max_evals=args.max_evals, seed=args.seed,
        )
    except ConfigError as exc:
        _remove_created(created)
        return _error(exc)
    document = {
        "measured": os.path.abspath(args.measured),
        "format": measured.format,
        "requests": len(measured.request_id),
        "dropped_failed_requests": measured.dropped,
        "fit_fraction": args.fit_fraction,
        "loss_kind": args.loss,
        "overrides": overrides,
        "parameters": {key: {"value": result.values[key], "low": low, "high": high} for key, low, high in fit},
        "loss": result.loss,
        "evaluations": result.evaluations,
        "generations": result.generations,
        "seconds": result.seconds,
        "seed": args.seed,
        "errors": result.report,
    }
    deployment = {key: value for key, value in overrides.items() if key != "workload"}  # not the run's trace
    try:  # both files or neither
        write_atomic(out, [("calibrated.yaml", text_file(calibrated_yaml(deployment, result.values))),
                           ("calibration.json", text_file(json.dumps(document, indent=2, allow_nan=False) + "\n"))])
    except OSError as exc:  # a full disk; the temporary files are gone
        _remove_created(created)
        return _error(f"cannot write results to {exc.filename or out}: {_reason(exc)}", EXIT_ENVIRONMENT)
    for key, value in result.values.items():
        print(f"{key} = {value:.6g}")
    for name, part in result.report.items():
        cells = ", ".join(
            f"{stat} {label} {100 * part['calibrated'][f'{stat}_{col}']['error']:+.1f}%"
            for col, label in METRICS
            for stat in ("mean",)
        )
        print(f"{name} ({part['requests']} requests): {cells}")
    print(f"loss {result.loss:.4g}, {result.evaluations} candidates in {result.seconds:.1f} s; wrote {args.out}")
    return 0


def _reason(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else " ".join(str(exc).split())


def _remove_created(created: list[str]) -> None:
    """Remove the ``--out`` directories this command created, if still empty (nothing written)."""
    for directory in created:
        try:
            os.rmdir(directory)
        except OSError:
            return

if __name__ == "__main__":
    sys.exit(main())
