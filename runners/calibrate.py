"""``replaysim-calibrate``: fit named simulator parameters to a measured serving run.

    replaysim-calibrate MEASURED [MEASURED ...] [KEY=VALUE ...] --fit KEY[=LOW:HIGH] [--fit ...]
        [--fit-fraction 0.5] [--loss quantiles] [--out DIR] [--max-evals 2400] [--seed 0] [--format auto]
        [--stability-fits 3] [--score MEASURED ...] [--max-extrapolation 2] [--refuse-extrapolation]

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
generation one ``simcore.run_batch`` call per run over the whole population.

Several measured files (or a file of several stages) are fitted together: the
loss is the sum of their losses, every run replayed with its own workload and
load.  A measured run may keep only aggregates (``vllm-summary``,
``inference-perf`` below): each stage's statistics (mean, median, percentiles
of TTFT, TPOT, ITL and E2E) are its targets, the loss the sum of their squared
relative errors; the stage is replayed at its load (request rate: an open
loop; concurrency: a closed loop) with its completed requests at its mean
prompt and output lengths (or the lengths the ``workload.*`` overrides give
when every input is an aggregate).

Fitted keys are any replaysim key that takes a real value; the declared
calibration parameters (``key(..., calibration=(low, high))`` in the settings,
``docs/options.md``) have a default search range, others need ``KEY=LOW:HIGH``.
The operator scales ``timing.prefill_token_scale``,
``timing.decode_attention_scale`` and ``timing.decode_base_scale``
(``docs/timing.md``) split a pass into what its prefill entries add, its
decodes' attention and the rest of its decodes' time: fitted at a light load
they keep their meaning at another, where whole-pass scales
(``timing.prefill_scale``) would stretch the decodes of every mixed pass.

Stability (``--stability-fits N``, default 3; 0: none): the fit is repeated on
subsets of what it saw: with two or more runs or stages, each left out in turn
(leave-one-stage-out); with one per-request run, N bootstrap resamples of its
fit part.  Each parameter's values over the refits (min, max, spread = (max -
min) / fitted value) are reported.  ``--score MEASURED`` predicts further
runs with the fitted values (their errors reported, not fitted); a scored run
whose mean requests in flight (Little's law: the sum of its E2E latencies
over its span; a stage's concurrency, or rate x mean E2E) lies more than
``--max-extrapolation`` times outside the fitted runs' range is warned of on
stderr and in ``calibration.json`` (``--refuse-extrapolation``: refused, exit
2).  ``calibrated.yaml`` states the fitted range in a comment.

Written to ``--out`` (atomically, only on success): ``calibrated.yaml``, a Hydra
config of the deployment overrides plus the fitted values (``replaysim
--config-dir DIR --config-name calibrated``), and ``calibration.json``: the
fitted values, the loss, and per part (fit, held out) the measured, the
uncalibrated and the calibrated metrics with their errors (``errors``, one
per-request run; ``runs``: every run or stage), ``load_range``, ``stability``,
``scored`` and ``warnings``.

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
- ``vllm-summary``: ``vllm bench serve --save-result`` JSON without the
  per-request lists (one object, a JSON list of them, or one a line as
  ``--append-result`` writes): a stage each, ``{mean,median,pP}_{ttft,tpot,itl,
  e2el}_ms``, ``completed``, ``total_input_tokens``, ``total_output_tokens``,
  ``request_rate`` (a Poisson open loop; ``burstiness`` other than 1: gamma)
  or, with ``request_rate`` ``"inf"``, ``max_concurrency`` (a closed loop).
- ``inference-perf``: its lifecycle reports (``stage_N_lifecycle_metrics.json``,
  ``inference_perf/reportgen/base.py``, one object or a list): ``load_summary``
  ``requested_rate`` (a constant-rate open loop, inference-perf's default load)
  or ``concurrency`` (a closed loop), ``successes.count``,
  ``successes.latency.{time_to_first_token, time_per_output_token,
  inter_token_latency, request_latency}.{mean,median,pP}`` (s),
  ``successes.prompt_tokens.mean`` and ``successes.output_len.mean``.

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
import re
import sys
import time
from dataclasses import dataclass, field
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
def declared_ranges() -> dict[str, tuple[float, float]]:
    """The declared calibration parameters (``key(..., calibration=(low, high))``) and their ranges."""
    from simcore.checks import describe
    from simcore.settings import SimConfig

    return {doc.path: tuple(doc.calibration) for doc in describe(SimConfig) if doc.calibration is not None}


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


@dataclass(frozen=True)
class Stage:
    """One load stage measured only in aggregate: its statistics and how it was loaded.

    ``targets`` maps replaysim summary keys (``mean_ttft_ms``, ``median_tpot_ms``,
    ``p99_itl_ms``, ``mean_e2el_ms``; ms) to the measured values; ``load`` is the
    ``load`` section that replays the stage (an open loop at its request rate, or a
    closed loop at its concurrency); ``input_tokens`` and ``output_tokens`` the mean
    lengths (None: not in the file, the ``workload.*`` overrides must give them).
    """

    label: str
    targets: dict[str, float]
    load: dict[str, Any]
    num_requests: int
    input_tokens: float | None
    output_tokens: float | None
    format: str

    @property
    def in_flight(self) -> float:
        """Mean requests in flight: the concurrency, or (Little's law) rate x mean E2E latency."""
        if self.load["type"] == "closed_loop":
            return float(self.load["concurrency"])
        e2e = self.targets.get("mean_e2el_ms")
        if e2e is None and "mean_ttft_ms" in self.targets and "mean_tpot_ms" in self.targets and self.output_tokens:
            e2e = self.targets["mean_ttft_ms"] + self.targets["mean_tpot_ms"] * max(self.output_tokens - 1.0, 0.0)
        return float("nan") if e2e is None else self.load["request_rate"] * e2e / 1e3

    @property
    def request_rate(self) -> float | None:
        return self.load.get("request_rate")


# ------------------------------------------------------------------ readers

#: The largest clock reading (s) and latency a measured run may hold: a replayed
#: instant is an int64 ns count below ``MAX_INSTANT_NS`` (about 146 years).
MAX_CLOCK_S = MAX_INSTANT_NS / 1e9


#: ``--format`` values: per-request runs, and aggregate-only stages.
FORMATS = ("auto", "jsonl", "vllm", "vllm-summary", "inference-perf")
#: The metrics a stage's statistics may name: (replaysim summary name, vllm bench serve name,
#: inference-perf ``successes.latency`` name).
STAGE_METRICS = (
    ("ttft", "ttft", "time_to_first_token"),
    ("tpot", "tpot", "time_per_output_token"),
    ("itl", "itl", "inter_token_latency"),
    ("e2el", "e2el", "request_latency"),
)
#: The most statistics of one stage taken (a file listing hundreds of percentiles is refused).
MAX_STAGE_TARGETS = 200


def read_input(path: str, fmt: str = "auto") -> Measured | list[Stage]:
    """A measured run per request (:func:`read_measured`) or aggregate stages (:func:`read_stages`).

    ``auto``: a JSON object with ``ttfts`` (``--save-detailed``) is a per-request
    ``vllm`` run; JSON holding ``mean_ttft_ms``-like keys (one object, a list of them,
    or one a line) is ``vllm-summary``; JSON with ``load_summary`` and ``successes`` is
    ``inference-perf``; anything else ``jsonl`` per request.
    """
    if fmt not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt in ("jsonl", "vllm"):
        return read_measured(path, fmt)
    text = _read_text(path)
    if fmt == "auto":
        head = text.lstrip()[:1]
        if head == "{" and '"ttfts"' in text:
            return read_measured(path, "vllm")
        if head in ("{", "[") and '"load_summary"' in text and '"successes"' in text:
            fmt = "inference-perf"
        elif head in ("{", "[") and re.search(r'"(mean|median|p[0-9.]+)_(ttft|tpot|itl|e2el)_ms"', text):
            fmt = "vllm-summary"
        else:
            return read_measured(path, "jsonl")
    return read_stages(path, text, fmt)


def read_stages(path: str, text: str, fmt: str) -> list[Stage]:
    """Aggregate stages: ``vllm bench serve --save-result`` JSON (one object, a JSON list, or one
    object a line as ``--append-result`` writes), or inference-perf's ``stage_N_lifecycle_metrics.json``
    / ``summary_lifecycle_metrics.json`` (one object or a list).

    Raises
    ------
    ConfigError
        One line naming the file and line or JSON path.
    """
    docs: list[tuple[str, Any]] = []
    stripped = text.lstrip()
    if stripped.startswith("["):
        value = _json(path, text)
        docs = [(f"{path}: [{i}]", d) for i, d in enumerate(value)]
    else:
        try:
            docs = [(path, json.loads(text))]
        except (ValueError, RecursionError):  # one object a line
            for line_no, line in enumerate(text.splitlines(), start=1):
                if line.strip():
                    docs.append((f"{path}:{line_no}", _json(path, line, line_no)))
    if not docs:
        raise ConfigError(f"{path}: no stages")
    reader = _vllm_stage if fmt == "vllm-summary" else _inference_perf_stage
    return [reader(where, doc, i, len(docs)) for i, (where, doc) in enumerate(docs)]


def _positive(where: str, key: str, value: Any, *, high: float = MAX_CLOCK_S * 1e3) -> float:
    number = _number(where, key, value, low=0.0, high=high)
    if number <= 0:
        raise ConfigError(f"{where}: {key} must be a number > 0, got {_shown(value)}")
    return number


def _vllm_stage(where: str, doc: Any, index: int, count: int) -> Stage:
    """One ``vllm bench serve --save-result`` result (``vllm/benchmarks/serve.py``): ``request_rate``
    (``"inf"``: unlimited), ``burstiness``, ``max_concurrency``, ``completed``,
    ``total_input_tokens``, ``total_output_tokens`` and ``{mean,median,std,pP}_{metric}_ms``."""
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: not a vllm bench serve result (a JSON object), got {_shown(doc)}")
    targets = {}
    for name, vllm_name, _ in STAGE_METRICS:
        for key, value in doc.items():
            m = re.fullmatch(rf"(mean|median|p[0-9]+(?:\.[0-9]+)?)_{vllm_name}_ms", key)
            if m and value is not None:
                stat = m.group(1)
                if stat.startswith("p") and not 0 < float(stat[1:]) < 100:
                    raise ConfigError(f"{where}: {key}: a percentile must be in (0, 100)")
                targets[f"{stat}_{name}_ms"] = _number(where, key, value, low=0.0, high=MAX_CLOCK_S * 1e3)
    if not targets:
        raise ConfigError(f"{where}: no statistic of ttft, tpot, itl or e2el (mean_ttft_ms, p99_ttft_ms, ...)")
    if len(targets) > MAX_STAGE_TARGETS:
        raise ConfigError(f"{where}: {len(targets)} statistics, more than {MAX_STAGE_TARGETS}")
    completed = _count(where, "completed", doc.get("completed"), 1)
    rate = doc.get("request_rate")
    concurrency = doc.get("max_concurrency")
    unlimited = rate is None or rate == "inf" or (isinstance(rate, float) and math.isinf(rate))
    if concurrency is not None:
        concurrency = _count(where, "max_concurrency", concurrency, 1)
    if unlimited:
        if concurrency is None:
            raise ConfigError(f"{where}: request_rate is unlimited and max_concurrency is null: "
                              "every request sent at once is not a load stage replaysim-calibrate replays")
        load = {"type": "closed_loop", "concurrency": concurrency, "think_time_ms": 0.0}
    else:
        rate = _positive(where, "request_rate", rate, high=1e9)
        if concurrency is not None:
            raise ConfigError(f"{where}: request_rate {rate:g} with max_concurrency {concurrency}: an open loop "
                              "capped by a concurrency is not modelled; give one of the two")
        burstiness = doc.get("burstiness", 1.0)
        burstiness = 1.0 if burstiness is None else _positive(where, "burstiness", burstiness, high=1e6)
        load = {"type": "poisson", "request_rate": rate} if burstiness == 1.0 else {
            "type": "gamma", "request_rate": rate, "burstiness": burstiness}
    lengths = []
    for key in ("total_input_tokens", "total_output_tokens"):
        value = doc.get(key)
        lengths.append(None if value is None else _count(where, key, value, completed) / completed)
    return Stage(where, targets, load, completed, lengths[0], lengths[1], "vllm-summary")


def _inference_perf_stage(where: str, doc: Any, index: int, count: int) -> Stage:
    """One inference-perf lifecycle report (``inference_perf/reportgen/base.py``, ``summarize_requests``):
    ``load_summary.requested_rate`` (and ``concurrency`` for a concurrency stage), ``successes.count``,
    ``successes.latency.<metric>.{mean,median,pP}`` in seconds, ``successes.prompt_tokens.mean`` and
    ``successes.output_len.mean``.  A rate stage is replayed as a constant-rate open loop
    (inference-perf's default ``load.type: constant``)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("load_summary"), dict) or not isinstance(
            doc.get("successes"), dict):
        raise ConfigError(f"{where}: not an inference-perf lifecycle report (load_summary and successes objects)")
    load_summary, successes = doc["load_summary"], doc["successes"]
    latency = successes.get("latency")
    if not isinstance(latency, dict):
        raise ConfigError(f"{where}: successes.latency is missing or not an object")
    targets = {}
    for name, _, ip_name in STAGE_METRICS:
        stats = latency.get(ip_name)
        if stats is None:
            continue
        if not isinstance(stats, dict):
            raise ConfigError(f"{where}: successes.latency.{ip_name} must be an object, got {_shown(stats)}")
        for stat, value in stats.items():
            if stat == "mean" or stat == "median" or re.fullmatch(r"p[0-9]+(\.[0-9]+)?", stat):
                if stat.startswith("p") and not 0 < float(stat[1:]) < 100:
                    raise ConfigError(f"{where}: successes.latency.{ip_name}.{stat}: a percentile must be in (0, 100)")
                seconds = _number(where, f"successes.latency.{ip_name}.{stat}", value, low=0.0)
                targets[f"{stat}_{name}_ms"] = seconds * 1e3
    if not targets:
        raise ConfigError(f"{where}: successes.latency has no statistic of time_to_first_token, "
                          "time_per_output_token, inter_token_latency or request_latency")
    if len(targets) > MAX_STAGE_TARGETS:
        raise ConfigError(f"{where}: {len(targets)} statistics, more than {MAX_STAGE_TARGETS}")
    completed = _count(where, "successes.count", successes.get("count"), 1)
    concurrency = load_summary.get("concurrency")
    if concurrency is not None:
        load = {"type": "closed_loop", "concurrency": _count(where, "load_summary.concurrency", concurrency, 1),
                "think_time_ms": 0.0}
    else:
        rate = load_summary.get("requested_rate")
        if rate is None:
            raise ConfigError(f"{where}: load_summary has neither requested_rate nor concurrency (a per-stage "
                              "report, stage_N_lifecycle_metrics.json, has them)")
        load = {"type": "constant_rate", "request_rate": _positive(where, "load_summary.requested_rate", rate, high=1e9)}
    lengths = []
    for key, alt in (("prompt_tokens", "prompt_len"), ("output_len", "output_tokens")):
        block = successes.get(key) or successes.get(alt)
        mean = block.get("mean") if isinstance(block, dict) else None
        lengths.append(None if mean is None else _positive(where, f"successes.{key}.mean", mean, high=MAX_LENGTH))
    return Stage(where, targets, load, completed, lengths[0], lengths[1], "inference-perf")


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


#: The workload keys that may describe the requests of aggregate stages (their lengths).
STAGE_WORKLOAD_KEYS = ("workload.input_tokens", "workload.output_tokens", "workload.input_dist",
                       "workload.output_dist", "workload.range_ratio", "workload.input_std", "workload.output_std",
                       "workload.prefix_tokens")


def parse_overrides(tokens: Sequence[str], *, stages_only: bool = False) -> dict[str, Any]:
    """``key=value`` tokens (YAML values, as on the replaysim command line) as a nested mapping.

    ``stages_only``: every input is an aggregate stage, whose requests' lengths the
    :data:`STAGE_WORKLOAD_KEYS` may describe."""
    from omegaconf import OmegaConf

    known = set(dotted_keys())
    for token in tokens:
        key = token.split("=", 1)[0]
        if "=" not in token or key not in known:
            raise ConfigError(f"override {token!r}: expected KEY=VALUE with a replaysim key")
        if stages_only and key in STAGE_WORKLOAD_KEYS:
            continue
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
        elif key in declared_ranges():
            low, high = declared_ranges()[key]
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
    runs: list[dict] = field(default_factory=list)  # per run: label, kind, load, errors
    stability: dict | None = None  # the parameters' spread over fit subsets
    load_range: dict | None = None  # the loads the fit saw
    scored: list[dict] = field(default_factory=list)  # runs predicted with the fit, not fitted
    warnings: list[str] = field(default_factory=list)


@dataclass
class FitRun:
    """One measured run or stage to fit (or score): its deployment and its measurement.

    ``measured``: per-request latencies (the workload and sends are the run's own);
    ``stage``: aggregate statistics (the workload from the stage's mean lengths or the
    ``workload.*`` overrides, the load from the stage).
    """

    label: str
    overrides: dict[str, Any]
    measured: Measured | None = None
    stage: Stage | None = None

    @property
    def kind(self) -> str:
        return "requests" if self.measured is not None else "stage"


@dataclass
class _Prepared:
    run: FitRun
    base: dict
    requests: pa.Table | None
    rows_of: np.ndarray | None
    parts: dict[str, np.ndarray]  # per-request runs: fit and held-out rows (measured order)


def _prepare(run: FitRun, fit_fraction: float) -> _Prepared:
    """The run's base config (workload and load set) and request table; a bad deployment fails here."""
    base = json.loads(json.dumps(run.overrides))
    if run.measured is not None:
        n = len(run.measured.request_id)
        base.setdefault("load", {})["type"] = "trace"
        base.setdefault("workload", {}).setdefault("num_requests", n)
        requests, rows_of = replay_inputs(base, run.measured)
        n_fit = max(1, int(math.floor(n * fit_fraction)))
        parts = {"fit": np.arange(n_fit)}
        if n_fit < n:
            parts["held_out"] = np.arange(n_fit, n)
        load_config(base)
        return _Prepared(run, base, requests, rows_of, parts)
    stage = run.stage
    base["load"] = dict(stage.load)
    workload = base.setdefault("workload", {})
    if workload.get("source", "synthetic") == "synthetic":
        for key, mean in (("input_tokens", stage.input_tokens), ("output_tokens", stage.output_tokens)):
            if key not in workload:
                if mean is None:
                    raise ConfigError(f"{stage.label}: the stage gives no mean {key.replace('_', ' ')}: "
                                      f"set workload.{key} (and its distribution) among the overrides")
                workload[key] = max(1, int(round(mean)))
    workload["num_requests"] = stage.num_requests
    percentiles = sorted({float(k.split("_", 1)[0][1:]) for k in stage.targets if k.startswith("p")})
    if percentiles:
        base.setdefault("metrics", {})["percentiles"] = [int(p) if p.is_integer() else p for p in percentiles]
    load_config(base)
    return _Prepared(run, base, None, None, {})


def _with(base: dict, fit: list[tuple[str, float, float]], x: Sequence[float]) -> dict:
    cfg = json.loads(json.dumps(base))
    for (key, _, _), value in zip(fit, x):
        set_dotted(cfg, key, float(value))
    return cfg


def stage_loss(summary: dict[str, Any], targets: dict[str, float]) -> float:
    """Sum of squared relative errors of a stage's statistics; a statistic the replay has no
    finite value of counts as predicted 0 (error -100%)."""
    total = 0.0
    for key, value in targets.items():
        if not value > 0:
            continue
        predicted = summary.get(key)
        predicted = predicted if isinstance(predicted, (int, float)) and math.isfinite(predicted) else 0.0
        total += (predicted / value - 1.0) ** 2
    return total


def _run_loss(prep: _Prepared, result, loss: str, rows: np.ndarray | None) -> float:
    if prep.run.measured is not None:
        return loss_value(loss, predicted_latency(result, prep.rows_of), prep.run.measured, rows)
    return stage_loss(result.summary, prep.run.stage.targets)


def _optimise(preps: list[_Prepared], fit, loss: str, max_evals: int, seed: int,
              rows: list[np.ndarray | None]) -> tuple[np.ndarray, float, int, int]:
    """Differential evolution over ``fit``: the summed loss of ``preps`` on ``rows`` (per run)."""
    from scipy.optimize import differential_evolution

    evaluations = 0
    generations = 0

    def population_loss(x: np.ndarray) -> np.ndarray:
        nonlocal evaluations, generations
        points = np.atleast_2d(x.T)  # scipy (vectorized): x is (parameters, candidates)
        total = np.zeros(len(points))
        for prep, part in zip(preps, rows):
            try:
                results = simcore.run_batch([_with(prep.base, fit, p) for p in points], requests=prep.requests)
            except ConfigError as exc:  # SciPy would wrap a ValueError in its own RuntimeError
                raise _Refused(exc) from None
            evaluations += len(results)
            total += [_run_loss(prep, r, loss, part) for r in results]
        generations += 1
        return total

    population = 1 << (POPSIZE * len(fit) - 1).bit_length()  # Sobol initialisation: a power of two
    maxiter = max(1, max_evals // (population * len(preps)) - 1)  # the initial population is one generation more
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
    return np.asarray(found.x, dtype=np.float64), float(found.fun), evaluations, generations


def _in_flight(run: FitRun) -> float:
    """The mean requests in flight a run measured (Little's law over its span), or a stage's."""
    if run.stage is not None:
        return run.stage.in_flight
    m = run.measured
    e2e = m.latency["e2el_ms"]
    span = float(np.max(m.send_ms + e2e) - np.min(m.send_ms))
    return float(np.sum(e2e) / span) if span > 0 else float(len(e2e))


def _request_rate(run: FitRun) -> float | None:
    if run.stage is not None:
        return run.stage.request_rate
    send = run.measured.send_ms
    return float((send.size - 1) / (send[-1] - send[0]) * 1e3) if send.size > 1 and send[-1] > send[0] else None


def _run_report(prep: _Prepared, best, initial) -> dict:
    """The calibrated and uncalibrated errors of one run (per part for a per-request run)."""
    run = prep.run
    out: dict[str, Any] = {"label": run.label, "kind": run.kind, "in_flight": _in_flight(run),
                           "request_rate": _request_rate(run)}
    if run.measured is not None:
        out["requests"] = len(run.measured.request_id)
        out["parts"] = {}
        for name, rows in prep.parts.items():
            target = part_metrics(run.measured.latency, rows)
            out["parts"][name] = {
                "requests": int(rows.size),
                "calibrated": errors_of(part_metrics(predicted_latency(best, prep.rows_of), rows), target),
                "uncalibrated": errors_of(part_metrics(predicted_latency(initial, prep.rows_of), rows), target),
            }
    else:
        out["load"] = run.stage.load
        out["errors"] = {
            key: {"measured": value, "calibrated": best.summary.get(key), "uncalibrated": initial.summary.get(key)}
            for key, value in run.stage.targets.items()
        }
        for row in out["errors"].values():
            for side in ("calibrated", "uncalibrated"):
                p = row[side]
                row[f"{side}_error"] = p / row["measured"] - 1.0 if isinstance(p, (int, float)) and math.isfinite(
                    p) and row["measured"] > 0 else None
    return out


#: A scored run whose load (mean requests in flight) lies beyond this factor of the fitted
#: loads' range is an extrapolation (``--max-extrapolation``).
DEFAULT_MAX_EXTRAPOLATION = 2.0


def extrapolation(load_range: dict, in_flight: float) -> float:
    """How far ``in_flight`` lies outside the fitted range, as a factor (1: inside)."""
    low, high = load_range["in_flight_min"], load_range["in_flight_max"]
    if not (math.isfinite(in_flight) and in_flight > 0 and low > 0):
        return 1.0
    return max(1.0, in_flight / high, low / in_flight)


def calibrate_runs(
    runs: list[FitRun],
    fit: list[tuple[str, float, float]],
    *,
    fit_fraction: float = 0.5,
    loss: str = DEFAULT_LOSS,
    max_evals: int = 2400,
    seed: int = 0,
    stability_fits: int = 0,
    score: Sequence[FitRun] = (),
    max_extrapolation: float = DEFAULT_MAX_EXTRAPOLATION,
    refuse_extrapolation: bool = False,
) -> Calibration:
    """Fit ``fit`` to every run of ``runs`` at once (the sum of their losses), then measure the
    fit's stability and predict the ``score`` runs.

    Parameters
    ----------
    runs : list of FitRun
        Per-request runs (fitted on their first ``fit_fraction`` by send instant) and
        aggregate stages (every statistic fitted), each with its own deployment.
    fit : list of (key, low, high)
    fit_fraction, loss, max_evals, seed
        As :func:`calibrate`; ``max_evals`` counts replays (candidates x runs).
    stability_fits : int
        0: no stability figures.  With two or more runs: each run left out in turn
        (leave-one-stage-out: as many fits as runs); with one per-request run:
        this many bootstrap fits (the fit part's requests resampled with
        replacement, seeded).  Each fit has the budget of the main one.
    score : sequence of FitRun
        Runs predicted with the fitted values and scored, not fitted.
    max_extrapolation : float
        A scored run whose mean requests in flight lies beyond this factor outside
        the fitted runs' range is warned of (``Calibration.warnings``).
    refuse_extrapolation : bool
        Refuse such a run instead (ConfigError), before fitting.

    Returns
    -------
    Calibration
    """
    if not runs:
        raise ConfigError("no measured run to fit")
    if not 0 < fit_fraction <= 1:
        raise ConfigError(f"--fit-fraction must be in (0, 1], got {fit_fraction!r}")
    if loss not in LOSSES:
        raise ConfigError(f"--loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    if not (math.isfinite(max_extrapolation) and max_extrapolation >= 1):
        raise ConfigError(f"--max-extrapolation must be a number >= 1, got {max_extrapolation!r}")
    preps = [_prepare(run, fit_fraction) for run in runs]
    scored = [_prepare(run, 1.0) for run in score]
    for prep in preps + scored:  # each bound of each parameter must be a valid config
        for key, low, high in fit:
            for value in (low, high):
                trial = json.loads(json.dumps(prep.base))
                set_dotted(trial, key, value)
                load_config(trial)
    loads = [_in_flight(run) for run in runs]
    finite = [x for x in loads if math.isfinite(x)]
    rates = [r for r in (_request_rate(run) for run in runs) if r is not None]
    load_range = {
        "in_flight_min": min(finite) if finite else float("nan"),
        "in_flight_max": max(finite) if finite else float("nan"),
        "request_rate_min": min(rates) if rates else None,
        "request_rate_max": max(rates) if rates else None,
    }
    warnings = []
    for prep in scored:
        factor = extrapolation(load_range, _in_flight(prep.run))
        if factor > max_extrapolation:
            message = (f"{prep.run.label}: {_in_flight(prep.run):.3g} requests in flight is {factor:.2f}x outside "
                       f"the fitted loads ({load_range['in_flight_min']:.3g} to {load_range['in_flight_max']:.3g}); "
                       f"the fit is extrapolated beyond --max-extrapolation {max_extrapolation:g}")
            if refuse_extrapolation:
                raise ConfigError(message)
            warnings.append(message)
    fit_rows = [prep.parts.get("fit") for prep in preps]
    start = time.perf_counter()
    x, fun, evaluations, generations = _optimise(preps, fit, loss, max_evals, seed, fit_rows)
    seconds = time.perf_counter() - start
    values = {key: float(v) for (key, _, _), v in zip(fit, x)}
    reports = []
    for prep in preps + scored:
        best, initial = simcore.run_batch([_with(prep.base, fit, x), prep.base], requests=prep.requests)
        reports.append(_run_report(prep, best, initial))
    for report in reports[len(preps):]:
        report["extrapolation"] = extrapolation(load_range, report["in_flight"])
    stability = None
    if stability_fits > 0:
        stability = _stability(preps, fit, loss, max_evals, seed, fit_rows, stability_fits, values)
    first = reports[0]
    report = first.get("parts", {}) if len(preps) == 1 else {}
    return Calibration(values, fun, evaluations, generations, seconds, report, reports[:len(preps)], stability,
                       load_range, reports[len(preps):], warnings)


def _stability(preps, fit, loss, max_evals, seed, fit_rows, count, values) -> dict:
    """The fitted values over fit subsets: leave-one-run-out with two or more runs, else
    ``count`` bootstrap resamples of the one run's fit part."""
    subsets: list[tuple[str, list[_Prepared], list]] = []
    if len(preps) >= 2:
        method = "leave-one-stage-out"
        for i, prep in enumerate(preps):
            keep = [j for j in range(len(preps)) if j != i]
            subsets.append((f"without {prep.run.label}", [preps[j] for j in keep], [fit_rows[j] for j in keep]))
    elif preps[0].run.measured is not None:
        method = "bootstrap"
        rng = np.random.default_rng(seed)
        rows = fit_rows[0]
        for b in range(count):
            sample = np.sort(rng.choice(rows, size=rows.size, replace=True))
            subsets.append((f"resample {b + 1}", preps, [sample]))
    else:
        return {"method": "none", "fits": 0, "note": "one aggregate stage: no subset to refit on"}
    fitted: dict[str, list[float]] = {key: [] for key, _, _ in fit}
    labels = []
    for label, subset, rows in subsets:
        x, _, _, _ = _optimise(subset, fit, loss, max_evals, seed, rows)
        labels.append(label)
        for (key, _, _), v in zip(fit, x):
            fitted[key].append(float(v))
    parameters = {}
    for key, series in fitted.items():
        low, high = min(series), max(series)
        centre = values[key]
        parameters[key] = {
            "value": centre, "min": low, "max": high, "values": series,
            "spread": (high - low) / abs(centre) if centre != 0 else float("inf") if high > low else 0.0,
        }
    return {"method": method, "fits": len(subsets), "subsets": labels, "parameters": parameters}


def calibrate(
    measured: Measured,
    overrides: dict[str, Any],
    fit: list[tuple[str, float, float]],
    *,
    fit_fraction: float = 0.5,
    loss: str = DEFAULT_LOSS,
    max_evals: int = 2400,
    seed: int = 0,
    stability_fits: int = 0,
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
    stability_fits : int
        Bootstrap refits for the stability figures (0: none).

    Returns
    -------
    Calibration
    """
    run = FitRun("measured", overrides, measured=measured)
    return calibrate_runs([run], fit, fit_fraction=fit_fraction, loss=loss, max_evals=max_evals, seed=seed,
                          stability_fits=stability_fits)


# ------------------------------------------------------------------ output


def calibrated_yaml(overrides: dict[str, Any], values: dict[str, float], load_range: dict | None = None) -> str:
    """A Hydra config: the app's ``config`` plus the deployment overrides and the fitted values
    (a comment says the loads the fit saw)."""
    from omegaconf import OmegaConf

    tree = json.loads(json.dumps(overrides))
    for key, value in values.items():
        set_dotted(tree, key, value)
    body = OmegaConf.to_yaml(OmegaConf.create(tree)) if tree else ""
    seen = ""
    if load_range and math.isfinite(load_range.get("in_flight_min", math.nan)):
        seen = (f"# Fitted at {load_range['in_flight_min']:.3g} to {load_range['in_flight_max']:.3g} requests in "
                "flight (calibration.json: load_range); far outside them the fit is extrapolated.\n")
    return (
        "# Written by replaysim-calibrate; run it with\n"
        "#   replaysim --config-dir <this directory> --config-name calibrated [overrides]\n" + seen +
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


def check_cost(max_evals: int, requests: int, fits: int = 1) -> None:
    """Refuse a calibration whose candidates x requests (x fits: the fit and its stability
    refits) exceed :data:`MAX_SIMULATED_REQUESTS`; ``requests``: of the largest run."""
    if not 1 <= max_evals <= MAX_EVALS:
        raise ConfigError(f"--max-evals must be an integer from 1 to {MAX_EVALS}, got {_shown(max_evals)}")
    one = max_evals * requests
    cost = one * fits
    if cost > MAX_SIMULATED_REQUESTS:
        each = f" a fit x {fits} fits (the fit and --stability-fits) = {cost:.3g}" if fits > 1 else ""
        raise ConfigError(f"--max-evals {max_evals} x {requests} measured requests = {one:.3g} simulated requests"
                          f"{each}, above the bound of {MAX_SIMULATED_REQUESTS:.0e}: lower --max-evals"
                          f"{' or --stability-fits' if fits > 1 else ''}")


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


def _is_override(token: str) -> bool:
    """Whether a positional token is a ``KEY=VALUE`` override (else a measured file)."""
    key, eq, _ = token.partition("=")
    return bool(eq) and "." in key and "/" not in key and not os.path.exists(token)


def _runs(paths: Sequence[str], fmt: str, overrides: dict[str, Any]) -> list[FitRun]:
    """Each file's runs: one per-request run, or its aggregate stages."""
    runs = []
    for path in paths:
        found = read_input(path, fmt)
        if isinstance(found, Measured):
            runs.append(FitRun(path, overrides, measured=found))
        else:
            runs += [FitRun(stage.label, overrides, stage=stage) for stage in found]
    return runs


def _count_requests(runs: Sequence[FitRun]) -> int:
    return sum(len(r.measured.request_id) if r.measured is not None else r.stage.num_requests for r in runs)


def main(argv: Sequence[str] | None = None) -> int:
    """The command: bad input prints one line and returns 2, an unwritable ``--out`` 74; nothing is written."""
    if argv is None:
        _stop_on_signals()
        argv = sys.argv[1:]
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("inputs", nargs="+", metavar="MEASURED|KEY=VALUE",
                        help="measured runs or stages (files; several are fitted together) and replaysim "
                             "KEY=VALUE overrides of the deployment")
    parser.add_argument("--fit", action="append", default=[], metavar="KEY[=LOW:HIGH]", help="a parameter to fit")
    parser.add_argument("--fit-fraction", type=float, default=0.5, help="share of requests (by send) fitted")
    parser.add_argument("--loss", default=DEFAULT_LOSS, choices=tuple(LOSSES),
                        help="what the fit minimises (default %(default)s; see the module docstring)")
    parser.add_argument("--out", default="calibration", help="output directory")
    parser.add_argument("--max-evals", type=_int_text, default=2400, help="most simulated candidates")
    parser.add_argument("--seed", type=_int_text, default=0,
                        help=f"seed of the optimiser (differential evolution), 0 to {MAX_SEED}; the same inputs and "
                             "seed give the same fit (default %(default)s)")
    parser.add_argument("--format", default="auto", choices=FORMATS,
                        help="format of the measured run: jsonl (one JSON object per request), vllm (vllm bench serve "
                             "--save-result --save-detailed JSON), vllm-summary (vllm bench serve --save-result "
                             "statistics, one object a stage), inference-perf (its lifecycle metrics reports), or "
                             "auto: from the content (default %(default)s)")
    parser.add_argument("--stability-fits", type=_int_text, default=3, metavar="N",
                        help="the fit's stability: with several runs or stages each left out in turn, with one "
                             "per-request run N bootstrap refits; 0: none (default %(default)s)")
    parser.add_argument("--score", action="append", default=[], metavar="MEASURED",
                        help="a run or stages predicted with the fit and scored, not fitted")
    parser.add_argument("--max-extrapolation", type=float, default=DEFAULT_MAX_EXTRAPOLATION, metavar="F",
                        help="warn when a scored run's mean requests in flight lies more than F times outside "
                             "the fitted runs' (default %(default)s)")
    parser.add_argument("--refuse-extrapolation", action="store_true",
                        help="refuse such a scored run (exit 2) instead of warning")
    try:
        args = parser.parse_intermixed_args(list(argv))  # overrides before or after the flags
    except _ArgumentsError as exc:
        return _error(exc)
    out = os.path.abspath(args.out)
    created = [str(d) for d in missing_ancestors(Path(out))]
    paths = [t for t in args.inputs if not _is_override(t)]
    tokens = [t for t in args.inputs if _is_override(t)]
    try:
        if not 0 <= args.seed <= MAX_SEED:
            raise ConfigError(f"--seed must be an integer from 0 to {MAX_SEED}, got {_shown(args.seed)}")
        if not 1 <= args.max_evals <= MAX_EVALS:
            raise ConfigError(f"--max-evals must be an integer from 1 to {MAX_EVALS}, got {_shown(args.max_evals)}")
        if not 0 < args.fit_fraction <= 1:
            raise ConfigError(f"--fit-fraction must be in (0, 1], got {args.fit_fraction!r}")
        if not 0 <= args.stability_fits <= MAX_STABILITY_FITS:
            raise ConfigError(f"--stability-fits must be an integer from 0 to {MAX_STABILITY_FITS}, "
                              f"got {_shown(args.stability_fits)}")
        if not (math.isfinite(args.max_extrapolation) and args.max_extrapolation >= 1):
            raise ConfigError(f"--max-extrapolation must be a number >= 1, got {args.max_extrapolation!r}")
        if not paths:
            raise ConfigError("name at least one measured run (a file)")
        runs = _runs(paths, args.format, {})
        scored = _runs(args.score, args.format, {})
        overrides = parse_overrides(tokens, stages_only=all(r.stage is not None for r in runs + scored))
        for run in runs + scored:
            run.overrides = overrides
        fits = 1 + (args.stability_fits if len(runs) == 1 else len(runs)) * (args.stability_fits > 0)
        check_cost(args.max_evals, max(_count_requests([r]) for r in runs), fits)
        fit = parse_fit(args.fit)
        try:
            check_writable(out)  # before the fit, not after it
        except OSError as exc:
            _remove_created(created)
            return _error(f"cannot write results to {exc.filename or out}: {_reason(exc)}", EXIT_ENVIRONMENT)
        result = calibrate_runs(
            runs, fit, fit_fraction=args.fit_fraction, loss=args.loss, max_evals=args.max_evals, seed=args.seed,
            stability_fits=args.stability_fits, score=scored, max_extrapolation=args.max_extrapolation,
            refuse_extrapolation=args.refuse_extrapolation,
        )
    except ConfigError as exc:
        _remove_created(created)
        return _error(exc)
    first = runs[0]
    document = {
        "measured": [os.path.abspath(p) for p in paths] if len(paths) > 1 else os.path.abspath(paths[0]),
        "format": first.measured.format if first.measured is not None else first.stage.format,
        "requests": _count_requests(runs),
        "dropped_failed_requests": sum(r.measured.dropped for r in runs if r.measured is not None),
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
        "runs": result.runs,
        "load_range": result.load_range,
        "stability": result.stability,
        "scored": result.scored,
        "warnings": result.warnings,
    }
    deployment = {key: value for key, value in overrides.items() if key != "workload"}  # not the run's trace
    try:  # both files or neither
        write_atomic(out, [("calibrated.yaml", text_file(calibrated_yaml(deployment, result.values, result.load_range))),
                           ("calibration.json", text_file(json.dumps(_finite(document), indent=2, allow_nan=False) + "\n"))])
    except OSError as exc:  # a full disk; the temporary files are gone
        _remove_created(created)
        return _error(f"cannot write results to {exc.filename or out}: {_reason(exc)}", EXIT_ENVIRONMENT)
    for message in result.warnings:
        print(f"{PROG}: warning: {message}", file=sys.stderr, flush=True)
    for key, value in result.values.items():
        print(f"{key} = {value:.6g}")
    for line in _summary_lines(result):
        print(line)
    print(f"loss {result.loss:.4g}, {result.evaluations} candidates in {result.seconds:.1f} s; wrote {args.out}")
    return 0


#: Most stability refits (``--stability-fits``).
MAX_STABILITY_FITS = 100


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float as None (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _summary_lines(result: Calibration) -> list[str]:
    """The terminal lines: each run's calibrated mean errors, the stability, the scored runs."""
    lines = []
    for run in result.runs + result.scored:
        tag = "scored " if run in result.scored else ""
        if "parts" in run:
            for name, part in run["parts"].items():
                cells = ", ".join(f"mean {label} {100 * part['calibrated'][f'mean_{col}']['error']:+.1f}%"
                                  for col, label in METRICS)
                where = f"{name}" if len(result.runs) == 1 and not tag else f"{tag}{run['label']} {name}"
                lines.append(f"{where} ({part['requests']} requests): {cells}")
        else:
            cells = ", ".join(f"{key} {100 * row['calibrated_error']:+.1f}%" for key, row in run["errors"].items()
                              if key.startswith("mean_") and row["calibrated_error"] is not None)
            lines.append(f"{tag}{run['label']}: {cells}")
    if result.stability and result.stability.get("fits"):
        cells = ", ".join(f"{key} {p['min']:.4g}..{p['max']:.4g} (spread {100 * p['spread']:.1f}%)"
                          for key, p in result.stability["parameters"].items())
        lines.append(f"stability ({result.stability['method']}, {result.stability['fits']} fits): {cells}")
    return lines


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
