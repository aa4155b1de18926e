"""Multi-turn sessions: the synthetic generator, table validation and the send schedule (docs/semantics.md, Sessions).

A session is a conversation: turn t + 1 is sent when the client has received
the last token of turn t (or its rejection) plus the think time, and its prompt
is turn t's prompt, turn t's answer (its requested ``output_tokens``) and the
new input.  Every prompt of a session is therefore a prefix of the next one:
the session is one token stream, and engine block j of any of its turns has the
identity (session, j) (or, inside the shared system prompt, j alone), so that
prefix caching reuses the previous turn's prompt blocks while they are resident.

Rows of a request table are sessions' turns; a session's turns are numbered
0, 1, ... in table order.  Sessions are numbered by their first row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from simcore.arrow_np import pc
from simcore.errors import ConfigError
from simcore.schema import string_array
from simcore.units import ms_to_ns
from simcore.workload.table import RequestTable, default_ids

if TYPE_CHECKING:
    from simcore.settings import SimConfig
    from simcore.workload.settings import SessionsConfig

SESSION_COLUMNS = ("session_id", "turn")


def session_turns(cfg: SessionsConfig, rng: np.random.Generator) -> np.ndarray:
    """Turns of each session: ``turns`` (fixed), uniform over 1..turns, or geometric with mean ``turns``.

    Parameters
    ----------
    cfg : SessionsConfig
    rng : numpy.random.Generator
        The run's generator (not used by ``fixed``).

    Returns
    -------
    ndarray(int64, ndim=1)
        ``num_sessions`` counts, each >= 1.
    """
    if cfg.turns_dist == "uniform":
        return rng.integers(1, cfg.turns, size=cfg.num_sessions, endpoint=True).astype(np.int64)
    if cfg.turns_dist == "geometric":  # P(n) = p (1 - p)^(n - 1), p = 1 / turns
        return rng.geometric(1.0 / cfg.turns, size=cfg.num_sessions).astype(np.int64)
    return np.full(cfg.num_sessions, cfg.turns, dtype=np.int64)


def session_requests(cfg: SessionsConfig, rng: np.random.Generator) -> RequestTable:
    """The synthetic sessions, session by session, turn by turn.

    Turn 0's prompt is ``system_prompt_tokens + new_input_tokens``; turn t's is
    turn t - 1's plus ``output_tokens + new_input_tokens``.

    Parameters
    ----------
    cfg : SessionsConfig
    rng : numpy.random.Generator
        Passed to :func:`session_turns`.

    Returns
    -------
    RequestTable
        Default request ids, session ids ``s{index}``, turns, lengths.
    """
    turns = session_turns(cfg, rng)
    session = np.repeat(np.arange(cfg.num_sessions, dtype=np.int64), turns)
    turn = np.arange(session.shape[0], dtype=np.int64) - np.repeat(np.cumsum(turns) - turns, turns)
    input_tokens = cfg.system_prompt_tokens + cfg.new_input_tokens + turn * (cfg.output_tokens + cfg.new_input_tokens)
    return RequestTable(
        default_ids(session.shape[0]),
        input_tokens.astype(np.int64),
        np.full(session.shape[0], cfg.output_tokens, dtype=np.int64),
        session_id=string_array([f"s{s}" for s in range(cfg.num_sessions)]).take(pa.array(session)),
        session=session,
        turn=turn,
        shared_prefix_tokens=cfg.system_prompt_tokens,
    )


def table_sessions(table: pa.Table, origin: str, input_tokens: np.ndarray, output_tokens: np.ndarray, where):
    """Validate a request table's ``session_id`` and ``turn`` columns.

    Parameters
    ----------
    table : pyarrow.Table
        With both columns (strings or integers; integers >= 0).
    origin : str
        The file or ``requests``, for messages.
    input_tokens, output_tokens : ndarray(int64, ndim=1)
        The validated lengths.
    where : callable
        ``where(row)``: the row's place for messages (``line 7``).

    Returns
    -------
    session_id : pyarrow.StringArray
    session : ndarray(int64, ndim=1)
        Each row's session, numbered by first row.
    turn : ndarray(int64, ndim=1)

    Raises
    ------
    ConfigError
        Only one of the columns, a missing value, turns of a session not
        numbered 0, 1, ... in table order, or a prompt shorter than the
        previous turn's prompt and answer.
    """
    present = [c for c in SESSION_COLUMNS if c in table.column_names]
    if len(present) == 1:
        raise ConfigError(f"{origin}: a session table needs both session_id and turn columns, got only {present[0]}")
    labels = table.column("session_id").combine_chunks()
    if not (pa.types.is_string(labels.type) or pa.types.is_large_string(labels.type)
            or pa.types.is_integer(labels.type)):
        raise ConfigError(f"{origin}: session_id must be strings or integers, got {labels.type}")
    labels = labels.cast(pa.string())
    turn_column = table.column("turn").combine_chunks()
    if not pa.types.is_integer(turn_column.type):
        raise ConfigError(f"{origin}: turn must be integers, got {turn_column.type}")
    for name, column in (("session_id", labels), ("turn", turn_column)):
        if column.null_count:
            row = int(pc.index(pc.is_null(column), True).as_py())
            raise ConfigError(f"{origin}: {name} has a missing value at {where(row)}")
    # dictionary_encode numbers the labels in the order of their first row
    session = pc.dictionary_encode(labels).indices.to_numpy().astype(np.int64)
    raw_turn = turn_column.to_numpy()
    beyond = np.flatnonzero(raw_turn > np.iinfo(np.int64).max) if raw_turn.dtype == np.uint64 else []
    if len(beyond):
        row = int(beyond[0])
        raise ConfigError(f"{origin}: turn must be an integer from 0 to {np.iinfo(np.int64).max} at {where(row)}, "
                          f"got {raw_turn[row].item()}")
    turn = raw_turn.astype(np.int64)
    expected = _rank_within(session)
    bad = np.flatnonzero(turn != expected)
    if bad.size:
        row = int(bad[0])
        raise ConfigError(
            f"{origin}: session {labels[row].as_py()!r} has turn {turn[row]} at {where(row)}, expected turn "
            f"{expected[row]} (a session's turns are numbered 0, 1, ... in table order)"
        )
    previous = _previous_turn(session)
    later = previous >= 0
    context = np.zeros_like(input_tokens)
    context[later] = input_tokens[previous[later]] + output_tokens[previous[later]]
    short = np.flatnonzero(later & (input_tokens < context))
    if short.size:
        row = int(short[0])
        raise ConfigError(
            f"{origin}: session {labels[row].as_py()!r} turn {turn[row]} at {where(row)} has input_tokens "
            f"{input_tokens[row]}, fewer than the previous turn's input_tokens + output_tokens = {context[row]} "
            "(a turn's prompt holds the previous prompt and answer)"
        )
    return labels, session, turn


def _rank_within(session: np.ndarray) -> np.ndarray:
    """Each row's count of earlier rows of its session."""
    order = np.argsort(session, kind="stable")
    sorted_session = session[order]
    starts = np.flatnonzero(np.r_[True, sorted_session[1:] != sorted_session[:-1]])
    counts = np.diff(np.r_[starts, sorted_session.shape[0]])
    rank = np.empty_like(session)
    rank[order] = np.arange(session.shape[0]) - np.repeat(starts, counts)
    return rank


