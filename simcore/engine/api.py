"""Engine replay wrapper: validates shapes, allocates buffers, calls the kernel once.

``simulate_engine`` returns the raw per-request and per-token instants (int64
ns, -1 for "did not happen") that ``simcore.metrics`` turns into tables.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from simcore.client.api import client_inputs
from simcore.bounds import checked_total
from simcore.config import ConfigError, SimConfig
from simcore.engine import nb
from simcore.engine.router import router_inputs
from simcore.engine.settings import POOLS
from simcore.memory import filled
from simcore.engine.state import Client, Load, Logs, Outputs, Ranks, Requests, Router, Timing, Topology
from simcore.receipts import Receipts, allocate_stream_state, completed_mask
from simcore.receipts_nb import STREAM_FIELDS
from simcore.scheduler.kv_nb import allocate_prefix_cache
from simcore.scheduler.api import prefix_cache_inputs, queue_keys, rank_inputs, request_acceptance, request_streams
from simcore.scheduler.speculative import MAX_DRAFT_TOKENS
from simcore.scheduler.radix import radix_prefix_cache
from simcore.scheduler.kv_tree import kv_tree_prefix_cache
from simcore.scheduler.offload import OffloadRun, OffloadShape, offload_results, offload_state
from simcore.timing.api import worker_timing
from simcore.units import ms_array_to_ns, ms_to_ns
from simcore.workload.api import RequestTable
from simcore.workload.sessions import session_schedule

STREAM_RECEIVED = STREAM_FIELDS.index("num_received")
STREAM_INCLUDE = STREAM_FIELDS.index("itl_include")
PROGRESS_INTERVAL_S = 0.2
#: Per-request outputs allocated as "did not happen" (-1) and as counts (0).
NOT_YET_OUTPUTS = ("send_ns", "arrival_ns", "first_admit_ns", "first_emit_ns", "finish_ns", "reject_ns", "handoff_ns",
                   "transfer_end_ns", "decode_rank", "placed_rank", "placed_worker", "send_seq")
COUNT_OUTPUTS = ("cached_tokens", "generated", "num_preemptions", "failures")

#: ``on_progress(done, total)``: requests finished or rejected, out of the run's requests.
ProgressCallback = Callable[[int, int], None]


@dataclass
class EngineRun:
    """Raw result of one engine replay (all instants int64 ns, -1 = did not happen).

    Per request: ``send_ns``, ``arrival_ns``, ``first_admit_ns``,
    ``first_emit_ns``, ``finish_ns`` (engine finish), ``reject_ns``,
    ``generated``, ``num_preemptions``, ``worker``, ``rank`` (the receiving
    placement), ``cached_tokens`` (prefix-cache hits at the first admission),
    ``prompt_done_ns`` (end of the pass that computed the prompt),
    and in P/D ``transfer_end_ns``, ``decode_worker`` (global index) and
    ``decode_rank`` (-1 until handed off; all -1 when aggregated).  Per token (request
    k's at ``token_offset[k]:token_offset[k + 1]``): ``token_emit_ns``,
    ``token_recv_ns`` (receipts after the cap already set to -1); both empty
    in the bounded output mode, where ``receipts`` holds the per-request
    receipt statistics and ITL sketch instead (None in the detailed mode).
    ``passes``: int64 log (``nb.PASS_*`` columns) and float64 ``pass_ms`` of
    the passes that ended by the cap, or None when not recorded.
    """

    send_ns: np.ndarray
    arrival_ns: np.ndarray
    first_admit_ns: np.ndarray
    first_emit_ns: np.ndarray
    finish_ns: np.ndarray
    reject_ns: np.ndarray
    generated: np.ndarray
    num_preemptions: np.ndarray
    worker: np.ndarray
    rank: np.ndarray
    cached_tokens: np.ndarray
    prompt_done_ns: np.ndarray
    transfer_end_ns: np.ndarray
    decode_worker: np.ndarray
    decode_rank: np.ndarray
    token_offset: np.ndarray
    token_emit_ns: np.ndarray
    token_recv_ns: np.ndarray
    receipts: Receipts | None
    cap_ns: int | None
    disaggregated: bool
    worker_role: np.ndarray
    pass_log: np.ndarray | None
    pass_ms: np.ndarray | None
    offload: OffloadRun | None = None  # the CPU tier's results (None: no tier)
    # speculative decoding (None: off): verifications, proposals, accepted per position; positions counted
    spec_counts: np.ndarray | None = None
    spec_positions: int = 0
    # autoscaling or failures (None: neither): rows of instant ns, worker, event
    # (simcore.engine.autoscale_nb.SCALE_EVENTS), in the order they happened (by instant, then as written)
    scale_log: np.ndarray | None = None
    failures: np.ndarray | None = None  # failures: attempts each request lost to them (None: off)


class Buffers(NamedTuple):
    """What one kernel call writes: the outputs (the send instants among them, in/out), the bounded receipt state, the logs."""

    out: Outputs
    receipts: tuple
    logs: Logs

    @property
    def send_ns(self) -> np.ndarray:
        """The send instants, ns (``Outputs.send_ns``): an open loop's are written in before the call."""
        return self.out.send_ns


@dataclass
class Prepared:
    """One configuration's kernel inputs and what turning its outputs into an EngineRun needs.

    The typed inputs (``simcore.engine.state``) are built once by
    :func:`prepare`; the send instants (``send`` gives the open-loop ones),
    outputs and prefix cache (:meth:`prefix_cache`) are allocated per call.
    """

    cfg: SimConfig
    requests: Requests
    load: Load
    client: Client
    topology: Topology
    ranks: Ranks
    timing: Timing
    send: np.ndarray | None
    n: int
    num_tokens: int
    pass_rows: int
    record_passes: bool
    bounded: bool
    rank_worker: np.ndarray
    cache_shape: tuple  # num_slots, num_ranks, ident_offset, ident
    router: Router
    sessions: bool = False  # placement by send sequence number (out.send_seq)
    offload_shape: OffloadShape | None = None  # the CPU tier (simcore.scheduler.offload)
    radix_tree: bool = False  # sglang's radix cache as a node tree (simcore.scheduler.radix)
    kv_tree: bool = False  # vllm's prefix cache as a node tree (simcore.scheduler.kv_tree)
    scale_rows: int = 0  # the scaling log's first capacity (0: no autoscaling)

    @property
    def closed(self) -> bool:
        return self.load.closed_loop

    @property
    def mode(self) -> int:
        return self.client.detok_mode

    def prefix_cache(self) -> tuple:
        """The prefix-cache state tuple ``(state, ident)`` of ``kv_nb``, the CPU tier's state at the state's tail."""
        num_slots, num_ranks, ident_offset, ident = self.cache_shape
        if self.radix_tree:
            return radix_prefix_cache(*self.cache_shape, offload_state(self.offload_shape), self.ranks.num_blocks)
        if self.kv_tree:
            return kv_tree_prefix_cache(*self.cache_shape, offload_state(self.offload_shape), self.ranks.num_blocks)
        if ident.shape[0] or self.offload_shape is not None:
            return allocate_prefix_cache(*self.cache_shape, tail=offload_state(self.offload_shape))
        # No prompt-block identities (prefix caching off): every call of this size starts
        # from the same state, so copy it rather than build it (issue 11).
        return tuple(array.copy() for array in _empty_prefix_cache(num_slots, num_ranks, ident_offset.shape[0] - 1))

    def with_offload(self, run: EngineRun, state: np.ndarray) -> EngineRun:
        """``run`` with the CPU tier's results read from the prefix-cache ``state`` after the run."""
        run.offload = offload_results(self.offload_shape, state)
        return run

    def kernel_args(self, buffers: Buffers, prefix_cache: tuple) -> tuple:
        """Positional arguments of ``simulate_engine_nb`` (and, stacked, ``simulate_batch_nb``)."""
        return kernel_args(self.requests, self.load, self.client, self.topology, self.ranks, self.timing,
                           buffers, prefix_cache, self.router)


@functools.lru_cache(maxsize=4)
def _empty_prefix_cache(num_slots: int, num_ranks: int, n: int) -> tuple:
    """The prefix-cache state of ``n`` requests without prompt-block identities; copied, never passed."""
    return allocate_prefix_cache(num_slots, num_ranks, np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.int64))


