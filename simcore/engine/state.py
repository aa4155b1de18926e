"""The engine kernel's typed state: NamedTuples of arrays and scalars, declared once.

``simulate_engine_nb`` takes one of each (plus the send instants, the
prefix cache of ``simcore.scheduler.kv_nb`` and the bounded mode's receipt
state, both opaque tuples); ``simulate_batch_nb`` takes the same tuples with a
leading configuration axis on every member (scalars become 1-D arrays) and
hands row ``c`` of each to ``simulate_engine_nb``.  numba compiles a
NamedTuple like a tuple (also with ``cache=True``); a kernel reads its members
by name, so a new member is declared here and filled in
``simcore.engine.api.prepare`` (inputs) or ``allocate_outputs`` (outputs),
and read where it is used.

Units: instants and durations int64 ns, token counts int64, ms float64.
"""

from typing import NamedTuple

from numba import types

I64 = types.int64[::1]  # C-contiguous 1-D
F64 = types.float64[::1]
BOOL = types.boolean[::1]
I64_2D = types.int64[:, ::1]
F64_2D = types.float64[:, ::1]


class Requests(NamedTuple):
    """Per request (row ``k`` = send sequence number; with sessions ``Outputs.send_seq``), read-only
    (but ``recv_rank``, written at the send with sessions)."""

    input_tokens: I64  # prompt tokens
    output_tokens: I64  # requested output tokens
    token_offset: I64  # n + 1 offsets of each request's tokens in the per-token arrays
    recv_rank: I64  # global rank that receives the request
    transfer_ns: I64  # KV-transfer duration (P/D), ns
    spec_alpha: F64  # (n,) or (0,): each request's own acceptance per proposal (NaN: the pool's rates)
    spec_stream: I64  # (n,) or (0,): speculative draws=prompt: each request's prompt id, its draws' stream
    queue_key: I64  # (n,): the waiting-queue key of a keyed queue order (lower first; docs/semantics.md)


class Load(NamedTuple):
    """The load generator and the time cap."""

    closed_loop: types.boolean  # concurrency clients, each sending on receipt
    concurrency: types.int64  # closed-loop clients
    think_ns: types.int64  # closed-loop think time, ns
    cap_ns: types.int64  # time cap, ns (NO_CAP for none)
    # Multi-turn sessions (simcore.engine.sessions_nb; arrays empty without them).
    # With sessions ``closed_loop`` is false and ``Client.tok_server`` is the
    # server within the worker: placement follows the send sequence number s.
    session_mode: types.boolean
    session_closed: types.boolean  # concurrency counts sessions
    session_think_ns: types.int64  # closed loop: a session's end to the next session's first send, ns
    session_first: I64  # per session: its first turn's row
    next_turn: I64  # per row: the row of its session's next turn (-1: the last)
    turn_think_ns: I64  # per row: the previous turn's last receipt to this send, ns
    seq_rank: I64  # per send sequence number: the receiving global rank
    seq_tok_base: I64  # per send sequence number: its worker's first tokenizer server


class Client(NamedTuple):
    """Tokenizer and detokenizer servers (SPEC §4, §7)."""

    tok_server: I64  # per request, global tokenizer server
    tok_service_ns: I64  # per request, tokenizer job service, ns
    num_tok_servers: types.int64  # over all receiving workers
    detok_mode: types.int64  # DETOK_OFF or DETOK_IN_KERNEL (simcore.enums)
    detok_server: I64  # per request, detokenizer server within its worker
    detok_workers: types.int64  # detokenizer servers per token-emitting worker
    detok_params: F64  # (4,) [base_ms, per_output_us, first_output_us, final_output_us]
    chunk_size: types.int64  # most outputs per detokenizer job (0: no limit)


class Topology(NamedTuple):
    """Workers: the aggregated pool, or the prefill pool then the decode pool (SPEC §3)."""

    worker_role: I64  # ROLE_* (simcore.enums)
    worker_first_rank: I64  # first global rank of each worker
    worker_num_ranks: I64  # attention-DP ranks of each worker
    num_decode_workers: types.int64  # the last workers; 0 when aggregated
    worker_async: BOOL  # asynchronous scheduling (docs/semantics.md)
    worker_lockstep: BOOL  # expert parallelism: the ranks step together through the MoE layers


