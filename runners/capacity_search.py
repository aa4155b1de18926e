"""Capacity search: SLO judgement, per-configuration bisection, Pareto front.

Every configuration's capacity is the highest value of one load axis
(``load.request_rate`` or ``load.concurrency``) at which its SLO holds.  A
:class:`Bracket` per configuration walks doubling, then bisection; the caller
(:mod:`runners.capacity`) gathers the next probe of every unfinished bracket
and simulates them together, so one bisection step is one batch of
:func:`simcore.run_batch`.  Nothing here imports Hydra or simulates.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from simcore.checks import shown
from simcore.config import ConfigError, SimConfig
from simcore.metrics.registry import DISTRIBUTIONS, slo_metrics

AXES = ("load.request_rate", "load.concurrency")
GOODPUT_FRACTION = "goodput_fraction"
#: The latency SLO keys: a statistic of any registered distribution (``<stat>_<name>_<unit>``).
_LATENCY_SLO = re.compile(
    r"^(mean|median|max|p(\d+))_(" + "|".join(re.escape(f"{m.name}_{m.unit}") for m in DISTRIBUTIONS) + ")$"
)
_UNITS = {m.unit for m in DISTRIBUTIONS}
#: Those keys as the error message spells them: ``<ttft|tpot|itl|e2el>_ms``.
_KNOWN_METRICS = (
    "<" + "|".join(m.name for m in DISTRIBUTIONS) + f">_{next(iter(_UNITS))}" if len(_UNITS) == 1
    else "<" + "|".join(f"{m.name}_{m.unit}" for m in DISTRIBUTIONS) + ">"
)

#: Why a bisection ended (the ``status`` column of ``capacity.parquet``).
STATUS_BRACKETED = "ok"  # the SLO holds at capacity and fails within the tolerance above it
STATUS_BELOW_LO = "below_lo"  # the SLO fails at capacity.lo already: no capacity
STATUS_ABOVE_HI = "above_hi"  # the SLO holds at capacity.hi: the capacity is at least hi
STATUS_UNBOUNDED = "unbounded"  # the SLO held at every doubling: the capacity is at least the last


@dataclass(frozen=True)
class Slo:
    """The service-level objective a probe must meet.

    Attributes
    ----------
    limits : dict of str to float
        Summary key (``p99_ttft_ms``) -> its upper bound, and optionally
        ``goodput_fraction`` -> the lower bound of the share of requests that
        meet every ``metrics.goodput`` target.
    quantile : float
        The quantile over a probe's seeds at which each metric is judged (1:
        the worst seed; for the goodput fraction the worst is the lowest).
    """

    limits: dict[str, float]
    quantile: float

    def check_config(self, config: SimConfig, where: str) -> None:
        """Raise ConfigError if ``config``'s summary will not carry a key the SLO reads."""
        for key in self.limits:
            if key == GOODPUT_FRACTION:
                if not config.metrics.goodput.enabled:
                    first, *others = [metric.column for metric in slo_metrics()]
                    choices = f"{', '.join([first, *others[:-1]])} or {others[-1]}" if others else first
                    raise ConfigError(
                        f"capacity.slo.{key} needs a per-request target: set metrics.goodput.{choices} ({where})"
                    )
                continue
            percentile = _LATENCY_SLO.match(key).group(2)
            if percentile is not None and float(percentile) not in [float(p) for p in config.metrics.percentiles]:
                raise ConfigError(
                    f"capacity.slo.{key}: {percentile} is not among metrics.percentiles "
                    f"{list(config.metrics.percentiles)} ({where})"
                )

    def judged(self, summaries: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
        """Each SLO metric over the seeds' summaries, at the SLO's quantile (None: not measured)."""
        out: dict[str, float | None] = {}
        for key in self.limits:
            values = [goodput_fraction(s) if key == GOODPUT_FRACTION else s.get(key) for s in summaries]
            if any(v is None for v in values):
                out[key] = None
                continue
            level = 1.0 - self.quantile if key == GOODPUT_FRACTION else self.quantile
            out[key] = float(np.quantile(np.asarray(values, dtype=np.float64), level))
        return out

    def holds(self, judged: Mapping[str, float | None], summaries: Sequence[Mapping[str, Any]]) -> bool:
        """True when every judged metric meets its limit and no seed left a request unfinished.

        An unfinished request (``max_time_ms`` reached) means the run stopped
        before the backlog cleared, so its latencies understate the load.
        """
        if any(s.get("incomplete") for s in summaries):
            return False
        for key, limit in self.limits.items():
            value = judged[key]
            if value is None:
                return False
            if (value < limit) if key == GOODPUT_FRACTION else (value > limit):
                return False
        return True


def goodput_fraction(summary: Mapping[str, Any]) -> float | None:
    """The share of a run's requests that met every ``metrics.goodput`` target."""
    goodput, duration, total = summary.get("request_goodput"), summary.get("duration_s"), summary.get("num_requests")
    if not total:
        return None
    if duration is None:  # nothing completed
        return 0.0
    if goodput is None:  # no target set
        return None
    return round(goodput * duration) / total  # request_goodput is a count per second of duration_s


def parse_slo(raw: Mapping[str, Any] | None, quantile: Any) -> Slo:
    """Validate ``capacity.slo`` and ``capacity.seed_quantile``.

    Raises
    ------
    ConfigError
        No SLO, an unknown SLO key, a limit that is not a positive finite number,
        a goodput fraction outside (0, 1], or a quantile outside [0, 1].
    """
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError("capacity.slo: give at least one SLO, e.g. capacity.slo.p99_ttft_ms=200")
    limits: dict[str, float] = {}
    for key, value in raw.items():
        if key != GOODPUT_FRACTION and not _LATENCY_SLO.match(str(key)):
            key = key if isinstance(key, str) and key.isprintable() else repr(key)  # one line
            raise ConfigError(
                f"capacity.slo.{key} is not an SLO key (known: <mean|median|max|p<P>>_{_KNOWN_METRICS}, "
                f"{GOODPUT_FRACTION})"
            )
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not (isinstance(value, float) or abs(value) < 2**1000) or not math.isfinite(value) or value <= 0):
            raise ConfigError(f"capacity.slo.{key} must be a positive number, got {shown(value)}")
        if key == GOODPUT_FRACTION and value > 1:
            raise ConfigError(f"capacity.slo.{key} is a share of requests in (0, 1], got {value!r}")
        limits[str(key)] = float(value)
    if isinstance(quantile, bool) or not isinstance(quantile, (int, float)) or not 0 <= quantile <= 1:
        raise ConfigError(f"capacity.seed_quantile must be a number in [0, 1], got {shown(quantile)}")
    return Slo(limits, float(quantile))