def kernel_args(
    requests, load, client, topology, ranks, timing, buffers: Buffers, prefix_cache: tuple, router
) -> tuple:
    """The kernels' parameter order, written once.

    Parameters
    ----------
    requests, load, client, topology, ranks, timing : NamedTuple
        The typed inputs (``simcore.engine.state``), one configuration's or stacked.
    buffers : Buffers
        The caller-allocated outputs (the send instants, ns, among them).
    prefix_cache : tuple of ndarray(int64)
        The ``simcore.scheduler.kv_nb`` state.
    router : Router
        The routing inputs, one configuration's or stacked.

    Returns
    -------
    tuple
        The positional arguments of ``simulate_engine_nb`` / ``simulate_batch_nb`` (before ``engine_address``).
    """
    return (requests, load, client, topology, ranks, prefix_cache, timing,
            buffers.out, buffers.receipts, buffers.logs, router)


def simulate_engine(
    cfg: SimConfig,
    requests: RequestTable,
    send_ns: np.ndarray | None,
    *,
    record_passes: bool = False,
    on_progress: ProgressCallback | None = None,
) -> EngineRun:
    """Replay ``requests`` through the configured deployment (aggregated or P/D, any policy).

    Parameters
    ----------
    cfg : SimConfig
    requests : RequestTable
    send_ns : ndarray(int64, ndim=1) or None
        Open-loop send instants, ns; None for a closed loop.
    record_passes : bool
        Keep the per-rank pass log.
    on_progress : callable, optional
        ``on_progress(done, total)``, called from this thread about every
        0.2 s while the kernel runs (in a worker thread) and once at its end.

    Returns
    -------
    EngineRun
        Per-request and per-token instants, int64 ns (-1: did not happen).

    Raises
    ------
    simcore.ConfigError
        The timing model gave a pass time that is not finite and >= 0.
    """
    prep = prepare(cfg, requests, send_ns, record_passes=record_passes)
    return run_prepared(prep, on_progress=on_progress)


