"""The ``replaysim`` command: Hydra overrides -> :func:`simcore.run` -> result files.

Bad input (an unknown key or preset, an override Hydra cannot compose, an
invalid value, a bad request table) prints one line ``replaysim: error: ...`` on
stderr and exits with code 2; nothing is written and the run directory Hydra
made for the run is removed (SPEC §11, :mod:`runners.rundir`).  An environment
error (``output.dir`` not writable, a file in its place, a full disk) prints one
line naming the path and the OS error and exits 74; Ctrl-C exits 130 and
SIGTERM 143, each with one line and no temporary file left; a sweep in which
some point failed exits 1.

Sweeps (``-m``, or in-job batch axes ``sweep.batch.<key>=[...]``) run through
:mod:`runners.sweep`: in a multirun a failing point writes ``failure.json`` and
the sweep goes on; points whose ``summary.json`` exists are skipped unless
``force=true``.
"""

from __future__ import annotations

import gc

# Start-up allocates about a million long-lived objects (numba, Hydra, pyarrow
# and what they import here; pandas and numba's target context on the first
# simulation) and the cyclic GC rescans them in full every time the heap grows
# by a quarter: about 0.17 s of a default run.  Collection is off while this
# module imports and back as it was at its end, so importing runners.cli
# leaves the GC as found; main() keeps it off for a single run, a short-lived
# process, and it is turned on again for sweeps, which are long-lived.
_GC_ENABLED_AT_IMPORT = gc.isenabled()
gc.disable()

import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402


def _stopped_while_starting(signum: int, frame: object) -> None:
    """Ctrl-C or SIGTERM during the second of imports below: the one line and exit code of :func:`stopped`."""
    name, code = ("SIGTERM", 143) if signum == signal.SIGTERM else ("SIGINT (Ctrl-C)", 130)
    os.write(2, f"replaysim: stopped by {name}; results of unfinished runs were not written\n".encode())
    os._exit(code)


# Only as the command (not when a test or another module imports this one); main() installs its own.
if __name__ == "__main__" or os.path.basename(sys.argv[0]) == "replaysim":
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where the shell ignores it
        signal.signal(signal.SIGINT, _stopped_while_starting)
    signal.signal(signal.SIGTERM, _stopped_while_starting)

import atexit  # noqa: E402
import functools  # noqa: E402
import logging  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import TYPE_CHECKING, Callable, Mapping, NoReturn, Sequence  # noqa: E402

import hydra  # noqa: E402
from hydra.core.config_loader import ConfigLoader  # noqa: E402
from hydra.core.global_hydra import GlobalHydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: E402
from hydra.core.override_parser.types import Glob, IntervalSweep, Override, OverrideType, RangeSweep  # noqa: E402
from hydra.errors import CompactHydraException, HydraException  # noqa: E402
from hydra.types import RunMode  # noqa: E402
from hydra.utils import to_absolute_path  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from omegaconf.errors import OmegaConfBaseException  # noqa: E402

import runners.conf_store  # noqa: E402,F401  (registers base_config before Hydra composes)
from runners import callbacks, params  # noqa: E402
from runners.hydra_private import args_parser, skip_mode_composition  # noqa: E402  the one module using hydra._internal
from runners.reaper import LAUNCHER_PID_ENV  # noqa: E402
from runners.entry import wants_help  # noqa: E402
from runners.options import print_help  # noqa: E402
from runners.progress import LineProgress, RunProgress, announce_compile  # noqa: E402
from runners.report import format_summary, warnings_for  # noqa: E402
from runners.rundir import claimed_dir, remove_new_run_dir  # noqa: E402
from runners.sweep import (  # noqa: E402
    Point,
    RunnerOptions,
    job_points,
    export_documents,
    point_stamps,
    presimulate,
    record_crashed,
    record_failure,
    unfinished_points,
    run_point,
    say,
    simulate,
    split_options,
    write_summary,
)
from runners.writer import check_writable, write_results  # noqa: E402
import simcore  # noqa: E402
from simcore.config import ConfigError, SimConfig, load_config  # noqa: E402
from simcore.jit_cache import engine_kernel_cached  # noqa: E402

