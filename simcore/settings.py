"""The run's settings: one frozen dataclass per stage, assembled into :class:`SimConfig`.

Each stage declares its keys once in its own ``settings`` module
(``simcore/<stage>/settings.py``); this module only puts the sections
together, in the order of the configuration tree.  :func:`simcore.config.load_config`
builds a :class:`SimConfig` and is the only place that should.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simcore.checks import count, key, optional_number, section
from simcore.client.settings import DetokenizationConfig, TokenizationConfig
from simcore.engine import settings as engine_settings
from simcore.engine.settings import EngineConfig
from simcore.metrics.settings import MetricsConfig, OutputConfig
from simcore.timing.settings import TimingConfig
from simcore.units import MAX_INSTANT_MS
from simcore.workload.settings import LoadConfig, WorkloadConfig


@dataclass(frozen=True)
class SimConfig:
    """Every stage's settings, checked and derived (:func:`simcore.config.load_config`)."""

    seed: int = key(0, count, minimum=0)
    workload: WorkloadConfig = section(WorkloadConfig)
    load: LoadConfig = section(LoadConfig)
    engine: EngineConfig = section(EngineConfig, engine_settings.defaults)
    timing: TimingConfig = section(TimingConfig)
    tokenization: TokenizationConfig = section(TokenizationConfig)
    detokenization: DetokenizationConfig = section(DetokenizationConfig)
    max_time_ms: float | None = key(None, optional_number, maximum=MAX_INSTANT_MS)
    metrics: MetricsConfig = section(MetricsConfig)
    output: OutputConfig = section(OutputConfig)
    resolved: dict = field()  # the merged mapping, for summary.json
