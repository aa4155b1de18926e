"""Hydra's basic sweeper, composing each job's config once instead of twice, or a batch's once in all.

(A Hydra plugin module: Hydra instantiates sweepers only from the
``hydra_plugins`` namespace.)

With Hydra's basic launcher and a task that runs composed jobs (replaysim's:
``runners.cli.run_composed_jobs``, set as the task function's
``run_composed_jobs`` attribute), a batch whose jobs differ only in plain
values of existing keys is composed once (:func:`runners.multirun.compose`):
the first job through Hydra, every other job by setting its values on that
composition as Hydra's override step does.  The jobs' ``.hydra/`` records and
log files are written as Hydra's ``run_job`` writes them and the jobs run
together (:func:`runners.multirun.launch`), so points of one shape share the
batch path.  Other batches go through the launcher as below.

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

import time
from pathlib import Path
from typing import Any, Sequence

from hydra.core.config_loader import ConfigLoader
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from runners import multirun
from runners.hydra_private import basic_sweeper  # the one module using hydra._internal

#: The task function's attribute naming its runner of composed jobs (a callable taking a list of
#: :class:`runners.multirun.ComposedJob`).
RUN_COMPOSED_JOBS = "run_composed_jobs"

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
        self.run_composed_jobs = getattr(task_function, RUN_COMPOSED_JOBS, None)
        if not multirun.callbacks_allow(hydra_context.callbacks):
            self.run_composed_jobs = None
        context = HydraContext(config_loader=self.composed, callbacks=hydra_context.callbacks)
        super().setup(hydra_context=context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        """Hydra's ``BasicSweeper.sweep`` (same jobs, same order, same ``multirun.yaml``), batches composed once when they qualify."""
        if self.run_composed_jobs is None:
            return super().sweep(arguments)
        params_conf = self._parse_config()
        params_conf.extend(arguments)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        self.overrides = self.split_arguments(parser.parse_overrides(params_conf), self.max_batch_size)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        returns = []
        initial_job_idx = 0
        while not self.is_done():
            batch = self.get_job_batch()
            tic = time.perf_counter()
            composed = multirun.compose(self.composed.loader, self.config, batch, initial_job_idx)
            if composed is None:
                self.validate_batch_is_legal(batch)
                results = self.launcher.launch(batch, initial_job_idx=initial_job_idx)
            else:
                multirun.log.debug(f"Composed {len(batch)} jobs in {time.perf_counter() - tic:0.2f} seconds")
                results = multirun.launch(composed, self.config, self.run_composed_jobs)
            for result in results:
                _ = result.return_value  # raises a job's exception, as Hydra's sweeper does
            initial_job_idx += len(batch)
            returns.append(results)
        return returns

    def validate_batch_is_legal(self, batch: Sequence[Sequence[str]]) -> None:
        for overrides in batch:
            self.composed.keep(self.config, overrides)