def run_prepared(
    prep: Prepared, itl_include: np.ndarray | None = None, on_progress: ProgressCallback | None = None
) -> EngineRun:
    """Run one prepared configuration (:func:`prepare`) through the kernel.

    The pass log is doubled and the run repeated while the kernel reports it
    full; in the bounded mode, the run is repeated once more if
    :func:`itl_rerun_mask` asks for it.

    Parameters
    ----------
    prep : Prepared
        Kernel inputs of one configuration.
    itl_include : ndarray(int64, ndim=1), optional
        Bounded mode: the requests whose gaps enter the ITL sketch (default all,
        then repeated as needed).
    on_progress : callable, optional
        As :func:`simulate_engine` (a repeated run reports from 0 again).

    Returns
    -------
    EngineRun
        As :func:`simulate_engine`.
    """
    pass_rows = prep.pass_rows
    scale_rows = prep.scale_rows
    while True:
        buffers = allocate_buffers(prep.n, prep.num_tokens, pass_rows, bounded=prep.bounded, scale_rows=scale_rows)
        if itl_include is not None:
            buffers.receipts[STREAM_INCLUDE][:] = itl_include
        if prep.send is not None:
            buffers.send_ns[:] = prep.send
        cache = prep.prefix_cache()
        args = prep.kernel_args(buffers, cache)
        if on_progress is None:
            status, rows, num_emitted = nb.simulate_engine_nb(*args)
        else:
            status, rows, num_emitted = _kernel_with_progress(args, buffers.out.progress, prep.n, on_progress)
        if status == nb.PASS_LOG_FULL:
            pass_rows *= 2
            continue
        if status == nb.SCALE_LOG_FULL:
            scale_rows *= 2
            continue
        if status == nb.OK and itl_include is None:
            itl_include = itl_rerun_mask(prep, buffers)
            if itl_include is not None:
                continue
        return prep.with_offload(finish(prep, buffers, status, rows, num_emitted), cache[0])


