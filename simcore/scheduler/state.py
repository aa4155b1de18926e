"""The scheduler's mutable state inside the engine kernel, declared once.

A NamedTuple of arrays (numba compiles it like a tuple, also with
``cache=True``), allocated by ``simcore.scheduler.nb.scheduler_state_nb`` at
the start of a run and passed whole to the batch builders.  Per request
(row ``k``) or per global rank ``g``; token counts and block counts int64.
"""

from typing import NamedTuple

from numba import types

I64 = types.int64[::1]  # C-contiguous 1-D


class SchedulerState(NamedTuple):
    """Token counts, KV holdings, waiting queues and running batches."""

    computed: I64  # per request, tokens whose KV is computed (or, asynchronous, scheduled)
    held: I64  # per request, KV blocks held
    sched_n: I64  # per request, tokens scheduled in the pass being built or run
    wait_next: I64  # per request, next in its rank's waiting queue (-1: none)
    wait_prev: I64  # per request, previous in its rank's waiting queue (-1: none)
    wait_head: I64  # per rank, first waiting request (-1: empty)
    wait_tail: I64  # per rank, last waiting request (-1: empty)
    running: types.int64[:, ::1]  # (ranks, max sequences) running requests, in running order
    run_len: I64  # per rank, running requests
    blocks_used: I64  # per rank, in-use KV blocks
    ratio: types.float64[::1]  # per rank, SGLang new_token_ratio
    chunked: I64  # per rank, SGLang chunked request (-1: none)
    extend: types.boolean[::1]  # per rank, SGLang: the batch built is an extend batch
    inflight: I64  # per rank, KV transfers from or to it
