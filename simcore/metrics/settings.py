"""Metric and output settings: percentiles, goodput thresholds and what a run writes.

Each key is declared once, as a field of a frozen dataclass
(:func:`simcore.checks.key`): its default and its check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from simcore.checks import KeyDoc, Later, choice, flag, key, number, optional_number, optional_str, parse_keys, section
from simcore.errors import ConfigError
from simcore.metrics.registry import slo_metrics

OUTPUT_MODES = ("detailed", "bounded")


def _percentiles(path: str, value: Any) -> tuple[float, ...]:
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__") or iter(value) is value:  # an iterator reads once
        raise ConfigError(f"{path} must be a list of numbers in [0, 100], got {value!r}")
    out = []
    for item in value:
        p = number(path, item)
        if p > 100:
            raise ConfigError(f"{path} values must be in [0, 100], got {item!r}")
        out.append(p)
    if len(set(out)) != len(out):
        raise ConfigError(f"{path} must not repeat a value, got {list(value)!r}")
    return tuple(out)


@dataclass(frozen=True)
class GoodputConfig:
    """Per-request targets, ms (None: none), by the column of each ``registry.slo_metrics()`` metric."""

    targets: tuple[tuple[str, float | None], ...]

    def target(self, column: str) -> float | None:
        return dict(self.targets)[column]

    @property
    def enabled(self) -> bool:
        return any(v is not None for _, v in self.targets)

    @staticmethod
    def key_docs(path: str) -> list[KeyDoc]:
        """One key per metric that takes a target (read by :func:`simcore.checks.describe`)."""
        return [
            KeyDoc(f"{path}.{metric.column}", None, "float | None", metric.unit, "number > 0 or null",
                   f"Goodput: a request is good only if its {metric.label} is at most this (with every other "
                   "target); null: no target.")
            for metric in slo_metrics()
        ]


def _goodput_tree() -> dict[str, Any]:
    # One key per metric that takes a target: its request-table column.
    return {metric.column: None for metric in slo_metrics()}


def _goodput(path: str, raw: Mapping[str, Any]) -> GoodputConfig:
    return GoodputConfig(tuple(
        (column, optional_number(f"{path}.{column}", raw[column], strict=True)) for column in _goodput_tree()
    ))


@dataclass(frozen=True)
class MetricsConfig:
    percentiles: tuple[float, ...] = key(
        [50, 90, 95, 99], _percentiles,
        doc="Percentiles reported for every latency metric (vllm bench serve --metric-percentiles).",
        values="list of numbers in [0, 100], no repeats",
    )
    goodput: GoodputConfig = section(GoodputConfig, tree=_goodput_tree)


@dataclass(frozen=True)
class OutputConfig:
    dir: str | None = key(
        None, optional_str,
        doc="Directory for the result files; null: the run's Hydra directory (outputs/<date>/<time>).",
    )
    passes: bool = key(
        False, flag,
        doc="Also write passes.parquet: one row per engine pass (batch, tokens, KV use, duration).",
    )
    tokens: bool = key(
        False, flag,
        doc="Also write tokens.parquet: one row per output token with its emission and receipt instants.",
    )
    mode: str = key(
        "detailed", choice, allowed=OUTPUT_MODES,
        doc="detailed: per-token arrays; bounded: memory O(requests) for million-request runs, ITL percentiles from a sketch within 0.05%.",
    )


def parse(raw: Mapping[str, Any], path: str = "metrics") -> MetricsConfig:
    """Check the ``metrics`` section.

    Parameters
    ----------
    raw : Mapping[str, Any]
        The merged ``metrics`` tree.
    path : str
        Its dotted path, for messages.

    Returns
    -------
    MetricsConfig
    """
    return parse_keys(
        MetricsConfig, raw, path, goodput=Later(lambda: _goodput(f"{path}.goodput", raw["goodput"]))
    )


def parse_output(raw: Mapping[str, Any], path: str = "output") -> OutputConfig:
    """Check the ``output`` section.

    Parameters
    ----------
    raw : Mapping[str, Any]
        The merged ``output`` tree.
    path : str
        Its dotted path, for messages.

    Returns
    -------
    OutputConfig
    """
    return parse_keys(OutputConfig, raw, path)
