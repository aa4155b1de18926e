"""Per-request table, token and pass tables, and the run summary (SPEC §10).

Every distribution is declared once in :mod:`simcore.metrics.registry` and ``docs/metrics.md``.
Statistics follow ``vllm bench serve``: ``numpy.percentile`` with linear
interpolation, population std (ddof = 0), and null (None) for an empty
distribution.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from simcore import enums
from simcore.arrow_np import to_arrow
from simcore.engine.settings import EngineConfig
from simcore.metrics.settings import GoodputConfig, MetricsConfig
from simcore.engine.api import EngineRun
from simcore.enums import POOL_NAMES
from simcore.metrics.registry import (
    CACHE_TIERS, SPEC_DECODE, SPEC_POSITION_KEY, DISTRIBUTIONS, ITL, PER_TURN, STATISTICS, TURN_GROUPS, Distribution, per_turn, percentile_key, slo_metrics,
    summary_key,
)
from simcore.metrics.receipts import Receipts, completed_mask, exact_itl_percentiles, itl_moments, sketch_percentiles
from simcore.schema import PASSES_SCHEMA, REQUESTS_SCHEMA, TOKENS_SCHEMA, TTFT_STAGES, conform, string_array
from simcore.units import NOT_YET

COMPLETED, REJECTED, INCOMPLETE = 0, 1, 2
STATUS_NAMES = ("completed", "rejected", "incomplete")

#: ``saturated`` when requests leave at less than this share of their arrival rate.
SATURATION_DEPARTURE_SHARE = 0.9
#: Sends the second half of the sending window needs for a saturation verdict.
SATURATION_MIN_SENDS = 50


def _span_ms(end_ns: np.ndarray, start_ns: np.ndarray) -> np.ndarray:
    """``(end - start) / 1e6`` where both instants happened, else NaN."""
    both = (end_ns != NOT_YET) & (start_ns != NOT_YET)
    return np.where(both, (end_ns - start_ns) / 1e6, np.nan)


def _instant_ms(ns: np.ndarray) -> np.ndarray:
    return np.where(ns != NOT_YET, ns / 1e6, np.nan)


class RequestColumns:
    """Per-request instants and metrics derived from an engine run (int64 ns)."""

    def __init__(self, run: EngineRun):
        receipts = run.receipts
        if receipts is None:  # detailed mode: reduce the per-token receipts
            receipts = Receipts.from_tokens(run.token_offset, run.token_recv_ns)
        self.receipts = receipts
        self.num_received = receipts.num_received
        self.first_recv_ns = receipts.first_recv_ns
        self.last_recv_ns = receipts.last_recv_ns

        self.completed = completed_mask(run.finish_ns, run.reject_ns, run.generated, self.num_received)
        self.status = np.full(run.generated.shape[0], INCOMPLETE, dtype=np.int8)
        self.status[self.completed] = COMPLETED
        self.status[run.reject_ns != NOT_YET] = REJECTED
        self.run = run

        self.ttft_ms = _span_ms(self.first_recv_ns, run.send_ns)
        end_ns = np.where(self.completed, self.last_recv_ns, NOT_YET)
        self.e2el_ms = _span_ms(end_ns, run.send_ns)
        several = self.completed & (run.generated >= 2)
        self.tpot_ms = np.where(
            several,
            _span_ms(self.last_recv_ns, self.first_recv_ns) / np.maximum(run.generated - 1, 1),
            np.nan,
        )
        # TTFT stages; aggregated, the prompt's pass emits the first token.
        if run.disaggregated:
            transfer = _span_ms(run.transfer_end_ns, run.prompt_done_ns)
            decode_wait = _span_ms(run.first_emit_ns, run.transfer_end_ns)
        else:
            transfer = decode_wait = np.where(run.prompt_done_ns != NOT_YET, 0.0, np.nan)
        self.stages = {
            "tokenization_ms": _span_ms(run.arrival_ns, run.send_ns),
            "queue_ms": _span_ms(run.first_admit_ns, run.arrival_ns),
            "prefill_ms": _span_ms(run.prompt_done_ns, run.first_admit_ns),
            "transfer_ms": transfer,
            "decode_wait_ms": decode_wait,
            "detokenization_ms": _span_ms(self.first_recv_ns, run.first_emit_ns),
        }
        # Registered metrics beyond the built-ins above, in registry order (one may read another).
        for metric in DISTRIBUTIONS:
            if metric.compute is not None:
                setattr(self, metric.column, np.asarray(metric.compute(self), dtype=np.float64))


def requests_table(
    request_id: pa.Array, input_tokens, output_tokens, cols: RequestColumns,
    session_id: pa.Array | None = None, turn: np.ndarray | None = None, priority: np.ndarray | None = None,
) -> pa.Table:
    """The per-request table (``REQUESTS_SCHEMA``), one row per request in send order.

    Parameters
    ----------
    request_id : pyarrow.StringArray
        Request ids (n).
    input_tokens, output_tokens : ndarray(int64, ndim=1)
        Prompt and requested output lengths, tokens.
    cols : RequestColumns
        Instants and metrics derived from the engine run.
    session_id, turn : pyarrow.StringArray, ndarray(int64, ndim=1), optional
        Multi-turn sessions: each request's session and turn (null without).
    priority : ndarray(int64, ndim=1), optional
        Each request's priority (queue orders; null without).

    Returns
    -------
    pyarrow.Table
        Instants and latencies in float64 ms (null / NaN where they did not happen).
    """
    run = cols.run
    status = pa.DictionaryArray.from_arrays(
        to_arrow(cols.status, pa.int8()), string_array(list(STATUS_NAMES))
    )
    data = {
        "request_id": request_id,
        "status": status,
        "worker": to_arrow(run.worker, pa.int32(), run.worker >= 0),  # negative: never placed
        "rank": to_arrow(run.rank, pa.int32(), run.rank >= 0),
        **_pd_placement(run),
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "generated_tokens": run.generated,
        "num_preemptions": run.num_preemptions,
        "cached_tokens": to_arrow(run.cached_tokens, valid=run.first_admit_ns != NOT_YET),
        **_tier_columns(run),
        "send_ms": _instant_ms(run.send_ns),
        "engine_arrival_ms": _instant_ms(run.arrival_ns),
        "first_admit_ms": _instant_ms(run.first_admit_ns),
        "first_token_emit_ms": _instant_ms(run.first_emit_ns),
        "first_token_ms": _instant_ms(cols.first_recv_ns),
        "last_token_ms": _instant_ms(cols.last_recv_ns),
        **{metric.column: getattr(cols, metric.column) for metric in DISTRIBUTIONS if metric.column},
        "transfer_start_ms": _instant_ms(run.prompt_done_ns if run.disaggregated else np.full_like(run.send_ns, NOT_YET)),
        "transfer_end_ms": _instant_ms(run.transfer_end_ns),
        **cols.stages,
        "session_id": pa.nulls(len(request_id), pa.string()) if session_id is None else session_id,
        "turn": pa.nulls(len(request_id), pa.int64()) if turn is None else turn,
        "priority": pa.nulls(len(request_id), pa.int64()) if priority is None else priority,
    }
    arrays = [to_arrow(value) if isinstance(value, np.ndarray) else value for value in data.values()]
    return conform(pa.table(arrays, names=list(data)), REQUESTS_SCHEMA)


def _pd_placement(run: EngineRun) -> dict[str, pa.Array]:
    """P/D placement columns: prefill (receiving) and decode worker/rank; null when aggregated."""
    def nullable(values, valid):
        return to_arrow(values, pa.int32(), valid)

    receiving = np.full(run.worker.shape[0], run.disaggregated) & (run.worker >= 0)
    handed_off = run.decode_rank != NOT_YET
    return {
        "prefill_worker": nullable(run.worker, receiving),
        "prefill_rank": nullable(run.rank, receiving),
        "decode_worker": nullable(run.decode_worker, handed_off),
        "decode_rank": nullable(run.decode_rank, handed_off),
    }


def tokens_table(request_id: pa.Array, run: EngineRun) -> pa.Table:
    """The per-token table (``TOKENS_SCHEMA``): one row per emitted token.

    Parameters
    ----------
    request_id : pyarrow.StringArray
        Request ids (n).
    run : EngineRun

    Returns
    -------
    pyarrow.Table
        ``request_id``, token ``index``, ``emitted_ms`` and ``received_ms``
        (float64 ms; null when not received by the cap).
    """
    counts = np.diff(run.token_offset)
    emitted = run.token_emit_ns != NOT_YET
    request_of_token = np.repeat(np.arange(counts.shape[0]), counts)[emitted]
    index = (np.arange(run.token_emit_ns.shape[0]) - np.repeat(run.token_offset[:-1], counts))[emitted]
    table = pa.table(
        {
            "request_id": request_id.take(pa.array(request_of_token)),
            "index": index,
            "emitted_ms": run.token_emit_ns[emitted] / 1e6,
            "received_ms": pa.array(_instant_ms(run.token_recv_ns[emitted]), from_pandas=True),
        }
    )
    return conform(table, TOKENS_SCHEMA)


def passes_table(run: EngineRun) -> pa.Table:
    """The pass table (``PASSES_SCHEMA``): one row per rank per recorded pass.

    Parameters
    ----------
    run : EngineRun
        A run with a pass log (``record_passes=True``).

    Returns
    -------
    pyarrow.Table
        Pool, worker, rank, start/end (float64 ms), the SPEC §8 batch summary
        (tokens), ``rank_time_ms`` and ``blocks_in_use`` (blocks).
    """
    log = run.pass_log
    roles = run.worker_role[log[:, enums.PASS_WORKER]].astype(np.int8)
    table = pa.table(
        {
            "pool": pa.DictionaryArray.from_arrays(pa.array(roles, type=pa.int8()), pa.array(POOL_NAMES)),
            "worker": log[:, enums.PASS_WORKER],
            "rank": log[:, enums.PASS_RANK],
            "start_ms": log[:, enums.PASS_START] / 1e6,
            "end_ms": log[:, enums.PASS_END] / 1e6,
            "num_prefill": log[:, enums.PASS_NUM_PREFILL],
            "prefill_tokens": log[:, enums.PASS_PREFILL_TOKENS],
            "prefill_kv_tokens": log[:, enums.PASS_PREFILL_KV_TOKENS],
            "num_decode": log[:, enums.PASS_NUM_DECODE],
            "decode_kv_tokens": log[:, enums.PASS_DECODE_KV_TOKENS],
            "rank_time_ms": run.pass_ms,
            "blocks_in_use": log[:, enums.PASS_BLOCKS_IN_USE],
        }
    )
    return conform(table, PASSES_SCHEMA)


def distribution_stats(metric: Distribution, values: np.ndarray, percentiles) -> dict:
    """mean/median/std/min/max and percentiles of one metric, None when empty.

    ``values`` is a scratch array: the order statistics partition it in place
    (after the order-sensitive sums), which saves a copy.

    Parameters
    ----------
    metric : Distribution
        A per-request metric of the registry (``TTFT``, ``TPOT``, ``E2EL``).
    values : ndarray(float64, ndim=1)
        The metric's values, ms, without NaN; reordered in place.
    percentiles : sequence of float
        Percentiles to report, 0..100.

    Returns
    -------
    dict of str to (float or None)
        ``mean_<name>_ms``, ``median_<name>_ms``, ``std_<name>_ms``,
        ``min_<name>_ms``, ``max_<name>_ms`` and ``p<q>_<name>_ms``, ms.
    """
    if values.size == 0:
        return _stats_dict(metric, percentiles, None)
    mean, std = float(np.mean(values)), float(np.std(values))
    low, high = float(np.min(values)), float(np.max(values))
    # One call: numpy partitions once for the median and every percentile.
    points = np.percentile(values, [50, *percentiles], overwrite_input=True)
    return _stats_dict(metric, percentiles, (mean, std, low, high, points))


def itl_stats(cols: RequestColumns, percentiles) -> dict:
    """The ITL statistics (keys as :func:`distribution_stats`), None when no gap.

    Mean, std, min and max are exact from the per-request receipt statistics
    (equal in both output modes); the median and percentiles are exact from
    the pooled gaps in the detailed mode and read from the log-bucket sketch
    in the bounded mode.

    Parameters
    ----------
    cols : RequestColumns
    percentiles : sequence of float
        Percentiles to report, 0..100.

    Returns
    -------
    dict of str to (float or None)
        ms.
    """
    moments = itl_moments(cols.receipts, cols.completed)
    if moments is None:
        return _stats_dict(ITL, percentiles, None)
    count, mean, std, low, high = moments
    sketch = cols.receipts.itl_sketch
    if sketch is None:
        run = cols.run
        points = exact_itl_percentiles(
            run.token_offset, run.token_recv_ns, cols.receipts, cols.completed, count, [50, *percentiles]
        )
    else:
        points = sketch_percentiles(sketch, [50, *percentiles], low, high)
    return _stats_dict(ITL, percentiles, (mean, std, low, high, points))


def _stats_dict(metric: Distribution, percentiles, stats) -> dict:
    """Summary keys of one distribution from ``(mean, std, min, max, [median, *points])`` or None."""
    keys = [summary_key(statistic, metric) for statistic in STATISTICS]
    keys += [summary_key(percentile_key(p), metric) for p in percentiles]
    if stats is None:
        return dict.fromkeys(keys)
    mean, std, low, high, points = stats
    values = [mean, points[0], std, low, high, *points[1:]]
    return {key: float(value) for key, value in zip(keys, values)}


def summarize(cols: RequestColumns, input_tokens: np.ndarray, metrics: MetricsConfig, turn: np.ndarray | None = None) -> dict:
    """The SPEC §10 summary, keyed like ``vllm bench serve``'s result JSON.

    Parameters
    ----------
    cols : RequestColumns
        Per-request instants and metrics of the run.
    input_tokens : ndarray(int64, ndim=1)
        Prompt length of each request, tokens.
    metrics : MetricsConfig
        Percentiles and goodput SLOs.
    turn : ndarray(int64, ndim=1), optional
        Multi-turn sessions: each request's turn; adds ``num_sessions`` and
        the per-turn-group statistics of ``PER_TURN``.

    Returns
    -------
    dict
        Counts, token totals, ``duration_s`` (s), throughputs (per s), goodput,
        prefix-cache hit rate, distribution statistics and mean TTFT stages (ms);
        None where undefined.
    """
    run = cols.run
    done = cols.completed
    completed = int(done.sum())
    total_input = int(input_tokens[done].sum())
    total_output = int(run.generated[done].sum())
    sent = run.send_ns[run.send_ns != NOT_YET]
    duration_s = None
    if completed:
        duration_s = float((cols.last_recv_ns[done].max() - sent.min()) / 1e9)

    def per_second(count):
        return None if duration_s is None else count / duration_s

    summary = {
        "num_requests": int(done.shape[0]),
        "completed": completed,
        "rejected": int((cols.status == REJECTED).sum()),
        "incomplete": int((cols.status == INCOMPLETE).sum()),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "duration_s": duration_s,
        "request_throughput": per_second(completed),
        "output_throughput": per_second(total_output),
        "total_token_throughput": per_second(total_input + total_output),
        "request_goodput": _goodput(cols, metrics.goodput, per_second),
        "prefix_cache_hit_rate": _hit_rate(run, input_tokens),
        **_tier_summary(run, input_tokens),
        **_spec_summary(run),
    }
    for metric in DISTRIBUTIONS:
        if metric.column is None:  # pooled over token gaps
            summary.update(itl_stats(cols, metrics.percentiles))
            continue
        values = getattr(cols, metric.column)
        values = values[done & ~np.isnan(values)]  # tpot exists from 2 tokens on
        summary.update(distribution_stats(metric, values, metrics.percentiles))
    for stage in TTFT_STAGES:
        values = cols.stages[stage][done]
        summary[f"mean_{stage}"] = float(np.mean(values)) if values.size else None
    if turn is not None:
        summary.update(_per_turn_stats(cols, turn, metrics.percentiles))
    return summary


def _per_turn_stats(cols: RequestColumns, turn: np.ndarray, percentiles) -> dict:
    """``num_sessions`` and each ``PER_TURN`` distribution over each turn group's completed requests."""
    stats = {"num_sessions": int((turn == 0).sum())}
    for metric in PER_TURN:
        values = getattr(cols, metric.column)
        for group in TURN_GROUPS:
            chosen = values[cols.completed & group.selects(turn) & ~np.isnan(values)]
            stats.update(distribution_stats(per_turn(metric, group), chosen, percentiles))
    return stats


