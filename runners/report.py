"""A short, plain-text summary table of one run for the terminal, headed by what was simulated.

:func:`described` reads a run's resolved configuration (``summary.json``'s
``config``) and says in a few labelled lines what was simulated: the policy,
the timing model (with its GPU and model when named), the deployment, the
workload, the load and the detokenizer.  The terminal table and the HTML
report (:mod:`runners.html_report`) both print them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from simcore.metrics.registry import DISTRIBUTIONS, PER_TURN, TURN_GROUPS, per_turn, percentile_names, summary_key
from simcore.schema import TTFT_STAGES

LABEL = 28
CELL = 10
#: Terminal tables are fitted to this many columns (the full data is in the files).
TABLE_WIDTH = 100


def _fmt(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


#: A closed loop whose concurrency is more than this many times its requests
#: (or sessions) gets a warning: every one of them is sent at the start.
CONCURRENCY_WARNING_FACTOR = 10


def _num(value: Any) -> str:
    """A config number as written: ``30``, ``2.85``, ``61.6`` (``-`` for null)."""
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return format(value, "g") if isinstance(value, float) else str(value)


def _plural(count: Any, word: str) -> str:
    return f"{_num(count)} {word}{'' if count == 1 else 's'}"


def _timing(timing: Mapping[str, Any]) -> str:
    kind = timing.get("type")
    named = [f"{label} {timing[k]}" for k, label in (("gpu", "GPU"), ("model", "model")) if timing.get(k)]
    if kind == "fixed":
        text = f"fixed (prefill pass {_num(timing.get('prefill_ms'))} ms, decode pass {_num(timing.get('decode_ms'))} ms)"
    elif kind == "linear":
        text = (f"linear ({_num(timing.get('base_ms'))} ms + {_num(timing.get('per_prefill_token_us'))} µs/prefill token"
                f" + {_num(timing.get('per_decode_seq_us'))} µs/decode seq + {_num(timing.get('per_kv_token_ns'))} ns/KV token)")
    elif kind == "aic":
        backend = timing.get("backend")
        version = f" {timing['backend_version']}" if timing.get("backend_version") else ""
        text = f"aic (aiconfigurator{f', {backend}{version}' if backend else ''})"
    elif kind == "table":
        text = f"table ({Path(str(timing.get('profile'))).name})"
    elif kind == "roofline":
        text = "roofline (the model's FLOPs and bytes against the GPU's peaks)"
    else:
        text = str(kind)
    if timing.get("tp") not in (None, 1):
        named.append(f"TP {timing['tp']}")
    return text + (f"; {', '.join(named)}" if named else "")


def _pool(name: str, pool: Mapping[str, Any]) -> str:
    text = f"{name} {_plural(pool.get('replicas'), 'replica')}"
    if pool.get("attention_dp") not in (None, 1):
        text += f" × attention-DP {pool['attention_dp']}"
    features = [label for key, label in (("prefix_caching", "prefix caching"), ("async_scheduling", "async scheduling"))
                if pool.get(key)]
    if (pool.get("kv_offload") or {}).get("num_blocks"):
        features.append(f"CPU KV tier {_num(pool['kv_offload']['num_blocks'])} blocks")
    return text + (f" ({', '.join(features)})" if features else "")


def _deployment(engine: Mapping[str, Any]) -> str:
    if engine.get("mode") == "disaggregated":
        text = f"P/D disaggregated: {_pool('prefill', engine['prefill'])}, {_pool('decode', engine['decode'])}"
        kv = engine.get("kv_transfer") or {}
        if kv.get("bandwidth_gb_per_second"):
            text += f"; KV transfer {_num(kv['bandwidth_gb_per_second'])} GB/s"
        return text
    text = f"aggregated: {_pool('', engine['aggregated']).lstrip()}"
    router = (engine.get("router") or {}).get("policy")
    if engine["aggregated"].get("replicas", 1) > 1 and router:
        text += f"; router {router}"
    return text


def _workload(workload: Mapping[str, Any]) -> str:
    source = workload.get("source")
    if source == "synthetic":
        def length(which: str) -> str:
            dist = workload.get(f"{which}_dist")
            return f"{_num(workload.get(f'{which}_tokens'))}" + ("" if dist == "fixed" else f" ({dist})")
        text = f"synthetic, {_plural(workload.get('num_requests'), 'request')} of {length('input')} in / {length('output')} out tokens"
        if workload.get("prefix_tokens"):
            text += f", {_num(workload['prefix_tokens'])}-token shared prefix"
        return text
    if source == "shared_prefix":
        shared = workload.get("shared_prefix") or {}
        return (f"shared_prefix, {_num(shared.get('num_groups'))} system prompts × "
                f"{_num(shared.get('num_prompts_per_group'))} questions")
    if source == "sessions":
        sessions = workload.get("sessions") or {}
        return (f"sessions, {_plural(sessions.get('num_sessions'), 'session')} of {_num(sessions.get('turns'))} turns"
                f" ({_num(sessions.get('new_input_tokens'))} new in / {_num(sessions.get('output_tokens'))} out tokens)")
    path = Path(str(workload.get("path"))).name
    limit = f", first {_num(workload['max_requests'])} requests" if workload.get("max_requests") else ""
    return f"{source} {'table' if source == 'table' else 'trace'} {path}{limit}"


def _load(load: Mapping[str, Any]) -> str:
    kind = load.get("type")
    if kind == "closed_loop":
        think = f", think time {_num(load['think_time_ms'])} ms" if load.get("think_time_ms") else ""
        return f"closed loop, concurrency {_num(load.get('concurrency'))}{think}"
    if kind == "trace":
        return f"the workload's send times, speedup {_num(load.get('speedup'))}"
    text = f"{kind}, {_num(load.get('request_rate'))} req/s"
    if kind == "gamma" or load.get("burstiness") not in (None, 1.0):
        text += f", burstiness {_num(load.get('burstiness'))}"
    return text


def _client_stage(stage: Mapping[str, Any], per: str) -> str:
    costs = [(stage.get("base_ms"), "ms/job")] + [(stage.get(k), f"µs/{label}") for k, label in per]
    if not any(value for value, _ in costs):
        return "off (0 ms per job)"
    shown = " + ".join(f"{_num(v)} {unit}" for v, unit in costs if v)
    return f"{_plural(stage.get('workers'), 'server')}, {shown}"


def described(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What a run simulated, as (label, text) lines, from its resolved configuration.

    Parameters
    ----------
    config : mapping
        The resolved configuration (``summary.json``'s ``config``,
        ``SimConfig.resolved``).

    Returns
    -------
    list of (str, str)
        ``Policy``, ``Timing``, ``Deployment``, ``Workload``, ``Load``,
        ``Tokenizer`` (only when it costs time) and ``Detokenizer``; keys a
        configuration lacks print as ``-``.
    """
    engine = config.get("engine") or {}
    lines = [
        ("Policy", str(engine.get("policy", "-"))),
        ("Timing", _timing(config.get("timing") or {})),
        ("Deployment", _deployment(engine) if engine else "-"),
        ("Workload", _workload(config.get("workload") or {})),
        ("Load", _load(config.get("load") or {})),
    ]
    tokenizer = _client_stage(config.get("tokenization") or {}, (("per_input_us", "input token"),))
    if not tokenizer.startswith("off"):
        lines.append(("Tokenizer", tokenizer))
    lines.append(("Detokenizer", _client_stage(
        config.get("detokenization") or {},
        (("per_output_us", "output token"), ("first_output_us", "first output"), ("final_output_us", "final output")))))
    if config.get("max_time_ms") is not None:
        lines.append(("Time cap", f"{_num(config['max_time_ms'])} ms"))
    return lines