if TYPE_CHECKING:
    from runners.isolate import ChildEnded
    from runners.multirun import ComposedJob

PROG = "replaysim"
#: The Hydra configs, package data of :mod:`runners.conf` (Hydra's application
#: packaging layout): ``config_path="conf"`` is relative to this module, so Hydra
#: reads ``pkg://runners.conf`` from an installed wheel, an editable install or
#: ``python -m runners.cli`` alike.
CONFIG_PATH = "conf"
CONFIG_DIR = Path(__file__).resolve().parent / CONFIG_PATH
EXIT_BAD_INPUT = 2
#: Some point of a sweep failed (``summary.parquet`` lists them).
EXIT_POINTS_FAILED = 1
#: The results cannot be written (sysexits' EX_IOERR).
EXIT_ENVIRONMENT = 74
#: Stopped by SIGINT (Ctrl-C) or SIGTERM: 128 + the signal number, as a shell reports it.
EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM
#: Libraries whose log records belong in the run's log file, not on the console.
THIRD_PARTY_LOGGERS = ("aiconfigurator_core",)
#: Set by :func:`task` once a single run (no sweep, no batch axes) has written
#: its results; :func:`main` then exits without the interpreter's teardown.
_single_run_done = False


def fail(message: object) -> NoReturn:
    """Print ``replaysim: error: <message>`` as one stderr line and exit 2.

    Parameters
    ----------
    message : object
        The error (its ``str`` is printed, newlines folded).

    Raises
    ------
    SystemExit
        Always, with code 2 (Hydra's ``run_and_report`` lets it through).
    """
    text = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    remove_new_run_dir()
    print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_BAD_INPUT)