def _hit_rate(run: EngineRun, input_tokens: np.ndarray) -> float | None:
    """Prompt tokens reused at first admission / prompt tokens, over admitted requests."""
    admitted = run.first_admit_ns != NOT_YET
    if not admitted.any():
        return None
    return float(run.cached_tokens[admitted].sum() / input_tokens[admitted].sum())


def _cpu_cached_tokens(run: EngineRun) -> np.ndarray:
    return np.zeros_like(run.cached_tokens) if run.offload is None else run.offload.cpu_cached_tokens


def _tier_columns(run: EngineRun) -> dict[str, pa.Array]:
    """``cached_tokens`` split by tier (GPU, CPU) and the CPU -> GPU load time."""
    never = run.first_admit_ns == NOT_YET
    cpu = _cpu_cached_tokens(run)
    load_ns = np.zeros_like(cpu) if run.offload is None else run.offload.kv_load_ns
    return {
        "gpu_cached_tokens": to_arrow(run.cached_tokens - cpu, valid=~never),
        "cpu_cached_tokens": to_arrow(cpu, valid=~never),
        "kv_load_ms": to_arrow(load_ns / 1e6, valid=load_ns != 0),
    }


def _tier_summary(run: EngineRun, input_tokens: np.ndarray) -> dict[str, float | None]:
    """The summary figures of ``CACHE_TIERS`` (all null without a CPU tier)."""
    admitted = run.first_admit_ns != NOT_YET
    if run.offload is None or not admitted.any():
        return {metric.name: None for metric in CACHE_TIERS}
    prompt = input_tokens[admitted].sum()
    cpu = run.offload.cpu_cached_tokens[admitted].sum()
    return dict(zip(
        (metric.name for metric in CACHE_TIERS),
        (float((run.cached_tokens[admitted].sum() - cpu) / prompt), float(cpu / prompt),
         run.offload.loaded_bytes / 1e9, run.offload.stored_bytes / 1e9),
    ))


