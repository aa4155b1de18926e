"""Timing-model kernels.

Contract: ``rank_time_ms_nb`` is ``@njit(cache=True)``; it reads a model code,
a float64 parameter vector and the SPEC §8 batch summary (int64 counts) and
returns the rank's time in float64 ms, evaluated left to right exactly as SPEC
§8 writes the formula.  An empty batch takes 0.  Models that need lookup tables
receive them in one flat float64 array, ``table``, laid out by their wrapper.
"""

from __future__ import annotations

from numba import njit

TIMING_FIXED = 0
TIMING_LINEAR = 1


@njit(cache=True)
def rank_time_ms_nb(
    model, params, table, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens
):
    """Time of one rank's batch, ms.

    Parameters
    ----------
    model : int
        ``TIMING_FIXED`` or ``TIMING_LINEAR``.
    params : ndarray(float64, ndim=1)
        fixed: ``[prefill_ms, decode_ms]``; linear: ``[base_ms,
        per_prefill_token_us, per_decode_seq_us, per_kv_token_ns]``.
    table : ndarray(float64, ndim=1)
        Flat lookup tables of table-driven models (empty for fixed, linear).
    num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens : int
        The batch summary of SPEC §8 (tokens, sequences).

    Returns
    -------
    float
        The rank's time, ms (0.0 for an empty batch).
    """
    if num_prefill == 0 and num_decode == 0:
        return 0.0
    if model == TIMING_FIXED:
        ms = 0.0
        if num_prefill > 0:
            ms += params[0]
        if num_decode > 0:
            ms += params[1]
        return ms
    return (
        params[0]
        + params[1] * prefill_tokens / 1000
        + params[2] * num_decode / 1000
        + params[3] * (prefill_kv_tokens + decode_kv_tokens) / 1e6
    )
