"""``hydra/launcher=slurm``: hydra-submitit's Slurm launcher, with lost jobs recorded as failed points.

(A Hydra plugin module: Hydra instantiates launchers only from the
``hydra_plugins`` namespace, and imports every module in it at start-up, so
this one imports replaysim's runner lazily and defines nothing without the
``slurm`` extra.)

A job can end without returning: cancelled (``scancel``), past its time limit,
killed with its node, or out of memory.  hydra-submitit's launcher then raises
at that job while later jobs still run, so the sweep stops with a traceback,
no ``summary.parquet``, and nothing that says which point was lost.  This
launcher submits the same sbatch array with the same parameters, waits for
every job, and records each lost job's unfinished points as ``failed``
(``failure.json``, error ``UncompletedJobError``), so the sweep ends normally
and a rerun into the same sweep directory runs them again (resume).

Stopping the launching process with Ctrl-C or SIGTERM cancels the sweep's
array tasks (``scancel``) before it exits 130 or 143.  A launcher killed with
SIGKILL cannot do that: its tasks belong to the cluster and run on
(``scancel -n <hydra.launcher.name>`` stops them); a rerun resumes from the
points whose manifest verifies.
"""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path
from typing import Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, filter_overrides, run_job
from omegaconf import DictConfig, OmegaConf, open_dict

try:
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher
except ImportError:  # no slurm extra: hydra/launcher=slurm reports the missing plugin
    SubmititSlurmLauncher = None

log = logging.getLogger(__name__)


#: Seconds a job may be unknown to both squeue and sacct before it counts as lost.
VANISHED_AFTER_S = 20.0


def queued(job_id: str) -> bool:
    """Whether squeue still lists the job (pending or running); True when squeue cannot tell."""
    try:
        listed = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%i"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return True
    if listed.stdout.strip():
        return True
    return listed.returncode != 0 and "Invalid job id" not in listed.stderr  # squeue failed: cannot tell


def wait_for(job) -> None:
    """Until submitit sees ``job`` done, or Slurm has forgotten it.

    submitit reads job states from accounting (sacct), but an array task
    cancelled while pending leaves no accounting record: submitit would wait
    for it forever.  A job neither queued nor accounted for during
    :data:`VANISHED_AFTER_S` raises ``UncompletedJobError``, as a cancelled
    running job does.
    """
    from submitit.core.utils import UncompletedJobError

    unknown_since = None
    while not job.done():
        if job.state.upper() != "UNKNOWN" or queued(job.job_id):
            unknown_since = None
        elif unknown_since is None:
            unknown_since = time.monotonic()
        elif time.monotonic() - unknown_since > VANISHED_AFTER_S:
            raise UncompletedJobError(
                f"Job {job.job_id} is neither queued nor in Slurm's accounting: cancelled while pending?"
            )
        time.sleep(2.0)


def result_of(job) -> JobReturn:
    """The job's return value; ``UncompletedJobError`` if it ended without one.

    Accounting marks a job cancelled at once, but its processes ignore the
    SIGTERM (submitit waits for a preemption signal) and run on until Slurm's
    KillWait ends (30 s by default) while squeue shows it completing; a point
    that finishes meanwhile is kept, so the outcome is read only after that.
    """
    from submitit.core.utils import UncompletedJobError

    wait_for(job)
    try:
        return job.results()[0]
    except UncompletedJobError:
        while queued(job.job_id):
            time.sleep(2.0)
        return job.results()[0]


def cancel(job_ids: Sequence[str]) -> None:
    """``scancel`` the given jobs, best effort: the launcher is stopping and must not hang or raise."""
    try:
        subprocess.run(["scancel", *job_ids], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        pass


class SlurmLauncher(SubmititSlurmLauncher or object):
    """Every job of the sweep as a Slurm array task; lost jobs become failed points."""

    def executor(self):
        """A submitit Slurm executor set from the preset's parameters (as hydra-submitit sets it)."""
        import submitit

        params = dict(self.params)
        executor = submitit.AutoExecutor(
            cluster=self._EXECUTOR, folder=params.pop("submitit_folder"),
            slurm_max_num_timeout=params.pop("max_num_timeout"),
        )
        shared = set(OmegaConf.structured(BaseQueueConf).keys())  # keys without the "slurm_" prefix
        executor.update_parameters(**{k if k in shared else f"{self._EXECUTOR}_{k}": v for k, v in params.items()})
        return executor

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from submitit.core.utils import UncompletedJobError

        assert self.config is not None and self.hydra_context is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:  # hydra.sweep.mode: the directory's permissions, octal
            sweep_dir.chmod(int(str(self.config.hydra.sweep.mode), 8))
        numbers = range(initial_job_idx, initial_job_idx + len(job_overrides))
        for number, overrides in zip(numbers, job_overrides):
            log.info(f"\t#{number} : {' '.join(filter_overrides(overrides))}")
        state = Singleton.get_state()
        jobs = self.executor().map_array(
            self,
            [list(overrides) for overrides in job_overrides],
            ["hydra.sweep.dir"] * len(job_overrides),
            list(numbers),
            [f"job_id_for_{number}" for number in numbers],
            [state] * len(job_overrides),
        )
        returns = []
        try:
            for job, overrides, number in zip(jobs, job_overrides, numbers):
                try:
                    returns.append(result_of(job))
                except UncompletedJobError as exc:  # the job ended without a result
                    log.warning(f"job #{number} ({job.job_id}) ended without a result: {job.state}")
                    returns.append(self.record_lost(list(overrides), number, exc))
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (runners.cli.Terminated): the sweep's tasks stop with it
            cancel([job.job_id for job in jobs])
            raise
        return returns

    def record_lost(self, overrides: list[str], number: int, error: Exception) -> JobReturn:
        """Write ``failure.json`` for the points of job ``number`` that have no results.

        The job's config is composed here as the job composes it, and its
        directory set up by Hydra's ``run_job``, so the failed points carry the
        same run ids, parameter columns and ``.hydra/`` files as any other.
        """
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(config.hydra.job):
            config.hydra.job.num = number

        def record(cfg: DictConfig) -> None:
            from runners.cli import job_run_id
            from runners.sweep import SUMMARY_FILE, job_points, record_failure, split_options

            hydra_cfg = HydraConfig.get()
            root = Path(hydra_cfg.runtime.output_dir)
            options, sim = split_options(OmegaConf.to_container(cfg, resolve=True))
            run_id = job_run_id(hydra_cfg, root, True)
            for point in job_points(root, run_id, sim, list(hydra_cfg.overrides.task), options):
                if not (point.dir / SUMMARY_FILE).exists():
                    record_failure(point, error)

        return run_job(
            hydra_context=self.hydra_context, task_function=record, config=config,
            job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir", configure_logging=False,
        )
