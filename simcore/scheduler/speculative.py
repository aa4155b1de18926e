"""Speculative decoding: the engines' own configurations read into one description (docs/speculative.md).

``engine.<pool>.speculative.config`` takes the form of the policy's engine,
verbatim: vLLM's ``--speculative-config`` JSON, SGLang's ``--speculative-*``
server arguments, TensorRT-LLM's ``speculative_config``.  :func:`read_engine_form`
maps each to a :class:`Speculation`; :func:`acceptance_rates` gives the
per-position acceptance model.  Imports nothing of the simulator but the
errors and the value checks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from simcore.checks import count, is_number, shown
from simcore.errors import ConfigError

#: The engine forms (``Policy.speculative_form`` of :mod:`simcore.scheduler.policies`).
FORM_VLLM, FORM_SGLANG, FORM_TRTLLM = "vLLM --speculative-config", "SGLang --speculative-*", "TensorRT-LLM speculative_config"
SPEC_FORMS = (FORM_VLLM, FORM_SGLANG, FORM_TRTLLM)

#: Most draft tokens one verification may carry (a bound; the engines' own
#: examples use 1-10).
MAX_DRAFT_TOKENS = 32

#: ``engine.<pool>.speculative.draws``: the acceptance draws' stream per request, or per prompt id
#: (docs/speculative.md, "Draws per prompt").
SPEC_DRAWS = ("request", "prompt")

#: vLLM's methods (``SpeculativeConfig.method``, vllm/config/speculative.py).
#: ``use_eagle()`` is true for eagle, eagle3 and mtp, ``uses_draft_model()`` for
#: draft_model: both reserve ``num_lookahead_tokens = num_speculative_tokens``
#: KV slots per scheduled request (vllm/v1/core/sched/scheduler.py,
#: ``Scheduler.__init__``); n-gram proposals need none.
VLLM_METHODS = ("ngram", "eagle", "eagle3", "mtp", "draft_model")
VLLM_LOOKAHEAD = ("eagle", "eagle3", "mtp", "draft_model")
#: vLLM's n-gram lookup proposes nothing when no suffix of the context matches
#: (``proposal_rate``, docs/speculative.md); the other proposers always propose.
VLLM_NGRAM = "ngram"
VLLM_FIELDS = ("method", "model", "num_speculative_tokens", "draft_tensor_parallel_size",
               "prompt_lookup_min", "prompt_lookup_max")
#: SGLang's ``--speculative-algorithm`` values (NEXTN is EAGLE there).
SGLANG_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
SGLANG_FIELDS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
                 "speculative_num_draft_tokens", "speculative_draft_model_path")
#: TensorRT-LLM's ``speculative_config.decoding_type`` values.
TRTLLM_TYPES = ("Eagle", "Eagle3", "MTP", "NGram", "DraftTarget")
TRTLLM_FIELDS = ("decoding_type", "max_draft_len", "num_nextn_predict_layers", "speculative_model_dir",
                 "max_matching_ngram_size", "eagle3_one_model")


@dataclass(frozen=True)
class Speculation:
    """One pool's speculative decoding, whichever engine form it came from.

    A decode step of a request that has sampled a token on its rank verifies
    ``draft_tokens`` proposals (query ``draft_tokens + 1``); at most
    ``positions`` of them can be accepted (a chain: ``positions ==
    draft_tokens``; SGLang's tree with ``topk > 1`` verifies more than it can
    accept).  ``rates[i]``: probability that proposal ``i + 1`` is accepted
    (all before it accepted too), non-increasing.
    """

    method: str  # the engine's name of the proposer
    draft_tokens: int  # proposals verified per decode step
    positions: int  # most proposals accepted per step
    lookahead: int  # extra KV slots allocated per scheduled request (vLLM num_lookahead_tokens)
    proposer_steps: int  # sequential proposer passes per engine step (1 for n-gram lookup)
    rates: tuple[float, ...]  # per-position acceptance (length ``positions``)
    proposer_step_ms: float  # one proposer pass, ms
    proposer_per_seq_us: float  # one proposer pass, per decoding sequence, us
    proposal_rate: float = 1.0  # probability that a decode step has proposals (vLLM n-gram: a match)
    draws: str = "request"  # the draws' stream: each request's own, or one per prompt id (SPEC_DRAWS)


def _mapping(path: str, value: Any) -> dict[str, Any]:
    """The engine form as a mapping: a mapping, or a JSON object in a string; keys with ``-`` or a
    leading ``--`` (command-line spelling) become argument names."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{path} is not valid JSON ({error.msg} at character {error.pos})") from None
    if not isinstance(value, Mapping):
        raise ConfigError(f"{path} must be a mapping or a JSON object, got {shown(value)}")
    return {str(name).lstrip("-").replace("-", "_"): item for name, item in value.items()}