@dataclass
class Probe:
    """One axis value of one configuration, judged over its seeds."""

    value: float
    holds: bool
    judged: dict[str, float | None]
    summary: dict[str, Any]  # of the first seed (the configured one)


@dataclass
class Bracket:
    """The bisection of one configuration's capacity.

    ``lo`` is the highest value known to meet the SLO, ``hi`` the lowest known
    to fail it.  Without ``hi`` the search doubles ``lo`` until a probe fails
    (at most ``max_doublings`` times).  A search ends when ``hi <= lo × (1 +
    tolerance)``, or, on an integer axis, ``hi = lo + 1``.
    """

    start: float
    hi_given: float | None
    tolerance: float
    integer: bool
    max_doublings: int
    probes: list[Probe] = field(default_factory=list)
    lo: float | None = None
    hi: float | None = None
    status: str | None = None  # set when the search is over

    @property
    def done(self) -> bool:
        return self.status is not None

    def next_values(self) -> list[float]:
        """The values to probe in the next step (empty once done)."""
        if self.done:
            return []
        if not self.probes:  # a given hi is probed with lo: one step fewer when it holds or both fail
            return [self.start] if self.hi_given is None else [self.start, self.hi_given]
        if self.hi is None:
            return [self.lo * 2]
        mid = (self.lo + self.hi) // 2 if self.integer else (self.lo + self.hi) / 2
        return [mid]

    def record(self, probes: Sequence[Probe]) -> None:
        """Take the outcome of the values :meth:`next_values` asked for."""
        first = not self.probes
        self.probes.extend(probes)
        if first:
            start = probes[0]
            if not start.holds:
                self.status = STATUS_BELOW_LO
                return
            self.lo = start.value
            if self.hi_given is not None:
                if probes[1].holds:
                    self.lo, self.status = self.hi_given, STATUS_ABOVE_HI
                    return
                self.hi = self.hi_given
        else:
            (probe,) = probes
            if probe.holds:
                self.lo = probe.value
            else:
                self.hi = probe.value
        if self.hi is None:
            if len(self.probes) > self.max_doublings:
                self.status = STATUS_UNBOUNDED
            return
        if self.hi <= self.lo * (1 + self.tolerance) or (self.integer and self.hi - self.lo <= 1):
            self.status = STATUS_BRACKETED

    @property
    def capacity(self) -> float | None:
        """The highest value found to meet the SLO (None: not even ``capacity.lo``)."""
        return None if self.status == STATUS_BELOW_LO else self.lo

    def at_capacity(self) -> Probe | None:
        """The probe at the capacity."""
        return next((p for p in self.probes if p.value == self.lo), None) if self.capacity is not None else None

    def non_monotone(self, slo: Slo) -> list[str]:
        """Each SLO metric that improves somewhere as the axis grows: its largest improvement, as text.

        Latencies should not fall, nor the goodput share rise, with more load;
        where they do between two probes, bisection may have stepped over a
        band where the SLO holds again.
        """
        probes = sorted(self.probes, key=lambda p: p.value)
        notes = []
        for key in slo.limits:
            sign = -1.0 if key == GOODPUT_FRACTION else 1.0
            worst = None
            for a, b in zip(probes, probes[1:]):
                va, vb = a.judged[key], b.judged[key]
                if va is None or vb is None or sign * (vb - va) >= 0:
                    continue
                drop = abs(vb - va) / abs(va) if va else math.inf
                if worst is None or drop > worst[0]:
                    worst = (drop, a, b)
            if worst is not None:
                drop, a, b = worst
                verb = "rises" if sign < 0 else "falls"
                notes.append(f"{key} {verb} {drop:.2%} from {a.value:g} to {b.value:g} "
                             f"({a.judged[key]:.6g} -> {b.judged[key]:.6g})")
        return notes


def pareto_mask(x: Sequence[float], y: Sequence[float]) -> np.ndarray:
    """The points not dominated when both coordinates are maximised.

    A point is dominated when another is at least as large in both
    coordinates and larger in one; equal points are all kept.  Sorted sweep,
    O(n log n).

    Parameters
    ----------
    x, y : sequences of float
        Finite coordinates of n points.

    Returns
    -------
    numpy.ndarray of bool
        True for the points on the front.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    order = np.lexsort((-y, -x))  # x descending, then y descending
    front = np.zeros(x.shape[0], dtype=bool)
    best_y_at_larger_x = -math.inf
    start = 0
    while start < order.shape[0]:
        stop = start
        while stop < order.shape[0] and x[order[stop]] == x[order[start]]:
            stop += 1
        group = order[start:stop]
        group_best = y[group[0]]
        if group_best > best_y_at_larger_x:
            front[group[y[group] == group_best]] = True
        best_y_at_larger_x = max(best_y_at_larger_x, group_best)
        start = stop
    return front


__all__ = ["AXES", "Bracket", "Probe", "Slo", "goodput_fraction", "pareto_mask", "parse_slo"]