def _kernel_with_progress(args: tuple, progress: np.ndarray, total: int, on_progress: ProgressCallback):
    """Run the kernel in a worker thread (it releases the GIL) and report its progress counter."""
    outcome: list = []

    def work():
        try:
            outcome.append(nb.simulate_engine_nb(*args))
        except BaseException as exc:  # re-raised in the caller's thread
            outcome.append(exc)

    worker = threading.Thread(target=work, name="replaysim-kernel", daemon=True)
    worker.start()
    while True:  # reports at least once, after the end, even when the kernel ends at once
        worker.join(PROGRESS_INTERVAL_S)
        on_progress(int(progress[0]), total)
        if not worker.is_alive():
            break
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def itl_rerun_mask(prep: Prepared, buffers: Buffers) -> np.ndarray | None:
    """Bounded mode: the ITL-sketch mask for a second run, or None when the first one stands.

    The sketch takes every gap as it happens, but ITL pools completed
    requests only, and completion is known at the end.  When some request
    with gaps did not complete (the time cap, a request that never fits), the
    run is repeated (it is deterministic) with only the completed requests'
    gaps let into the sketch.

    Parameters
    ----------
    prep : Prepared
    buffers : Buffers
        The first run's kernel outputs.

    Returns
    -------
    ndarray(int64, ndim=1) or None
        1 for the completed requests, 0 for the others.
    """
    if not prep.bounded:
        return None
    received = buffers.receipts[STREAM_RECEIVED]
    out = buffers.out
    completed = completed_mask(out.finish_ns, out.reject_ns, out.generated, received)
    if not np.any(~completed & (received >= 2)):
        return None
    return completed.astype(np.int64)


