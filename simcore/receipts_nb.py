"""Per-request receipt statistics: their record layout and the kernels that fill them.

Below every stage (it imports nothing of the simulator): the engine kernel
streams a pass's receipts into them in the bounded output mode
(``stream_receipts_nb``), the metrics stage derives them from the per-token
receipts in the detailed mode (``receipts_nb``) and reads them, so neither
stage imports the other for them.

Contract: ``@njit(cache=True)``, flat int64 arrays in, caller-allocated outputs.
Request k's tokens are ``token_offset[k] .. token_offset[k + 1]``; receipts are
int64 ns, ``-1`` where not received by the cap, and non-decreasing within a
request (one FIFO detokenizer server), so the received tokens are a prefix.
Both modes give the same integers, so bit-identical summaries.  Sums of
squared gaps are exact 124-bit integers (``hi * 2**62 + lo``), which makes the
ITL std independent of summation order.
"""

from __future__ import annotations

import math

from numba import njit

#: Per-request receipt statistics, in the order of the ``receipts`` state tuple:
#: tokens received, first and last receipt (ns, -1: none), the sum of squared
#: ITL gaps (ns^2) as ``hi * 2**62 + lo``, and the smallest and largest gap (ns,
#: -1: fewer than two receipts).
RECEIPT_FIELDS = ("num_received", "first_recv_ns", "last_recv_ns", "gap_sq_hi", "gap_sq_lo", "gap_min_ns", "gap_max_ns")
#: The bounded mode's extra state: 1 where a request's gaps enter the ITL
#: sketch, and the sketch's bucket counts.
STREAM_FIELDS = RECEIPT_FIELDS + ("itl_include", "itl_sketch")

SQ_BITS = 62
SQ_MASK = (1 << SQ_BITS) - 1
_LOW_BITS = 31
_LOW_MASK = (1 << _LOW_BITS) - 1
_MID_MASK = (1 << 30) - 1

#: Log-linear ITL sketch (as HDR histograms): gaps below 2**SKETCH_SUB_BITS ns
#: have a bucket each; above, every power of two [2**e, 2**(e + 1)) is cut into
#: 2**(SKETCH_SUB_BITS - 1) equal buckets, represented by their midpoints, so
#: a representative is within SKETCH_ALPHA = 2**-SKETCH_SUB_BITS relative of
#: every gap in its bucket.  Integer shifts only: no logarithm per gap.
SKETCH_SUB_BITS = 11
SKETCH_ALPHA = 2.0**-SKETCH_SUB_BITS
SKETCH_EXACT = 1 << SKETCH_SUB_BITS
SKETCH_PER_OCTAVE = 1 << (SKETCH_SUB_BITS - 1)
SKETCH_BUCKETS = SKETCH_EXACT + (63 - SKETCH_SUB_BITS) * SKETCH_PER_OCTAVE


@njit(cache=True, inline="always")
def _sq_add_nb(hi, lo, g):
    """``(hi, lo) + g**2`` for the 124-bit total ``hi * 2**62 + lo`` (0 <= lo < 2**62, 0 <= g < 2**63)."""
    a = g >> _LOW_BITS
    b = g & _LOW_MASK
    lo += b * b
    hi += lo >> SQ_BITS
    lo &= SQ_MASK
    if a != 0:
        # g**2 = a**2 * 2**62 + a*b * 2**32 + b**2
        ab = a * b
        lo += (ab & _MID_MASK) << 32
        hi += (ab >> 30) + a * a + (lo >> SQ_BITS)
        lo &= SQ_MASK
    return hi, lo


@njit(cache=True, inline="always")
def _sketch_bucket_nb(g):
    """The ITL-sketch bucket of a gap of g ns (0 <= g < 2**63)."""
    if g < SKETCH_EXACT:
        return g
    octave = math.frexp(g)[1] - 1  # floor(log2 g), but the conversion may round up
    if (g >> octave) == 0:
        octave -= 1
    shift = octave - (SKETCH_SUB_BITS - 1)
    return SKETCH_EXACT + (octave - SKETCH_SUB_BITS) * SKETCH_PER_OCTAVE + (g >> shift) - SKETCH_PER_OCTAVE


@njit(cache=True)
def receipts_nb(token_offset, token_recv_ns, num_received, first_recv_ns, last_recv_ns, gap_sq_hi, gap_sq_lo, gap_min_ns, gap_max_ns):
    """Per request: the :data:`RECEIPT_FIELDS` statistics of its received tokens.

    Parameters
    ----------
    token_offset : ndarray(int64, ndim=1)
        ``n + 1`` token offsets.
    token_recv_ns : ndarray(int64, ndim=1)
        Receipt instant of every token, ns (-1: not received).
    num_received, first_recv_ns, last_recv_ns, gap_sq_hi, gap_sq_lo, gap_min_ns, gap_max_ns : ndarray(int64, ndim=1)
        Out, per request: count, first and last receipt (ns), the sum of
        squared gaps (ns^2, ``hi * 2**62 + lo``), smallest and largest gap (ns).
    """
    for k in range(num_received.shape[0]):
        lo = token_offset[k]
        hi = token_offset[k + 1]
        count = 0
        while lo + count < hi and token_recv_ns[lo + count] != -1:
            count += 1
        num_received[k] = count
        first_recv_ns[k] = token_recv_ns[lo] if count > 0 else -1
        last_recv_ns[k] = token_recv_ns[lo + count - 1] if count > 0 else -1
        sq_hi = 0
        sq_lo = 0
        smallest = -1
        largest = -1
        for i in range(lo + 1, lo + count):
            g = token_recv_ns[i] - token_recv_ns[i - 1]
            sq_hi, sq_lo = _sq_add_nb(sq_hi, sq_lo, g)
            if smallest < 0 or g < smallest:
                smallest = g
            if g > largest:
                largest = g
        gap_sq_hi[k] = sq_hi
        gap_sq_lo[k] = sq_lo
        gap_min_ns[k] = smallest
        gap_max_ns[k] = largest


@njit(cache=True)
def stream_receipts_nb(num_out, out_req, out_recv, cap_ns, state):
    """Fold one pass's receipts into the bounded mode's per-request statistics.

    Each request has at most one output per pass and its receipts never
    decrease, so passes in end order give every request's receipts in token
    order, as ``receipts_nb`` reads them.

    Parameters
    ----------
    num_out : int
        Outputs of the pass.
    out_req, out_recv : ndarray(int64, ndim=1)
        Request and receipt instant (ns) of each output.
    cap_ns : int
        Time cap, ns: later receipts do not happen.
    state : tuple of ndarray(int64, ndim=1)
        The :data:`STREAM_FIELDS` arrays, updated in place.
    """
    num_received, first_recv, last_recv, sq_hi, sq_lo, gap_min, gap_max, include, sketch = state
    for e in range(num_out):
        end = out_recv[e]
        if end > cap_ns:
            continue
        k = out_req[e]
        if num_received[k] == 0:
            first_recv[k] = end
        else:
            g = end - last_recv[k]
            sq_hi[k], sq_lo[k] = _sq_add_nb(sq_hi[k], sq_lo[k], g)
            if gap_min[k] < 0 or g < gap_min[k]:
                gap_min[k] = g
            if g > gap_max[k]:
                gap_max[k] = g
            if include[k]:
                sketch[_sketch_bucket_nb(g)] += 1
        last_recv[k] = end
        num_received[k] += 1
