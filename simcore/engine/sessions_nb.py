"""Multi-turn sessions in the engine kernel: turns sent on the previous turn's receipt (docs/semantics.md, Sessions).

Contract
--------
* ``@njit(cache=True)`` kernels called from ``simcore.engine.nb._replay_nb``
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
    """Queue the first turns the load starts at once; returns the send-heap size.

    Closed loop: the first ``min(concurrency, sessions)`` sessions at t = 0.
    Open loop: every session's first turn at its given ``send_ns``.
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
    """Queue a release at the receipt of each request-final token of a pass; returns the release-heap size."""
    for e in range(num_out):
        if out_flags[e] & OUT_FINAL:
            rel_size = heap_push_nb(rel_key, rel_val, rel_size, recv_target[out_token[e]], out_req[e])
    return rel_size


@njit(cache=True)
def session_next_instant_nb(t, rel_key, rel_size, sess_key, sess_size):
    """The earlier of ``t`` and the first pending release or send."""
    if rel_size > 0 and rel_key[0] < t:
        t = rel_key[0]
    if sess_size > 0 and sess_key[0] < t:
        t = sess_key[0]
    return t


@njit(cache=True)
def session_sends_nb(
    t, closed, think_ns, next_turn, turn_think_ns, session_first, rel_key, rel_val, rel_size,
    sess_key, sess_val, sess_size, counters, send_ns, send_seq, seq_row, seq_rank, seq_tok_base, recv_rank,
    tok_server, tok_service_ns, tok_free, arr_key, arr_val, arr_size,
):
    """SPEC §5 (c) with sessions: the releases at ``t``, then the sends at ``t``, each in row order.

    A release of row k queues its session's next turn at ``t +
    turn_think_ns[next]``; after a session's last turn, a closed loop queues
    the next session not yet started (session order) at ``t + think_ns``.
    Each send takes the next send sequence number s: its receiving rank and
    tokenizer servers are those of s, its tokenizer job is FIFO per server in
    send order, and its engine arrival is keyed (instant, s).

    Returns
    -------
    rel_size, sess_size, arr_size : int
        The heap sizes.
    sent : bool
        Whether anything was released or sent at ``t``.
    """
    sent = False
    while rel_size > 0 and rel_key[0] == t:
        k = rel_val[0]
        rel_size = heap_pop_nb(rel_key, rel_val, rel_size)
        sent = True
        nxt = next_turn[k]
        if nxt >= 0:
            sess_size = heap_push_nb(sess_key, sess_val, sess_size, t + turn_think_ns[nxt], nxt)
        elif closed and counters[SESSIONS_STARTED] < session_first.shape[0]:
            first = session_first[counters[SESSIONS_STARTED]]
            counters[SESSIONS_STARTED] += 1
            sess_size = heap_push_nb(sess_key, sess_val, sess_size, t + think_ns, first)
    while sess_size > 0 and sess_key[0] == t:
        k = sess_val[0]
        sess_size = heap_pop_nb(sess_key, sess_val, sess_size)
        sent = True
        s = counters[ROWS_SENT]
        counters[ROWS_SENT] = s + 1
        send_ns[k] = t
        send_seq[k] = s
        seq_row[s] = k
        recv_rank[k] = seq_rank[s]
        server = seq_tok_base[s] + tok_server[k]
        end = max(t, tok_free[server]) + tok_service_ns[k]
        tok_free[server] = end
        arr_size = heap_push_nb(arr_key, arr_val, arr_size, end, s)
    return rel_size, sess_size, arr_size, sent
