"""``report.html``: one self-contained HTML page per run, and one per sweep.

A run's page (:func:`run_report`) says what was simulated
(:func:`runners.report.described`), then gives the summary table, the
TTFT / TPOT / ITL / E2E latency distributions, the TTFT stage breakdown and
a timeline of the engine (requests waiting and running, from the request
table; batch size and KV use per pool, from the pass table when it was
recorded).  A sweep's page (:func:`sweep_report`) gives the knee plots
(output throughput against tail TTFT and TPOT, one curve per configuration
family), the Pareto plot of tokens/s per GPU against tokens/s per user, the
TTFT stage shares and the table of points.

Everything is inline: CSS in a ``<style>`` element, charts as SVG
(:mod:`runners.svg`), no script and no external resource, so the page opens
without a network.  Built from what a run writes (``summary.json``'s
document and the Arrow tables), so ``replaysim-analyze`` rebuilds it from a
run directory.
"""

from __future__ import annotations

import json
import math
from html import escape
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa

from simcore.arrow_np import dictionary_strings, pc, to_numpy
from runners import svg
from runners.report import cache_lines, described, saturation_line, warnings_for
from runners.sweep import REPORT_FILE  # noqa: F401  (re-exported: declared once, with the result files)
from simcore.metrics.registry import DISTRIBUTIONS, percentile_names, summary_key
from simcore.schema import TTFT_STAGES

#: Instants at which the timeline is sampled.
TIMELINE_SAMPLES = 600

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1280px;
       padding: 0 16px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
.sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; margin: 8px 0; }
td, th { padding: 3px 10px; border-bottom: 1px solid #eee; text-align: right; vertical-align: top; }
th { background: #f6f6f6; } td.l, th.l { text-align: left; }
table.kv td:first-child { font-weight: 600; text-align: left; white-space: nowrap; }
table.kv td { text-align: left; }
.grid2 { display: flex; flex-wrap: wrap; gap: 12px 28px; align-items: flex-start; }
.note { color: #555; font-size: 13px; } .warn { color: #a40; font-weight: 600; }
svg.plot { background: #fff; border: 1px solid #e4e4e4; border-radius: 4px; max-width: 100%; height: auto; }
svg .frame { fill: none; stroke: #999; } svg .grid { stroke: #eee; }
svg text { font: 11px system-ui, sans-serif; fill: #333; } svg .title { font-size: 13px; font-weight: 600; }
svg .label { font-size: 12px; } svg .tick { fill: #555; } svg .legend-title { font-weight: 600; }
svg .point { font-size: 10px; fill: #444; } svg text.note { font-size: 13px; fill: #777; }
.scroll { overflow-x: auto; } .scroll td { white-space: nowrap; }
pre { background: #f6f6f6; padding: 8px; overflow-x: auto; font-size: 12px; }
"""


def _page(title: str, body: Sequence[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _fmt(value: Any, spec: str = ".2f") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return format(value, spec)
    return escape(str(value))


def _kv_table(rows: Sequence[tuple[str, str]]) -> str:
    return "<table class=\"kv\">" + "".join(
        f"<tr><td>{escape(label)}</td><td>{escape(text)}</td></tr>" for label, text in rows) + "</table>"


def _column(table: pa.Table | None, name: str) -> np.ndarray | None:
    """A numeric column as float64 (nulls as NaN), or None when absent."""
    if table is None or name not in table.column_names:
        return None
    column = table.column(name)
    if column.null_count == 0:
        return column.to_numpy(zero_copy_only=False).astype(float, copy=False)
    if column.type == pa.float64():  # nulls as NaN, without pyarrow.compute
        return to_numpy(column)
    return pc.fill_null(column.cast(pa.float64()), float("nan")).to_numpy(zero_copy_only=False)


def _status_is(requests: pa.Table, status: str) -> np.ndarray:
    """Whether each request's status is ``status`` (bool array)."""
    return dictionary_strings(requests.column("status")) == status


# ---------------------------------------------------------------- a run


def _summary_tables(summary: Mapping[str, Any]) -> str:
    get = summary.get
    counts = [
        ("Requests completed", _fmt(get("completed"))), ("Requests rejected", _fmt(get("rejected"))),
        ("Requests incomplete", _fmt(get("incomplete"))), ("Duration (s)", _fmt(get("duration_s"), ".3f")),
        ("Request throughput (req/s)", _fmt(get("request_throughput"))),
        ("Output throughput (tok/s)", _fmt(get("output_throughput"))),
        ("Total token throughput (tok/s)", _fmt(get("total_token_throughput"))),
    ]
    if get("request_goodput") is not None:
        counts.append(("Request goodput (req/s)", _fmt(get("request_goodput"))))
    if get("gpu_seconds") is not None:  # autoscaling
        counts += [("GPU-seconds", _fmt(get("gpu_seconds"), ".1f")),
                   ("Mean ready replicas", _fmt(get("mean_ready_replicas"))),
                   ("Scale-ups / scale-downs", f"{_fmt(get('scale_ups'))} / {_fmt(get('scale_downs'))}")]
        if get("slo_attainment") is not None:
            counts.append(("SLO attainment", _fmt(get("slo_attainment"), ".4f")))
    if get("worker_failures") is not None:  # failures
        counts += [("Worker failures", _fmt(get("worker_failures"))),
                   ("Requests failed / retried / lost", f"{_fmt(get('failed_requests'))} / "
                    f"{_fmt(get('retried_requests'))} / {_fmt(get('lost_requests'))}")]
    first = "<table class=\"kv\" data-table=\"counts\">" + "".join(
        f"<tr><td>{label}</td><td>{value}</td></tr>" for label, value in counts) + "</table>"
    names = percentile_names(summary)
    head = "<tr><th class=\"l\">latency (ms)</th><th>mean</th>" + "".join(f"<th>{escape(n)}</th>" for n in names) \
        + "<th>max</th></tr>"
    rows = []
    for metric in DISTRIBUTIONS:
        cells = [_fmt(get(summary_key("mean", metric)))] + [_fmt(get(summary_key(n, metric))) for n in names]
        cells.append(_fmt(get(summary_key("max", metric))))
        rows.append(f"<tr><td class=\"l\">{escape(metric.label)}</td>" + "".join(f"<td>{c}</td>" for c in cells)
                    + "</tr>")
    return f"<div class=\"grid2\">{first}<table data-table=\"latency\">{head}{''.join(rows)}</table></div>"


def _itl_values(requests: pa.Table, tokens: pa.Table | None) -> np.ndarray | None:
    """The pooled gaps between consecutive receipts of completed requests (ms), from the token table."""
    if tokens is None or tokens.num_rows == 0:
        return None
    completed = pc.equal(requests.column("status").cast(pa.string()), "completed")
    done_ids = pc.filter(requests.column("request_id"), completed)
    rows = tokens.filter(pc.is_in(tokens.column("request_id"), value_set=done_ids))
    if rows.num_rows < 2:
        return np.empty(0)
    rows = rows.sort_by([("request_id", "ascending"), ("index", "ascending")])
    ids = rows.column("request_id").to_numpy(zero_copy_only=False)
    received = _column(rows, "received_ms")
    same = ids[1:] == ids[:-1]
    gaps = np.diff(received)[same]
    return gaps[np.isfinite(gaps)]


def _distributions(summary: Mapping[str, Any], requests: pa.Table, tokens: pa.Table | None) -> list[str]:
    completed = _status_is(requests, "completed")
    charts, notes = [], []
    for metric in DISTRIBUTIONS:
        name = f"{metric.name}_cdf"
        title = f"{metric.label} CDF (completed requests)"
        if metric.column is not None:
            values = _column(requests, metric.column)
            charts.append(svg.cdf(name, title, [(metric.label, values[completed])], f"{metric.label} (ms)"))
            continue
        values = _itl_values(requests, tokens)
        if values is not None:
            charts.append(svg.cdf(name, f"{metric.label} CDF (gaps between receipts)", [(metric.label, values)],
                                  f"{metric.label} (ms)"))
            continue
        # per-token receipts not written: the summary's percentiles as points of the CDF
        names = percentile_names(summary)
        xs = [summary.get(summary_key(n, metric)) for n in names]
        ys = [float(n[1:]) / 100.0 for n in names]
        charts.append(svg.lines(name, f"{metric.label}: the summary's percentiles",
                                [{"label": metric.label, "x": xs, "y": ys, "marker": True}],
                                f"{metric.label} (ms)", "fraction of gaps", y_range=(0.0, 1.0)))
        notes.append(f"{metric.label}: the per-token receipts were not written, so only the summary's percentiles "
                     "are drawn (output.tokens=true writes tokens.parquet and gives the whole distribution).")
    body = "<div class=\"grid2\">" + "".join(charts) + "</div>"
    return [body, *(f"<p class=\"note\">{escape(n)}</p>" for n in notes)]


def _stages(summary: Mapping[str, Any], requests: pa.Table) -> list[str]:
    completed = _status_is(requests, "completed")
    labels = [stage.removesuffix("_ms") for stage in TTFT_STAGES]
    means = [summary.get(f"mean_{stage}") for stage in TTFT_STAGES]
    chart = svg.hbar("ttft_stages", "Mean TTFT split into its stages (completed requests)",
                     list(zip(labels, means)), "ms")
    rows = []
    total = sum(m for m in means if m) or 0.0
    for stage, label, mean in zip(TTFT_STAGES, labels, means):
        values = _column(requests, stage)
        values = values[completed & np.isfinite(values)] if values is not None else np.empty(0)
        p50, p99 = (np.percentile(values, [50, 99]) if values.size else (None, None))
        share = None if not total or mean is None else 100.0 * mean / total
        rows.append(f"<tr><td class=\"l\">{escape(label)}</td><td>{_fmt(mean, '.3f')}</td>"
                    f"<td>{_fmt(share, '.1f')}</td><td>{_fmt(None if p50 is None else float(p50), '.3f')}</td>"
                    f"<td>{_fmt(None if p99 is None else float(p99), '.3f')}</td></tr>")
    table = ("<table data-table=\"stages\"><tr><th class=\"l\">stage</th><th>mean (ms)</th><th>share of mean (%)</th>"
             "<th>p50 (ms)</th><th>p99 (ms)</th></tr>" + "".join(rows) + "</table>")
    return [chart, table]


def _grid(lo: float, hi: float) -> np.ndarray:
    return np.linspace(lo, hi, TIMELINE_SAMPLES) if hi > lo else np.asarray([lo])


def _occupancy(starts: np.ndarray, ends: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """How many [start, end) spans hold each instant of ``grid`` (NaN start: never; NaN end: open)."""
    keep = np.isfinite(starts)
    starts, ends = starts[keep], np.where(np.isfinite(ends[keep]), ends[keep], np.inf)
    started = np.searchsorted(np.sort(starts), grid, side="right")
    ended = np.searchsorted(np.sort(ends), grid, side="right")
    return (started - ended).astype(float)


def _per_rank_at(passes: pa.Table, grid: np.ndarray, values: np.ndarray) -> dict[str, np.ndarray]:
    """Per pool, the sum over its ranks of ``values`` of the pass running at each instant (0 between passes)."""
    pools = np.asarray(passes.column("pool").cast(pa.string()).to_pylist(), dtype=object)
    worker = passes.column("worker").to_numpy()
    rank = passes.column("rank").to_numpy()
    start, end = _column(passes, "start_ms"), _column(passes, "end_ms")
    out: dict[str, np.ndarray] = {}
    keys = np.unique(np.stack([worker, rank]), axis=1).T if passes.num_rows else []
    for w, r in keys:
        rows = np.flatnonzero((worker == w) & (rank == r))
        rows = rows[np.argsort(start[rows], kind="stable")]
        at = np.searchsorted(start[rows], grid, side="right") - 1
        ok = at >= 0
        running = np.zeros(grid.size)
        index = rows[np.clip(at, 0, None)]
        hold = ok & (grid < end[index])
        running[hold] = values[index][hold]
        pool = str(pools[rows[0]])
        out[pool] = out.get(pool, 0.0) + running
    return out


def _held_blocks(passes: pa.Table, grid: np.ndarray) -> dict[str, np.ndarray]:
    """Per pool, KV blocks in use summed over its ranks, each rank's last pass start value held until its next."""
    pools = np.asarray(passes.column("pool").cast(pa.string()).to_pylist(), dtype=object)
    worker = passes.column("worker").to_numpy()
    rank = passes.column("rank").to_numpy()
    start = _column(passes, "start_ms")
    blocks = _column(passes, "blocks_in_use")
    out: dict[str, np.ndarray] = {}
    keys = np.unique(np.stack([worker, rank]), axis=1).T if passes.num_rows else []
    for w, r in keys:
        rows = np.flatnonzero((worker == w) & (rank == r))
        rows = rows[np.argsort(start[rows], kind="stable")]
        at = np.searchsorted(start[rows], grid, side="right") - 1
        held = np.where(at >= 0, blocks[rows[np.clip(at, 0, None)]], 0.0)
        pool = str(pools[rows[0]])
        out[pool] = out.get(pool, 0.0) + held
    return out


def _replicas(scaling: pa.Table, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Replicas ready and up (started, not yet off) at each grid instant (ms) from the scaling table."""
    instant = _column(scaling, "instant_ms")
    event = np.asarray(scaling.column("event").cast(pa.string()).to_pylist(), dtype=object)
    ready = np.cumsum(np.where(event == "ready", 1, 0) - np.where((event == "drain") | (event == "fail"), 1, 0))
    up = np.cumsum(np.where(event == "start", 1, 0) - np.where(event == "off", 1, 0))
    at = np.searchsorted(instant, grid, side="right") - 1  # the level after the latest event by then
    valid = at >= 0
    return (np.where(valid, ready[np.clip(at, 0, None)], 0).astype(float),
            np.where(valid, up[np.clip(at, 0, None)], 0).astype(float))


def _timeline(requests: pa.Table, passes: pa.Table | None, kv_blocks: Mapping[str, int] | None,
              scaling: pa.Table | None = None) -> list[str]:
    completed, rejected = _status_is(requests, "completed"), _status_is(requests, "rejected")
    send = _column(requests, "send_ms")
    arrival = _column(requests, "engine_arrival_ms")
    admit = _column(requests, "first_admit_ms")
    last = _column(requests, "last_token_ms")
    finite = np.concatenate([v[np.isfinite(v)] for v in (send, last)])
    if finite.size == 0:
        return ["<p class=\"note\">No request was sent: no timeline.</p>"]
    lo, hi = float(finite.min()), float(finite.max())
    grid = _grid(lo, hi)
    seconds = (grid - lo) / 1000.0
    not_rejected = ~rejected
    waiting = _occupancy(np.where(not_rejected, arrival, np.nan), admit, grid)
    end = np.where(completed, last, np.nan)  # incomplete: open to the end
    running = _occupancy(np.where(not_rejected, admit, np.nan), end, grid)
    charts = [svg.lines("requests_timeline", "Requests at the engine", [
        {"label": "waiting (not admitted)", "x": seconds, "y": waiting},
        {"label": "admitted, running", "x": seconds, "y": running},
    ], "time from the first send (s)", "requests")]
    notes = [f"Sampled at {grid.size} instants. Requests at the engine from requests.parquet: waiting from engine "
             "arrival to first admission, then running until the last token is received (a preempted request "
             "still counts as running)."]
    if scaling is not None and scaling.num_rows:
        ready, up = _replicas(scaling, grid)
        charts.append(svg.lines("replicas_timeline", "Replicas", [
            {"label": "ready (take requests)", "x": seconds, "y": ready},
            {"label": "up (starting, ready or draining)", "x": seconds, "y": up, "dash": "4 3"},
        ], "time from the first send (s)", "replicas", step=True))
        notes.append("Replicas from scaling.parquet: up from each start to its off, ready from ready to drain "
                     "or failure; GPU-seconds count the replicas up.")
    if passes is None:
        notes.append("Batch size and KV use come from passes.parquet, which this run did not record: "
                      "rerun with output.passes=true for them.")
    elif passes.num_rows == 0:
        notes.append("passes.parquet holds no pass: no batch size or KV use to draw.")
    else:
        sizes = _column(passes, "num_prefill") + _column(passes, "num_decode")
        batch = _per_rank_at(passes, grid, sizes)
        charts.append(svg.lines("batch_timeline", "Running batch size (sum over ranks)", [
            {"label": pool, "x": seconds, "y": values} for pool, values in batch.items()
        ], "time from the first send (s)", "sequences in the pass"))
        held = _held_blocks(passes, grid)
        series, unit = [], "KV blocks in use"
        if kv_blocks and all(kv_blocks.get(pool) for pool in held):
            unit = "KV use (% of the pool's blocks)"
            ranks = _ranks_per_pool(passes)
            series = [{"label": pool, "x": seconds, "y": 100.0 * values / (kv_blocks[pool] * ranks[pool])}
                      for pool, values in held.items()]
        else:
            series = [{"label": pool, "x": seconds, "y": values} for pool, values in held.items()]
        charts.append(svg.lines("kv_timeline", "KV cache use (sum over ranks, at each pass start)", series,
                                "time from the first send (s)", unit))
        notes.append("Batch size and KV use from passes.parquet: each rank's pass running at the instant "
                     "(0 between passes), KV blocks as of its latest pass start.")
    return ["<div class=\"grid2\">" + "".join(charts) + "</div>", *(f"<p class=\"note\">{escape(n)}</p>" for n in notes)]


def _ranks_per_pool(passes: pa.Table) -> dict[str, int]:
    pools = np.asarray(passes.column("pool").cast(pa.string()).to_pylist(), dtype=object)
    pairs = set(zip(pools, passes.column("worker").to_numpy().tolist(), passes.column("rank").to_numpy().tolist()))
    out: dict[str, int] = {}
    for pool, _, _ in pairs:
        out[str(pool)] = out.get(str(pool), 0) + 1
    return out


def kv_blocks_from(sim) -> dict[str, int]:
    """KV blocks per rank of each active pool of a SimConfig (``num_blocks`` as derived)."""
    names = ("aggregated",) if sim.engine.mode == "aggregated" else ("prefill", "decode")
    blocks = [pool.num_blocks for pool in sim.engine.pools]
    return {name: int(b) for name, b in zip(names, blocks) if isinstance(b, (int, np.integer))}


def kv_blocks_of(config: Mapping[str, Any]) -> dict[str, int] | None:
    """:func:`kv_blocks_from` the resolved ``config`` (``summary.json``'s), or None when it does not load."""
    from simcore.config import load_config

    try:
        return kv_blocks_from(load_config(config))
    except (ValueError, TypeError, KeyError):  # a config of another version: the plot shows blocks
        return None


def run_report(document: Mapping[str, Any], requests: pa.Table, passes: pa.Table | None = None,
               tokens: pa.Table | None = None, kv_blocks: Mapping[str, int] | None = None,
               where: str | None = None, scaling: pa.Table | None = None) -> str:
    """The HTML page of one run.

    Parameters
    ----------
    document : mapping
        ``summary.json``'s document (the summary metrics and ``config``).
    requests : pyarrow.Table
        The request table.
    passes, tokens : pyarrow.Table, optional
        The pass and token tables when recorded.
    kv_blocks : mapping, optional
        KV blocks per rank by pool name (:func:`kv_blocks_of`): KV use is then
        drawn as a share of capacity.
    where : str, optional
        The run directory, named in the heading.
    scaling : pyarrow.Table, optional
        Autoscaling: the scaling table (replicas drawn on the timeline).

    Returns
    -------
    str
        The page.
    """
    config = document.get("config") or {}
    described_rows = described(config) + cache_lines(document)
    verdict = saturation_line(document)
    warnings = warnings_for(document)
    sub = " · ".join(escape(str(x)) for x in (
        f"replaysim {document.get('version', '')}".strip(), f"seed {document.get('seed')}",
        where) if x)
    body = [f"<h1>replaysim run</h1><p class=\"sub\">{sub}</p>",
            "<h2 id=\"simulated\">What was simulated</h2>", _kv_table(described_rows)]
    if verdict:
        body.append(f"<p class=\"warn\">{escape(verdict)}</p>")
    body += [f"<p class=\"warn\">warning: {escape(w)}</p>" for w in warnings]
    body += ["<h2 id=\"summary\">Summary</h2>", _summary_tables(document),
             "<h2 id=\"distributions\">Latency distributions</h2>", *_distributions(document, requests, tokens),
             "<h2 id=\"stages\">TTFT stages</h2>", *_stages(document, requests),
             "<h2 id=\"timeline\">Timeline</h2>", *_timeline(requests, passes, kv_blocks, scaling),
             "<h2 id=\"config\">Configuration</h2><details><summary>resolved configuration (summary.json)</summary>"
             f"<pre>{escape(json.dumps(config, indent=1, sort_keys=False, default=str))}</pre></details>"]
    return _page("replaysim run" + (f": {where}" if where else ""), body)


# ---------------------------------------------------------------- a sweep

#: Load axes, in order of preference, along a knee curve (as replaysim-analyze takes them).
LOAD_AXES = ("load.concurrency", "load.request_rate", "load.speedup")


def gpus_of(config: Mapping[str, Any]) -> int | None:
    """GPUs of a resolved config: ranks of its active pools × ``timing.tp`` (as ``replaysim-capacity`` counts)."""
    engine = config.get("engine") or {}
    names = ("prefill", "decode") if engine.get("mode") == "disaggregated" else ("aggregated",)
    try:
        ranks = sum(int(engine[n]["replicas"]) * int(engine[n]["attention_dp"]) for n in names)
        return ranks * int((config.get("timing") or {}).get("tp") or 1)
    except (KeyError, TypeError, ValueError):
        return None


def _fmt_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_fmt_value(v) for v in value) + "]"
    return str(value)


def _tail(rows: Sequence[Mapping[str, Any]], metric: str) -> str | None:
    names = {k for row in rows for k in row if k.startswith("p") and k.endswith(f"_{metric}_ms")}
    if f"p99_{metric}_ms" in names:
        return f"p99_{metric}_ms"
    numeric = []
    for name in names:
        try:
            numeric.append((float(name[1:].split("_")[0]), name))
        except ValueError:
            continue
    return max(numeric)[1] if numeric else None


def pareto_front(x: Sequence[float], y: Sequence[float]) -> list[int]:
    """Indices of the points no other point beats in both x and y (both maximised), by increasing x."""
    order = sorted(range(len(x)), key=lambda i: (-x[i], -y[i]))
    front, best = [], -math.inf
    for i in order:
        if y[i] > best:
            front.append(i)
            best = y[i]
    return sorted(front, key=lambda i: x[i])


def sweep_report(rows: Sequence[Mapping[str, Any]], keys: Sequence[str], *, along: str | None = None,
                 gpus: Mapping[str, int | None] | None = None,
                 ttft: Mapping[str, np.ndarray] | None = None, where: str | None = None) -> str:
    """The HTML page of a sweep.

    Parameters
    ----------
    rows : sequence of mapping
        One row per point (``summary.parquet`` or ``replaysim-analyze``'s
        table): ``run_id``, ``status``, the swept keys and the summary metrics.
    keys : sequence of str
        The swept keys.
    along : str, optional
        The key the knee curves run along (default: the first varying load axis).
    gpus : mapping, optional
        GPUs per run id (:func:`gpus_of`), for the Pareto plot's tokens/s per GPU
        (without: output tokens/s of the deployment).
    ttft : mapping, optional
        Per run id, the completed requests' TTFT (ms), for CDFs.
    where : str, optional
        The sweep directory, named in the heading.
    """
    ok = [r for r in rows if r.get("status") != "failed"]
    varying = [k for k in keys if len({repr(r.get(k)) for r in ok}) > 1]
    if along is None:
        along = next((k for k in LOAD_AXES if k in varying), varying[0] if varying else None)
    family_keys = [k for k in varying if k != along]

    def family(row: Mapping[str, Any]) -> str:
        return ", ".join(f"{k.rsplit('.', 1)[-1]}={_fmt_value(row.get(k))}" for k in family_keys) or "all points"

    def point(row: Mapping[str, Any]) -> str:
        """A point's label: its family, then its value along the curves."""
        value = f"{along.rsplit('.', 1)[-1]}={_fmt_value(row.get(along))}" if along else str(row.get("run_id"))
        return value if not family_keys else f"{family(row)} {value}"

    def short(row: Mapping[str, Any]) -> str:
        """A point's values alone (family keys, then the key along the curves): ``200, 16``."""
        keys = [*family_keys, *([along] if along else [])]
        return ", ".join(_fmt_value(row.get(k)) for k in keys) if keys else str(row.get("run_id"))

    short_title = ", ".join(k.rsplit(".", 1)[-1] for k in [*family_keys, *([along] if along else [])]) or None

    families: dict[str, list[Mapping[str, Any]]] = {}
    for row in ok:
        families.setdefault(family(row), []).append(row)
    for members in families.values():
        if along is not None:
            try:
                members.sort(key=lambda r: r.get(along))
            except TypeError:
                pass
    charts = []
    for metric in ("ttft", "tpot"):
        tail = _tail(ok, metric)
        if tail is None:
            continue
        series = [{"label": name, "x": [r.get("output_throughput") for r in members],
                   "y": [r.get(tail) for r in members], "marker": True,
                   "labels": [_fmt_value(r.get(along)) if along else "" for r in members],
                   "dash": svg.DASHES[i % len(svg.DASHES)]}
                  for i, (name, members) in enumerate(families.items())]
        values = [v for s in series for v in s["y"] if v is not None and v > 0]
        log_y = bool(values) and max(values) / min(values) > 50
        labelled = f"; points labelled by {along}" if along else ""
        charts.append(svg.lines(f"knee_{metric}", f"Throughput vs {tail.split('_')[0]} {metric.upper()}{labelled}",
                                series, "output throughput (tok/s)", f"{tail.split('_')[0]} {metric.upper()} (ms)",
                                log_y=log_y, annotate=along is not None,
                                legend_title=", ".join(k.rsplit(".", 1)[-1] for k in family_keys) or None))
    # Pareto: tokens/s per GPU against tokens/s per user (1000 / mean TPOT)
    per_user, per_gpu, names = [], [], []
    for row in ok:
        tpot, throughput = row.get("mean_tpot_ms"), row.get("output_throughput")
        count = (gpus or {}).get(row.get("run_id"))
        if tpot is None or throughput is None or not tpot > 0:
            continue
        per_user.append(1000.0 / tpot)
        per_gpu.append(throughput / count if count else throughput)
        names.append(point(row))
    if per_user:
        front = pareto_front(per_user, per_gpu)
        unit = "output tok/s per GPU" if gpus else "output tok/s"
        charts.append(svg.lines("pareto", "Pareto front: throughput per GPU vs per user", [
            {"label": "points", "x": per_user, "y": per_gpu, "marker": True, "marker_only": True},
            {"label": "Pareto front", "x": [per_user[i] for i in front], "y": [per_gpu[i] for i in front],
             "marker": True, "color": "#d62728"},
        ], "output tok/s per user (1000 / mean TPOT)", unit))
    # TTFT stage shares per point
    stage_rows = [(short(r), [r.get(f"mean_{s}") for s in TTFT_STAGES]) for r in ok]
    totals = [sum(v or 0.0 for v in values) for _, values in stage_rows]
    charts.append(svg.stacked_bars("ttft_stages", "Mean TTFT by stage: shares per point (total ms above)",
                                   stage_rows, [s.removesuffix("_ms") for s in TTFT_STAGES], "share of mean TTFT (%)",
                                   percent=True, totals=[f"{t:.3g}" for t in totals],
                                   xlabel=f"points: {short_title}" if short_title else ""))
    if ttft:
        charts.append(svg.cdf("ttft_cdf", "Per-request TTFT CDF per point (completed requests)",
                              [(short(r), ttft.get(r["run_id"], np.empty(0))) for r in ok], "TTFT (ms)",
                              legend_title=short_title))
    fixed = [k for k in keys if k not in varying]
    fixed_text = ", ".join(f"{k}={_fmt_value(ok[0].get(k))}" for k in fixed) if ok and fixed else ""
    head = ["run_id", "status", *varying, "request_throughput", "output_throughput", "p99_ttft_ms", "p99_tpot_ms",
            "mean_e2el_ms", "saturated"]
    table = ["<table data-table=\"points\"><tr>" + "".join(f"<th class=\"l\">{escape(h)}</th>" for h in head)
             + "</tr>"]
    for row in rows:
        table.append("<tr>" + "".join(f"<td class=\"l\">{_fmt(row.get(h)) if not isinstance(row.get(h), (list, tuple)) else escape(_fmt_value(row.get(h)))}</td>"
                                      for h in head) + "</tr>")
    table.append("</table>")
    failed = [r for r in rows if r.get("status") == "failed"]
    sub = " · ".join(x for x in (f"{len(rows)} points ({len(failed)} failed)", escape(where or "")) if x)
    body = [f"<h1>replaysim sweep</h1><p class=\"sub\">{sub}</p>"]
    if fixed_text:
        body.append(f"<p class=\"note\">fixed: {escape(fixed_text)}</p>")
    body += ["<h2 id=\"plots\">Knee, Pareto and TTFT stages</h2>", "<div class=\"grid2\">" + "".join(charts) + "</div>",
             "<h2 id=\"points\">Points</h2>", "<div class=\"scroll\">" + "".join(table) + "</div>"]
    for row in failed:
        body.append(f"<p class=\"warn\">failed point {escape(str(row.get('run_id')))}: "
                    f"{escape(str(row.get('error_type')))}: {escape(str(row.get('error')))}</p>")
    return _page("replaysim sweep" + (f": {where}" if where else ""), body)