def _unknown(path: str, form: Mapping[str, Any], allowed: tuple[str, ...], engine: str) -> None:
    unknown = [name for name in form if name not in allowed]
    if unknown:
        raise ConfigError(f"{path}: unknown or unmodelled {engine} field(s) {', '.join(unknown)} "
                          f"(allowed: {', '.join(allowed)})")


def _tokens(path: str, value: Any) -> int:
    n = count(path, value)
    if n > MAX_DRAFT_TOKENS:
        raise ConfigError(f"{path} must be <= {MAX_DRAFT_TOKENS}, got {n}")
    return n


def read_engine_form(path: str, value: Any, engine_form: str) -> tuple[str, int, int, int, int]:
    """``(method, draft_tokens, positions, lookahead, proposer_steps)`` of one engine form.

    Parameters
    ----------
    path : str
        The dotted key (``engine.aggregated.speculative.config``), for messages.
    value : Any
        The engine's own configuration: a mapping or a JSON string.
    engine_form : str
        The policy's form, one of :data:`SPEC_FORMS`.

    Returns
    -------
    tuple of (str, int, int, int, int)

    Raises
    ------
    ConfigError
        An unknown field (all named), a missing or bad value.
    """
    form = _mapping(path, value)
    if engine_form not in SPEC_FORMS:
        raise ValueError(f"unknown speculative engine form {engine_form!r}")
    if engine_form == FORM_TRTLLM:
        _unknown(path, form, TRTLLM_FIELDS, FORM_TRTLLM)
        kind = form.get("decoding_type")
        if kind not in TRTLLM_TYPES:
            raise ConfigError(f"{path}.decoding_type must be one of {', '.join(TRTLLM_TYPES)}, got {shown(kind)}")
        if kind == "MTP":
            k = _tokens(f"{path}.num_nextn_predict_layers", form.get("num_nextn_predict_layers"))
        else:
            k = _tokens(f"{path}.max_draft_len", form.get("max_draft_len"))
        return kind, k, k, 0, 1 if kind == "NGram" else k
    if engine_form == FORM_SGLANG:
        _unknown(path, form, SGLANG_FIELDS, FORM_SGLANG)
        algorithm = form.get("speculative_algorithm")
        if algorithm not in SGLANG_ALGORITHMS:
            raise ConfigError(f"{path}.speculative_algorithm must be one of {', '.join(SGLANG_ALGORITHMS)}, "
                              f"got {shown(algorithm)}")
        if algorithm == "NGRAM":  # a lookup of num_draft_tokens - 1 proposals, verified as a chain
            q = _tokens(f"{path}.speculative_num_draft_tokens", form.get("speculative_num_draft_tokens"))
            if q < 2:
                raise ConfigError(f"{path}.speculative_num_draft_tokens must be >= 2 with NGRAM, got {q}")
            return algorithm, q - 1, q - 1, 0, 1
        steps = _tokens(f"{path}.speculative_num_steps", form.get("speculative_num_steps"))
        topk = form.get("speculative_eagle_topk", 1)
        topk = count(f"{path}.speculative_eagle_topk", topk)
        q = form.get("speculative_num_draft_tokens", steps + 1 if topk == 1 else None)
        q = _tokens(f"{path}.speculative_num_draft_tokens", q)
        if topk == 1 and q != steps + 1:
            raise ConfigError(f"{path}.speculative_num_draft_tokens must be speculative_num_steps + 1 = "
                              f"{steps + 1} with speculative_eagle_topk=1 (a chain), got {q}")
        if q < steps + 1:
            raise ConfigError(f"{path}.speculative_num_draft_tokens must be >= speculative_num_steps + 1 = "
                              f"{steps + 1}, got {q}")
        return algorithm, q - 1, steps, 0, steps
    _unknown(path, form, VLLM_FIELDS, FORM_VLLM)
    method = form.get("method")
    if method is None and form.get("model") in ("ngram", "[ngram]"):
        method = "ngram"
    if method not in VLLM_METHODS:
        raise ConfigError(f"{path}.method must be one of {', '.join(VLLM_METHODS)}, got {shown(method)}")
    k = _tokens(f"{path}.num_speculative_tokens", form.get("num_speculative_tokens"))
    for name in ("draft_tensor_parallel_size", "prompt_lookup_min", "prompt_lookup_max"):
        if form.get(name) is not None:
            count(f"{path}.{name}", form[name])
    if method != "ngram" and (form.get("prompt_lookup_min") is not None or form.get("prompt_lookup_max") is not None):
        raise ConfigError(f"{path}.prompt_lookup_min/max are used by method=ngram only, got method={method}")
    lookahead = k if method in VLLM_LOOKAHEAD else 0
    return method, k, k, lookahead, 1 if method == "ngram" else k


