"""A basic-launcher multirun composed once: the jobs' configs and ``.hydra/`` records from one composition.

Hydra's basic launcher composes every job of a multirun from scratch (the
defaults list, every config merged, the overrides applied; about 0.1 s a job
for replaysim's config), deep-copies it twice in ``run_job``, writes its
``.hydra/`` records through PyYAML's pure-Python emitter and calls the task
function for that one job.  When the jobs of a batch differ from its first
job only in plain values of existing keys (``load.concurrency=1,2,...``: the
usual sweep), job *j*'s composition is the first job's with those values set.
:func:`compose` composes the first job through Hydra and applies every other
job's differing overrides to that one config with the call Hydra's own
override step makes (``OmegaConf.update(cfg, key, value, merge=True)``, in
struct mode), reading off each job's values; :func:`launch` writes each job's
``.hydra/config.yaml``, ``hydra.yaml`` and ``overrides.yaml`` (the same text
as Hydra's ``run_job``: OmegaConf's YAML representers on libyaml's emitter)
and its log file, logs Hydra's launch lines, and hands all jobs at once to the
task's job runner (:func:`runners.cli.run_composed_jobs`), which runs points
of one shape through the batch path.

A batch that does not qualify (another launcher, a config-group choice or an
added or deleted key among the swept overrides, a value with an interpolation,
a callback with job hooks, ``hydra.job.chdir``) is launched by the launcher as
Hydra does (:class:`hydra_plugins.replaysim_sweeper.ComposeOnceSweeper`).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml
from hydra.core.config_loader import ConfigLoader
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus, configure_log, env_override, setup_globals
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write

from runners import params
from runners.hydra_private import BASIC_LAUNCHER, omegaconf_str_representer

#: Hydra's basic launcher logs its lines under its module's name; so do these.
log = logging.getLogger(BASIC_LAUNCHER.rpartition(".")[0])
#: ``key=value`` with a plain dotted key: the only form a swept override may take here.
_PLAIN = re.compile(r"([A-Za-z_][\w-]*(?:\.[\w-]+)*)=(.*)\Z", re.S)
#: A value Hydra's grammar reads as a decimal int or a plain float (``12``, ``-3``, ``2.85``).
_INT = re.compile(r"[+-]?(?:0|[1-9][0-9]*)\Z")
_FLOAT = re.compile(r"[+-]?(?:0|[1-9][0-9]*)\.[0-9]+\Z")


class _Dumper(getattr(yaml, "CDumper", yaml.Dumper)):
    """OmegaConf's YAML dumper (``OmegaConf.to_yaml``) on libyaml's emitter: its representer of
    strings (quoted where they would read as bools or numbers), every other representer PyYAML's own."""


_Dumper.add_representer(str, omegaconf_str_representer())


def to_yaml(container: Any) -> str:
    """``OmegaConf.to_yaml`` of a config whose plain form (``to_container(enum_to_str=True)``) is ``container``."""
    return yaml.dump(container, Dumper=_Dumper, default_flow_style=False, allow_unicode=True, sort_keys=False)


@dataclass
class ComposedJob:
    """One job of a multirun batch, composed by :func:`compose`.

    Attributes
    ----------
    num : int
        ``hydra.job.num`` (and ``hydra.job.id``).
    overrides : list of str
        ``hydra.overrides.task``, as typed.
    dir : Path
        ``hydra.runtime.output_dir``.
    run_id : str
        ``<sweep dir name>/<job dir relative to it>`` (:func:`runners.cli.job_run_id`).
    mapping : dict
        The job's config without its ``hydra`` node, resolved, plain containers (what the task reads).
    config : dict
        The same unresolved (``.hydra/config.yaml``).
    hydra : dict
        The ``hydra`` node, unresolved (``.hydra/hydra.yaml``).
    log_files : list of str
        The files of the job's ``hydra.job_logging`` file handlers.
    """

    num: int
    overrides: list[str]
    dir: Path
    run_id: str
    mapping: dict
    config: dict
    hydra: dict
    log_files: list[str]


def callbacks_allow(callbacks: Any) -> bool:
    """True when no configured Hydra callback has job hooks (which :func:`launch` does not call)."""
    for callback in getattr(callbacks, "callbacks", None) or []:
        kind = type(callback)
        if kind.on_job_start is not Callback.on_job_start or kind.on_job_end is not Callback.on_job_end:
            return False
    return True