class Ranks(NamedTuple):
    """Per global rank: scheduler limits and policy (SPEC §5, docs/policies.md)."""

    max_batched_tokens: I64  # token budget per pass
    max_sequences: I64  # running requests
    num_blocks: I64  # KV blocks
    block_size: I64  # tokens per block
    seq_limit: I64  # sequence limit L, tokens
    policy: I64  # POLICY_* (simcore.scheduler.nb)
    chunk_tokens: I64  # SGLang chunked_prefill_size / attention_dp
    max_prefill_tokens: I64  # SGLang extend-batch budget
    ratio_params: F64_2D  # (ranks, 3) SGLang new_token_ratio [init, min, decay]
    prefix_caching: BOOL
    reserve_full_isl: BOOL  # vLLM scheduler_reserve_full_isl admission (docs/semantics.md)
    cache_generated_blocks: BOOL  # vLLM caches generated blocks too (docs/prefix-caching.md)
    chunked_prefill: BOOL  # false: a waiting request's whole need must fit the budget (docs/semantics.md)
    # Speculative decoding (docs/speculative.md; simcore.scheduler.spec_nb): 0 drafts: off
    spec_drafts: I64  # proposals verified per decode step
    spec_lookahead: I64  # extra KV slots per scheduled request (vLLM num_lookahead_tokens)
    spec_rates: F64_2D  # (ranks, MAX_DRAFT_TOKENS) per-position acceptance, 0 past the last position
    spec_proposer: F64_2D  # (ranks, 4) [proposer passes per step, ms per pass, us per sequence and pass,
    #                         probability that a step proposes (vLLM n-gram: a match)]
    spec_key: I64  # the acceptance draws' key (counter-based, seeded outside the kernel)
    spec_positions: I64  # most proposals accepted per step
    queue_order: I64  # ORDER_* (simcore.scheduler.nb): FCFS, key then entry instant, key then insertion
    preempt_lowest: BOOL  # vLLM priority: a preemption takes the running request of largest (key, entry instant)
    shuffle_key: I64  # SGLang random: the shuffles' key (counter-based, seeded outside the kernel)


class Timing(NamedTuple):
    """The pass-time models of ``simcore.timing.nb`` (``timing.api.worker_timing``): each pool's
    parameters and table laid end to end, each worker reading its own pool's span."""

    worker_model: I64  # TIMING_* code of each worker's pool
    params: F64  # every distinct pool timing's parameters, end to end
    table: F64  # their flat lookup tables, end to end (empty for fixed and linear)
    worker_span: I64_2D  # (workers, 4): each worker's params[s0:s1] and table[s2:s3]


class Outputs(NamedTuple):
    """Caller-allocated results: per request (``-1``: did not happen; counts 0), per token, progress."""

    send_ns: I64  # send instants: an open loop's given (non-decreasing), a closed loop's filled at each send
    arrival_ns: I64
    first_admit_ns: I64
    first_emit_ns: I64
    finish_ns: I64
    reject_ns: I64
    handoff_ns: I64  # P/D: end of the prefill pass that computed the prompt
    transfer_end_ns: I64
    decode_rank: I64  # P/D: global decode rank
    cached_tokens: I64  # prompt tokens reused from the prefix cache at the first admission
    generated: I64  # tokens emitted
    num_preemptions: I64
    token_emit_ns: I64  # per token (empty in the bounded output mode)
    token_recv_ns: I64  # per token
    progress: I64  # (1,): requests finished or rejected so far, read by another thread
    placed_rank: I64  # global rank that received each request (-1: not placed by the cap; docs/routing.md)
    placed_worker: I64  # routing policies: the worker picked at the send (-1: round robin, or never sent)
    send_seq: I64  # sessions: each row's send sequence number (-1: never sent); empty without
    spec_counts: I64  # (2 + MAX_DRAFT_TOKENS,) verifications, proposals, accepted per position
    failures: I64  # attempts lost to worker failures (docs/failures.md)


