"""Speculative decoding kernels: a decode step's query and its accepted proposals (docs/speculative.md).

Contract: ``@njit(cache=True)`` functions of scalars and the ``Ranks``
speculation members (``spec_drafts``, ``spec_rates``, ``spec_key``,
``spec_proposer``).  A step of vLLM's n-gram proposer proposes with the pool's
``proposal_rate`` (:func:`spec_proposes_nb`, a second hash of the same counter).  The acceptance draws are counter-based: the uniform of
request ``k``'s step whose first emitted token has index ``tok`` (its offset in
the per-token arrays) is a SplitMix64 hash of ``(key, k, tok)``, with ``key``
drawn once per run from the run seed outside the kernel
(``simcore.scheduler.api.stream_key``, stream 3).  So a step's draw does not depend on the
schedule (a step always emits at least one token, so no two steps of a request
share ``tok``), reruns are bit-identical, and no per-token array is held.
With ``engine.<pool>.speculative.draws=prompt`` (``Requests.spec_stream``
non-empty) the hash is of ``(key, prompt id, j)``, ``j`` the request's own
index of the step's first emitted token (its tokens emitted before the step):
the copies of one prompt draw alike at each of their own steps
(:func:`spec_draw_nb`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
MIX_2 = np.uint64(0x94D049BB133111EB)
UNIT = 2.0 ** -53
#: XORed into the run's key for the proposal draws (:func:`spec_proposes_nb`), so that a step's
#: proposal draw and its acceptance draw are hashes of different keys (a fixed 63-bit constant).
PROPOSAL_SALT = np.int64(0x2545F4914F6CDD1D)


@njit(cache=True)
def _mix_nb(x):
    """SplitMix64's finaliser (uint64 -> uint64, wrapping)."""
    x = (x ^ (x >> np.uint64(30))) * MIX_1
    x = (x ^ (x >> np.uint64(27))) * MIX_2
    return x ^ (x >> np.uint64(31))


@njit(cache=True)
def spec_uniform_nb(key, k, tok):
    """The uniform in [0, 1) of request ``k``'s verification whose first token is ``tok``.

    Parameters
    ----------
    key : int
        The run's key, in [0, 2**63).
    k : int
        Request index.
    tok : int
        Index of the step's first emitted token in the per-token arrays.

    Returns
    -------
    float
        ``(h >> 11) * 2**-53`` with ``h = mix(mix(key + k * G) + tok * G)``, G the golden-ratio constant.
    """
    x = _mix_nb(np.uint64(key) + np.uint64(k) * GOLDEN)
    x = _mix_nb(x + np.uint64(tok) * GOLDEN)
    return np.float64(x >> np.uint64(11)) * UNIT


@njit(cache=True)
def spec_draw_nb(key, k, offset, gen, spec_stream):
    """The uniform of request ``k``'s step whose first emitted token is its ``gen``-th (0-based).

    ``draws=request`` (``spec_stream`` empty): :func:`spec_uniform_nb` of
    ``(key, k, offset + gen)``, the step's token in the per-token arrays.
    ``draws=prompt``: of ``(key, spec_stream[k], gen)``, so requests of one
    prompt id draw the same uniform at the same output position.

    Parameters
    ----------
    key : int
        The draw's key (``Ranks.spec_key``, or it XOR :data:`PROPOSAL_SALT`).
    k : int
        Request index.
    offset, gen : int
        ``Requests.token_offset[k]`` and the tokens the request emitted before the step.
    spec_stream : ndarray(int64, ndim=1)
        ``Requests.spec_stream``: (n,) prompt ids, or (0,).

    Returns
    -------
    float
    """
    if spec_stream.shape[0] > 0:
        return spec_uniform_nb(key, spec_stream[k], gen)
    return spec_uniform_nb(key, k, offset + gen)


@njit(cache=True)
def spec_accepted_nb(rates, g, drafts, u):
    """Proposals accepted out of ``drafts``: the positions ``i`` with ``u < rates[g, i]`` (a prefix,
    the rates being non-increasing), at most ``drafts``.

    Parameters
    ----------
    rates : ndarray(float64, ndim=2)
        ``Ranks.spec_rates``, per rank the per-position acceptance.
    g : int
        Global rank.
    drafts : int
        Proposals verified.
    u : float
        The step's uniform (:func:`spec_uniform_nb`).

    Returns
    -------
    int
    """
    a = 0
    while a < drafts and u < rates[g, a]:
        a += 1
    return a


@njit(cache=True)
def spec_accepted_alpha_nb(alpha, drafts, u):
    """Proposals accepted out of ``drafts`` for a request of its own acceptance ``alpha``: the
    positions ``i`` with ``u < alpha^(i+1)``, the powers taken by repeated products (``r *= alpha``).

    Parameters
    ----------
    alpha : float
        ``Requests.spec_alpha`` of the request.
    drafts : int
        Proposals verified, at most the pool's positions.
    u : float
        The step's uniform (:func:`spec_uniform_nb`).

    Returns
    -------
    int
    """
    a = 0
    rate = alpha
    while a < drafts and u < rate:
        a += 1
        rate *= alpha
    return a