def acceptance_rates(path: str, rates: Any, mean_length: Any, positions: int) -> tuple[float, ...]:
    """The per-position acceptance probabilities: given, or derived from a mean acceptance length.

    Given (vLLM's per-position acceptance rates, ``vllm:spec_decode_num_accepted_tokens_per_pos``
    over ``num_drafts``): ``positions`` values in [0, 1], non-increasing.  From a
    mean acceptance length ``tau`` (vLLM's ``1 + accepted / drafts``, in ``[1,
    positions + 1]``): the standard model of Leviathan et al. (2023), each
    proposal accepted independently with probability ``alpha`` while all before it
    were, so ``rates[i] = alpha ** (i + 1)`` and ``tau = (1 - alpha ** (P + 1)) /
    (1 - alpha)``; ``alpha`` is found by 200 bisection steps (deterministic).

    Parameters
    ----------
    path : str
        The section's dotted path, for messages.
    rates : list of float or None
        ``acceptance_rates``.
    mean_length : float or None
        ``mean_acceptance_length``.
    positions : int
        Proposals that can be accepted per step.

    Returns
    -------
    tuple of float
    """
    if (rates is None) == (mean_length is None):
        raise ConfigError(f"{path}: set exactly one of acceptance_rates and mean_acceptance_length "
                          f"(got {'both' if rates is not None else 'neither'})")
    if rates is not None:
        if not isinstance(rates, (list, tuple)) or len(rates) != positions:
            raise ConfigError(f"{path}.acceptance_rates must be a list of {positions} probabilities "
                              f"(one per draft position), got {shown(rates)}")
        values = []
        for i, r in enumerate(rates):
            if not is_number(r) or not 0.0 <= float(r) <= 1.0:
                raise ConfigError(f"{path}.acceptance_rates[{i}] must be in [0, 1], got {shown(r)}")
            if values and float(r) > values[-1]:
                raise ConfigError(f"{path}.acceptance_rates must be non-increasing (position {i + 1} is accepted "
                                  f"only with every earlier one), got {shown(rates)}")
            values.append(float(r))
        return tuple(values)
    if not is_number(mean_length) or not math.isfinite(float(mean_length)):
        raise ConfigError(f"{path}.mean_acceptance_length must be a number, got {shown(mean_length)}")
    tau = float(mean_length)
    if not 1.0 <= tau <= positions + 1:
        raise ConfigError(f"{path}.mean_acceptance_length must be in [1, {positions + 1}] "
                          f"(1 + accepted per step of {positions} proposals), got {tau!r}")
    alpha = float(geometric_alpha(np.array([tau]), positions)[0])
    rates, rate = [], 1.0
    for _ in range(positions):
        rate *= alpha
        rates.append(rate)
    return tuple(rates)


def geometric_alpha(tau: np.ndarray, positions: int) -> np.ndarray:
    """Per-proposal acceptance ``alpha`` with ``1 + alpha + ... + alpha^P = tau`` (the geometric model).

    Parameters
    ----------
    tau : ndarray(float64, ndim=1)
        Mean acceptance lengths in ``[1, P + 1]`` (NaN stays NaN).
    positions : int
        ``P``.

    Returns
    -------
    ndarray(float64, ndim=1)
        200 bisection steps over [0, 1] (the sum evaluated by Horner-free accumulation,
        ``term *= alpha``); exactly 0 at ``tau = 1`` and 1 at ``tau = P + 1``.
        The steps stop early once a step leaves every interval as it was: each
        later step would too, so the result is that of all 200.
    """
    lo, hi = np.zeros(tau.shape[0]), np.ones(tau.shape[0])
    for _ in range(200):
        mid = (lo + hi) / 2
        total, term = np.zeros(tau.shape[0]), np.ones(tau.shape[0])
        for _ in range(positions + 1):
            total += term
            term = term * mid
        below = total < tau
        next_lo = np.where(below, mid, lo)
        next_hi = np.where(below, hi, mid)
        if np.array_equal(next_lo, lo, equal_nan=True) and np.array_equal(next_hi, hi, equal_nan=True):
            break
        lo, hi = next_lo, next_hi
    alpha = (lo + hi) / 2
    alpha = np.where(tau == positions + 1, 1.0, np.where(tau == 1.0, 0.0, alpha))
    return np.where(np.isnan(tau), np.nan, alpha)
