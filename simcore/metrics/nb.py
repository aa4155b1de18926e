"""Metric kernels over the per-token receipt array.

Contract: ``@njit(cache=True)``, flat int64 arrays in, caller-allocated outputs.
Request k's tokens are ``token_offset[k] .. token_offset[k + 1]``; receipts are
int64 ns, ``-1`` where not received by the cap, and non-decreasing within a
request (one FIFO detokenizer server), so the received tokens are a prefix.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def receipts_nb(token_offset, token_recv_ns, num_received, first_recv_ns, last_recv_ns):
    """Per request: tokens received by the cap, first and last receipt (ns, -1: none).

    Parameters
    ----------
    token_offset : ndarray(int64, ndim=1)
        ``n + 1`` token offsets.
    token_recv_ns : ndarray(int64, ndim=1)
        Receipt instant of every token, ns (-1: not received).
    num_received, first_recv_ns, last_recv_ns : ndarray(int64, ndim=1)
        Out, per request: count, first and last receipt instants, ns.
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


@njit(cache=True)
def itl_gaps_nb(token_offset, token_recv_ns, num_received, include, out):
    """Every gap between consecutive receipts of the included requests, ms.

    Parameters
    ----------
    token_offset, token_recv_ns, num_received : ndarray(int64, ndim=1)
        As in ``receipts_nb``.
    include : ndarray(bool, ndim=1)
        Requests whose gaps count (the completed ones).
    out : ndarray(float64, ndim=1)
        Out: the gaps, in request then token order; its length is the sum of
        ``num_received - 1`` over included requests.
    """
    j = 0
    for k in range(include.shape[0]):
        if not include[k]:
            continue
        lo = token_offset[k]
        for i in range(lo + 1, lo + num_received[k]):
            out[j] = (token_recv_ns[i] - token_recv_ns[i - 1]) / 1e6
            j += 1
