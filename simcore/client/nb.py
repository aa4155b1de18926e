"""Kernels of the tokenization and detokenization stages.

Contract: every function is ``@njit(cache=True)`` and takes flat, contiguous
numpy arrays and scalars only.  Instants and services are int64 ns.  Results go
into caller-allocated ``out`` arrays; the job cost rule returns its value.
The engine kernel calls :func:`detokenize_pass_nb` at every pass end
(``DETOK_IN_KERNEL``); the pass outputs' flags (``OUT_FIRST``, ``OUT_FINAL``)
and the detokenizer modes are in ``simcore.enums``, below both stages.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simcore.enums import OUT_FINAL, OUT_FIRST
from simcore.heap_nb import heap_push_nb

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


@njit(cache=True, inline="always")
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


@njit(cache=True, inline="always")
def detokenization_service_ns_nb(params, k, n_first, n_final):
    """Service of one detokenizer job, ns: :func:`detokenization_job_ms_nb` rounded to the nearest ns.

    Parameters
    ----------
    params : ndarray(float64, shape (4,))
        ``[base_ms, per_output_us, first_output_us, final_output_us]``.
    k, n_first, n_final : int
        Outputs in the job, and of them request-first / request-final tokens.

    Returns
    -------
    int
        ns.
    """
    return np.int64(np.rint(detokenization_job_ms_nb(params, k, n_first, n_final) * 1e6))


@njit(cache=True, inline="always")
def detokenize_pass_nb(t, first_server, num_out, buffers, chunk_size, detok_params, closed_loop, think_ns, send_key,
                       send_val, send_size):
    """Queue a worker's outputs of the pass ending at t as FIFO jobs (SPEC §7).

    A sweep over the outputs (rank, then running order) sorts them by server;
    then each server's outputs are cut into jobs of at most ``chunk_size``,
    served in order.  Without chunking a server has one job, whose counts
    (``job_count``, ``job_firsts``, ``job_finals``) the pass end kept as it
    emitted: a single sweep stamps the job ends.  Servers are independent
    queues, so this gives the same receipts as SPEC's job order.  Stamps the
    receipts (``recv_target[out_token[e]]``: the per-token array, or the
    pass's receipt buffer in the bounded mode) and, in a closed loop, queues
    the send released by each request-final token.

    Parameters
    ----------
    t : int
        The pass end, ns.
    first_server : int
        The worker's first global detokenizer server.
    num_out : int
        Outputs of the pass.
    buffers : DetokBuffers
        ``simcore.engine.state.DetokBuffers``: per output ``out_token`` (where
        its receipt goes in ``recv_target``), ``out_server`` (its server within
        the worker) and ``out_flags`` (``OUT_FIRST`` / ``OUT_FINAL``);
        ``detok_free`` (per global server, when it is free, ns; updated);
        ``recv_target`` (out: receipt instants, ns); per server of the worker
        ``job_count``, ``job_firsts``, ``job_finals`` (the unchunked job's
        counts so far; reset) and ``job_ends`` (scratch); ``job_tokens``,
        ``job_flags`` (scratch, (servers, outputs)).
    chunk_size : int
        Most outputs per job (0: no limit).
    detok_params : ndarray(float64, shape (4,))
        The job cost's coefficients (:func:`detokenization_job_ms_nb`).
    closed_loop : bool
        Queue a send at ``receipt + think_ns`` for each request-final token.
    think_ns : int
        Think time, ns.
    send_key, send_val : ndarray(int64, ndim=1)
        The send heap (``simcore.heap_nb``); updated.
    send_size : int
        Its size.

    Returns
    -------
    int
        The send-heap size.
    """
    out_token, out_server, out_flags = buffers.out_token, buffers.out_server, buffers.out_flags
    detok_free, recv_target = buffers.detok_free, buffers.recv_target
    job_count, job_firsts, job_finals = buffers.job_count, buffers.job_firsts, buffers.job_finals
    job_ends, job_tokens, job_flags = buffers.job_ends, buffers.job_tokens, buffers.job_flags
    if chunk_size == 0:
        # One job per server, counted as the pass emitted: serve, then stamp.
        for s in range(job_count.shape[0]):
            if job_count[s] > 0:
                server = first_server + s
                job_ends[s] = max(t, detok_free[server]) + detokenization_service_ns_nb(
                    detok_params, job_count[s], job_firsts[s], job_finals[s]
                )
                detok_free[server] = job_ends[s]
            job_count[s] = 0
            job_firsts[s] = 0
            job_finals[s] = 0
        for e in range(num_out):
            end = job_ends[out_server[e]]
            recv_target[out_token[e]] = end
            if closed_loop and out_flags[e] & OUT_FINAL:
                send_size = heap_push_nb(send_key, send_val, send_size, end + think_ns, 0)
        return send_size
    # Chunked: the sweep below places every output in its job and counts per job.
    job_count[:] = 0
    job_firsts[:] = 0
    job_finals[:] = 0
    for e in range(num_out):
        s = out_server[e]
        q = job_count[s]
        job_tokens[s, q] = out_token[e]
        job_flags[s, q] = out_flags[e]
        job_count[s] = q + 1
    for s in range(job_count.shape[0]):
        count = job_count[s]
        server = first_server + s
        lo = 0
        while lo < count:
            hi = min(lo + chunk_size, count)
            n_first = 0
            n_final = 0
            for q in range(lo, hi):
                n_first += job_flags[s, q] & OUT_FIRST
                n_final += job_flags[s, q] >> 1
            end = max(t, detok_free[server]) + detokenization_service_ns_nb(detok_params, hi - lo, n_first, n_final)
            detok_free[server] = end
            for q in range(lo, hi):
                recv_target[job_tokens[s, q]] = end
                if closed_loop and job_flags[s, q] & OUT_FINAL:
                    send_size = heap_push_nb(send_key, send_val, send_size, end + think_ns, 0)
            lo = hi
        job_count[s] = 0
    return send_size