def _previous_turn(session: np.ndarray) -> np.ndarray:
    """Each row's previous turn's row (-1 for a first turn)."""
    order = np.argsort(session, kind="stable")
    previous = np.full_like(session, -1)
    same = session[order[1:]] == session[order[:-1]]
    previous[order[1:][same]] = order[:-1][same]
    return previous


def first_turns(requests: RequestTable) -> np.ndarray:
    """Rows of the sessions' first turns, in session order.

    Parameters
    ----------
    requests : RequestTable
        With sessions.

    Returns
    -------
    ndarray(int64, ndim=1)
    """
    return np.flatnonzero(requests.turn == 0).astype(np.int64)


def session_schedule(requests: RequestTable, cfg: SimConfig, seq_rank: np.ndarray, seq_tok_base: np.ndarray) -> dict:
    """The ``Load`` members of sessions (``simcore.engine.state``): empty arrays without them.

    Parameters
    ----------
    requests : RequestTable
    cfg : SimConfig
    seq_rank : ndarray(int64, ndim=1)
        The receiving global rank of each send sequence number (SPEC §3).
    seq_tok_base : ndarray(int64, ndim=1)
        Its worker's first tokenizer server.

    Returns
    -------
    dict
        ``session_mode``, ``session_closed``, ``session_think_ns`` (load.think_time_ms),
        ``session_first``, ``next_turn``, ``turn_think_ns`` (workload.sessions.think_time_ms
        before every later turn), ``seq_rank``, ``seq_tok_base``.
    """
    none = np.zeros(0, dtype=np.int64)
    if requests.session is None:
        return dict(session_mode=False, session_closed=False, session_think_ns=0, session_first=none,
                    next_turn=none, turn_think_ns=none, seq_rank=none, seq_tok_base=none)
    previous = _previous_turn(requests.session)
    next_turn = np.full(len(requests), -1, dtype=np.int64)
    next_turn[previous[previous >= 0]] = np.flatnonzero(previous >= 0)
    think = ms_to_ns(cfg.workload.sessions.think_time_ms, "workload.sessions.think_time_ms")
    return dict(
        session_mode=True,
        session_closed=cfg.load.closed_loop,
        session_think_ns=ms_to_ns(cfg.load.think_time_ms, "load.think_time_ms"),
        session_first=first_turns(requests),
        next_turn=next_turn,
        turn_think_ns=np.where(previous >= 0, think, 0).astype(np.int64),
        seq_rank=np.ascontiguousarray(seq_rank, dtype=np.int64),
        seq_tok_base=np.ascontiguousarray(seq_tok_base, dtype=np.int64),
    )


def session_block_base(requests: RequestTable, counts: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Per row, the first identity of its session's own blocks (before the shared prefix's are added).

    Without sessions every request owns its blocks (its offset in the flat
    block array); with sessions a session owns as many identities as its
    longest turn has blocks, so block j of every turn is the same identity.

    Parameters
    ----------
    requests : RequestTable
    counts : ndarray(int64, ndim=1)
        Complete prompt blocks per row.
    offset : ndarray(int64, ndim=1)
        ``n + 1`` offsets of the rows' blocks.

    Returns
    -------
    ndarray(int64, ndim=1)
    """
    if requests.session is None:
        return offset[:-1]
    longest = np.zeros(int(requests.session.max()) + 1, dtype=np.int64)
    np.maximum.at(longest, requests.session, counts)
    base = np.zeros_like(longest)
    np.cumsum(longest[:-1], out=base[1:])
    return base[requests.session]