def _plain(node: Any, resolve: bool) -> Any:
    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=resolve, enum_to_str=True)
    return node


def _top(cfg: DictConfig, resolve: bool) -> dict:
    """The config without ``hydra`` as plain containers (``OmegaConf.to_container`` of ``run_job``'s task config)."""
    out = {}
    for key in cfg:
        if key == "hydra":
            continue
        node = cfg._get_node(key)
        if OmegaConf.is_config(node):
            out[key] = OmegaConf.to_container(node, resolve=resolve, enum_to_str=not resolve)
        else:
            out[key] = cfg[key] if resolve else node._value()
    return out


def _set(tree: dict, key: str, value: Any) -> dict:
    """A copy of ``tree`` with dotted ``key`` set, sharing every branch off its path."""
    head, _, rest = key.partition(".")
    out = dict(tree)
    out[head] = _set(tree[head], rest, value) if rest else value
    return out


def _parse_value(text: str) -> Any:
    """The value Hydra's override grammar gives ``text`` (the part after ``=``)."""
    if _INT.match(text):
        return int(text)
    if _FLOAT.match(text):
        return float(text)
    override = params._parse_override(f"k={text}")
    if override is None or override.is_sweep_override():
        raise ValueError(text)
    return override.value()


def _scalar_or_list(value: Any) -> bool:
    if isinstance(value, list):
        return all(_scalar_or_list(item) and not isinstance(item, list) for item in value)
    if isinstance(value, str):
        return "$" not in value and value != "???"
    return value is None or isinstance(value, (bool, int, float))


def _key_of(line: str) -> str | None:
    """The key or group an override line names (Hydra's ``key_or_group``), None if it does not parse."""
    override = params._parse_override(line)
    return None if override is None else override.key_or_group


def _swept(batch: Sequence[Sequence[str]], groups: set[str]) -> list[tuple[int, str]] | None:
    """The positions and keys of the overrides that differ between jobs, or None when they do not qualify.

    Every job has the same number of overrides; at a position where the jobs
    differ every line is a plain ``key=value`` of one key that is not a config
    group (``groups``), and no other value override of the jobs names a key
    inside or above it (its value is then set alone, as Hydra's override step
    sets it).
    """
    first = list(batch[0])
    if any(len(job) != len(first) for job in batch):
        return None
    swept: list[tuple[int, str]] = []
    for position, line in enumerate(first):
        if all(job[position] == line for job in batch):
            continue
        keys = set()
        for job in batch:
            match = _PLAIN.match(job[position])
            if match is None:
                return None
            keys.add(match.group(1))
        if len(keys) != 1:
            return None
        key = keys.pop()
        if key in groups or key.startswith("hydra."):
            return None
        swept.append((position, key))
    positions = {p for p, _ in swept}
    others = {_key_of(line) for position, line in enumerate(first) if position not in positions}
    others = {key for key in others if key is not None and key not in groups}
    for _, key in swept:
        for other in others | {k for _, k in swept if k != key}:
            if other == key or other.startswith(f"{key}.") or key.startswith(f"{other}."):
                return None
    return swept


#: Interpolations whose value is the same in every job (``${sample:azure.csv}`` of the presets).
_JOB_INDEPENDENT = re.compile(r"\$\{(?:sample|oc\.env):[^${}]*\}")


