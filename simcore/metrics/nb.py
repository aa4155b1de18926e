"""Metric kernels: per-request receipt statistics, ITL order statistics and the ITL sketch.

Contract: ``@njit(cache=True)``, flat int64 arrays in, caller-allocated outputs.
Request k's tokens are ``token_offset[k] .. token_offset[k + 1]``; receipts are
int64 ns, ``-1`` where not received by the cap, and non-decreasing within a
request (one FIFO detokenizer server), so the received tokens are a prefix.

The per-request statistics (``RECEIPT_FIELDS``), their kernels (``receipts_nb``,
``stream_receipts_nb``) and the sketch's buckets are declared below the stages,
in ``simcore.receipts_nb`` (the engine kernel streams receipts into them); they
are re-exported here.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simcore.receipts_nb import (  # noqa: F401  re-exported for the metrics stage
    RECEIPT_FIELDS,
    SKETCH_ALPHA,
    SKETCH_BUCKETS,
    SKETCH_SUB_BITS,
    SQ_BITS,
    STREAM_FIELDS,
    SKETCH_EXACT,
    SKETCH_PER_OCTAVE,
    receipts_nb,
    stream_receipts_nb,
)

SELECT_DIGIT_BITS = 16
SELECT_TABLE_MAX = 1 << 20  # prefixes looked up in a table up to this range, else compared


@njit(cache=True)
def itl_order_statistics_nb(token_offset, token_recv_ns, num_received, include, max_gap_ns, ranks, out):
    """Exact order statistics of the pooled gaps (ns) without pooling or sorting them.

    A radix selection: each level reads every included gap once and counts the
    next ``SELECT_DIGIT_BITS`` bits of those that share a target's known
    leading bits; two levels cover gaps below 2**32 ns. Gaps sharing no
    target's leading bits are counted in a spare row rather than skipped: with
    speculative decoding most gaps are 0 (a pass's tokens received together)
    and the rest scattered, so a branch on a match would be mispredicted at
    almost every other gap.

    Parameters
    ----------
    token_offset, token_recv_ns, num_received : ndarray(int64, ndim=1)
        As in ``receipts_nb``.
    include : ndarray(bool, ndim=1)
        Requests whose gaps count (the completed ones).
    max_gap_ns : int
        The largest included gap, ns.
    ranks : ndarray(int64, ndim=1)
        0-based ranks wanted (each below the number of included gaps).
    out : ndarray(int64, ndim=1)
        Out: the gap of each rank, ns.
    """
    bits = 0
    while bits < 63 and (max_gap_ns >> bits) > 0:
        bits += 1
    m = ranks.shape[0]
    prefix = np.zeros(m, dtype=np.int64)  # each target's leading bits found so far
    remaining = ranks.copy()  # its rank among the gaps that share them
    group = np.empty(m, dtype=np.int64)
    shift = bits
    while shift > 0:
        step = min(SELECT_DIGIT_BITS, shift)
        shift -= step
        high = shift + step
        distinct = np.empty(m, dtype=np.int64)
        num_distinct = 0
        for i in range(m):
            group[i] = -1
            for j in range(num_distinct):
                if distinct[j] == prefix[i]:
                    group[i] = j
            if group[i] < 0:
                distinct[num_distinct] = prefix[i]
                group[i] = num_distinct
                num_distinct += 1
        # Prefixes map to their group through a table while the range is small.
        prefix_range = (max_gap_ns >> high) + 1
        use_table = prefix_range <= SELECT_TABLE_MAX
        spare = num_distinct  # the row of the gaps no target shares
        table = np.full(prefix_range if use_table else 1, spare, dtype=np.int64)
        if use_table:
            for j in range(num_distinct):
                table[distinct[j]] = j
        mask = (1 << step) - 1
        counts = np.zeros((num_distinct + 1, 1 << step), dtype=np.int64)
        for k in range(include.shape[0]):
            if not include[k]:
                continue
            lo = token_offset[k]
            for i in range(lo + 1, lo + num_received[k]):
                g = token_recv_ns[i] - token_recv_ns[i - 1]
                p = g >> high
                j = spare
                if use_table:
                    j = table[p]
                else:
                    for u in range(num_distinct):
                        if distinct[u] == p:
                            j = u
                counts[j, (g >> shift) & mask] += 1
        for i in range(m):
            j = group[i]
            r = remaining[i]
            d = 0
            while r >= counts[j, d]:
                r -= counts[j, d]
                d += 1
            remaining[i] = r
            prefix[i] = (prefix[i] << step) | d
    for i in range(m):
        out[i] = prefix[i]


def sketch_values(buckets: np.ndarray) -> np.ndarray:
    """The representative gap (ns, float64) of each sketch bucket.

    Parameters
    ----------
    buckets : ndarray(int64, ndim=1)
        Bucket indices.

    Returns
    -------
    ndarray(float64, ndim=1)
        The gap itself below ``2**SKETCH_SUB_BITS`` ns, else the bucket's midpoint.
    """
    buckets = np.asarray(buckets, dtype=np.int64)
    above = np.maximum(buckets - SKETCH_EXACT, 0)
    octave = SKETCH_SUB_BITS + above // SKETCH_PER_OCTAVE
    width = np.exp2(octave - (SKETCH_SUB_BITS - 1))
    lower = (SKETCH_PER_OCTAVE + above % SKETCH_PER_OCTAVE) * width
    return np.where(buckets < SKETCH_EXACT, buckets.astype(np.float64), lower + width / 2)
