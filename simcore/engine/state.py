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
    detok_mode: types.int64  # DETOK_OFF, DETOK_IN_KERNEL or DETOK_DEFERRED (simcore.client.nb)
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


class Timing(NamedTuple):
    """The pass-time model of ``simcore.timing.nb`` (``timing_arrays``)."""

    model: types.int64
    params: F64
    table: F64  # flat lookup tables (empty for fixed and linear)


class Outputs(NamedTuple):
    """Caller-allocated results: per request (``-1``: did not happen; counts 0), per token, progress."""

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
    token_recv_ns: I64  # per token (left -1 in DETOK_DEFERRED mode)
    progress: I64  # (1,): requests finished or rejected so far, read by another thread
    placed_rank: I64  # global rank that received each request (-1: not placed by the cap; docs/routing.md)
    placed_worker: I64  # routing policies: the worker picked at the send (-1: round robin, or never sent)
    send_seq: I64  # sessions: each row's send sequence number (-1: never sent); empty without


class Logs(NamedTuple):
    """Caller-allocated logs with explicit capacity."""

    emit_log: I64  # token indices in emission order (DETOK_DEFERRED only)
    pass_log: I64_2D  # (rows, PASS_LOG_COLUMNS) one row per rank per pass; 0 rows: none
    pass_ms: F64  # each pass-log row's rank time, ms
    bad_batch: F64  # (8,) the batch whose pass time was not finite and >= 0


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
