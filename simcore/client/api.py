"""Tokenization and detokenization stages (SPEC §4, §7).

Each request-receiving worker owns ``tokenization.workers`` tokenizer servers and
each token-emitting worker ``detokenization.workers`` detokenizer servers; a
request's server is ``fnv1a64(utf8(request_id)) mod workers``.  The tokenizer
queue is simple enough to run inside the engine kernel at send time.  The
detokenizer is a FIFO per server over the pass boundaries: inside the kernel
(by default; a closed loop's receipts trigger sends), or here, vectorised after
the run, when asked for and receipts cannot change sends (open loop).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from simcore.client import nb
from simcore.client.nb import fnv1a64_mod_nb
from simcore.config import DetokenizationConfig, TokenizationConfig
from simcore.engine.state import Client
from simcore.enums import DETOK_IN_KERNEL, DETOK_OFF
from simcore.units import ms_array_to_ns


def client_inputs(
    tok: TokenizationConfig,
    detok: DetokenizationConfig,
    requests,
    input_tokens: np.ndarray,
    worker: np.ndarray,
    num_workers: int,
    *,
    sessions: bool,
) -> tuple[Client, np.ndarray]:
    """The client stage's kernel inputs: tokenizer placement and service, detokenizer mode, servers and costs.

    Parameters
    ----------
    tok, detok : TokenizationConfig, DetokenizationConfig
    requests : RequestTable
        Its ``request_id`` places each request on a server.
    input_tokens : ndarray(int64, ndim=1)
        Prompt length of each request, tokens.
    worker : ndarray(int64, ndim=1)
        Each request's receiving worker by row (unused with sessions).
    num_workers : int
        Receiving workers (each owns ``tok.workers`` tokenizer servers).
    sessions : bool
        Placement by send sequence number (the kernel adds the worker's first server).

    Returns
    -------
    Client
    tok_index : ndarray(int64, ndim=1)
        Each request's tokenizer server within its worker (read by the router).
    """
    tok_index = server_index(requests.request_id, tok.workers)
    mode = DETOK_IN_KERNEL if detok.enabled else DETOK_OFF
    client = Client(
        tok_server=tok_index if sessions else worker * tok.workers + tok_index,
        tok_service_ns=tokenization_service_ns(tok, input_tokens),
        num_tok_servers=num_workers * tok.workers,
        detok_mode=mode,
        detok_server=server_index(requests.request_id, detok.workers),
        detok_workers=detok.workers,
        detok_params=detokenization_params(detok),
        chunk_size=detok.chunk_size or 0,
    )
    return client, tok_index


def server_index(request_ids: pa.Array, workers: int) -> np.ndarray:
    """``fnv1a64(utf8(request_id)) mod workers`` per request, int64.

    Parameters
    ----------
    request_ids : pyarrow.StringArray or ChunkedArray
        Request ids (n).
    workers : int
        Number of servers, >= 1.

    Returns
    -------
    ndarray(int64, ndim=1)
        Server index of each request, ``0 .. workers - 1`` (all 0 when ``workers == 1``).
    """
    n = len(request_ids)
    out = np.zeros(n, dtype=np.int64)
    if workers == 1 or n == 0:
        return out
    if isinstance(request_ids, pa.ChunkedArray):
        request_ids = request_ids.combine_chunks()
    # Offsets read as they are stored (a cast to large_string costs a small call more than the hash).
    ids = request_ids if request_ids.type in (pa.string(), pa.large_string()) else request_ids.cast(pa.large_string())
    _, offsets_buf, data_buf = ids.buffers()
    width = np.int32 if ids.type == pa.string() else np.int64
    offsets = np.frombuffer(offsets_buf, dtype=width, count=n + 1 + ids.offset)[ids.offset :].astype(np.int64)
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    )
    fnv1a64_mod_nb(data, offsets, workers, out)
    return out


def tokenization_service_ns(cfg: TokenizationConfig, input_tokens: np.ndarray) -> np.ndarray:
    """Per-request tokenizer job service, ns: ``base_ms + per_input_us x input / 1000``.

    Parameters
    ----------
    cfg : TokenizationConfig
        Cost coefficients (``base_ms``, ms; ``per_input_us``, us per input token).
    input_tokens : ndarray(int64, ndim=1)
        Prompt length of each request, tokens.

    Returns
    -------
    ndarray(int64, ndim=1)
        Tokenizer service of each request, ns.
    """
    ms = cfg.base_ms + cfg.per_input_us * input_tokens.astype(np.float64) / 1000
    return ms_array_to_ns(ms)


def detokenization_params(cfg: DetokenizationConfig) -> np.ndarray:
    """The four per-job cost coefficients in the order the kernels read them.

    Parameters
    ----------
    cfg : DetokenizationConfig

    Returns
    -------
    ndarray(float64, shape (4,))
        ``[base_ms, per_output_us, first_output_us, final_output_us]`` (ms, then us).
    """
    return np.array(
        [cfg.base_ms, cfg.per_output_us, cfg.first_output_us, cfg.final_output_us],
        dtype=np.float64,
    )


def detokenization_service_ns(
    params: np.ndarray, k: np.ndarray, n_first: np.ndarray, n_final: np.ndarray
) -> np.ndarray:
    """Job service, ns, for jobs of ``k`` outputs (SPEC §7), evaluated left to right.

    Parameters
    ----------
    params : ndarray(float64, shape (4,))
        ``[base_ms, per_output_us, first_output_us, final_output_us]``
        (:func:`detokenization_params`).
    k : ndarray(int64, ndim=1)
        Outputs (tokens) in each job.
    n_first, n_final : ndarray(int64, ndim=1)
        Per job, outputs that are a request's first token / its finishing token.

    Returns
    -------
    ndarray(int64, ndim=1)
        Service of each job, ns.
    """
    return ms_array_to_ns(nb.detokenization_job_ms_nb(params, k, n_first, n_final))
