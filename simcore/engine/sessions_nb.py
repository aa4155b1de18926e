"""Multi-turn sessions in the engine kernel: turns sent on the previous turn's receipt (docs/semantics.md, Sessions).

Contract
--------
* ``@njit(cache=True)`` kernels called from the event loop (``simcore.engine.nb``, ``simcore.engine.phases_nb``)
  only when ``Load.session_mode`` is set; arguments are int64 arrays (rows
  ``k`` = table rows, sessions in table order) and scalars.
* Two min-heaps of ``simcore.heap_nb``.  *Releases* ``(instant, k)``: request
  ``k`` ended at the client at ``instant`` (its final token received, or its
  rejection).  *Sends* ``(instant, k)``: row ``k`` is sent at ``instant``.
  Both pop in (instant, row) order.
* Send sequence numbers are given in the order rows are sent; the receiving
  placement of SPEC §3 is that of the send sequence number (``seq_rank``,
  ``seq_tok_base``), written into the row's ``recv_rank`` and read back as
  ``send_seq``.  Engine arrivals are keyed by send sequence number
  (``seq_row`` maps it back to the row), so equal-instant arrivals go in send
  order as SPEC §5 (d) says.
* ``counters``: ``[sessions started, rows sent]``.
"""

from __future__ import annotations

from numba import njit

from simcore.enums import OUT_FINAL
from simcore.heap_nb import heap_pop_nb, heap_push_nb

SESSIONS_STARTED = 0
ROWS_SENT = 1


@njit(cache=True)
def session_start_nb(closed, concurrency, session_first, send_ns, sess_key, sess_val, counters):
    """Queue the first turns the load sends by itself.

    Closed loop: the first ``min(concurrency, sessions)`` sessions at t = 0.
    Open loop: every session's first turn at its given ``send_ns``.

    Parameters
    ----------
    closed : bool
        Closed loop over sessions.
    concurrency : int
        Closed loop: sessions in flight.
    session_first : ndarray(int64, ndim=1)
        Each session's first row, in session order.
    send_ns : ndarray(int64, ndim=1)
        Open loop: the first turns' send instants, ns (read at those rows).
    sess_key, sess_val : ndarray(int64, ndim=1)
        The sends heap (room for every row); filled.
    counters : ndarray(int64, ndim=1)
        Out: ``counters[SESSIONS_STARTED]`` set.

    Returns
    -------
    int
        The sends-heap size.
    """
    num_sessions = session_first.shape[0]
    started = min(concurrency, num_sessions) if closed else num_sessions
    size = 0
    for s in range(started):
        k = session_first[s]
        size = heap_push_nb(sess_key, sess_val, size, 0 if closed else send_ns[k], k)
    counters[SESSIONS_STARTED] = started
    return size


@njit(cache=True)
def session_finals_nb(num_out, out_req, out_token, out_flags, recv_target, rel_key, rel_val, rel_size):
    """Queue a release at the receipt of each request-final token of a pass's detokenizer jobs.

    Parameters
    ----------
    num_out : int
        The pass's outputs.
    out_req, out_token, out_flags : ndarray(int64, ndim=1)
        Per output: its request, where its receipt is stamped, its ``OUT_*`` flags.
    recv_target : ndarray(int64, ndim=1)
        The receipts, ns (indexed by ``out_token``).
    rel_key, rel_val : ndarray(int64, ndim=1)
        The releases heap; updated.
    rel_size : int
        Its size.

    Returns
    -------
    int
        The releases-heap size.
    """
    for e in range(num_out):
        if out_flags[e] & OUT_FINAL:
            rel_size = heap_push_nb(rel_key, rel_val, rel_size, recv_target[out_token[e]], out_req[e])
    return rel_size


