"""vllm_bench.json's peak of tokens per second: counted without a counter per simulated second."""

from __future__ import annotations

import collections
import tracemalloc

import numpy as np

from runners.export import _most_common_count


def test_most_common_count_is_the_largest_multiplicity_either_way():
    rng = np.random.default_rng(7)
    values = rng.integers(0, 50, size=400)
    expected = max(collections.Counter(values.tolist()).values())
    assert _most_common_count(values, 50) == expected  # a counter per second
    assert _most_common_count(values, 10**12) == expected  # the distinct seconds only


def test_a_sparse_span_allocates_by_the_values_not_the_seconds():
    # three receipts, 1e12 seconds apart at most: a table of 1e12 counters would need 8 TB
    values = np.array([3, 10**12 - 1, 3], dtype=np.int64)
    tracemalloc.start()
    try:
        assert _most_common_count(values, 10**12) == 2
        assert tracemalloc.get_traced_memory()[1] < 1 << 20
    finally:
        tracemalloc.stop()
