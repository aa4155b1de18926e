"""Hydra's basic sweeper, composing each job's config once instead of twice.

(A Hydra plugin module: Hydra instantiates sweepers only from the
``hydra_plugins`` namespace.)

Hydra's :class:`~hydra._internal.core_plugins.basic_sweeper.BasicSweeper`
composes every job of a batch before launching it (so that a composition
error stops the sweep before any job runs), then the launcher composes each
job again, about 0.05 s a job here.  :class:`ComposeOnceSweeper` keeps what the
check composed and hands it to the launcher, which asks for the same
overrides: every launcher composes through the sweeper's config loader
(basic, joblib and submitit in the launching process).  Registered as
``hydra.sweeper._target_`` in ``runners/conf/config.yaml``; its keys are the
basic sweeper's.
"""

from __future__ import annotations

from typing import Any, Sequence

from hydra.core.config_loader import ConfigLoader
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from runners.hydra_private import basic_sweeper  # the one module using hydra._internal

#: Composed configs kept at most (about 0.2 MB each): jobs past it are composed twice, as by Hydra.
MAX_KEPT = 256


class _ComposedOnce:
    """A config loader that returns a kept composition of the same job overrides once.

    Everything else is delegated to Hydra's loader.  Pickled (a joblib or
    submitit launcher sends the Hydra context to its workers) as that loader.
    """

    def __init__(self, loader: ConfigLoader) -> None:
        self.loader = loader
        self.kept: dict[tuple[str, ...], DictConfig] = {}

    def keep(self, master_config: DictConfig, overrides: Sequence[str]) -> None:
        """Compose the job of ``overrides`` (raising as Hydra would) and keep it for the launcher."""
        config = self.loader.load_sweep_config(master_config, list(overrides))
        if len(self.kept) < MAX_KEPT:
            self.kept[tuple(overrides)] = config

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        kept = self.kept.pop(tuple(sweep_overrides), None)
        if kept is not None:
            return kept
        return self.loader.load_sweep_config(master_config, sweep_overrides)

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "kept"):  # not set yet (a copy under construction)
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __reduce__(self) -> tuple:
        return _same, (self.loader,)


def _same(loader: ConfigLoader) -> ConfigLoader:
    return loader


class ComposeOnceSweeper(basic_sweeper()):
    """The basic sweeper (same keys, same job order) whose launcher reuses the check's compositions."""

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.composed = _ComposedOnce(hydra_context.config_loader)
        context = HydraContext(config_loader=self.composed, callbacks=hydra_context.callbacks)
        super().setup(hydra_context=context, task_function=task_function, config=config)

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        for overrides in batch:
            self.composed.keep(self.config, overrides)