@njit(cache=True)
def session_next_instant_nb(t, rel_key, rel_size, sess_key, sess_size):
    """The earlier of ``t`` and the first pending release or send.

    Parameters
    ----------
    t : int
        An instant, ns.
    rel_key, sess_key : ndarray(int64, ndim=1)
        The releases and sends heaps' keys, ns.
    rel_size, sess_size : int
        Their sizes.

    Returns
    -------
    int
        The instant, ns.
    """
    if rel_size > 0 and rel_key[0] < t:
        t = rel_key[0]
    if sess_size > 0 and sess_key[0] < t:
        t = sess_key[0]
    return t


@njit(cache=True)
def session_releases_nb(
    t, closed, think_ns, next_turn, turn_think_ns, session_first, rel_key, rel_val, rel_size, sess_key, sess_val,
    sess_size, counters,
):
    """SPEC §5 (c) with sessions, first half: the releases at ``t``, in row order.

    A release of row k queues its session's next turn at ``t +
    turn_think_ns[next]``; after a session's last turn, a closed loop queues
    the next session not yet started (session order) at ``t + think_ns``.

    Parameters
    ----------
    t : int
        The instant, ns.
    closed : bool
        Closed loop over sessions.
    think_ns : int
        Closed loop: a session's end to the next session's first send, ns.
    next_turn, turn_think_ns : ndarray(int64, ndim=1)
        Per row: its session's next turn (-1: none) and the think before its send, ns.
    session_first : ndarray(int64, ndim=1)
        Each session's first row, in session order.
    rel_key, rel_val, sess_key, sess_val : ndarray(int64, ndim=1)
        The releases and sends heaps; updated.
    rel_size, sess_size : int
        Their sizes.
    counters : ndarray(int64, ndim=1)
        Sessions started and rows sent; updated.

    Returns
    -------
    rel_size, sess_size : int
        The heap sizes.
    released : bool
        Whether anything was released at ``t``.
    """
    released = False
    while rel_size > 0 and rel_key[0] == t:
        k = rel_val[0]
        rel_size = heap_pop_nb(rel_key, rel_val, rel_size)
        released = True
        nxt = next_turn[k]
        if nxt >= 0:
            sess_size = heap_push_nb(sess_key, sess_val, sess_size, t + turn_think_ns[nxt], nxt)
        elif closed and counters[SESSIONS_STARTED] < session_first.shape[0]:
            first = session_first[counters[SESSIONS_STARTED]]
            counters[SESSIONS_STARTED] += 1
            sess_size = heap_push_nb(sess_key, sess_val, sess_size, t + think_ns, first)
    return rel_size, sess_size, released


@njit(cache=True)
def session_next_send_nb(t, sess_key, sess_val, sess_size, counters, send_ns, send_seq, seq_row):
    """SPEC §5 (c) with sessions, second half: the next send at ``t`` (row order), if any.

    It takes the next send sequence number s; the caller places it (round
    robin: the placement of s, ``seq_rank``/``seq_tok_base``; or by its
    routing policy) and queues its tokenizer job, FIFO per server in send
    order, whose engine arrival is keyed (instant, s).

    Parameters
    ----------
    t : int
        The instant, ns.
    sess_key, sess_val : ndarray(int64, ndim=1)
        The sends heap; updated.
    sess_size : int
        Its size.
    counters : ndarray(int64, ndim=1)
        Sessions started and rows sent; updated.
    send_ns, send_seq : ndarray(int64, ndim=1)
        Out, per row: send instant (ns) and send sequence number.
    seq_row : ndarray(int64, ndim=1)
        Out, per send sequence number: its row.

    Returns
    -------
    sess_size : int
        The heap size.
    k, s : int
        The row sent and its send sequence number (-1, -1: none at ``t``).
    """
    if sess_size == 0 or sess_key[0] != t:
        return sess_size, -1, -1
    k = sess_val[0]
    sess_size = heap_pop_nb(sess_key, sess_val, sess_size)
    s = counters[ROWS_SENT]
    counters[ROWS_SENT] = s + 1
    send_ns[k] = t
    send_seq[k] = s
    seq_row[s] = k
    return sess_size, k, s