class Logs(NamedTuple):
    """Caller-allocated logs with explicit capacity."""

    pass_log: I64_2D  # (rows, PASS_LOG_COLUMNS) one row per rank per pass; 0 rows: none
    pass_ms: F64  # each pass-log row's rank time, ms
    bad_batch: F64  # (8,) the batch whose pass time was not finite and >= 0
    scale_log: I64_2D  # (rows, 3) autoscaling or failures: instant, worker, SCALE_* event (0 rows without)


class Router(NamedTuple):
    """Routing over workers and ranks (``simcore.engine.router_nb``, docs/routing.md)."""

    policy: types.int64  # ROUTE_* (simcore.enums) of the receiving pool
    decode_policy: types.int64  # ROUTE_* of the P/D decode pool
    rank_policy: I64  # per worker, RANK_*
    weights: F64  # (3,) prefix_aware: [prefix, queue, kv_cache]
    draws: I64  # (2n,) or (0,): per send k, two distinct seeded workers of the receiving pool
    decode_draws: I64  # (2n,) or (0,): per handoff h, two distinct seeded decode workers
    tok_index: I64  # per request, its tokenizer server within the worker that receives it
    tok_workers: types.int64  # tokenizer servers per receiving worker
    scale: I64  # (2 x 4,) autoscaling per pool (simcore.engine.autoscale_nb): metric code (0: off), interval, min, startup ns
    scale_target: F64  # (2,) per pool, the metric's target per replica (latency metrics: ms)
    fail: I64  # (NUM_FAIL_PARAMS,) failures (simcore.engine.failures_nb): on (0: off), action, retries, delays, repair
    fail_at: I64  # (2 m,) fixed failures: instant ns, worker, by instant then worker
    fail_gaps: I64  # (workers x gaps,) random failures: time from a start or repair to the next failure, ns


# ------------------------------------------------------------------ the event loop's own state
# Allocated once per run by ``simcore.engine.nb._allocate_loop_nb`` and passed
# to the phase functions of ``_replay_nb``, which are inlined into it (numba
# ``inline="always"``): each phase reads the members it uses into locals once.

BOOL_2D = types.boolean[:, ::1]
I64_3D = types.int64[:, :, ::1]

# ``Loop.counts``: the loop's scalars that phases update, by index.
ARR_SIZE = 0  # engine-arrival heap entries
XFER_SIZE = 1  # KV-transfer-end heap entries
SEND_SIZE = 2  # send heap entries (closed-loop sends; with sessions, releases)
SESS_SIZE = 3  # session send heap entries
NEXT_ROW = 4  # next row to send in table order (n with sessions: that order is idle)
NUM_HANDOFFS = 5  # P/D handoffs so far
PASS_LOG_ROWS = 6  # rows written to Logs.pass_log
NUM_EMITTED = 7  # tokens emitted
NUM_COUNTS = 8


class RequestState(NamedTuple):
    """Per request: the scheduler's view."""

    computed: I64  # tokens whose KV is computed (asynchronous: or scheduled)
    held: I64  # KV blocks held
    sched_n: I64  # tokens scheduled in the pass being built or run
    wait_next: I64  # waiting-queue links
    wait_prev: I64
    planned: I64  # emitted plus in-flight outputs (``Outputs.generated`` itself without async workers)
    sample_flag: BOOL_2D  # (2, n) or (2, 0): async sample slots, whether its chunk samples a token
    drafts: I64  # speculative proposals verified in the pass being built or run
    queued_ns: I64  # the instant it entered its current rank (a keyed queue order's second key), ns
    shuffle_buf: I64  # (n,) or (0,): SGLang random, the waiting queue being shuffled


