"""Kernels of the tokenization and detokenization stages.

Contract: every function is ``@njit(cache=True)`` and takes flat, contiguous
numpy arrays and scalars only.  Instants and services are int64 ns.  Results go
into caller-allocated ``out`` arrays; the job cost rule returns its value.
"""

from __future__ import annotations

import numpy as np
from numba import njit

FNV_OFFSET_BASIS = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)


@njit(cache=True)
def fnv1a64_mod_nb(data, offsets, modulus, out):
    """Server index of each string: ``fnv1a64(utf8 bytes) mod modulus`` (SPEC §4).

    Parameters
    ----------
    data : ndarray(uint8, ndim=1)
        Concatenated UTF-8 bytes of all strings (an Arrow string buffer).
    offsets : ndarray(int64, ndim=1)
        ``n + 1`` byte offsets; string i is ``data[offsets[i]:offsets[i + 1]]``.
    modulus : int
        Number of servers, >= 1.
    out : ndarray(int64, ndim=1)
        ``n`` server indices, written in place.
    """
    mod = np.uint64(modulus)
    for i in range(out.shape[0]):
        h = FNV_OFFSET_BASIS
        for j in range(offsets[i], offsets[i + 1]):
            h = (h ^ np.uint64(data[j])) * FNV_PRIME  # uint64 arithmetic wraps mod 2**64
        out[i] = np.int64(h % mod)


@njit(cache=True)
def detokenization_job_ms_nb(params, k, n_first, n_final):
    """Service of a detokenizer job of ``k`` outputs, ms (SPEC §7), evaluated left to right.

    The one statement of the job cost; it takes scalars (one job) or equal-shape
    int64 arrays (many jobs, elementwise, the same float64 operations).

    Parameters
    ----------
    params : ndarray(float64, shape (4,))
        ``[base_ms, per_output_us, first_output_us, final_output_us]``.
    k : int or ndarray(int64)
        Outputs (tokens) in the job.
    n_first, n_final : int or ndarray(int64)
        Outputs that are a request's first token / its finishing token.

    Returns
    -------
    float or ndarray(float64)
        ms (rounded to ns by the caller).
    """
    return params[0] + params[1] * k / 1000 + params[2] * n_first / 1000 + params[3] * n_final / 1000