def _spec_summary(run: EngineRun) -> dict[str, float | int | None]:
    """The ``SPEC_DECODE`` keys and the per-position rates (none without speculative decoding)."""
    if run.spec_counts is None:
        return {}
    counts = run.spec_counts
    drafts, proposed, accepted = int(counts[0]), int(counts[1]), int(counts[2:].sum())
    values = (drafts, proposed, accepted, accepted / proposed if proposed else None,
              1 + accepted / drafts if drafts else None)
    summary = dict(zip((metric.name for metric in SPEC_DECODE), values))
    for i in range(run.spec_positions):
        summary[SPEC_POSITION_KEY.format(i + 1)] = int(counts[2 + i]) / drafts if drafts else None
    return summary


def _goodput(cols: RequestColumns, slo: GoodputConfig, per_second) -> float | None:
    if not slo.enabled:
        return None
    good = cols.completed.copy()
    for metric in slo_metrics():
        target = slo.target(metric.column)
        if target is not None:
            # NaN: the metric does not apply (TPOT below 2 tokens); a completed
            # request always has a TTFT and an E2E latency.
            values = getattr(cols, metric.column)
            good &= np.isnan(values) | (values <= target)
    return per_second(int(good.sum()))


def rejection_reasons(cols: RequestColumns, input_tokens: np.ndarray, engine: EngineConfig,
                      lost: np.ndarray | None = None) -> dict:
    """How many requests were rejected because of each limit (SPEC §5).

    A rank rejects a prompt of ``input_tokens >= L``, ``L = min(context_length,
    num_blocks x block_size)``: the reason is the limit that sets ``L`` in the
    rejecting pool (the prefill pool when the prompt reaches its L, else the
    decode pool; the aggregated pool otherwise).

    Parameters
    ----------
    cols : RequestColumns
        The run's per-request statuses.
    input_tokens : ndarray(int64, ndim=1)
        Prompt length of each request, tokens.
    engine : EngineConfig
        The pools and their limits.
    lost : ndarray(bool, ndim=1), optional
        Failures (docs/failures.md): the requests taken as failed, rejected
        for no limit (counted by ``lost_requests`` instead).

    Returns
    -------
    dict
        ``rejected_context_length`` and ``rejected_kv_capacity`` (requests;
        they sum to ``rejected``, less the ``lost`` ones).
    """
    rejected = cols.status == REJECTED
    if lost is not None:
        rejected &= ~lost
    receiving, *later = engine.pools  # aggregated; or prefill, then decode
    at_receiving = input_tokens >= receiving.sequence_limit
    where = [(receiving, at_receiving)] + [(pool, ~at_receiving) for pool in later]
    by_context = np.zeros(rejected.shape[0], dtype=bool)
    for pool, rejected_here in where:
        capacity = pool.num_blocks * pool.block_size
        if pool.context_length is not None and pool.context_length <= capacity:
            by_context |= rejected_here
    context = int((rejected & by_context).sum())
    return {"rejected_context_length": context, "rejected_kv_capacity": int(rejected.sum()) - context}


