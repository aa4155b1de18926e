"""Batched engine replay: many configurations of one shape in one parallel kernel call.

``simulate_engine_batch`` prepares each configuration exactly as
:func:`simcore.engine.api.simulate_engine` does (:func:`~simcore.engine.api.prepare`),
stacks the per-configuration inputs into 2-D arrays, runs
``nb.simulate_batch_nb`` once (``prange`` over configurations) and turns row
``c`` of the outputs into the EngineRun that ``simulate_engine`` would return
(:func:`~simcore.engine.api.finish`).

*One shape* (what the configurations must share): the number of requests and
their output lengths (the per-token arrays have one width), the deployment's
workers and ranks (mode, replicas, attention-DP ranks), the detokenizer's
evaluation mode (off, in the kernel, or after the run), the output mode, no
pass log, and equal prefix-cache state sizes.  Everything else may differ:
prompts, request ids, send instants, closed or open loop, concurrency, think
time, tokenizer and detokenizer servers and costs, scheduler limits, policy,
timing model and coefficients, time cap.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from simcore.settings import SimConfig
from simcore.engine import nb
from simcore.engine.api import (
    EngineRun,
    Prepared,
    allocate_buffers,
    finish,
    itl_rerun_mask,
    kernel_args,
    prepare,
    run_prepared,
)
from simcore.workload.api import RequestTable

#: Kernel inputs (state tuple, member) equal in a batch, with the field a mismatch reports.
SHARED_INPUTS = {
    ("requests", "output_tokens"): "the requests' output lengths (output_tokens)",
    ("requests", "token_offset"): "the requests' output lengths (token_offset)",
    ("requests", "spec_stream"): "the speculative draws' streams (speculative.draws, prompt_id)",
    ("requests", "recv_rank"): "topology (receiving rank of each request: replicas, attention_dp)",
    ("client", "detok_mode"): "detokenization mode (detok_mode: detokenization on or off, or evaluated after the run)",
    ("topology", "worker_role"): "topology (worker roles: engine.mode, replicas)",
    ("topology", "worker_first_rank"): "topology (first rank of each worker: replicas, attention_dp)",
    ("topology", "worker_num_ranks"): "topology (ranks of each worker: attention_dp)",
    ("topology", "num_decode_workers"): "topology (decode workers)",
    ("load", "session_first"): "the sessions (the rows of their first turns)",
}
#: The typed inputs stacked member by member (``simcore.engine.state``).
STACKED_INPUTS = ("requests", "load", "client", "topology", "ranks", "timing", "router")
#: Members that are padded to the widest row (read by index only).
PADDED_INPUTS = (("timing", "params"), ("timing", "table"), ("router", "draws"), ("router", "decode_draws"))


def shape_of(prep: Prepared) -> dict[str, object]:
    """The fields that must be equal for configurations to share a batch, by name.

    Parameters
    ----------
    prep : Prepared
        One configuration's prepared inputs.

    Returns
    -------
    dict of str to object
        Human-readable field label -> comparable value (arrays as ``(shape, bytes)``).
    """
    shape: dict[str, object] = {"the number of requests (n)": prep.n}
    for (state, member), label in SHARED_INPUTS.items():
        value = getattr(getattr(prep, state), member)
        shape[label] = (value.shape, value.tobytes()) if isinstance(value, np.ndarray) else value
    shape["record_passes (output.passes)"] = prep.record_passes
    shape["the output mode (output.mode)"] = prep.bounded
    num_slots, num_ranks, ident_offset, ident = prep.cache_shape
    shape["prefix-cache state sizes (prefix_caching, num_blocks, prompt blocks)"] = (
        num_slots, num_ranks, ident_offset.shape[0], ident.shape[0]
    )
    shape["the prefix-cache model (node tree or blocks)"] = (prep.radix_tree, prep.kv_tree)
    offload = prep.offload_shape
    shape["CPU-tier sizes (kv_offload.num_blocks per rank, requests)"] = (offload.capacity.tobytes(), offload.n)
    return shape


def batch_key(prep: Prepared) -> tuple:
    """A hashable form of :func:`shape_of`: configurations with equal keys share a batch.

    Parameters
    ----------
    prep : Prepared

    Returns
    -------
    tuple
        The values of ``shape_of(prep)``, in order.
    """
    return tuple(shape_of(prep).values())


def _mismatch(first: dict[str, object], other: dict[str, object]) -> str | None:
    for label, value in first.items():
        if other[label] != value:
            return label
    return None


def simulate_engine_batch(
    cfgs: Sequence[SimConfig],
    requests: RequestTable | Sequence[RequestTable],
    send_ns_list: Sequence[np.ndarray | None] | None = None,
) -> list[EngineRun]:
    """Simulate configurations of one shape in one parallel kernel call.

    Parameters
    ----------
    cfgs : sequence of SimConfig
        The configurations (``output.passes`` must be false).
    requests : RequestTable or sequence of RequestTable
        One table for all, or one per configuration.
    send_ns_list : sequence of (ndarray(int64) or None), optional
        Each configuration's open-loop send instants (None for a closed loop);
        omitted: all closed loops.

    Returns
    -------
    list of EngineRun
        Equal, array for array, to ``simulate_engine(cfg, table, send_ns)``
        of each configuration (arrays may be rows of shared 2-D buffers).

    Raises
    ------
    ValueError
        The configurations are not of one shape (the message names the field).
    simcore.ConfigError
        As ``simulate_engine`` (the first configuration, in order, whose
        timing model gave a bad pass time).
    """
    cfgs = list(cfgs)
    if not cfgs:
        return []
    tables = [requests] * len(cfgs) if isinstance(requests, RequestTable) else list(requests)
    sends = [None] * len(cfgs) if send_ns_list is None else list(send_ns_list)
    if len(tables) != len(cfgs) or len(sends) != len(cfgs):
        raise ValueError(
            f"simulate_engine_batch: {len(cfgs)} configurations but {len(tables)} request tables "
            f"and {len(sends)} send-instant arrays"
        )
    preps = [prepare(cfg, table, send) for cfg, table, send in zip(cfgs, tables, sends)]
    shapes = [shape_of(prep) for prep in preps]
    for index, shape in enumerate(shapes[1:], start=1):
        field = _mismatch(shapes[0], shape)
        if field is not None:
            raise ValueError(
                f"simulate_engine_batch: configuration {index} differs from configuration 0 in "
                f"{field}; a batch needs one shape (use simcore.run_batch to group them)"
            )
    return run_prepared_batch(preps)


def run_prepared_batch(preps: Sequence[Prepared]) -> list[EngineRun]:
    """Run prepared configurations of one shape (checked by the caller) in one kernel call.

    Parameters
    ----------
    preps : sequence of Prepared
        C >= 1 configurations with equal :func:`batch_key`.

    Returns
    -------
    list of EngineRun
        One per configuration, in order (arrays may be rows of shared 2-D buffers).

    Raises
    ------
    simcore.ConfigError
        The first configuration whose timing model gave a bad pass time.
    """
    first = preps[0]
    count = len(preps)
    stacked = {name: _stack_state([getattr(prep, name) for prep in preps], name) for name in STACKED_INPUTS}
    buffers = allocate_buffers(first.n, first.num_tokens, 0, batch=count, bounded=first.bounded,
                               scale_rows=max(prep.scale_rows for prep in preps))
    for c, prep in enumerate(preps):
        if prep.send is not None:
            buffers.send_ns[c] = prep.send
    caches = [prep.prefix_cache() for prep in preps]
    prefix_cache = tuple(np.stack(arrays) for arrays in zip(*caches))
    args = kernel_args(**stacked, buffers=buffers, prefix_cache=prefix_cache)
    status = nb.simulate_batch_nb(*args, nb.engine_address(args))
    runs = []
    for c, prep in enumerate(preps):
        if status[c, 0] == nb.SCALE_LOG_FULL:  # its scaling log grows in a run of its own
            runs.append(run_prepared(prep))
            continue
        row = _row(buffers, c)
        itl_include = itl_rerun_mask(prep, row) if status[c, 0] == nb.OK else None
        if itl_include is not None:  # bounded mode with incomplete requests
            runs.append(run_prepared(prep, itl_include))
            continue
        run = finish(prep, row, int(status[c, 0]), int(status[c, 1]), int(status[c, 2]))
        runs.append(prep.with_offload(run, prefix_cache[0][c]))
    return runs


def _row(value, c: int):
    """Configuration c's part of batched kernel outputs: row c of every array, tuples kept."""
    if isinstance(value, tuple):
        rows = [_row(member, c) for member in value]
        return type(value)(*rows) if hasattr(value, "_fields") else tuple(rows)
    return value[c]


def _stack_state(states: list, name: str):
    """One state tuple (``simcore.engine.state``) per configuration as one with a leading configuration axis."""
    members = (
        _stack([getattr(state, member) for state in states], pad=(name, member) in PADDED_INPUTS)
        for member in states[0]._fields
    )
    return type(states[0])(*members)


def _stack(values: list, *, pad: bool) -> np.ndarray:
    """Per-configuration values as one C-contiguous array with a leading configuration axis."""
    first = values[0]
    if not isinstance(first, np.ndarray):
        dtype = np.bool_ if isinstance(first, (bool, np.bool_)) else np.int64
        return np.array(values, dtype=dtype)
    if pad:
        width = max(v.shape[0] for v in values)
        stacked = np.zeros((len(values), width), dtype=first.dtype)
        for c, v in enumerate(values):
            stacked[c, : v.shape[0]] = v
        return stacked
    return np.ascontiguousarray(np.stack(values))
