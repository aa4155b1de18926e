"""Per-request receipt statistics as produced by the client stage, read by metrics.

Below every stage (it imports only ``simcore.receipts_nb``): the engine
wrapper allocates the bounded mode's state and decides its rerun from the
completed requests; the metrics stage reads :class:`Receipts`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simcore.receipts_nb import RECEIPT_FIELDS, SKETCH_BUCKETS, STREAM_FIELDS, receipts_nb


@dataclass
class Receipts:
    """Per-request receipt statistics (int64; instants and gaps in ns, -1: none).

    ``itl_sketch``: the bounded mode's ITL bucket counts over completed
    requests, None in the detailed mode.
    """

    num_received: np.ndarray
    first_recv_ns: np.ndarray
    last_recv_ns: np.ndarray
    gap_sq_hi: np.ndarray
    gap_sq_lo: np.ndarray
    gap_min_ns: np.ndarray
    gap_max_ns: np.ndarray
    itl_sketch: np.ndarray | None = None

    @classmethod
    def from_tokens(cls, token_offset: np.ndarray, token_recv_ns: np.ndarray) -> "Receipts":
        """The statistics of a per-token receipt array (detailed mode).

        Parameters
        ----------
        token_offset : ndarray(int64, ndim=1)
            ``n + 1`` token offsets.
        token_recv_ns : ndarray(int64, ndim=1)
            Receipt instant of every token, ns (-1: not received).

        Returns
        -------
        Receipts
        """
        n = token_offset.shape[0] - 1
        fields = {name: np.empty(n, dtype=np.int64) for name in RECEIPT_FIELDS}
        receipts_nb(token_offset, token_recv_ns, *fields.values())
        return cls(**fields)

    @classmethod
    def from_stream(cls, state: tuple) -> "Receipts":
        """The bounded mode's kernel state (``STREAM_FIELDS`` arrays) as Receipts.

        Parameters
        ----------
        state : tuple of ndarray(int64, ndim=1)

        Returns
        -------
        Receipts
        """
        fields = dict(zip(STREAM_FIELDS, state))
        return cls(**{name: fields[name] for name in RECEIPT_FIELDS}, itl_sketch=fields["itl_sketch"])


def allocate_stream_state(n: int, batch: int | None = None) -> tuple:
    """Fresh bounded-mode kernel state for n requests (every request's gaps in the sketch).

    Parameters
    ----------
    n : int
        Requests; 0 gives the empty state of the detailed mode.
    batch : int, optional
        A leading axis of that many configurations.

    Returns
    -------
    tuple of ndarray(int64)
        The ``STREAM_FIELDS`` arrays.
    """
    lead = () if batch is None else (batch,)
    initial = {"num_received": 0, "gap_sq_hi": 0, "gap_sq_lo": 0, "itl_include": 1}
    names = RECEIPT_FIELDS + ("itl_include",)
    # One block, its rows the per-request arrays: one allocation per call, not eight.
    state = np.empty((len(names),) + lead + (n,), dtype=np.int64)
    for row, name in zip(state, names):
        row.fill(initial.get(name, -1))
    return (*state, np.zeros(lead + (SKETCH_BUCKETS if n else 0,), dtype=np.int64))


def completed_mask(finish_ns: np.ndarray, reject_ns: np.ndarray, generated: np.ndarray, num_received: np.ndarray) -> np.ndarray:
    """Requests completed at the client: finished, not rejected, every token received.

    Parameters
    ----------
    finish_ns, reject_ns : ndarray(int64, ndim=1)
        Engine finish and rejection instants, ns (-1: did not happen).
    generated, num_received : ndarray(int64, ndim=1)
        Tokens emitted and tokens received by the cap.

    Returns
    -------
    ndarray(bool, ndim=1)
    """
    return (finish_ns != -1) & (reject_ns == -1) & (num_received == generated) & (num_received > 0)