def cache_lines(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The prefix cache and CPU-tier figures of a run, when those features were on (else none).

    The hit rate is shown when any prompt token was reused or prefix caching
    was on (``summary.json``'s ``config``), the tier split and offload traffic
    when the run had a CPU tier (their summary keys are not null).
    """
    config = summary.get("config") or {}
    pools = [p for p in ((config.get("engine") or {}).get(n) or {} for n in ("aggregated", "prefill", "decode"))]
    caching = any(p.get("prefix_caching") for p in pools) or bool(summary.get("prefix_cache_hit_rate"))
    lines = []
    if caching and summary.get("prefix_cache_hit_rate") is not None:
        text = f"{100 * summary['prefix_cache_hit_rate']:.1f}% of prompt tokens reused"
        if summary.get("gpu_prefix_cache_hit_rate") is not None:
            text += (f" (GPU {100 * summary['gpu_prefix_cache_hit_rate']:.1f}%, "
                     f"CPU {100 * (summary.get('cpu_prefix_cache_hit_rate') or 0.0):.1f}%)")
        lines.append(("Prefix cache", text))
    if summary.get("kv_offload_loaded_gb") is not None:
        lines.append(("KV offload", f"{summary['kv_offload_loaded_gb']:.3f} GB loaded CPU -> GPU, "
                                    f"{(summary.get('kv_offload_stored_gb') or 0.0):.3f} GB stored GPU -> CPU"))
    return lines


def warnings_for(summary: Mapping[str, Any]) -> list[str]:
    """Warnings about a finished run's configuration (one line each, without the program's prefix).

    An operator of the timing model priced beyond its data (the summary's
    ``timing_warnings``: aic decode attention beyond the database's KV heads).
    A closed loop whose concurrency is more than
    :data:`CONCURRENCY_WARNING_FACTOR` times its requests (sessions, with
    sessions) sends every one of them at the start: the run is the same as
    with the concurrency equal to that count.
    """
    notes = list(summary.get("timing_warnings") or [])
    config = summary.get("config") or {}
    load = config.get("load") or {}
    if load.get("type") != "closed_loop":
        return notes
    units, what = summary.get("num_sessions"), "sessions"
    if units is None:
        units, what = summary.get("num_requests"), "requests"
    concurrency = load.get("concurrency")
    if not units or concurrency is None or concurrency <= CONCURRENCY_WARNING_FACTOR * units:
        return notes
    return notes + [f"load.concurrency={_num(concurrency)} is more than {CONCURRENCY_WARNING_FACTOR} times the workload's "
            f"{units} {what}: all of them are sent at the start, as with load.concurrency={units}"]


def _row(label: str, *values: str) -> str:
    return f"{label:<{LABEL}}" + "".join(f"{v:>{CELL}}" for v in values)


def _rejected(get) -> str:
    count = _fmt(get("rejected"), "d")
    if not get("rejected"):
        return _row("Requests rejected", count)
    why = f"(context length {get('rejected_context_length')}, KV capacity {get('rejected_kv_capacity')})"
    return f"{_row('Requests rejected', count)}  {why}"


def saturation_line(summary: Mapping[str, Any]) -> str | None:
    """The one-line verdict when the run is saturated (``summary["saturated"]``), else None."""
    if not summary.get("saturated"):
        return None
    return (
        f"Saturated: over the second half of the sends requests arrived at "
        f"{summary['arrival_rate_second_half']:.2f} req/s and left at "
        f"{summary['departure_rate_second_half']:.2f} req/s; queues grow through the run"
    )


def _wrapped(label: str, text: str, width: int) -> str:
    """``label`` then ``text``, wrapped at word boundaries to ``width`` columns under the text's start."""
    import textwrap

    indent = " " * 13
    return "\n".join(textwrap.wrap(text, width=max(width, 40), initial_indent=f"{label:<13}", subsequent_indent=indent,
                                   break_on_hyphens=False)) or label


def format_summary(summary: Mapping[str, Any], out_dir: str | Path) -> str:
    """Render the headline metrics of a run as aligned text.

    Parameters
    ----------
    summary : mapping
        The run summary (``simcore.Result.summary``), or ``summary.json``'s
        document: with its ``config`` the table is headed by what was
        simulated (:func:`described`, :func:`cache_lines`).  The latency columns are
        the mean and every configured percentile (``p<P>_*`` keys); missing
        keys and None values print as ``-``.  Request goodput is shown when an
        SLO is set (not None), rejection reasons when requests were rejected,
        and a saturation verdict when the run is saturated.
    out_dir : str or Path
        Where the result files were written.

    Returns
    -------
    str
        The table, without a trailing newline.
    """
    get = summary.get
    percentiles = percentile_names(summary)
    most = (TABLE_WIDTH - LABEL) // CELL - 1  # percentile columns that fit beside the label and the mean
    left_out = []
    if len(percentiles) > most:  # the lowest and the highest ones kept
        kept = [percentiles[0], *percentiles[len(percentiles) - most + 1:]]
        left_out = [p for p in percentiles if p not in kept]
        percentiles = kept
    width = LABEL + CELL * (1 + len(percentiles))
    lines = [" replaysim result ".center(width, "=")]
    config = get("config")
    if config:
        lines += [_wrapped(f"{label}:", text, width) for label, text in described(config)]
        lines += [_wrapped(f"{label}:", text, width) for label, text in cache_lines(summary)]
        lines.append("-" * width)
    lines += [
        _row("Requests completed", _fmt(get("completed"), "d")),
        _rejected(get),
        _row("Requests incomplete", _fmt(get("incomplete"), "d")),
        _row("Duration (s)", _fmt(get("duration_s"), ".3f")),
        _row("Request throughput (req/s)", _fmt(get("request_throughput"))),
    ]
    if get("request_goodput") is not None:
        lines.append(_row("Request goodput (req/s)", _fmt(get("request_goodput"))))
    lines += [
        _row("Output throughput (tok/s)", _fmt(get("output_throughput"))),
        _row("Latency (ms)", "mean", *percentiles),
    ]
    # With sessions (num_sessions set): the per-turn-group distributions after the others.
    split = [per_turn(m, g) for m in PER_TURN for g in TURN_GROUPS] if get("num_sessions") is not None else []
    for metric in (*DISTRIBUTIONS, *split):
        points = (_fmt(get(summary_key(p, metric))) for p in percentiles)
        lines.append(_row(f"  {metric.label}", _fmt(get(summary_key("mean", metric))), *points))
    if left_out:
        lines.append(f"  ({', '.join(left_out)} left out to fit {TABLE_WIDTH} columns: see summary.json)")
    lines.append(_row("TTFT stages, mean (ms)"))
    for stage in TTFT_STAGES:
        lines.append(_row(f"  {stage.removesuffix('_ms')}", _fmt(get(f"mean_{stage}"), ".3f")))
    if get("spec_decode_num_drafts") is not None:  # speculative decoding (docs/speculative.md)
        lines += [
            _row("Speculative decoding"),
            _row("  acceptance rate", _fmt(get("spec_decode_acceptance_rate"), ".3f")),
            _row("  mean acceptance length", _fmt(get("spec_decode_acceptance_length"), ".3f")),
            _row("  drafted / accepted tokens", f"{get('spec_decode_draft_tokens')}/{get('spec_decode_accepted_tokens')}"),
        ]
        positions = [key for key in summary if key.startswith("spec_decode_acceptance_rate_pos_")]
        if positions:
            lines.append(_row("  per-position acceptance", " ".join(_fmt(get(key), ".2f") for key in positions)))
    verdict = saturation_line(summary)
    lines += ["=" * width, *([verdict] if verdict else []), f"Output directory: {out_dir}"]
    return "\n".join(line.rstrip() for line in lines)



def fit_table(columns: list[tuple[str, list[str], int]], width: int = TABLE_WIDTH, right: bool = True) -> list[str]:
    """A plain-text table of at most ``width`` columns, the least important columns left out first.

    Parameters
    ----------
    columns : list of (header, cells, importance)
        In display order; a lower importance is left out first (equal ones:
        the rightmost first).  Cells are text; a cell wider than
        ``width // 3`` is cut with ``…``.
    width : int
        Most characters a line may have.
    right : bool
        Right-align the cells (numbers), except the first column's.

    Returns
    -------
    list of str
        The header line, the rows, and, when columns were left out, a last
        line naming them.
    """
    cap = max(8, width // 3)

    def cut(text: str) -> str:
        return text if len(text) <= cap else text[: cap - 1] + "…"

    prepared = [(cut(h), [cut(c) for c in cells], imp) for h, cells, imp in columns]
    widths = [max([len(h), *(len(c) for c in cells)]) for h, cells, _ in prepared]
    kept = list(range(len(prepared)))
    dropped: list[str] = []

    def line_width() -> int:
        return sum(widths[i] for i in kept) + 2 * (len(kept) - 1)

    while len(kept) > 1 and line_width() > width:
        victim = min(kept, key=lambda i: (prepared[i][2], -i))
        kept.remove(victim)
        dropped.append(columns[victim][0])
    rows = len(prepared[0][1]) if prepared else 0

    def render(texts: list[str]) -> str:
        parts = []
        for n, (i, text) in enumerate(zip(kept, texts)):
            parts.append(text.ljust(widths[i]) if n == 0 or not right else text.rjust(widths[i]))
        return "  ".join(parts).rstrip()

    lines = [render([prepared[i][0] for i in kept])]
    lines += [render([prepared[i][1][r] for i in kept]) for r in range(rows)]
    if dropped:
        lines.append(f"({len(dropped)} column{'s' * (len(dropped) != 1)} left out to fit {width} characters: "
                     f"{', '.join(reversed(dropped))})")
    return lines