def _interpolations(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if "${" in value else []
    if isinstance(value, dict):
        return [text for item in value.values() for text in _interpolations(item)]
    if isinstance(value, list):
        return [text for item in value for text in _interpolations(item)]
    return []


@dataclass
class ComposedBatch:
    """The jobs of one batch and the one composition they were read from (set to the last job)."""

    base: DictConfig
    jobs: list[ComposedJob]


def _set_job(base: DictConfig, num: int, dirname: str | None = None, lines: list[str] | None = None,
             out_dir: str | None = None) -> None:
    with read_write(base.hydra), open_dict(base.hydra):
        base.hydra.job.id = num
        base.hydra.job.num = num
        if dirname is not None:
            base.hydra.job.override_dirname = dirname
            base.hydra.overrides.task = lines
        if out_dir is not None:
            base.hydra.runtime.output_dir = out_dir


def compose(loader: ConfigLoader, master: DictConfig, batch: Sequence[Sequence[str]],
            initial_job_idx: int) -> ComposedBatch | None:
    """Compose the jobs of ``batch`` from one composition of its first job, or None if they do not qualify.

    Parameters
    ----------
    loader : ConfigLoader
        Hydra's config loader (its ``load_sweep_config`` composes the first
        job, raising as Hydra's sweeper would).
    master : DictConfig
        The multirun's config.
    batch : sequence of sequence of str
        Each job's overrides, as Hydra's basic sweeper made them.
    initial_job_idx : int
        The first job's number.

    Returns
    -------
    ComposedBatch or None
        None leaves the batch to Hydra's launcher: another launcher,
        ``hydra.job.chdir``, jobs that differ in something other than plain
        values of existing keys, a value that is not a scalar or a list of
        scalars (or holds an interpolation), an interpolation of the config
        that reads Hydra's node, or a value Hydra's override step refuses
        (Hydra then reports it, as for any job).
    """
    if OmegaConf.select(master, "hydra.launcher._target_") != BASIC_LAUNCHER or master.hydra.job.chdir:
        return None
    groups = set(master.hydra.runtime.choices or {})
    swept = _swept(batch, groups)
    if swept is None:
        return None
    values: list[list[Any]] = []
    try:
        for job in batch:
            row = [_parse_value(job[position].partition("=")[2]) for position, _ in swept]
            if not all(_scalar_or_list(value) for value in row):
                return None
            values.append(row)
    except ValueError:
        return None
    base = loader.load_sweep_config(master, list(batch[0]))
    config = _top(base, resolve=False)
    texts = _interpolations(config)
    if any("hydra" in text for text in texts) or any(isinstance(v, Enum) for v in config.values()):
        return None
    resolve_each = any(_JOB_INDEPENDENT.sub("", text).count("${") for text in texts)
    try:
        for _, key in swept:
            node = OmegaConf.select(base, key, throw_on_missing=False, default=None)
            if isinstance(node, DictConfig) or not (node is None or isinstance(node, (ListConfig, bool, int, float, str))):
                return None
        mapping_once = None if resolve_each else _top(base, resolve=True)
    except Exception:  # noqa: BLE001 - an interpolation that does not resolve: the task reports it
        return None
    _set_job(base, initial_job_idx)
    hydra = _plain(base.hydra, resolve=False)
    naming = hydra["job"]["config"]["override_dirname"]
    exclude = set(naming["exclude_keys"])
    keys_of = [_key_of(line) for line in batch[0]]
    sweep_dir = str(base.hydra.sweep.dir)
    sweep_root = Path(_absolute(sweep_dir, str(base.hydra.runtime.cwd)))
    job_logging = hydra.get("job_logging") or {}
    file_handlers = [name for name in (job_logging.get("root") or {}).get("handlers") or []
                     if isinstance((job_logging.get("handlers") or {}).get(name), dict)
                     and "filename" in job_logging["handlers"][name]]
    jobs = []
    for index, (job, row) in enumerate(zip(batch, values)):
        num = initial_job_idx + index
        lines = list(job)
        try:
            for (_, key), value in zip(swept, row):
                OmegaConf.update(base, key, value, merge=True)
            stored = [_plain(OmegaConf.select(base, key), resolve=True) for _, key in swept]
        except Exception:  # noqa: BLE001 - Hydra's composition of that job reports it
            return None
        if any(isinstance(value, Enum) for value in stored):
            return None
        # hydra.job.override_dirname as Hydra's get_overrides_dirname makes it
        dirname = re.sub("[=]", naming["kv_sep"], naming["item_sep"].join(
            sorted(line for line, key in zip(lines, keys_of) if key not in exclude)))
        _set_job(base, num, dirname, lines)
        subdir = str(OmegaConf.select(base, "hydra.sweep.subdir"))
        out_dir = os.path.abspath(os.path.join(sweep_dir, subdir))
        _set_job(base, num, out_dir=out_dir)
        job_config, mapping = config, mapping_once
        for (_, key), value in zip(swept, stored):
            job_config = _set(job_config, key, value)
            if mapping is not None:
                mapping = _set(mapping, key, value)
        if mapping is None:
            try:
                mapping = _top(base, resolve=True)
            except Exception:  # noqa: BLE001
                return None
        job_hydra = hydra
        # as stored by Hydra's typed node (hydra.job.id is a string)
        for key, value in (("job.id", base.hydra.job.id), ("job.num", base.hydra.job.num), ("job.override_dirname", dirname),
                           ("overrides.task", lines), ("runtime.output_dir", out_dir)):
            job_hydra = _set(job_hydra, key, value)
        log_files = [str(OmegaConf.select(base, f"hydra.job_logging.handlers.{name}.filename"))
                     for name in file_handlers]
        jobs.append(ComposedJob(num, lines, Path(out_dir), _run_id(sweep_root, Path(out_dir), subdir),
                                mapping, job_config, job_hydra, log_files))
    return ComposedBatch(base, jobs)


def _absolute(path: str, cwd: str) -> str:
    """``hydra.utils.to_absolute_path`` against the launch directory ``cwd``."""
    return path if os.path.isabs(path) else os.path.join(cwd, path)


def _run_id(sweep_root: Path, out_dir: Path, subdir: str) -> str:
    """:func:`runners.cli.job_run_id` of a multirun job."""
    try:
        rel = out_dir.resolve().relative_to(sweep_root.resolve()).as_posix()
    except ValueError:
        rel = subdir
    return f"{sweep_root.name}/{rel}"


def write_records(job: ComposedJob, output_subdir: str | None) -> None:
    """The job's directory, ``.hydra/`` records (none when ``hydra.output_subdir`` is null) and log files."""
    job.dir.mkdir(parents=True, exist_ok=True)
    for path in job.log_files:  # as the job's logging.FileHandler opens it
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        open(path, "a", encoding="utf-8").close()
    if output_subdir is None:
        return
    records = job.dir / output_subdir
    records.mkdir(parents=True, exist_ok=True)
    for name, content in (("config.yaml", job.config), ("hydra.yaml", {"hydra": job.hydra}),
                          ("overrides.yaml", job.overrides)):
        with open(records / name, "w", encoding="utf-8") as file:
            file.write(to_yaml(content))


def launch(batch: ComposedBatch, master: DictConfig,
           run_jobs: Callable[[Sequence[ComposedJob]], None]) -> list[JobReturn]:
    """Write the jobs' records and run them all with ``run_jobs``, as the basic launcher runs them one by one.

    Parameters
    ----------
    batch : ComposedBatch
        From :func:`compose`.
    master : DictConfig
        The multirun's config (its logging, sweep directory, ``env_set``).
    run_jobs : callable
        Runs the jobs (the task's job runner), in the job logging of the first job.

    Returns
    -------
    list of JobReturn
        One per job: completed, or failed with the exception ``run_jobs`` raised.
    """
    jobs = batch.jobs
    setup_globals()
    configure_log(master.hydra.hydra_logging, master.hydra.verbose)
    Path(str(master.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
    log.info(f"Launching {len(jobs)} jobs locally")
    output_subdir = master.hydra.output_subdir
    for job in jobs:
        log.info(f"\t#{job.num} : {' '.join(line for line in job.overrides if not line.startswith('hydra.'))}")
        write_records(job, None if output_subdir is None else str(output_subdir))
    returns = [JobReturn(overrides=job.overrides, working_dir=os.getcwd(), task_name=str(master.hydra.job.name))
               for job in jobs]
    if jobs:
        first = jobs[0]
        _set_job(batch.base, first.num, out_dir=str(first.dir))
        HydraConfig.instance().set_config(batch.base)
        configure_log(batch.base.hydra.job_logging, batch.base.hydra.verbose)
    try:
        with env_override(OmegaConf.to_container(batch.base.hydra.job.env_set, resolve=True)):
            run_jobs(jobs)
        outcome: tuple[JobStatus, Any] = (JobStatus.COMPLETED, None)
    except Exception as exc:  # noqa: BLE001 - the sweeper raises it, as for a job of Hydra's launcher
        outcome = (JobStatus.FAILED, exc)
    for ret in returns:
        ret.status, ret.return_value = outcome
    configure_log(master.hydra.hydra_logging, master.hydra.verbose)
    return returns