def prepare(
    cfg: SimConfig,
    requests: RequestTable,
    send_ns: np.ndarray | None,
    *,
    record_passes: bool = False,
) -> Prepared:
    """Validate and build the kernel inputs of one configuration (see :func:`simulate_engine`).

    Parameters
    ----------
    cfg : SimConfig
    requests : RequestTable
    send_ns : ndarray(int64, ndim=1) or None
        Open-loop send instants, ns, one per request; None for a closed loop.
    record_passes : bool
        Size a pass log (rows estimated from outputs and prompt chunks).

    Returns
    -------
    Prepared
        The kernel inputs (all but ``send_ns`` and ``prefix_cache``) and the
        topology (the placement is the kernel's, ``Outputs.placed_rank``).

    Raises
    ------
    ValueError
        Open-loop ``send_ns`` missing or of the wrong length.
    """
    closed = cfg.load.closed_loop
    sessions = requests.session is not None
    if not closed and (send_ns is None or send_ns.shape[0] != len(requests)):
        raise ValueError("an open loop needs one send instant per request")
    bounded = cfg.output.mode == "bounded"
    pools = cfg.engine.pools
    n = len(requests)
    input_tokens = np.ascontiguousarray(requests.input_tokens, dtype=np.int64)
    output_tokens = np.ascontiguousarray(requests.output_tokens, dtype=np.int64)
    num_tokens = checked_total(output_tokens, "output_tokens")  # before the cumsum can wrap
    token_offset = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(output_tokens, out=token_offset[1:])
    topology, rank_worker = _topology(pools)
    ranks = rank_inputs(pools, cfg.engine.policy, cfg.seed)

    # Placement by send sequence number k over the receiving pool (SPEC §3);
    # under another routing policy the kernel places each request (placed_rank).
    k = np.arange(n, dtype=np.int64)
    receiving = pools[0]
    worker = k % receiving.replicas
    rank = (k // receiving.replicas) % receiving.attention_dp
    recv_rank = topology.worker_first_rank[worker] + rank

    tok = cfg.tokenization
    schedule = session_schedule(requests, cfg, recv_rank.copy(), worker * tok.workers)  # recv_rank is rewritten at sends
    # Placement by row; with sessions by send sequence number, in the kernel.
    client, tok_index = client_inputs(tok, cfg.detokenization, requests, input_tokens, worker, receiving.replicas,
                                      sessions=sessions)
    transfer_ns = ms_array_to_ns(cfg.engine.kv_transfer.transfer_ms(input_tokens), "engine.kv_transfer.bytes_per_token")
    # Prefix caching runs on the receiving pool (aggregated, or P/D prefill).
    prefix_cache = prefix_cache_inputs(receiving, cfg.engine.policy, requests, cfg.workload, cfg.engine.router.policy,
                                       len(ranks.policy), path=f"engine.{POOLS[cfg.engine.mode][0]}")
    cap_ns = None if cfg.max_time_ms is None else ms_to_ns(cfg.max_time_ms, "max_time_ms")

    # A worker pass either emits a token or fills some rank's token budget with
    # prompt, so without preemption passes <= outputs + inputs / budget.  The
    # log doubles (and the run repeats) in the rare case this estimate is short.
    pass_rows = 0
    if record_passes:
        budget = min(pool.max_batched_tokens or pool.chunked_prefill_size for pool in pools)
        chunks = checked_total(-(-input_tokens // budget), "input_tokens")
        pass_rows = (num_tokens + chunks * len(pools) + len(topology.worker_role)) * int(
            topology.worker_num_ranks.max()
        )
    return Prepared(
        cfg=cfg,
        requests=Requests(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            token_offset=token_offset,
            recv_rank=recv_rank,
            transfer_ns=transfer_ns,
            spec_alpha=request_acceptance(pools, requests.acceptance_length),
            spec_stream=request_streams(pools, requests.prompt_id, n),
            queue_key=queue_keys(pools, requests),
        ),
        load=Load(
            closed_loop=closed and not sessions,
            concurrency=cfg.load.concurrency,
            think_ns=ms_to_ns(cfg.load.think_time_ms, "load.think_time_ms"),
            cap_ns=nb.NO_CAP if cap_ns is None else cap_ns,
            **schedule,
        ),
        client=client,
        topology=topology,
        ranks=ranks,
        timing=Timing(*worker_timing([cfg.timing_of(i) for i in range(len(pools))], [p.replicas for p in pools])),
        send=None if closed else send_ns,
        sessions=sessions,
        n=n,
        num_tokens=num_tokens,
        pass_rows=pass_rows,
        record_passes=record_passes,
        bounded=bounded,
        rank_worker=rank_worker,
        router=router_inputs(cfg, n, topology, np.ascontiguousarray(tok_index, dtype=np.int64)),
        scale_rows=(64 + 4 * len(topology.worker_role) + len(cfg.engine.failures.at)
                    if cfg.engine.scaled or cfg.engine.failures.enabled else 0),
        **prefix_cache._asdict(),
    )


def finish(prep: Prepared, buffers: Buffers, status: int, rows: int, num_emitted: int) -> EngineRun:
    """Turn one configuration's kernel outputs into its EngineRun (or its timing error).

    Parameters
    ----------
    prep : Prepared
        The configuration's prepared inputs.
    buffers : Buffers
        Its kernel outputs (instants int64 ns).
    status : int
        Kernel status: ``nb.OK`` or ``nb.BAD_TIMING``.
    rows : int
        Rows written to the pass log.
    num_emitted : int
        Tokens emitted (rows of the emission log in deferred detokenization).

    Returns
    -------
    EngineRun
        Receipts after the run where deferred; instants after the cap set to -1;
        pass log cut to the cap and ordered by end, worker, rank.

    Raises
    ------
    simcore.ConfigError
        ``status`` is ``BAD_TIMING`` (the message gives the batch summary).
    """
    cfg = prep.cfg
    rank_worker = prep.rank_worker
    out, logs, send_ns = buffers.out, buffers.logs, buffers.send_ns
    # The placement the kernel reports (round robin: the rows' own); -1 for a
    # request not placed by the cap (routed by another policy: never sent, or
    # its least-loaded rank not yet picked).
    placed = out.placed_rank >= 0
    if prep.sessions:  # a session turn never sent keeps its row's placement in placed_rank
        placed &= out.send_seq >= 0
    worker = np.where(out.placed_worker >= 0, out.placed_worker, np.where(placed, rank_worker[out.placed_rank], -1))
    rank = np.where(placed, out.placed_rank - prep.topology.worker_first_rank[worker], -1)
    if status == nb.BAD_TIMING:
        b = logs.bad_batch
        pool_of_worker = np.repeat(np.arange(len(cfg.engine.pools)), [p.replicas for p in cfg.engine.pools])
        timing = cfg.timing_of(int(pool_of_worker[min(int(b[0]), pool_of_worker.shape[0] - 1)]))
        t = timing.path
        curve = timing.allreduce_curve if timing.allreduce else None
        source = (f"{t}.type={timing.type} with {t}.allreduce.curve={curve} (beyond its last point "
                  "the curve's last segment is extended)" if curve else f"{t}.type={timing.type}")
        raise ConfigError(
            f"{source} gave {float(b[7])!r} ms for worker {int(b[0])} rank "
            f"{int(b[1])}'s batch (num_prefill={int(b[2])}, prefill_tokens={int(b[3])}, "
            f"prefill_kv_tokens={int(b[4])}, num_decode={int(b[5])}, decode_kv_tokens={int(b[6])}); "
            "a pass time must be finite and >= 0"
        )
    cap_ns = None if prep.load.cap_ns == nb.NO_CAP else prep.load.cap_ns
    token_offset = prep.requests.token_offset

    token_recv = out.token_recv_ns
    receipts = Receipts.from_stream(buffers.receipts) if prep.bounded else None
    if cap_ns is not None:  # nothing stamped after the cap happened (SPEC §9)
        token_recv[token_recv > cap_ns] = -1
        send_ns[send_ns > cap_ns] = -1

    pass_log = pass_ms = None
    if prep.record_passes:
        pass_log = logs.pass_log[:rows]
        pass_ms = logs.pass_ms[:rows]
        if cap_ns is not None:
            ended = pass_log[:, nb.PASS_END] <= cap_ns
            pass_log, pass_ms = pass_log[ended], pass_ms[ended]
        # Rows in the order passes end (by end, then worker, then rank).
        order = np.lexsort((pass_log[:, nb.PASS_RANK], pass_log[:, nb.PASS_WORKER], pass_log[:, nb.PASS_END]))
        pass_log, pass_ms = pass_log[order], pass_ms[order]

    decode = out.decode_rank >= 0
    decode_worker = rank_worker[out.decode_rank]
    speculation = [pool for pool in cfg.engine.pools if pool.speculative is not None]
    return EngineRun(
        send_ns=send_ns,
        arrival_ns=out.arrival_ns,
        first_admit_ns=out.first_admit_ns,
        first_emit_ns=out.first_emit_ns,
        finish_ns=out.finish_ns,
        reject_ns=out.reject_ns,
        generated=out.generated,
        num_preemptions=out.num_preemptions,
        worker=worker,
        rank=rank,
        cached_tokens=out.cached_tokens,
        prompt_done_ns=out.handoff_ns if cfg.engine.mode == "disaggregated" else out.first_emit_ns,
        transfer_end_ns=out.transfer_end_ns,
        decode_worker=np.where(decode, decode_worker, -1),
        decode_rank=np.where(decode, out.decode_rank - prep.topology.worker_first_rank[decode_worker], -1),
        token_offset=token_offset,
        token_emit_ns=out.token_emit_ns,
        token_recv_ns=token_recv,
        receipts=receipts,
        cap_ns=cap_ns,
        disaggregated=cfg.engine.mode == "disaggregated",
        worker_role=prep.topology.worker_role,
        pass_log=pass_log,
        pass_ms=pass_ms,
        spec_counts=out.spec_counts.copy() if speculation else None,
        spec_positions=max((pool.speculative.positions for pool in speculation), default=0),
        scale_log=_scale_log(logs.scale_log, cap_ns) if prep.scale_rows else None,
        failures=out.failures if cfg.engine.failures.enabled else None,
    )


def _scale_log(log: np.ndarray, cap_ns: int | None) -> np.ndarray:
    """The scaling log's written rows (by the cap), by instant, then in the order written."""
    written = log[log[:, 0] >= 0]
    if cap_ns is not None:
        written = written[written[:, 0] <= cap_ns]
    return written[np.argsort(written[:, 0], kind="stable")].copy()


def _topology(pools) -> tuple[Topology, np.ndarray]:
    """Workers of the deployment as flat per-worker arrays, and each global rank's worker."""
    roles = [nb.ROLE_AGGREGATED] if len(pools) == 1 else [nb.ROLE_PREFILL, nb.ROLE_DECODE]
    worker_role, worker_num_ranks, worker_async, worker_lockstep = [], [], [], []
    for role, pool in zip(roles, pools):
        worker_role += [role] * pool.replicas
        worker_async += [pool.async_scheduling] * pool.replicas
        worker_lockstep += [pool.expert_parallel] * pool.replicas
        worker_num_ranks += [pool.attention_dp] * pool.replicas
    worker_num_ranks = np.array(worker_num_ranks, dtype=np.int64)
    first_rank = np.cumsum(worker_num_ranks) - worker_num_ranks
    topology = Topology(
        worker_role=np.array(worker_role, dtype=np.int64),
        worker_first_rank=first_rank,
        worker_num_ranks=worker_num_ranks,
        num_decode_workers=pools[-1].replicas if len(pools) == 2 else 0,
        worker_async=np.array(worker_async, dtype=np.bool_),
        worker_lockstep=np.array(worker_lockstep, dtype=np.bool_),
    )
    return topology, np.repeat(np.arange(len(worker_role), dtype=np.int64), worker_num_ranks)


def allocate_buffers(
    n: int, num_tokens: int, pass_rows: int, batch: int | None = None, *, bounded: bool = False, scale_rows: int = 0
) -> Buffers:
    """Caller-allocated kernel outputs, initialised to their "not yet" values.

    ``batch``: a leading axis of that many configurations on every array (the
    pass log then has none: ``pass_rows`` must be 0).  ``bounded``: per-request
    receipt state instead of the per-token arrays.

    Parameters
    ----------
    n, num_tokens : int
        Requests and output tokens.
    pass_rows : int
        Pass-log capacity, rows.
    batch : int, optional
        Configurations.
    bounded : bool
        The bounded output mode.
    scale_rows : int
        Scaling-log capacity, rows (instants -1: not written).

    Returns
    -------
    Buffers
        Send instants and per-request instants ``-1`` (ns), counts 0.
    """
    lead = () if batch is None else (batch,)
    # The per-request arrays are rows of two blocks: two fills instead of a dozen
    # np.full calls, which dominate a small call's allocation (issue 11).
    not_yet = np.full((len(NOT_YET_OUTPUTS),) + lead + (n,), -1, dtype=np.int64)
    counts = np.zeros((len(COUNT_OUTPUTS),) + lead + (n,), dtype=np.int64)
    per_token = lead + (0 if bounded else num_tokens,)
    out = Outputs(
        **dict(zip(NOT_YET_OUTPUTS, not_yet)),
        **dict(zip(COUNT_OUTPUTS, counts)),
        token_emit_ns=filled(per_token, -1),
        token_recv_ns=filled(per_token, -1),
        progress=np.zeros(lead + (1,), dtype=np.int64),
        spec_counts=np.zeros(lead + (2 + MAX_DRAFT_TOKENS,), dtype=np.int64),
    )
    logs = Logs(
        pass_log=np.zeros(lead + (pass_rows, nb.PASS_LOG_COLUMNS), dtype=np.int64),
        pass_ms=np.zeros(lead + (pass_rows,), dtype=np.float64),
        bad_batch=np.zeros(lead + (8,), dtype=np.float64),
        scale_log=np.full(lead + (scale_rows, 3), -1, dtype=np.int64),
    )
    return Buffers(out, allocate_stream_state(n if bounded else 0, batch), logs)