def fail_environment(exc: OSError, out_dir: Path) -> NoReturn:
    """Print one line naming the path and the OS error of ``exc`` and exit :data:`EXIT_ENVIRONMENT`."""
    path = exc.filename or out_dir
    # the errno's own text: pyarrow's strerror wraps it in a longer message
    reason = os.strerror(exc.errno) if exc.errno else " ".join(str(exc).split())
    remove_new_run_dir()  # no outputs/<date>/<time>/ left behind, as for bad input
    print(f"{PROG}: error: cannot write results to {path}: {reason}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_ENVIRONMENT)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C raises KeyboardInterrupt.

    A ``BaseException``, so no ``except Exception`` (a sweep point's
    isolation) swallows it, and :func:`runners.writer.write_atomic` removes
    its temporary files on the way out.
    """

    signum = signal.SIGTERM


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated()


def unknown_key_message(key: str) -> str | None:
    """Why the override key ``key`` is not a config key, or None if it is one.

    Parameters
    ----------
    key : str
        A dotted key (``engine.aggregated.replicas``); a section such as
        ``metrics.goodput`` is a key too.

    Returns
    -------
    str or None
        The error message, with a close match and the keys allowed next to it.
    """
    if params.is_runner_key(key):
        return _runner_key_message(key)
    leaves = sorted(params.config_leaves())
    sections = params.config_sections()
    if key in sections or key in leaves:
        return None
    head, _, rest = key.partition(".timing.")
    if rest and head.startswith("engine.") and f"{head}.timing" in leaves:  # a pool's own timing block
        inner = unknown_key_message(f"timing.{rest}")
        return None if inner is None else f"{key}: {inner}"
    parent = key.rpartition(".")[0]
    while parent and parent not in sections:
        parent = parent.rpartition(".")[0]
    prefix = f"{parent}." if parent else ""
    siblings = sorted({k[len(prefix):].split(".")[0] for k in leaves if k.startswith(prefix)})
    where = f"under {parent}" if parent else "at the top level"
    candidates = [k for k in (*leaves, *sections) if not key.startswith(f"{k}.")]
    guess = _did_you_mean(key, candidates, cutoff=0.85)
    return f"{key} is not a known config key ({guess}known keys {where}: {', '.join(siblings)})"


def _did_you_mean(word: str, candidates: Sequence[str], cutoff: float) -> str:
    """``"did you mean <closest>? "``, or ``""`` when no candidate is that close."""
    import difflib  # bad input only

    hint = difflib.get_close_matches(word, candidates, n=1, cutoff=cutoff)
    return f"did you mean {hint[0]}? " if hint else ""


def _runner_key_message(key: str) -> str | None:
    """Why ``key`` (under ``force``, ``sweep`` or ``export``) is not a runner key, or None."""
    if key in ("force", "sweep", "sweep.batch", "export", "export.vllm_bench", "export.detailed", "export.aiperf"):
        return None
    if key.startswith("sweep.batch."):
        axis = key.removeprefix("sweep.batch.")
        if params.is_runner_key(axis):
            return f"{key}: only config keys can be batch axes, got {axis}"
        if axis == "output.dir":  # the points' directories are the batch's own, below its output.dir
            return f"{key}: output.dir cannot be a batch axis (each point writes below the one output.dir)"
        message = unknown_key_message(axis)
        return None if message is None else f"sweep.batch.{axis}: {message}"
    top = key.split(".")[0]
    allowed = {"force": "force=true|false", "sweep": "sweep.batch.<config key>=[values]",
               "export": "export.vllm_bench, export.detailed, export.aiperf"}[top]
    return f"{key} is not a known config key (known keys under {top}: {allowed})"


#: Config groups of replaysim's own presets (``engine=pd_1p2d``): the directories of ``runners/conf``.
APP_GROUPS = frozenset(p.name for p in CONFIG_DIR.iterdir() if p.is_dir() and p.name not in ("hydra", "__pycache__"))


def group_options(group: str) -> list[str] | None:
    """The options of the config group ``group`` (``hydra/launcher``, ``engine``), None if no such group.

    Listed by Hydra's own config loader on replaysim's search path, so plugin
    groups (joblib, submitit) are included.
    """
    loader = _config_loader()
    parent, _, name = group.rpartition("/")
    if name not in loader.list_groups(parent):
        return None
    return loader.get_group_options(group)


@functools.cache
def _config_loader() -> ConfigLoader:
    """Hydra's config loader on replaysim's search path (``pkg://runners.conf`` and the plugins'), through the public API."""
    with hydra.initialize_config_module(config_module=f"{__package__}.{CONFIG_PATH}", version_base="1.3"):
        return GlobalHydra.instance().config_loader()


def group_choice_message(override: Override, text: str) -> str | None:
    """Why the config-group override ``text`` cannot be composed, or None if it can."""
    group = override.key_or_group
    if override.is_add() or override.is_force_add():
        return f"{text}: {group} is a config group, chosen without '+': {group}=<option>"
    if override.is_delete() or isinstance(override.value(), Glob):
        return None
    options = group_options(group)
    if options is None:
        groups = sorted(APP_GROUPS) + ["hydra/launcher"]
        guess = _did_you_mean(group, groups, cutoff=0.6)
        return f"{text}: {group} is not a config group ({guess}groups: {', '.join(groups)}, ...)"
    chosen = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
    for choice in chosen:
        if choice is not None and choice not in options:  # group=null drops the choice
            guess = _did_you_mean(str(choice), options, cutoff=0.6)
            return f"{text}: {choice} is not an option of {group} ({guess}options: {', '.join(options)})"
    return None


def check_overrides(argv: Sequence[str]) -> None:
    """Exit 2 with one line (:func:`fail`) on the first bad override (:func:`override_problem`)."""
    problem = override_problem(argv)
    if problem is not None:
        fail(problem)


class _ArgumentsError(Exception):
    """The command line's flags cannot be parsed (argparse's message)."""


def _refuse_arguments(message: str) -> NoReturn:
    raise _ArgumentsError(message)


def override_problem(argv: Sequence[str], own_keys: Mapping[str, Callable[[str], str | None]] | None = None) -> str | None:
    """Why the first bad override is bad: Hydra cannot parse it, or it names an unknown key or preset.

    Parameters
    ----------
    argv : sequence of str
        The command-line arguments (without the program name).
    own_keys : mapping, optional
        A command's own top-level sections (``capacity``): the function that
        says why a key under that section is unknown, or None.

    Returns
    -------
    str or None
        The one-line message, or None when every override is fine.

    Notes
    -----
    ``key=value``, ``+key=value``, ``++key=value`` and ``~key`` overrides of
    non-``hydra`` keys are checked against the config keys, group overrides
    (``hydra/launcher=local``, ``engine=pd_1p2d``) against the group's options;
    other ``hydra.*`` keys are left to Hydra.  With ``--shell-completion`` the
    arguments (``install=bash``, ``query=bash``) are Hydra's own.
    """
    parser = args_parser()
    parser.error = _refuse_arguments  # argparse would print its usage, many lines, and exit
    try:
        args = parser.parse_args(list(argv))
    except _ArgumentsError as exc:
        hint = " (flags such as -m go before the overrides: replaysim [-m] key=value ...)"
        return f"{exc}{hint if str(exc).startswith('unrecognized arguments') else ''}"
    if args.shell_completion:
        return None
    # Configs of the user's own (--config-dir, hydra.searchpath) may add options:
    # Hydra checks group choices then (its errors also end in one line, see main).
    own_search_path = args.config_dir is not None or args.config_path is not None or any(
        text.lstrip("+~").startswith("hydra.searchpath") for text in args.overrides)
    parser = OverridesParser.create()
    hydra_texts = []
    for text in args.overrides:
        try:
            (override,) = parser.parse_overrides([text])
        except CompactHydraException as exc:
            return f"{text}: {str(exc).splitlines()[0]}"
        key = override.key_or_group
        if not key:
            return f"{text}: an override needs a key (key=value)"
        own = (own_keys or {}).get(key.split(".")[0])
        if own is not None:
            message = own(key)
        elif isinstance(override.value(), IntervalSweep) and not any(
                t.startswith("hydra/sweeper=") for t in args.overrides):  # the basic sweeper refuses it
            message = (f"{text}: interval() needs a sampling sweeper (hydra/sweeper=...); "
                       "the basic sweeper takes lists, range() and choice()")
        elif isinstance(override.value(), RangeSweep) and override.value().step == 0:  # Python's range() raises
            message = f"{text}: the step of range() must not be 0"
        elif "/" in key or key in APP_GROUPS:
            message = None if own_search_path else group_choice_message(override, text)
        elif override.is_hydra_override() or override.package is not None:
            if not _plain_hydra_change(override):
                hydra_texts.append(text)
            continue
        else:
            message = unknown_key_message(key)
        if message is not None:
            return message
    if hydra_texts and not own_search_path:
        return hydra_override_problem(args.config_name or "config", hydra_texts)
    return None


#: Nodes of Hydra's own config that hold plain values below nodes that are never null.
PLAIN_HYDRA_NODES = frozenset({"hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir", "hydra.job.name"})


def _plain_hydra_change(override: Override) -> bool:
    """True for a one-value change of a :data:`PLAIN_HYDRA_NODES` node (``hydra.run.dir=out``).

    Such a change cannot fail the assertion that :func:`hydra_override_problem`
    looks for, so it needs none of that function's trial compositions
    (about 0.05 s of every command that sets its run directory).
    """
    return (override.package is None and override.key_or_group in PLAIN_HYDRA_NODES
            and override.type == OverrideType.CHANGE and not override.is_sweep_override())


def hydra_override_problem(config_name: str, texts: Sequence[str]) -> str | None:
    """Why Hydra's own config cannot take the ``hydra.*`` overrides ``texts``, or None.

    Hydra reports its composition errors in one line (:func:`main`), but a key
    below a null node (``hydra.sweeper.params.x=1`` with the basic sweeper)
    fails an assertion inside OmegaConf instead, with a traceback.
    """
    try:
        _config_loader().load_configuration(config_name=config_name, overrides=list(texts), run_mode=RunMode.RUN)
        return None
    except (CompactHydraException, OmegaConfBaseException):
        return None  # Hydra's own one-line report (main)
    except Exception:  # noqa: BLE001 - find the override that raised it
        pass
    for text in texts:
        try:
            _config_loader().load_configuration(config_name=config_name, overrides=[text], run_mode=RunMode.RUN)
        except (CompactHydraException, OmegaConfBaseException):
            continue
        except Exception as exc:  # noqa: BLE001
            return f"{text}: Hydra cannot apply this override to its config ({type(exc).__name__}: {exc})"
    return None


def third_party_logs_to_file() -> None:
    """Send the :data:`THIRD_PARTY_LOGGERS` records to the job's log files only.

    Hydra's job logging gives the root logger a console handler (stdout) and
    a file handler (``<run dir>/<task>.log``); these loggers get the file
    handlers alone (none: their records are dropped) and stop propagating.
    """
    files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    for name in THIRD_PARTY_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers = files or [logging.NullHandler()]
        logger.propagate = False


def installed_version() -> str:
    """replaysim's version, from the installed distribution's metadata."""
    import importlib.metadata  # only here: it imports the email package

    try:
        return importlib.metadata.version(PROG)
    except importlib.metadata.PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        return simcore.__version__


def output_dir(config: SimConfig) -> Path:
    """The run's output directory.

    Parameters
    ----------
    config : SimConfig
        The validated configuration.

    Returns
    -------
    Path
        ``output.dir`` (a relative path is taken from the launch directory) if
        set, else the Hydra job's output directory.
    """
    if config.output.dir is not None:
        return Path(to_absolute_path(config.output.dir))
    return Path(HydraConfig.get().runtime.output_dir)


def _fail_point(exc: BaseException) -> str:
    if isinstance(exc, OmegaConfBaseException):
        return f"{exc.full_key}: {str(exc).splitlines()[0]}"
    return str(exc)


def job_run_id(hydra_cfg: DictConfig, root: Path, multirun: bool) -> str:
    """The run id of a job: ``<sweep dir name>/<job dir relative to it>`` (multirun) or its dir name."""
    if not multirun:
        return root.name
    sweep = Path(to_absolute_path(str(hydra_cfg.sweep.dir)))
    try:
        rel = root.resolve().relative_to(sweep.resolve()).as_posix()
    except ValueError:
        rel = str(hydra_cfg.sweep.subdir)
    return f"{sweep.name}/{rel}"


def single_run(config: SimConfig, options: RunnerOptions) -> None:
    """One run, no sweep: bad input exits 2; results and the summary table as before."""
    out_dir = output_dir(config)
    try:
        detailed = options.export_detailed(config)
    except ConfigError as exc:  # an export the output mode cannot give
        fail(exc)
    try:
        check_writable(out_dir)  # before a long simulation, not after
    except OSError as exc:
        fail_environment(exc, out_dir)
    cold = not engine_kernel_cached()
    watch = None
    if cold:  # the first run: the compile display (runners.compile_watch)
        from runners.compile_watch import CompileWatch, load_timeline, timeline_case

        watch = CompileWatch(load_timeline(timeline_case(config)))
    with RunProgress(cold=cold, watch=watch) as progress:
        try:
            result, tokens = simulate(config, options, progress.update)
        except ConfigError as exc:  # a bad request table or trace
            progress.close(ok=False)  # clears the bar before the error line
            fail(exc)
        progress.writing()
        try:
            write_results(result, out_dir, extra=export_documents(result, tokens, options, detailed))
        except OSError as exc:  # a full disk; the temporary files are gone
            progress.close(ok=False)
            fail_environment(exc, out_dir)
    document = {**result.summary, "config": result.config.resolved}
    print(format_summary(document, out_dir), flush=True)
    for line in warnings_for(document):
        print(f"{PROG}: warning: {line}", file=sys.stderr, flush=True)


def batch_run(points: list[Point], options: RunnerOptions, root: Path) -> None:
    """In-job batch axes outside a multirun: all-or-nothing validation, then each point."""
    configs = []
    for point in points:
        try:
            configs.append(load_config(point.mapping))
        except ValueError as exc:
            fail(f"{point.run_id} ({' '.join(point.overrides[-len(options.batch):])}): {exc}")
    announce_compile()
    progress = LineProgress(len(points), "batch")
    for point, simulated in zip(points, presimulate(points, options, configs)):
        try:
            run_point(point, options, isolate=False, simulated=simulated)
        except ConfigError as exc:  # a bad request table or trace
            fail(f"{point.run_id}: {exc}")
        except OSError as exc:
            fail_environment(exc, point.dir)
        progress.update()
    progress.close()
    write_summary(root)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="config")
def task(cfg: DictConfig) -> None:
    """Validate the composed config, simulate, write the results, print a summary.

    Parameters
    ----------
    cfg : DictConfig
        The composed Hydra config (without the ``hydra`` node).

    Notes
    -----
    A single run keeps the contract of SPEC §11 (bad input: exit 2, nothing
    written).  In a multirun every exception of a point is recorded in its
    ``failure.json`` and the job returns normally, so the sweep goes on.
    """
    global _single_run_done
    third_party_logs_to_file()
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    if multirun and threading.current_thread() is threading.main_thread():
        # a worker's point stops on SIGTERM (runners.reaper) as on the command line
        signal.signal(signal.SIGTERM, _raise_terminated)
    overrides = OmegaConf.to_container(hydra_cfg.overrides.task)  # as typed: ${...} left unresolved
    mapping: dict = {}
    try:
        mapping = OmegaConf.to_container(cfg, resolve=True)
        mapping.pop("hydra", None)
        options, sim = split_options(mapping)
    except (OmegaConfBaseException, ValueError) as exc:  # ConfigError is a ValueError
        if not multirun:
            fail(_fail_point(exc))
        callbacks.collect_from_now()
        root = Path(hydra_cfg.runtime.output_dir)
        _record_job_failure(root, job_run_id(hydra_cfg, root, True), mapping, overrides, exc)
        return
    if not multirun and not options.batch:
        try:
            config = load_config(sim)
        except ValueError as exc:
            fail(exc)
        single_run(config, options)
        _single_run_done = True
        return
    callbacks.collect_from_now()  # sweeps and batch axes: long-lived
    if multirun:
        root = Path(hydra_cfg.runtime.output_dir)
    else:
        out = params.lookup(sim, "output.dir")
        root = Path(to_absolute_path(out)) if out else Path(hydra_cfg.runtime.output_dir)
    points = job_points(root, job_run_id(hydra_cfg, root, multirun), sim, overrides, options)
    if not multirun:
        batch_run(points, options, root)
        return
    log_files = [h.baseFilename for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    run_jobs_isolated([(points, options, log_files)])


def _record_job_failure(root: Path, run_id: str, mapping: Mapping, overrides: Sequence[str],
                        exc: BaseException) -> None:
    """A multirun job whose config is refused before it has points: one failed point at its directory."""
    sim = {k: v for k, v in mapping.items() if not params.is_runner_key(k)}
    keys = tuple(sorted(set(params.override_keys(overrides)) - {"seed"}))
    point = Point(root, run_id, sim, tuple(overrides), keys)
    record_failure(point, exc)
    say(f"{point.run_id}: failed: {type(exc).__name__}: {_fail_point(exc)}", sys.stderr)


#: One multirun job's work for :func:`run_job_points`: its points, runner options and log files.
JobWork = tuple[list[Point], RunnerOptions, list[str]]


def run_composed_jobs(jobs: Sequence[ComposedJob]) -> None:
    """Multirun jobs composed once by the sweeper (:mod:`runners.multirun`): what :func:`task` does for each, run together.

    Each job's config is split into runner options and the simulation's (a
    refused one is a failed point, as in :func:`task`); then every job's
    points run in the job process at once (:func:`run_jobs_isolated`), so
    points of one shape share one batch kernel call.
    """
    work: list[JobWork] = []
    for job in jobs:
        try:
            options, sim = split_options(job.mapping)
        except ValueError as exc:
            _record_job_failure(job.dir, job.run_id, job.mapping, job.overrides, exc)
            continue
        work.append((job_points(job.dir, job.run_id, sim, job.overrides, options), options, job.log_files))
    if work:
        run_jobs_isolated(work)


def run_jobs_isolated(work: Sequence[JobWork]) -> None:
    """Run jobs' points in the job process (:func:`job_process`), recording the points of a crash as failed.

    When the process dies, the points it did not finish are run again job by
    job, so that the points of the job that crashes it fail (as when every
    job ran alone) and the other jobs' points run.
    """
    points = [point for job_points_, _, _ in work for point in job_points_]
    before = point_stamps(points)
    ended = job_process().run(list(work))
    if ended is None:
        return
    if len(work) > 1:
        retry = [(rest, options, logs) for job_points_, options, logs in work
                 if (rest := unfinished_points(job_points_, before))]
        for job in retry:
            ended = job_process().run([job])
            if ended is not None:
                _report_crashed(job[0], before, ended)
        return
    _report_crashed(points, before, ended)


def _report_crashed(points: Sequence[Point], before: Mapping, ended: ChildEnded) -> None:
    for run_id in record_crashed(points, before, ended.pid, ended.how):
        say(f"{run_id}: failed: PointLost: its process (pid {ended.pid}) {ended.how}", sys.stderr)


def _point_logs_to(log_files: Sequence[str]) -> None:
    """Point the root logger's file handlers (inherited from the job that forked this process) at ``log_files``."""
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    for handler, path in zip(handlers, log_files):
        if handler.baseFilename != path:
            handler.baseFilename = path
            old = handler.setStream(open(path, "a", encoding=handler.encoding))
            if old is not None:
                old.close()


def run_job_points(work: Sequence[JobWork]) -> None:
    """Multirun jobs' points, in the child of :func:`job_process`: each isolated (``failure.json``).

    The points of consecutive jobs with the same runner options are
    simulated together (:func:`runners.sweep.presimulate`: configurations of
    one shape in one batch kernel call).  Each job's log files are its
    Hydra file handlers' (the root logger's, configured by the parent for a
    job): the child's handlers are pointed at them while its points are written.
    """
    third_party_logs_to_file()
    start = 0
    while start < len(work):
        options = work[start][1]
        end = start + 1
        while end < len(work) and work[end][1] == options:
            end += 1
        points = [point for job_points_, _, _ in work[start:end] for point in job_points_]
        logs = [log_files for job_points_, _, log_files in work[start:end] for _ in job_points_]
        current = None
        for point, log_files, simulated in zip(points, logs, presimulate(points, options)):
            if log_files != current:
                _point_logs_to(log_files)  # the same handler objects: third-party loggers follow
                current = log_files
            run_point(point, options, isolate=True, simulated=simulated)
        start = end


#: The compose-once sweeper runs a batch of basic-launcher jobs composed once through this
#: (``hydra_plugins/replaysim_sweeper.py``); ``task.__wrapped__`` is the function Hydra hands it.
task.__wrapped__.run_composed_jobs = run_composed_jobs

_job_process = None


def job_process():
    """Runs this process's multirun jobs in a forked child, so that a point
    crashing it (a segfault, SIGKILL) fails alone (:class:`runners.isolate.JobProcess`).

    Made on first use (a plain global, not ``functools.cache``: joblib pickles
    this module's task function by value with the globals it uses).
    """
    global _job_process
    if _job_process is None:
        from runners.isolate import JobProcess  # sweeps only: a single run does without multiprocessing

        _job_process = JobProcess(run_job_points)
        atexit.register(_job_process.close)  # no child left behind a finished sweep
    return _job_process


def _exit_without_teardown() -> None:
    """End the process with code 0 now, skipping the interpreter's teardown.

    Tearing down the modules of numba, Hydra, pyarrow and pandas costs about
    0.3 s, a fifth of a default run, and does nothing a finished run needs.
    What a normal exit does before that teardown is done here: non-daemon
    threads must be finished (else this returns and the normal exit waits for
    them), the ``atexit`` handlers run (``logging.shutdown`` flushes Hydra's job
    log, finalizers, coverage), and stdout/stderr are flushed (if that fails,
    this returns and the normal exit reports it).  Returns without exiting
    under a tracer or profiler (``python -m cProfile``, coverage) or ``-X dev``,
    which report at teardown.
    """
    if sys.gettrace() is not None or sys.getprofile() is not None or sys.flags.dev_mode:
        return
    this = threading.current_thread()
    if any(t is not this and not t.daemon and t.is_alive() for t in threading.enumerate()):
        return
    atexit._run_exitfuncs()  # runs each handler once and unregisters it
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(0)


def main() -> None:
    """Console-script entry point: ``--version``, check the overrides, then run the Hydra app.

    Unless ``-m`` is given, the process runs without the cyclic garbage
    collector until it is known to be a sweep (:func:`task` for batch axes and
    in-process jobs, :class:`runners.callbacks.SweepCallback` for a multirun
    set in the config), and a single run ends without the interpreter's
    teardown (:func:`_exit_without_teardown`); results, output and exit codes
    are those of a normal exit.
    """
    argv = sys.argv[1:]
    if "--version" in argv:  # Hydra's parser would print Hydra's version
        print(f"{PROG} {installed_version()}", flush=True)
        return
    if wants_help(argv):  # every key documented (runners.options), not Hydra's YAML of defaults
        print_help(PROG)
        return
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    if signal.getsignal(signal.SIGINT) is _stopped_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt, caught below
    signal.signal(signal.SIGTERM, _raise_terminated)
    # Composition errors the check leaves to Hydra (``+key=1`` where key has a
    # value, an unknown --config-name) then reach the except below instead of
    # Hydra's multi-line report and exit 1; HYDRA_FULL_ERROR set by the user wins.
    own_report = "HYDRA_FULL_ERROR" not in os.environ
    if own_report:
        os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        check_overrides(argv)
        args = args_parser().parse_args(argv)
        if not args.multirun:
            gc.disable()
        if mode_only_from_command_line(args):
            skip_mode_composition()
        task()
    except HydraException as exc:  # composition errors, and a sweeper refusing a sweep type (interval(1,2))
        if not own_report:
            raise
        fail(str(exc).split("Config search path:")[0])  # the search path listing is Hydra's debugging aid
    except OmegaConfBaseException as exc:  # Hydra resolving its own node (hydra.run.dir=${nope}); task catches the rest
        if not own_report:
            raise
        fail(_fail_point(exc))
    except OSError as exc:  # Hydra writing the run directory's .hydra/ files (a full disk)
        fail_environment(exc, claimed_dir() or Path.cwd())
    except KeyboardInterrupt as exc:
        stopped(exc)
    if _single_run_done:
        _exit_without_teardown()
    gc.enable()
    if callbacks.failed_points:
        count = len(callbacks.failed_points)
        print(f"{PROG}: error: {count} point{'s' * (count != 1)} of the sweep failed "
              "(summary.parquet lists them)", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_POINTS_FAILED)


def mode_only_from_command_line(args) -> bool:
    """True when no config can set ``hydra.mode``, so ``-m`` alone says whether this is a multirun.

    Hydra composes the whole config once just to read ``hydra.mode``
    (``Hydra.get_mode``) before composing it again to run, about 0.05 s of
    every command.  replaysim's own configs never set it; configs of the
    user's (``--config-dir``, ``--config-path``, ``--config-name``,
    ``hydra.searchpath``) or a ``hydra.mode`` override may.
    """
    if args.config_dir is not None or args.config_path is not None or args.config_name is not None:
        return False
    return not any("hydra.mode" in text or "hydra.searchpath" in text for text in args.overrides)


def stopped(exc: KeyboardInterrupt) -> NoReturn:
    """One line for Ctrl-C or SIGTERM, then exit 130 or 143 at once.

    The temporary files are gone already (:func:`runners.writer.write_atomic`
    removes them as the exception passes); the interpreter's teardown is
    skipped so that the process ends within a second, and joblib workers
    are stopped by :mod:`runners.reaper`.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not print a traceback
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    name, code = ("SIGTERM", EXIT_SIGTERM) if isinstance(exc, Terminated) else ("SIGINT (Ctrl-C)", EXIT_SIGINT)
    try:
        start = "\n" if sys.stderr.isatty() else ""  # past a progress bar's line
        print(f"{start}{PROG}: stopped by {name}; results of unfinished runs were not written",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    os._exit(code)


if _GC_ENABLED_AT_IMPORT:
    gc.enable()

if __name__ == "__main__":
    main()