class RankState(NamedTuple):
    """Per global rank: waiting queue, running requests, KV blocks, SGLang state."""

    wait_head: I64
    wait_tail: I64
    running: I64_2D  # (ranks, max sequences) in running order
    run_len: I64
    blocks_used: I64
    ratio: F64  # SGLang new_token_ratio
    chunked: I64  # SGLang chunked request (-1: none)
    extend: BOOL  # SGLang: the batch built is an extend batch
    inflight: I64  # KV transfers from or to the rank
    shuffles: I64  # SGLang random: waiting-queue shuffles so far (the draws' counter)


class PassState(NamedTuple):
    """Per worker: the running pass, the batch summary being built, the queued async pass."""

    pass_end: I64  # -1: idle
    pass_start: I64
    summary: I64_2D  # (max ranks, 8) SPEC §8, blocks in use, longest decode, proposals verified
    rank_ms: F64  # (max ranks,)
    run_slot: I64  # async: sample slot of the running pass
    queued: BOOL  # async: a pass is built behind the running one
    queued_ms: F64
    queued_summary: I64_3D  # (workers or 0, max ranks, 8)
    queued_rank_ms: F64_2D  # (workers or 0, max ranks)


class Loop(NamedTuple):
    """Event queues (min-heaps of simcore.heap_nb), tokenizer servers, routing state and the counters."""

    arr_key: I64  # engine arrivals by (instant, k; with sessions the send sequence number)
    arr_val: I64
    xfer_key: I64  # KV-transfer ends by (instant, handoff number)
    xfer_val: I64
    handoff_req: I64  # per handoff number, its request
    send_key: I64  # closed-loop sends by instant; with sessions releases (instant, row)
    send_val: I64
    sess_key: I64  # sessions: sends (simcore.engine.sessions_nb)
    sess_val: I64
    seq_row: I64  # sessions: per send sequence number, its row
    session_counters: I64  # (2,)
    tok_free: I64  # per tokenizer server, when it is free
    route: I64  # simcore.engine.router_nb state
    routing: types.boolean  # any policy other than round robin routes (or autoscaling)
    scale: I64  # autoscaling state (simcore.engine.autoscale_nb); empty without
    fail: I64  # failures state (simcore.engine.failures_nb); empty without
    retry_key: I64  # failures: the clients' retries by (instant, row); empty without
    retry_val: I64
    counts: I64  # (NUM_COUNTS,) by the indices above


class DetokBuffers(NamedTuple):
    """The outputs of the pass being ended and the detokenizer servers (SPEC §7)."""

    detok_free: I64  # per detokenizer server, when it is free
    out_token: I64  # per output: where its receipt is stamped (token index; bounded: output index)
    out_req: I64
    out_recv: I64  # bounded mode: the receipts
    recv_target: I64  # out_recv in bounded mode, else Outputs.token_recv_ns
    out_server: I64
    out_flags: I64  # OUT_FIRST, OUT_FINAL
    job_count: I64  # per server: outputs in its job
    job_firsts: I64  # of which request-first tokens
    job_finals: I64  # of which request-final tokens
    job_ends: I64
    job_tokens: I64_2D
    job_flags: I64_2D


# ------------------------------------------------------------------ the groups the loop passes around
# The event loop and its phases take two tuples rather than seventeen:
# the run's (``simulate_engine_nb``'s parameters, in its order) and the loop's
# own state.  Both are borrowed whole (``simcore.engine.nb.borrow_nb`` recurses
# into nested tuples), so reading ``run.requests.input_tokens`` in a phase
# costs what a local did.


class Run(NamedTuple):
    """``simulate_engine_nb``'s parameters, grouped in its order (the inputs, then the outputs)."""

    requests: Requests
    load: Load
    client: Client
    topology: Topology
    ranks: Ranks
    prefix_cache: tuple  # simcore.scheduler.kv_nb's state (opaque here)
    timing: Timing
    out: Outputs
    receipts: tuple  # simcore.receipts_nb's bounded-mode state (opaque here)
    logs: Logs
    router: Router


class LoopState(NamedTuple):
    """The event loop's own state, allocated once per run (``simcore.engine.nb._allocate_loop_nb``)."""

    rq: RequestState
    rk: RankState
    ps: PassState
    lp: Loop
    dt: DetokBuffers
