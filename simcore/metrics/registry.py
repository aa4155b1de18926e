"""The latency distributions of a run, each declared once (SPEC §10, ``docs/metrics.md``).

The summary keys (``<stat>_<name>_<unit>``), the request-table fields of the
per-request metrics and their values, the goodput targets
(``metrics.goodput``), the capacity search's SLO keys, the calibration's
metrics, the terminal report and the ``vllm bench serve`` and aiperf exports
all read this table.  A metric's vLLM and aiperf names are optional: an export
leaves out a metric it has no name for.  The module imports nothing of the
simulator, so every stage and runner may use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class Distribution:
    """One latency distribution of the summary.

    ``column`` is the request-table field holding one value per request, or
    None for a metric pooled over token gaps (ITL).  ``depends`` names the
    request-table instants the formula reads.  ``compute`` derives the
    per-request values (float64, NaN where the metric does not apply) from
    ``simcore.metrics.api.RequestColumns``; None for the built-in metrics,
    which ``RequestColumns`` computes itself.  ``vllm`` / ``aiperf`` (with
    ``aiperf_header``): the metric's name in ``vllm bench serve``'s result
    JSON and its tag in aiperf's export, None where those tools have none (the
    export leaves the metric out).  ``slo``: ``metrics.goodput.<column>`` sets
    a per-request target (a request where the metric is NaN meets it).
    ``calibration``: the metric's label in ``replaysim-calibrate``'s fit, None
    when it is not fitted (a measured run gives TTFT and E2E latency, so only
    metrics derived from those can be).
    """

    name: str
    label: str
    unit: str
    formula: str
    depends: tuple[str, ...]
    column: str | None
    vllm: str | None = None
    aiperf: str | None = None
    aiperf_header: str | None = None
    compute: Callable[[Any], Any] | None = None
    slo: bool = False
    calibration: str | None = None


TTFT = Distribution(
    name="ttft", label="TTFT", unit="ms",
    formula="first_token - send",
    depends=("send_ms", "first_token_ms"),
    column="ttft_ms", vllm="ttft",
    aiperf="time_to_first_token", aiperf_header="Time to First Token",
    slo=True, calibration="TTFT",
)
TPOT = Distribution(
    name="tpot", label="TPOT", unit="ms",
    formula="(last - first token) / (generated - 1), completed with >= 2 tokens",
    depends=("first_token_ms", "last_token_ms", "generated_tokens"),
    column="tpot_ms", vllm="tpot",
    # aiperf's inter-token latency is the per-request average: replaysim's TPOT.
    aiperf="inter_token_latency", aiperf_header="Inter Token Latency",
    slo=True, calibration="TPOT",
)
ITL = Distribution(
    name="itl", label="ITL", unit="ms",
    formula="gaps between consecutive receipts of a completed request, pooled",
    depends=("received_ms",),
    column=None, vllm="itl",
    # aiperf's per-gap times (one chunk per token): replaysim's ITL.
    aiperf="inter_chunk_latency", aiperf_header="Inter Chunk Latency",
)
E2EL = Distribution(
    name="e2el", label="E2EL", unit="ms",
    formula="last token - send, completed requests",
    depends=("send_ms", "last_token_ms"),
    column="e2el_ms", vllm="e2el",
    aiperf="request_latency", aiperf_header="Request Latency",
    slo=True, calibration="E2E",
)

#: In ``vllm bench serve``'s order (``--percentile-metrics ttft,tpot,itl,e2el``).
DISTRIBUTIONS = (TTFT, TPOT, ITL, E2EL)
BY_NAME = {metric.name: metric for metric in DISTRIBUTIONS}


def slo_metrics() -> tuple[Distribution, ...]:
    """The per-request metrics a goodput target can be set on, in registry order.

    Returns
    -------
    tuple of Distribution
        Those of :data:`DISTRIBUTIONS` with ``slo`` and a request-table
        column; the goodput keys are ``metrics.goodput.<column>``.
    """
    return tuple(metric for metric in DISTRIBUTIONS if metric.slo and metric.column)


@dataclass(frozen=True)
class CacheTierMetric:
    """A summary figure of the KV-cache tiers (docs/prefix-caching.md): ``formula`` over admitted requests."""

    name: str
    unit: str
    formula: str


#: Summary keys of the cache tiers, after ``prefix_cache_hit_rate`` (the tiers
#: are null without a CPU tier, ``kv_offload``).
CACHE_TIERS = (
    CacheTierMetric("gpu_prefix_cache_hit_rate", "", "sum gpu_cached_tokens / sum input_tokens"),
    CacheTierMetric("cpu_prefix_cache_hit_rate", "", "sum cpu_cached_tokens / sum input_tokens"),
    CacheTierMetric("kv_offload_loaded_gb", "GB", "KV bytes copied CPU -> GPU / 1e9"),
    CacheTierMetric("kv_offload_stored_gb", "GB", "KV bytes copied GPU -> CPU / 1e9"),
)

#: Summary keys of speculative decoding (docs/speculative.md), present only when a pool
#: speculates, as vLLM counts them (vllm/v1/spec_decode/metrics.py: ``num_drafts``,
#: ``num_draft_tokens``, ``num_accepted_tokens``, ``num_accepted_tokens_per_pos``) over the
#: verifications that ended by the cap; the rates are null without one.  After them,
#: ``spec_decode_acceptance_rate_pos_<i>`` for each draft position i = 1..P.
SPEC_DECODE = (
    CacheTierMetric("spec_decode_num_drafts", "", "verifications (decode steps with proposals)"),
    CacheTierMetric("spec_decode_draft_tokens", "tokens", "proposals verified"),
    CacheTierMetric("spec_decode_accepted_tokens", "tokens", "proposals accepted"),
    CacheTierMetric("spec_decode_acceptance_rate", "", "accepted / draft_tokens"),
    CacheTierMetric("spec_decode_acceptance_length", "tokens", "1 + accepted / num_drafts (tokens per step)"),
)
#: The per-position key: verifications whose position i was accepted / num_drafts.
SPEC_POSITION_KEY = "spec_decode_acceptance_rate_pos_{}"

#: The statistics every distribution reports besides its percentiles, in summary order.
STATISTICS = ("mean", "median", "std", "min", "max")


@dataclass(frozen=True)
class TurnGroup:
    """Turns of multi-turn sessions whose requests a per-turn distribution pools."""

    name: str
    first: int  # the lowest turn index
    last: int | None  # the highest (None: no bound)

    def selects(self, turn):
        """Whether each turn index (an array) is in the group."""
        return (turn >= self.first) & (True if self.last is None else turn <= self.last)


#: With sessions: the first turn (a cold prompt) against the later ones (the
#: previous turns' context is in the prompt, cached where still resident).
TURN_GROUPS = (TurnGroup("first_turn", 0, 0), TurnGroup("later_turns", 1, None))
#: The distributions reported per turn group, as ``<stat>_<name>_<group>_<unit>``.
PER_TURN = (TTFT, E2EL)


def per_turn(metric: Distribution, group: TurnGroup) -> Distribution:
    """``metric`` over the completed requests of one turn group (``ttft_first_turn``).

    Parameters
    ----------
    metric : Distribution
        One of :data:`PER_TURN`.
    group : TurnGroup

    Returns
    -------
    Distribution
        Named ``<name>_<group>``; its summary keys are ``<stat>_<name>_<group>_<unit>``.
    """
    span = f"turn {group.first}" if group.last == group.first else f"turns >= {group.first}"
    return replace(
        metric, name=f"{metric.name}_{group.name}", label=f"{metric.label} ({span})",
        formula=f"{metric.formula}; requests of {span} of their session", depends=(*metric.depends, "turn"),
    )


def percentile_key(p: float) -> str:
    """``p99`` for an integral percentile, ``p99.9`` otherwise (SPEC §10).

    Parameters
    ----------
    p : float
        Percentile, 0..100.

    Returns
    -------
    str
        The key prefix of the summary field.
    """
    return f"p{int(p)}" if float(p).is_integer() else f"p{p}"


def summary_key(statistic: str, metric: Distribution) -> str:
    """The summary key of one statistic of a distribution, ``mean_ttft_ms``.

    Parameters
    ----------
    statistic : str
        One of :data:`STATISTICS` or a percentile prefix (``p99``).
    metric : Distribution

    Returns
    -------
    str
        ``<statistic>_<name>_<unit>``.
    """
    return f"{statistic}_{metric.name}_{metric.unit}"


_PERCENTILE_KEY = re.compile(rf"^(p\d+(?:\.\d+)?)_{TTFT.name}_{TTFT.unit}$")


def percentile_names(summary: Mapping[str, Any]) -> list[str]:
    """The percentile key prefixes of a summary, in the configured order.

    Every distribution reports the same percentiles; TTFT's keys are read.

    Parameters
    ----------
    summary : mapping
        A run summary (``simcore.Result.summary``).

    Returns
    -------
    list of str
        ``p50``, ``p99.9``, ...
    """
    return [m.group(1) for m in map(_PERCENTILE_KEY.match, summary) if m]
