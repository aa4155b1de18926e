"""Hydra callback of a replaysim multirun: warm-up, progress, ``summary.parquet``.

Registered in ``runners/conf/config.yaml`` as ``hydra.callbacks.sweep``.  Hydra calls
``on_multirun_start`` and ``on_multirun_end`` in the launching process, around
all launchers (basic, joblib, submitit), so the sweep summary is written once,
at the sweep root, after every job returned.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from runners import reaper
from runners.hydra_private import BASIC_LAUNCHER, BASIC_SWEEPER
from runners.progress import SweepWatcher, announce_compile
from runners.rundir import remove_new_run_dir
from runners.sweep import POINT_FILE, split_options, write_summary

#: Failed points of the last multirun of this process (:meth:`SweepCallback.on_multirun_end`);
#: :func:`runners.cli.main` exits non-zero when there are any.
failed_points: list[str] = []
#: Sweepers that launch the cartesian product of the overrides (Hydra's and replaysim's).
BASIC_SWEEPERS = (BASIC_SWEEPER, "hydra_plugins.replaysim_sweeper.ComposeOnceSweeper")
WARMUP_REQUESTS = 4
#: Allocations between young collections in a sweep (Python's default: 700).
YOUNG_GC_THRESHOLD = 20_000
LOKY_TRACKER = "joblib.externals.loky.backend.resource_tracker"


def collect_from_now() -> None:
    """Turn the cyclic garbage collector on for a long-lived sweep, without rescanning the start-up objects.

    The objects alive now (imported modules, numba's and Hydra's state:
    about a million, never garbage) are frozen out of the collector's scans
    (``gc.freeze``); otherwise every full collection walks them all, about a
    quarter of a basic-launcher sweep's time.  What jobs allocate later is
    collected as usual, in larger young generations (each job's Hydra
    composition allocates some 100,000 short-lived config nodes).
    """
    gc.freeze()
    gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])
    gc.enable()


def sweep_dir(config: DictConfig) -> Path:
    """The sweep directory (relative paths are from the launch directory, as Hydra's)."""
    return Path(str(config.hydra.sweep.dir))


def count_jobs(config: DictConfig) -> int | None:
    """Jobs the basic sweeper will launch: the product of the sweep overrides' lengths.

    Parameters
    ----------
    config : DictConfig
        The multirun config.

    Returns
    -------
    int or None
        None for other sweepers, or overrides that cannot be counted (glob).
    """
    if OmegaConf.select(config, "hydra.sweeper._target_") not in BASIC_SWEEPERS:
        return None
    swept = OmegaConf.select(config, "hydra.sweeper.params") or {}
    lines = [f"{key}={value}" for key, value in swept.items()]
    lines += list(config.hydra.overrides.task)
    try:
        overrides = OverridesParser.create().parse_overrides(lines)
        total = 1
        for override in overrides:
            if override.is_sweep_override():
                total *= len(list(override.sweep_string_iterator()))
    except (HydraException, TypeError, ValueError):
        return None
    return total


def warm_numba_cache(mapping: dict[str, Any]) -> float:
    """Run a tiny version of the sweep's config so workers load compiled kernels.

    Parameters
    ----------
    mapping : dict
        The sweep's base simcore config (without runner keys).

    Returns
    -------
    float
        Seconds spent.  Errors are ignored: the jobs report them.

    Notes
    -----
    Kernels are ``@njit(cache=True)``: this process compiles them once and
    writes the on-disk cache (``simcore.jit_cache``), so
    parallel workers load them (~0.2 s) instead of compiling at once.
    """
    import simcore

    start = time.perf_counter()
    tiny = json.loads(json.dumps(mapping))
    tiny.setdefault("workload", {})["num_requests"] = WARMUP_REQUESTS
    tiny["max_time_ms"] = None
    tiny.setdefault("output", {}).update({"dir": None, "tokens": True})
    for config in (tiny, {"workload": {"num_requests": WARMUP_REQUESTS}, "output": {"tokens": True}}):
        try:
            simcore.run(config)
            break
        except Exception:  # noqa: BLE001 - a bad sweep config is reported by its jobs
            continue
    return time.perf_counter() - start


def user_mapping(config: DictConfig) -> dict[str, Any]:
    """The composed config without its ``hydra`` node, resolved, as plain containers."""
    out: dict[str, Any] = {}
    for key in config:
        if key == "hydra":
            continue
        value = config[key]
        out[key] = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return out


class SweepCallback(Callback):
    """Warm the numba cache, draw sweep progress, write ``summary.parquet``.

    Parameters
    ----------
    warmup : bool
        Warm the numba cache before launching (skipped for the basic launcher,
        whose jobs share this process).
    """

    def __init__(self, warmup: bool = True) -> None:
        self.warmup = warmup
        self.watcher: SweepWatcher | None = None
        self.reaper = None

    def __getstate__(self) -> dict[str, Any]:
        # Launchers pickle the callbacks with the Hydra context to send jobs to
        # workers; the watcher (a thread) and the reaper stay in the launching process.
        return {**self.__dict__, "watcher": None, "reaper": None}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        collect_from_now()  # off in runners.cli.main unless -m was given; a sweep is long-lived
        if OmegaConf.select(config, "output.dir") is not None:
            remove_new_run_dir()  # the sweep directory claimed for this sweep
            print(
                "replaysim: error: output.dir names one run's directory; in a multirun set "
                "hydra.sweep.dir (every job writes into its own sub-directory)",
                file=sys.stderr, flush=True,
            )
            raise SystemExit(2)
        try:
            options, sim = split_options(user_mapping(config))
        except Exception:  # noqa: BLE001 - a bad config is reported by every job as a failed point
            options, sim = None, None
        launcher = OmegaConf.select(config, "hydra.launcher._target_")
        if "joblib" in str(launcher).lower():  # loky workers outlive a killed launcher
            self.reaper = reaper.start(os.getpid())
            # A stopped sweep ends with one line: loky's resource tracker (started
            # later, so it inherits this) frees the dead launcher's semaphores
            # without warning about each.
            quiet = f"ignore::UserWarning:{LOKY_TRACKER}"
            os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), quiet]))
        announce_compile()  # by the warm-up below, or by the first point of the basic launcher
        if self.warmup and launcher != BASIC_LAUNCHER and sim is not None:
            seconds = warm_numba_cache(sim)
            print(f"replaysim: numba cache warmed in {seconds:.2f} s", flush=True)
        jobs = count_jobs(config)
        per_job = 1 if options is None else options.num_points
        total = None if jobs is None else jobs * per_job
        self.watcher = SweepWatcher(sweep_dir(config), total, POINT_FILE)
        self.watcher.start()

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.watcher is not None:
            self.watcher.stop()
        if self.reaper is not None:  # every job returned: nothing left to reap
            self.reaper.kill()
            self.reaper.wait()
        root = sweep_dir(config)
        if root.exists():
            _, table = write_summary(root)
            failed_points[:] = [r for r, s in zip(table.column("run_id").to_pylist(),
                                                  table.column("status").to_pylist()) if s == "failed"]
