"""What the wrappers build for the engine kernel matches the declared state (names, dtypes, ndim).

The members' numba types are declared once, as the annotations of the
NamedTuples in ``simcore.engine.state`` and ``simcore.scheduler.state``; a
builder that gives another dtype, ndim or layout would make numba compile
another kernel (or fail), so each built tuple is checked against them, for the
single-configuration kernel and, one dimension up, for the batch kernel.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import types

from simcore.config import load_config
from simcore.engine import nb
from simcore.engine.api import allocate_buffers, prepare
from simcore.engine.batch import STACKED_INPUTS, _stack_state
from simcore.engine.state import DetokBuffers, Logs, Loop, Outputs, PassState, RankState, RequestState
from simcore.workload.api import build_requests, send_instants_ns

CASES = {
    "closed aggregated": {"workload": {"num_requests": 20}, "load": {"concurrency": 4}},
    "open P/D": {
        "workload": {"num_requests": 20},
        "load": {"type": "poisson", "request_rate": 10.0},
        "engine": {"mode": "disaggregated"},
    },
    "bounded sglang": {"workload": {"num_requests": 20}, "output": {"mode": "bounded"}, "engine": {"policy": "sglang"}},
}


def declared(cls) -> tuple:
    """The declared class and member types (numba types a NamedTuple of equal members as a NamedUniTuple)."""
    return cls, tuple(cls.__annotations__.values())


def typed(nbtype: types.BaseNamedTuple) -> tuple:
    return nbtype.instance_class, tuple(nbtype.types)


def stacked(member: types.Type) -> types.Array:
    """The declared member with a leading configuration axis (a scalar becomes a 1-D array)."""
    if isinstance(member, types.Array):
        return types.Array(member.dtype, member.ndim + 1, "C")
    return types.Array(member, 1, "C")


def _prepared(mapping):
    cfg = load_config(mapping)
    rng = np.random.default_rng(cfg.seed)
    table = build_requests(cfg, None, rng)
    send = None if cfg.load.closed_loop else send_instants_ns(cfg.load, table, rng)
    return prepare(cfg, table, send, record_passes=True)


@pytest.mark.parametrize("case", sorted(CASES))
def test_prepared_inputs_have_the_declared_members_and_types(case):
    prep = _prepared(CASES[case])
    for name in STACKED_INPUTS:
        state = getattr(prep, name)
        assert state._fields == tuple(type(state).__annotations__), name
        assert typed(numba.typeof(state)) == declared(type(state)), name


@pytest.mark.parametrize("bounded", [False, True])
def test_allocated_outputs_have_the_declared_types(bounded):
    buffers = allocate_buffers(5, 12, 7, bounded=bounded)
    assert typed(numba.typeof(buffers.out)) == declared(Outputs)
    assert typed(numba.typeof(buffers.logs)) == declared(Logs)
    assert numba.typeof(buffers.send_ns) == types.int64[::1]
    batch = allocate_buffers(5, 12, 0, batch=3, bounded=bounded)
    for state, cls in ((batch.out, Outputs), (batch.logs, Logs)):
        assert [numba.typeof(a) for a in state] == [stacked(t) for t in cls.__annotations__.values()]
        assert all(a.shape[0] == 3 for a in state)


def test_batch_inputs_are_the_declared_members_one_dimension_up():
    preps = [_prepared(CASES["closed aggregated"]), _prepared({**CASES["closed aggregated"], "load": {"concurrency": 9}})]
    for name in STACKED_INPUTS:
        batch = _stack_state([getattr(prep, name) for prep in preps], name)
        members = type(batch).__annotations__.values()
        assert [numba.typeof(a) for a in batch] == [stacked(t) for t in members], name
        assert all(a.shape[0] == len(preps) for a in batch), name


def test_the_kernel_compiles_for_the_declared_state():
    prep = _prepared(CASES["closed aggregated"])
    buffers = allocate_buffers(prep.n, prep.num_tokens, prep.pass_rows)
    args = prep.kernel_args(buffers, prep.prefix_cache())
    status, _, _ = nb.simulate_engine_nb(*args)
    assert status == nb.OK
    signature = tuple(numba.typeof(a) for a in args)
    assert signature in nb.simulate_engine_nb.signatures
    for position, name in ((0, "requests"), (1, "load"), (2, "client"), (3, "topology"), (4, "ranks"), (6, "timing")):
        assert typed(signature[position]) == declared(type(getattr(prep, name))), name
    assert typed(signature[7]) == declared(Outputs) and typed(signature[9]) == declared(Logs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_event_loop_state_has_the_declared_types(case):
    """The loop's own state, allocated inside the kernel per run, has the types declared beside the inputs."""
    prep = _prepared(CASES[case])
    buffers = allocate_buffers(prep.n, prep.num_tokens, prep.pass_rows, bounded=prep.bounded)
    requests, load, client, topology, ranks, _, _, out, receipts, _, router = prep.kernel_args(
        buffers, prep.prefix_cache()
    )
    states = nb._allocate_loop_nb(requests, load, client, topology, ranks, out, receipts, router)
    for state, cls in zip(states, (RequestState, RankState, PassState, Loop, DetokBuffers), strict=True):
        assert type(state) is cls
        assert typed(numba.typeof(state)) == declared(cls), cls.__name__
