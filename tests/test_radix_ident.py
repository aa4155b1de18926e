"""The radix tree's identities computed from ``hash_ids`` (simcore.scheduler.radix_ident_nb)
give the materialised array's identities (simcore.scheduler.prefix.radix_block_identities),
and so its equalities, block by block and run by run."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from simcore.scheduler.prefix import radix_block_identities, radix_tree_identities
from simcore.scheduler.radix_ident_nb import ident_at_nb, same_run_nb
from simcore.workload.api import RequestTable

TRACE_BLOCK = 4


def table(hash_ids, input_tokens, output_tokens, sessions=None):
    n = len(hash_ids)
    return RequestTable(
        pa.array([str(k) for k in range(n)], type=pa.string()),
        np.array(input_tokens, dtype=np.int64),
        np.array(output_tokens, dtype=np.int64),
        hash_ids=pa.array(hash_ids, type=pa.list_(pa.int64())),
        session=None if sessions is None else np.array(sessions, dtype=np.int64),
        turn=None if sessions is None else np.zeros(n, dtype=np.int64),
    )


# Shared first hashes, a short list (prompt past its hashes), an empty one, a
# prompt ending inside a trace block, a one-token prompt.
CASES = [
    ([[10, 20, 30], [10, 20, 40], [10, 50], [10, 20, 30], [], [60]], [12, 11, 13, 12, 5, 1], [3, 2, 1, 4, 2, 1], None),
    ([[1, 2], [1, 2, 3], [1, 2, 3]], [8, 12, 10], [5, 1, 7], [0, 0, 0]),  # one session's turns
]


def materialised_and_computed(requests, block_size):
    offset, ident = radix_block_identities(requests, block_size, TRACE_BLOCK, 0)
    tree_offset, computed = radix_tree_identities(requests, block_size, TRACE_BLOCK, 0)
    np.testing.assert_array_equal(tree_offset, offset)
    assert computed[0] < 0 and computed.shape[0] < 64  # a few int64 per request, not one per block
    return offset, ident, computed


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("block_size", [1, 2, 3, 4, 5, 8])  # dividing the trace block of 4, or not, or larger
def test_computed_identities_are_the_materialised_ones(case, block_size):
    hash_ids, inputs, outputs, sessions = case
    offset, ident, computed = materialised_and_computed(table(hash_ids, inputs, outputs, sessions), block_size)
    for k in range(offset.shape[0] - 1):
        for b in range(offset[k], offset[k + 1]):
            assert ident_at_nb(computed, k, b) == ident[b]
            assert ident_at_nb(ident, k, b) == ident[b]


def test_identities_worked_by_hand():
    # T = 4, bs = 2; distinct hashes 10, 20, 30 -> ranks 0, 1, 2; unique ids from 3 x 4 = 12.
    # Request 0 (7 prompt tokens, 2 outputs: 5 blocks): blocks end at tokens 2, 4, 6
    # (trace blocks 0, 0, 1), then one partial prompt block and a generated one.
    # Request 1 (8 tokens, hashes [10, 30]) shares block 0 and 1 (hash 10), not 2 and 3.
    requests = table([[10, 20], [10, 30]], [7, 8], [2, 1])
    _, computed = radix_tree_identities(requests, 2, TRACE_BLOCK, 0)
    got = [[ident_at_nb(computed, 0, b) for b in range(0, 5)], [ident_at_nb(computed, 1, b) for b in range(5, 10)]]
    expected = [[0 * 4 + 1, 0 * 4 + 3, 1 * 4 + 1, 12 + 3, 12 + 4], [1, 3, 2 * 4 + 1, 2 * 4 + 3, 12 + 9]]
    assert got == expected
    _, materialised = radix_block_identities(requests, 2, TRACE_BLOCK, 0)
    assert materialised.tolist() == expected[0] + expected[1]
    # Runs from depth 0: equal while hash 10 lasts (2 blocks), then 30 differs from 20.
    assert same_run_nb(computed, 0, 0, 1, 5, 4) == 2
    assert same_run_nb(computed, 0, 0, 1, 5, 1) == 1


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("block_size", [1, 3, 4, 6])
def test_runs_compare_as_the_materialised_identities(case, block_size):
    """Every run of two requests' blocks at one depth whose first blocks are
    equal: the leading equal blocks, as counted on the materialised array."""
    hash_ids, inputs, outputs, sessions = case
    offset, ident, computed = materialised_and_computed(table(hash_ids, inputs, outputs, sessions), block_size)
    counts = np.diff(offset)
    compared = 0
    for a in range(counts.shape[0]):
        for k in range(counts.shape[0]):
            for depth in range(min(counts[a], counts[k])):
                src, here = offset[a] + depth, offset[k] + depth
                if ident[src] != ident[here]:
                    continue
                for span in range(1, min(counts[a], counts[k]) - depth + 1):
                    equal = 0
                    while equal < span and ident[src + equal] == ident[here + equal]:
                        equal += 1
                    assert same_run_nb(computed, a, src, k, here, span) == equal
                    assert same_run_nb(ident, a, src, k, here, span) == equal
                    compared += 1
    assert compared > 0
