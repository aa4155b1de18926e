"""simcore.memory: large per-token arrays mapped without huge pages give the same arrays and the same runs."""

from __future__ import annotations

import mmap

import numpy as np

import simcore
from simcore import memory


def mapped(array: np.ndarray) -> bool:
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)


def test_small_arrays_are_numpy_full():
    array = memory.filled((3, 5), -1)
    assert array.dtype == np.int64 and array.flags.c_contiguous and array.flags.writeable
    assert not mapped(array)
    assert (array == -1).all()


def test_large_arrays_are_mapped_filled_and_writable(monkeypatch):
    monkeypatch.setattr(memory, "NO_HUGEPAGE_BYTES", 64)
    array = memory.filled((2, 9), -1)  # 144 bytes
    assert mapped(array)
    assert array.shape == (2, 9) and array.flags.c_contiguous and array.flags.writeable
    assert (array == -1).all()
    array[1, 3] = 7
    assert array.sum() == -17 + 7


def test_a_run_with_mapped_per_token_arrays_is_identical(monkeypatch):
    config = {"workload": {"num_requests": 64}, "detokenization": {"workers": 2, "base_ms": 0.5}}
    expected = simcore.run(config)
    monkeypatch.setattr(memory, "NO_HUGEPAGE_BYTES", 1)
    mapped = simcore.run(config)
    assert mapped.requests.equals(expected.requests)
    assert mapped.summary == expected.summary