@njit(cache=True)
def spec_verify_nb(key, positions, rates, g, k, offset, gen, spec_alpha, spec_stream, drafts, spec_counts):
    """Proposals accepted by request ``k``'s verification of ``drafts`` on rank ``g``, counted in
    ``spec_counts`` (verifications, proposals, accepted per position).

    Kept out of line: the engine's pass end calls it only for a verification, so
    the common path carries no acceptance code.  It takes the speculation
    members, not the whole ``Ranks``: an out-of-line call counts a reference to
    every array of a tuple argument, at every verification.

    Parameters
    ----------
    key, positions : int
        ``Ranks.spec_key[g]`` and ``Ranks.spec_positions[g]``.
    rates : ndarray(float64, ndim=2)
        ``Ranks.spec_rates``.
    g, k : int
        Global rank and request.
    offset, gen : int
        ``Requests.token_offset[k]`` and the tokens emitted before the step (:func:`spec_draw_nb`).
    spec_alpha : ndarray(float64, ndim=1)
        ``Requests.spec_alpha``: (n,) or (0,); NaN: the pool's rates.
    spec_stream : ndarray(int64, ndim=1)
        ``Requests.spec_stream``: (n,) prompt ids (``draws=prompt``) or (0,).
    drafts : int
        Proposals verified.
    spec_counts : ndarray(int64, ndim=1)
        ``Outputs.spec_counts``.

    Returns
    -------
    int
    """
    u = spec_draw_nb(key, k, offset, gen, spec_stream)
    if spec_alpha.shape[0] > 0 and not np.isnan(spec_alpha[k]):
        accepted = spec_accepted_alpha_nb(spec_alpha[k], min(drafts, positions), u)
    else:
        accepted = spec_accepted_nb(rates, g, drafts, u)
    spec_counts[0] += 1
    spec_counts[1] += drafts
    for a in range(accepted):
        spec_counts[2 + a] += 1
    return accepted


@njit(cache=True)
def spec_query_nb(drafts, generated, computed, known, seq_limit):
    """Tokens a decode step schedules: 1, or 1 + the proposals when it has some.

    A request has proposals once it has sampled a token on this rank and its
    only token to compute is the last one (vLLM proposes after each sampling
    step; a request entering a P/D decode rank has sampled none there).  The
    query stops at the sequence limit: vLLM caps a running request's tokens at
    ``max_model_len - 1 - num_computed_tokens`` (``Scheduler.schedule``).

    Parameters
    ----------
    drafts : int
        ``Ranks.spec_drafts`` of the rank (0: off).
    generated : int
        Tokens the request has emitted.
    computed, known : int
        Its computed and known tokens.
    seq_limit : int
        The rank's sequence limit L.

    Returns
    -------
    int
        The query length, tokens (1 without proposals).
    """
    if drafts > 0 and generated >= 1 and computed == known - 1:
        return min(1 + drafts, seq_limit - known)
    return 1


@njit(cache=True)
def spec_proposes_nb(ranks, g, k, offset, gen, spec_stream):
    """Whether request ``k``'s decode step whose first token is its ``gen``-th has proposals on rank ``g``.

    vLLM's n-gram lookup proposes nothing when no suffix of the context matches,
    and that step runs as a plain decode.  With probability ``p =
    ranks.spec_proposer[g, 3]`` (``proposal_rate``) a step proposes: the step's
    uniform is :func:`spec_draw_nb` with the key ``key XOR PROPOSAL_SALT``
    and the step proposes when it is below ``p``.  ``p >= 1``: always, without a
    draw (the behaviour without the key).

    Parameters
    ----------
    ranks : Ranks
        ``spec_proposer`` and ``spec_key`` of rank ``g``.
    g, k : int
        Global rank and request.
    offset, gen : int
        ``Requests.token_offset[k]`` and the tokens emitted before the step.
    spec_stream : ndarray(int64, ndim=1)
        ``Requests.spec_stream`` (:func:`spec_draw_nb`).

    Returns
    -------
    bool
    """
    rate = ranks.spec_proposer[g, 3]
    if rate >= 1.0:
        return True
    return spec_draw_nb(ranks.spec_key[g] ^ PROPOSAL_SALT, k, offset, gen, spec_stream) < rate


@njit(cache=True)
def spec_proposer_ms_nb(proposer, g, num_decode):
    """The proposer's time in a pass of rank g with ``num_decode`` decode entries, ms.

    ``passes x (pass_ms + per_seq_us x num_decode / 1000)``, 0 without decode entries.

    Parameters
    ----------
    proposer : ndarray(float64, ndim=2)
        ``Ranks.spec_proposer``: per rank ``[passes, pass_ms, per_seq_us, proposal_rate]``.
    g : int
        Global rank.
    num_decode : int
        Decode entries of the rank's batch.

    Returns
    -------
    float
    """
    if num_decode == 0:
        return 0.0
    return proposer[g, 0] * (proposer[g, 1] + proposer[g, 2] * num_decode / 1000)
