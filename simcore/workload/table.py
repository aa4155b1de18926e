"""The request table that every workload source produces (SPEC §1).

Its own module so that the readers (:mod:`simcore.workload.traces`) and the
builders (:mod:`simcore.workload.api`) both depend on it, not on each other.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from simcore.arrow_np import pc
from simcore.errors import ConfigError
from simcore.schema import string_array


@dataclass(frozen=True)
class RequestTable:
    """The requests of one run.

    Attributes
    ----------
    request_id : pyarrow.StringArray
        Unique ids (default ``"r{index}"``).
    input_tokens, output_tokens : ndarray(int64, ndim=1)
        Prompt and requested output lengths, tokens, >= 1.
    send_ms : ndarray(float64, ndim=1) or None
        Trace send instants, ms, non-decreasing (None without such a column).
    hash_ids : pyarrow.ListArray (list<int64>) or None
        Per-request prompt block hashes of a Mooncake trace, one list per row
        (blocks of ``workload.block_size`` tokens); None for other sources.
    num_dropped : int
        Trace rows dropped as unreplayable (``workload.drop_invalid=true``);
        the summary's ``dropped_requests``.
    session_id : pyarrow.StringArray or None
        Multi-turn sessions (``simcore.workload.sessions``): each row's session label.
    session, turn : ndarray(int64, ndim=1) or None
        Each row's session (numbered by first row) and turn (0, 1, ... in table order).
    shared_prefix_tokens : int
        Leading prompt tokens every session shares (the system prompt), tokens.
    acceptance_length : ndarray(float64, ndim=1) or None
        Speculative decoding (docs/speculative.md): each row's own mean acceptance
        length, tokens per verification (NaN: the pool's rates); None without the column.
    priority : ndarray(int64, ndim=1) or None
        Each row's priority (vLLM's: lower values first), read by
        ``engine.<pool>.queue_order=priority``; None without the column (all 0).
    predicted_output_tokens : ndarray(int64, ndim=1) or None
        Each row's predicted output length, tokens, read by
        ``queue_order=shortest_output``; None without the column.
    prompt_id : ndarray(int64, ndim=1) or None
        Each row's prompt, an integer >= 0: rows of one id are copies of one prompt, whose
        speculative draws are one stream with ``engine.<pool>.speculative.draws=prompt``
        (docs/speculative.md); None without the column (each row its own prompt).
    """

    request_id: pa.Array
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    send_ms: np.ndarray | None = None
    hash_ids: pa.ListArray | None = None
    num_dropped: int = 0
    session_id: pa.Array | None = None
    session: np.ndarray | None = None
    turn: np.ndarray | None = None
    shared_prefix_tokens: int = 0
    acceptance_length: np.ndarray | None = None
    priority: np.ndarray | None = None
    predicted_output_tokens: np.ndarray | None = None
    prompt_id: np.ndarray | None = None

    def __len__(self) -> int:
        return self.input_tokens.shape[0]


def default_ids(n: int) -> pa.Array:
    """The default request ids ``r0 .. r{n-1}``.

    Parameters
    ----------
    n : int
        Number of requests.

    Returns
    -------
    pyarrow.StringArray
        ``n`` ids.
    """
    return string_array([f"r{i}" for i in range(n)])


def first_duplicate(ids: pa.Array) -> tuple[int, int] | None:
    """Positions of the first two occurrences of the first id that occurs twice, else None.

    Parameters
    ----------
    ids : pyarrow.StringArray
        Request ids, without nulls.

    Returns
    -------
    tuple of (int, int) or None
        Row indices, in order; "first" means first in ``ids`` order.
    """
    counts = pc.value_counts(ids)
    repeated = pc.filter(counts, pc.greater(counts.field("counts"), 1))
    if not len(repeated):
        return None
    where = np.flatnonzero(pc.equal(ids, repeated[0]["values"]).to_numpy(zero_copy_only=False))
    return int(where[0]), int(where[1])


def utf8_text(data: bytes, origin: str, expected: str) -> str:
    """``data`` decoded as UTF-8 (a leading BOM dropped); bytes that are not are a ConfigError naming their line.

    Parameters
    ----------
    data : bytes
        A text file's contents.
    origin : str
        The file, for the message.
    expected : str
        What the file should be (``"a CSV request table"``), for the message.

    Returns
    -------
    str
    """
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{origin}:{line}: not UTF-8 text (byte {data[exc.start]:#04x}); expected {expected}") from None
