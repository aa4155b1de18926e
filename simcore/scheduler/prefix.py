"""Prompt-block identities for prefix caching (docs/prefix-caching.md).

Engine block j of a request (tokens ``[j·bs, (j+1)·bs)``, complete prompt
blocks only) gets an int64 identity >= 0; equal identities mean equal token
prefixes.  They come from Mooncake ``hash_ids`` (prefix-chained hashes of
``T``-token trace blocks), from a synthetic shared prefix, or are unique.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from simcore.scheduler.kv_nb import trace_block_identities_nb
from simcore.scheduler.radix import radix_trace_identities, radix_trace_runs
from simcore.workload.api import RequestTable
from simcore.workload.sessions import session_block_base


def prompt_block_identities(
    requests: RequestTable, block_size: int, trace_block_size: int | None, prefix_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """Identities of every request's complete prompt blocks.

    Parameters
    ----------
    requests : RequestTable
        With ``hash_ids`` (list<int64> per request) for traces.
    block_size : int
        Engine KV block size, tokens.
    trace_block_size : int or None
        Tokens per ``hash_ids`` entry (``workload.block_size``).
    prefix_tokens : int
        Synthetic shared prompt prefix, tokens (0: none).

    Returns
    -------
    offset : ndarray(int64, ndim=1)
        ``n + 1`` offsets; request k's identities are ``ident[offset[k]:offset[k+1]]``.
    ident : ndarray(int64, ndim=1)
        Identities, >= 0 and below distinct hashes x ``T`` + prompt blocks
        (synthetic: below prompt blocks + shared blocks); not dense.
    """
    counts = requests.input_tokens // block_size
    offset = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=offset[1:])
    total = int(offset[-1])
    if requests.hash_ids is not None:
        hash_ids = requests.hash_ids
        if isinstance(hash_ids, pa.ChunkedArray):
            hash_ids = hash_ids.combine_chunks()
        list_offsets = hash_ids.offsets.to_numpy().astype(np.int64)
        values = hash_ids.flatten().to_numpy().astype(np.int64)
        distinct, hash_rank = np.unique(values, return_inverse=True)
        trace_block = trace_block_size or 512
        ident = np.empty(total, dtype=np.int64)
        trace_block_identities_nb(
            offset, list_offsets - list_offsets[0], hash_rank.reshape(-1).astype(np.int64), block_size,
            trace_block, distinct.shape[0] * trace_block, ident,
        )
        return offset, ident
    return offset, _positional_identities(requests, counts, offset, block_size, prefix_tokens)


def _positional_identities(requests: RequestTable, counts, offset, block_size: int, prefix_tokens: int) -> np.ndarray:
    """Synthetic identities of ``counts[k]`` blocks per request, laid out by ``offset``."""
    request = np.repeat(np.arange(counts.shape[0]), counts)
    j = np.arange(int(offset[-1]), dtype=np.int64) - offset[:-1][request]
    prefix_tokens = max(prefix_tokens, requests.shared_prefix_tokens)
    shared = (j + 1) * block_size <= prefix_tokens
    # Shared prefix blocks are identified by their index; every other block by
    # its owner's first identity plus its index, past the shared ids (the owner:
    # the request, whose first is its position in the flat array, or its session).
    owner_base = session_block_base(requests, counts, offset)
    return np.where(shared, j, prefix_tokens // block_size + owner_base[request] + j)


def _radix_block_counts(requests: RequestTable, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Each request's ``ceil((input + output) / bs)`` blocks, and their ``n + 1`` offsets."""
    counts = (requests.input_tokens + requests.output_tokens + block_size - 1) // block_size
    offset = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=offset[1:])
    return counts, offset


def radix_block_identities(
    requests: RequestTable, block_size: int, trace_block_size: int | None, prefix_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """Identities of every block a request can hold, for SGLang's radix cache.

    SGLang inserts generated tokens too, so past its complete prompt blocks
    (:func:`prompt_block_identities`) each of a request's
    ``ceil((input + output) / bs)`` blocks gets an identity of its own, above
    every prompt identity.

    Parameters
    ----------
    requests, block_size, trace_block_size, prefix_tokens
        As :func:`prompt_block_identities`.

    Returns
    -------
    offset, ident : ndarray(int64, ndim=1)
        As :func:`prompt_block_identities`, over all the blocks.
    """
    counts, offset = _radix_block_counts(requests, block_size)
    total = int(offset[-1])
    if requests.hash_ids is not None:  # one pass over the blocks
        return offset, radix_trace_identities(requests, offset, block_size, trace_block_size)
    if requests.session is not None and requests.hash_ids is None:
        # A session's turn t+1 begins with turn t's prompt and answer, so block j
        # of every turn is one identity, generated blocks included.
        return offset, _positional_identities(requests, counts, offset, block_size, prefix_tokens)
    prompt_offset, prompt_ident = prompt_block_identities(requests, block_size, trace_block_size, prefix_tokens)
    own_base = int(prompt_ident.max()) + 1 if prompt_ident.shape[0] else 0
    ident = own_base + np.arange(total, dtype=np.int64)
    prompt_counts = np.diff(prompt_offset)
    request = np.repeat(np.arange(counts.shape[0]), prompt_counts)
    j = np.arange(prompt_ident.shape[0], dtype=np.int64) - prompt_offset[:-1][request]
    ident[offset[:-1][request] + j] = prompt_ident
    return offset, ident


def radix_tree_identities(
    requests: RequestTable, block_size: int, trace_block_size: int | None, prefix_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`radix_block_identities` for the node tree (``simcore.scheduler.radix_tree_nb``),
    computed from ``hash_ids`` rather than materialised when the trace has them
    (:func:`simcore.scheduler.radix.radix_trace_runs`).

    Parameters
    ----------
    requests, block_size, trace_block_size, prefix_tokens
        As :func:`prompt_block_identities`.

    Returns
    -------
    offset, ident : ndarray(int64, ndim=1)
        The block offsets of :func:`radix_block_identities`, and the
        identities in either form of ``simcore.scheduler.radix_ident_nb``.
    """
    if requests.hash_ids is None:
        return radix_block_identities(requests, block_size, trace_block_size, prefix_tokens)
    _, offset = _radix_block_counts(requests, block_size)
    return offset, radix_trace_runs(requests, offset, block_size, trace_block_size)