def saturation(cols: RequestColumns) -> dict:
    """Whether the offered load exceeds what the deployment serves (queues grow).

    Over the second half of the sending window (``(t_mid, t_last]``, ``t_mid``
    halfway between the first and the last send) the arrival rate is the sends
    per second and the departure rate the requests per second that left the
    client's view (final token or rejection received).  When requests keep
    arriving faster than they leave, the number in the system grows by the
    difference: the run is ``saturated`` when the departure rate is below
    :data:`SATURATION_DEPARTURE_SHARE` of the arrival rate.  A closed loop
    sends when a request leaves, so its two rates match: not saturated.

    Parameters
    ----------
    cols : RequestColumns
        The run's send instants, final receipts and rejections (int64 ns).

    Returns
    -------
    dict
        ``saturated`` (bool; None with fewer than :data:`SATURATION_MIN_SENDS`
        sends in the half or no sending window), ``arrival_rate_second_half``
        and ``departure_rate_second_half`` (req/s; None with the verdict).
    """
    run = cols.run
    send = run.send_ns[run.send_ns != NOT_YET]
    verdict = {"saturated": None, "arrival_rate_second_half": None, "departure_rate_second_half": None}
    if send.size == 0:
        return verdict
    first, last = int(send.min()), int(send.max())
    mid = first + (last - first) // 2
    arrived = int(((send > mid) & (send <= last)).sum())
    if last == first or arrived < SATURATION_MIN_SENDS:
        return verdict
    leave = np.where(cols.completed, cols.last_recv_ns, run.reject_ns)  # NOT_YET: still in the system
    departed = int(((leave != NOT_YET) & (leave > mid) & (leave <= last)).sum())
    window_s = (last - mid) / 1e9
    return {
        "saturated": bool(departed < SATURATION_DEPARTURE_SHARE * arrived),
        "arrival_rate_second_half": arrived / window_s,
        "departure_rate_second_half": departed / window_s,
    }
