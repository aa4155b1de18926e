"""The run's settings: one frozen dataclass per stage, assembled into :class:`SimConfig`.

Each stage declares its keys once in its own ``settings`` module
(``simcore/<stage>/settings.py``); this module only puts the sections
together, in the order of the configuration tree.  :func:`simcore.config.load_config`
builds a :class:`SimConfig` and is the only place that should.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simcore.checks import count, defaults, key, optional_number, section
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

    seed: int = key(
        0, count, minimum=0,
        doc="Seed of every random draw (lengths, arrival gaps, routing); the same seed gives bit-identical tables.",
    )
    workload: WorkloadConfig = section(WorkloadConfig, doc="The requests: generated or read from a file.")
    load: LoadConfig = section(LoadConfig, doc="When the client sends them: a closed loop, an open loop or a trace's timestamps.")
    engine: EngineConfig = section(
        EngineConfig, engine_settings.defaults, doc="The deployment: scheduling policy, pools of workers, routing."
    )
    timing: TimingConfig = section(TimingConfig, doc="How long each engine pass takes.")
    tokenization: TokenizationConfig = section(
        TokenizationConfig, doc="The server's tokenizer before a request reaches the engine (all 0: off)."
    )
    detokenization: DetokenizationConfig = section(
        DetokenizationConfig, doc="The server's response path: detokenizer jobs per pass before the client receives tokens (all 0: off)."
    )
    max_time_ms: float | None = key(
        None, optional_number, maximum=MAX_INSTANT_MS,
        doc="Stop simulating at this instant; requests not finished by then are reported as cut off. null: run to the end.",
    )
    metrics: MetricsConfig = section(MetricsConfig, doc="What the summary reports.")
    output: OutputConfig = section(OutputConfig, doc="Which result files are written, and where.")
    resolved: dict = field()  # the merged mapping, for summary.json
    # Each active pool's timing, in engine.pools order: ``timing`` itself unless the pool has its own
    # engine.<pool>.timing keys (docs/timing.md, Per-pool timing); () before simcore.derive.derive.
    pool_timing: tuple = field(default=())

    def timing_of(self, index: int) -> TimingConfig:
        """The timing of the active pool ``index`` (engine.pools order): its own, or the timing section's."""
        return self.pool_timing[index] if self.pool_timing else self.timing

    @property
    def per_pool_timing(self) -> bool:
        """Whether some active pool has timing of its own (engine.<pool>.timing)."""
        return any(t is not self.timing for t in self.pool_timing)


#: The default tree, built from each stage's declarations (its order is the
#: order of summary.json's config block).
DEFAULTS: dict = defaults(SimConfig)
