"""Sweep points: runner options, in-job batch axes, resume, failure isolation, sweep summary.

A *point* is one configuration simulated once.  A Hydra multirun job is one
point, or, with batch axes (``sweep.batch.<key>=[v1,v2,...]``), the cartesian
product of the axes run one after another in the job's process, one
sub-directory per point.  Every point directory holds the result files of
:mod:`runners.writer` (each Parquet row carrying ``run_id``, ``seed`` and one
column per swept key), ``vllm_bench.json``, and ``point.json`` (its run id,
status of the latest invocation, overrides, parameter values and where it ran).  A failed point holds ``failure.json``
instead of results.  :func:`write_summary` gathers the points under a sweep
directory into ``summary.parquet``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import socket
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import pyarrow as pa

import simcore
from runners import params
from runners.export import (
    AIPERF_CSV_FILE,
    AIPERF_JSON_FILE,
    EXPORT_FILES,
    VLLM_BENCH_FILE,
    aiperf_csv,
    aiperf_document,
    vllm_bench_document,
)
from runners.trace import TRACE_FILE, tables_needed
from runners.writer import (
    json_file,
    json_text,
    parquet_file,
    remove_result_set,
    summary_document,
    verified_set,
    write_atomic,
    write_results,
)
from simcore.arrow_np import from_pylist
from simcore.config import ConfigError, SimConfig, load_config

#: Defaults of the runner's own keys (registered beside the simcore defaults).
RUNNER_DEFAULTS: dict[str, Any] = {
    "force": False,
    "sweep": {"batch": {}},
    "export": {"vllm_bench": True, "detailed": False, "aiperf": False},
}
#: The runner's keys documented (``replaysim --help``, docs/options.md):
#: ``(key, unit, values, description)``, in :data:`RUNNER_DEFAULTS`' order.
RUNNER_KEY_DOCS: tuple[tuple[str, str, str, str], ...] = (
    ("force", "", "true | false", "Sweeps: rerun points whose summary.json exists (else they are skipped)."),
    ("sweep.batch.<key>", "", "a list of values of <key>",
     "In-job batch axis: simulate every value of <key> (several axes: their product) in one process."),
    ("export.vllm_bench", "", "true | false", "Write vllm_bench.json in the keys and units of vllm bench serve --save-result."),
    ("export.detailed", "", "true | false", "vllm_bench.json: include its per-request arrays."),
    ("export.aiperf", "", "true | false", "Write profile_export_aiperf.json and .csv as aiperf does."),
)

POINT_FILE = "point.json"
FAILURE_FILE = "failure.json"
SUMMARY_FILE = "summary.json"
SWEEP_SUMMARY = "summary.parquet"
#: Files that make up a point's results (removed when the point fails).
#: A run's page (runners.html_report, imported when a page is written).
REPORT_FILE = "report.html"
RESULT_FILES = ("requests.parquet", "passes.parquet", "tokens.parquet", *EXPORT_FILES, REPORT_FILE, TRACE_FILE,
                SUMMARY_FILE)
#: summary.json keys that are not metrics.
PROVENANCE_KEYS = ("config", "version", "seed", "git_sha", "schema_version")
STATUSES = ("ok", "failed", "skipped")
#: ``point.json`` status while a point runs; found at the end of a sweep it
#: means the point's process was killed or crashed.
RUNNING = "running"


@dataclass(frozen=True)
class RunnerOptions:
    """The runner's keys of the composed config (never passed to simcore).

    Attributes
    ----------
    force : bool
        Rerun points whose ``summary.json`` exists.
    batch : dict of str to list
        In-job batch axes: dotted config key -> values, in command-line order.
    vllm_bench : bool
        Write ``vllm_bench.json`` beside ``summary.json``.
    detailed : bool
        Include per-request arrays (``ttfts``, ``itls``, ...) in ``vllm_bench.json``,
        as ``vllm bench serve --save-detailed`` does (:meth:`export_detailed`).
    aiperf : bool
        Write ``profile_export_aiperf.json`` and ``.csv`` beside ``summary.json``.
    """

    force: bool = False
    batch: dict[str, list] = dataclasses.field(default_factory=dict)
    vllm_bench: bool = True
    detailed: bool = False
    aiperf: bool = False

    def export_detailed(self, config: SimConfig) -> bool:
        """Whether ``vllm_bench.json`` of ``config`` gets the per-request arrays.

        Parameters
        ----------
        config : SimConfig

        Returns
        -------
        bool

        Raises
        ------
        simcore.ConfigError
            ``export.detailed=true`` with ``output.mode=bounded`` (no per-token ``itls``).
        """
        if self.detailed and self.vllm_bench and config.output.mode == "bounded":
            raise ConfigError(
                "export.detailed=true needs output.mode=detailed: its itls are per-token "
                "receipts, which the bounded mode does not keep"
            )
        return self.detailed and self.vllm_bench

    @property
    def num_points(self) -> int:
        """Points per job: the product of the batch axes' lengths (1 without axes)."""
        count = 1
        for values in self.batch.values():
            count *= len(values)
        return count


def _flag(path: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{path} must be true or false, got {value!r}")
    return value


def split_options(mapping: Mapping[str, Any]) -> tuple[RunnerOptions, dict[str, Any]]:
    """Split a composed config into runner options and the simcore config.

    Parameters
    ----------
    mapping : mapping
        The resolved config without its ``hydra`` node.

    Returns
    -------
    RunnerOptions
        ``force``, the batch axes and the export flags, validated.
    dict
        The remaining keys, for :func:`simcore.load_config`.

    Raises
    ------
    ConfigError
        A runner key with a bad value, a batch axis that is not a simcore
        config key, or a batch axis whose value is not a non-empty list.
    """
    sim = {key: value for key, value in mapping.items() if key not in params.RUNNER_KEYS}
    force = _flag("force", mapping.get("force", False))
    sweep = mapping.get("sweep") or {}
    if not isinstance(sweep, Mapping) or set(sweep) - {"batch"}:
        raise ConfigError(f"sweep accepts only sweep.batch.<config key>=[values], got {sweep!r}")
    raw_batch = sweep.get("batch") or {}
    if not isinstance(raw_batch, Mapping):
        raise ConfigError(f"sweep.batch must map config keys to lists of values, got {raw_batch!r}")
    batch: dict[str, list] = {}
    for key, values in params.flatten(raw_batch).items():
        if not params.is_config_key(key) or params.is_runner_key(key):
            raise ConfigError(f"sweep.batch.{key}: {key} is not a config key")
        if not isinstance(values, (list, tuple)) or not values:
            raise ConfigError(
                f"sweep.batch.{key} must be a non-empty list such as [1,4,16], got {values!r}"
            )
        batch[key] = list(values)
    export = mapping.get("export") or {}
    if not isinstance(export, Mapping) or set(export) - {"vllm_bench", "detailed", "aiperf"}:
        raise ConfigError(f"export accepts vllm_bench, detailed and aiperf, got {export!r}")
    options = RunnerOptions(
        force=force,
        batch=batch,
        vllm_bench=_flag("export.vllm_bench", export.get("vllm_bench", True)),
        detailed=_flag("export.detailed", export.get("detailed", False)),
        aiperf=_flag("export.aiperf", export.get("aiperf", False)),
    )
    return options, sim


@dataclass(frozen=True)
class Point:
    """One configuration of a sweep.

    Attributes
    ----------
    dir : Path
        Its output directory.
    run_id : str
        Unique within the sweep: the sweep directory's name, then the point
        directory relative to it (``12-00-00/3``, ``12-00-00/3/point-002``).
    mapping : dict
        The simcore config (nested, without runner keys).
    overrides : tuple of str
        The overrides that make this point (job overrides, then batch values).
    keys : tuple of str
        The sweep's parameter keys, sorted (one column each).
    """

    dir: Path
    run_id: str
    mapping: dict
    overrides: tuple[str, ...]
    keys: tuple[str, ...]

    def values(self, resolved: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Each parameter's effective value: from the merged config if valid, else as given.

        A preset (``engine=pd_1p2d``) is given by its name.
        """
        out = {}
        choices = params.group_choices(self.overrides)
        for key in self.keys:
            if key in choices:
                out[key] = choices[key]
            elif resolved is not None:
                out[key] = params.lookup(resolved, key)
            else:
                out[key] = params.lookup(self.mapping, key, params.lookup(simcore.DEFAULTS, key))
        return out


def job_points(
    root: Path,
    run_id: str,
    mapping: Mapping[str, Any],
    overrides: Sequence[str],
    options: RunnerOptions,
) -> list[Point]:
    """The points of one job: itself, or the cartesian product of its batch axes.

    Parameters
    ----------
    root : Path
        The job's output directory.
    run_id : str
        The job's run id; batch points append ``/point-NNN``.
    mapping : mapping
        The job's simcore config.
    overrides : sequence of str
        The job's Hydra task overrides (``hydra.overrides.task``).
    options : RunnerOptions
        The batch axes.

    Returns
    -------
    list of Point
        In ``itertools.product`` order of the axes (the last axis varies
        fastest, as Hydra's basic sweeper numbers jobs).
    """
    own = [line for line in overrides if not params.is_runner_key(_override_key(line))]
    keys = set(params.override_keys(own)) | set(options.batch)
    keys.discard("seed")  # seed has its own column
    sorted_keys = tuple(sorted(keys))
    if not options.batch:
        return [Point(root, run_id, dict(mapping), tuple(own), sorted_keys)]
    axes = list(options.batch.items())
    combos = list(itertools.product(*(values for _, values in axes)))
    width = max(3, len(str(len(combos) - 1)))
    points = []
    for index, combo in enumerate(combos):
        point_mapping = json.loads(json.dumps(mapping))  # deep copy of plain data
        extra = []
        for (key, _), value in zip(axes, combo):
            params.assign(point_mapping, key, value)
            extra.append(f"{key}={params.format_value(value)}")
        name = f"point-{index:0{width}d}"
        points.append(Point(root / name, f"{run_id}/{name}", point_mapping, (*own, *extra), sorted_keys))
    return points


def _override_key(line: str) -> str:
    return line.lstrip("+~").split("=", 1)[0].split("@", 1)[0]


# ---------------------------------------------------------------- running a point


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, allow_nan=True))


def is_done(out: Path, resolved: Mapping[str, Any]) -> bool:
    """True when ``out`` holds a complete result set (its manifest verified) of the config ``resolved``."""
    try:
        files = verified_set(out)
    except OSError:
        return False
    return files is not None and {"requests.parquet", SUMMARY_FILE} <= set(files) and _same_config(out, resolved)


def _same_config(out: Path, resolved: Mapping[str, Any]) -> bool:
    try:
        stored = json.loads((out / SUMMARY_FILE).read_text(encoding="utf-8")).get("config")
    except (OSError, ValueError):
        return False
    return stored == _plain(resolved)


def runtime() -> dict[str, Any]:
    """Where a point ran: host, process id, numba threads (``NUMBA_NUM_THREADS`` at import)."""
    import numba

    return {"host": socket.gethostname(), "pid": os.getpid(), "numba_threads": int(numba.config.NUMBA_NUM_THREADS)}


def _write_point(point: Point, status: str, values: Mapping[str, Any], seed: Any) -> None:
    document = {
        "run_id": point.run_id,
        "status": status,
        "seed": seed,
        "overrides": list(point.overrides),
        "parameters": {key: values.get(key) for key in point.keys},
        "runtime": runtime(),
    }
    write_atomic(point.dir, [(POINT_FILE, json_file(_plain(document)))])


def simulate(
    config: SimConfig, options: RunnerOptions, progress: Callable[[int, int], None] | None = None
) -> tuple[simcore.Result, pa.Table | None]:
    """Run ``config``; also return the per-token table when the export needs it.

    Parameters
    ----------
    config : SimConfig
        The validated point configuration.
    options : RunnerOptions
        Export flags: the per-request arrays of ``vllm_bench.json``
        (``export.detailed=true``) need per-token receipts (``itls``), recorded
        even when ``output.tokens`` is false (then not written to
        ``tokens.parquet``).
    progress : callable, optional
        Passed to :func:`simcore.run` (``progress(done, total)`` requests).

    Returns
    -------
    simcore.Result
        The result as the configuration asked for it (``config`` unchanged).
    pyarrow.Table or None
        The tokens table, when recorded.
    """
    return _as_asked(config, simcore.run(_config_to_run(config, options), progress=progress))


def _config_to_run(config: SimConfig, options: RunnerOptions) -> SimConfig:
    """``config``, recording the tables that the detailed ``vllm_bench.json`` export and the trace need.

    The detailed export needs the tokens; ``output.trace=true`` needs the
    passes and, with a detokenizer, the tokens (:func:`runners.trace.tables_needed`).
    Tables recorded only for these are not written (:func:`_as_asked`).
    """
    tokens = options.export_detailed(config)
    passes = False
    if config.output.trace:
        passes, for_trace = tables_needed(config)
        tokens = tokens or for_trace
    tokens, passes = tokens and not config.output.tokens, passes and not config.output.passes
    if not tokens and not passes:
        return config
    resolved = _plain(config.resolved)
    resolved["output"]["tokens"] = config.output.tokens or tokens
    resolved["output"]["passes"] = config.output.passes or passes
    return load_config(resolved)


def _as_asked(config: SimConfig, result: simcore.Result) -> tuple[simcore.Result, pa.Table | None]:
    """The result with ``config`` as its configuration, and the tokens table apart.

    A pass table recorded only for the trace stays in the result (the report
    and the trace read it); :func:`runners.writer.write_results` writes it
    only when ``config.output.passes``.
    """
    if result.config is config:
        return result, result.tokens
    return dataclasses.replace(result, tokens=None, config=config), result.tokens


#: Points simulated together by :func:`presimulate` (bounds the results held at once) ...
BATCH_CHUNK = 256
#: ... and their requests together (``workload.num_requests``; a file read whole counts as this many).
BATCH_REQUESTS = 250_000


def presimulate(points: Sequence[Point], options: RunnerOptions,
                loaded: Sequence[SimConfig] | None = None) -> Iterator[tuple[simcore.Result, pa.Table | None] | None]:
    """Simulate points together (:func:`simcore.run_batch`), ahead of :func:`run_point`.

    Yields, per point in order, what :func:`simulate` would return, or None
    when the point is left to :func:`run_point` (an invalid configuration, a
    point that will be skipped, a lone point, or a chunk in which some point
    raised: its points then run one by one, so failures stay isolated).
    Chunks of at most ``BATCH_CHUNK`` points and ``BATCH_REQUESTS`` requests
    are simulated as they are consumed; ``run_batch`` runs those of one shape
    in one kernel call.  ``loaded``: the points' configurations when the
    caller has validated them already (``load_config`` of each mapping).
    """
    start = 0
    while start < len(points):
        configs: dict[int, SimConfig] = {}
        requests = 0
        end = start
        while end < len(points) and end - start < BATCH_CHUNK:
            try:
                config = loaded[end] if loaded is not None else load_config(points[end].mapping)
            except Exception:
                end += 1
                continue  # run_point reports it
            size = config.workload.num_requests or BATCH_REQUESTS
            if configs and requests + size > BATCH_REQUESTS:
                break
            end += 1
            if not options.force and is_done(points[end - 1].dir, config.resolved):
                continue
            configs[end - 1 - start] = config
            requests += size
        done: dict[int, tuple[simcore.Result, pa.Table | None]] = {}
        if len(configs) > 1:
            try:
                results = simcore.run_batch([_config_to_run(c, options) for c in configs.values()])
            except Exception:
                results = None
            if results is not None:
                done = {i: _as_asked(configs[i], r) for i, r in zip(configs, results)}
        for index in range(end - start):
            yield done.get(index)
        start = end


def run_point(
    point: Point,
    options: RunnerOptions,
    *,
    isolate: bool,
    quiet: bool = False,
    simulated: tuple[simcore.Result, pa.Table | None] | None = None,
) -> str:
    """Simulate one point into its directory, unless it is done already.

    Parameters
    ----------
    point : Point
        The point.
    options : RunnerOptions
        ``force`` and the export flags.
    isolate : bool
        True in a sweep: any exception is written to ``failure.json`` and the
        status is ``failed``.  False: exceptions propagate (a single run exits
        2 on bad input).
    quiet : bool
        Print nothing (the caller reports).
    simulated : tuple, optional
        The point's :func:`simulate` output, computed ahead (:func:`presimulate`).

    Returns
    -------
    str
        ``ok``, ``skipped`` (``summary.json`` exists for the same config and
        ``force`` is false) or ``failed``.
    """
    out = point.dir
    try:
        # a presimulated result carries the point's validated configuration
        config = simulated[0].config if simulated is not None else load_config(point.mapping)
        values = point.values(config.resolved)
        if not options.force and is_done(out, config.resolved):
            _write_point(point, "skipped", values, config.seed)
            if not quiet:
                say(f"{point.run_id}: skipped (its results are complete; force=true reruns it)")
            return "skipped"
        detailed = options.export_detailed(config)
        _write_point(point, RUNNING, values, config.seed)
        result, tokens = simulated if simulated is not None else simulate(config, options)
        columns = params.id_columns(point.run_id, config.seed, point.keys, values)
        extra = export_documents(result, tokens, options, detailed)
        (out / FAILURE_FILE).unlink(missing_ok=True)
        write_results(result, out, columns=columns, extra=extra)
        _write_point(point, "ok", values, config.seed)
    except Exception as exc:
        if not isolate:
            raise
        try:
            record_failure(point, exc)
        except OSError as unwritable:  # the point's directory itself: the summary reports it as lost
            say(f"{point.run_id}: cannot write {FAILURE_FILE}: {unwritable}", sys.stderr)
        if not quiet:
            say(f"{point.run_id}: failed: {type(exc).__name__}: {_one_line(exc)}", sys.stderr)
        return "failed"
    if not quiet:
        say(f"{point.run_id}: ok  {_headline(result.summary)}")
    return "ok"


def export_documents(result: simcore.Result, tokens: pa.Table | None, options: RunnerOptions,
                     detailed: bool) -> dict[str, dict | str]:
    """The export files the options ask for, by name (for :func:`runners.writer.write_results`).

    With them ``trace.json`` (``output.trace=true``) and ``report.html``
    (``output.report=true``, the default).

    ``detailed`` is :meth:`RunnerOptions.export_detailed`, checked before the
    simulation so that a refused combination writes nothing.
    """
    extra: dict[str, dict | str] = {}
    if result.config.output.trace:
        from runners.trace import trace_document

        extra[TRACE_FILE] = trace_document(result.config, result.requests, result.passes, tokens)
    if result.config.output.report:
        from runners.html_report import kv_blocks_from, run_report

        extra[REPORT_FILE] = run_report(summary_document(result), result.requests, result.passes, tokens,
                                        kv_blocks_from(result.config), scaling=result.scaling)
    if options.vllm_bench:
        extra[VLLM_BENCH_FILE] = vllm_bench_document(result, tokens, detailed=detailed)
    if options.aiperf:
        document = aiperf_document(result, tokens)
        extra[AIPERF_JSON_FILE] = json_text(document)  # indented, as aiperf writes it
        extra[AIPERF_CSV_FILE] = aiperf_csv(document)
    return extra


def say(line: str, stream=None) -> None:
    """Print ``line`` with one write call, so lines of parallel workers do not interleave."""
    stream = sys.stdout if stream is None else stream
    stream.write(line + "\n")
    stream.flush()


def _one_line(exc: BaseException) -> str:
    return " ".join(line.strip() for line in str(exc).splitlines())


def record_failure(point: Point, exc: BaseException, values: Mapping[str, Any] | None = None) -> None:
    """Write ``failure.json`` and a failed ``point.json``; remove the point's stale results.

    Parameters
    ----------
    point : Point
        The point that failed.
    exc : BaseException
        Its exception (``error_type`` is the class name, ``error`` the one-line
        message; a traceback is kept for errors that are not ``ValueError``).
    values : mapping, optional
        The parameter values for ``point.json`` (default: :meth:`Point.values`).
    """
    document = {
        "error_type": type(exc).__name__,
        "error": _one_line(exc),
        "overrides": list(point.overrides),
        "run_id": point.run_id,
    }
    if not isinstance(exc, (ValueError, PointLost)):  # ConfigError is a ValueError: its message says it all
        document["traceback"] = traceback.format_exc()
    remove_result_set(point.dir)
    for name in RESULT_FILES:  # a point directory holds only replaysim's files
        (point.dir / name).unlink(missing_ok=True)
    seed = params.lookup(point.mapping, "seed", simcore.DEFAULTS["seed"])
    write_atomic(point.dir, [(FAILURE_FILE, json_file(_plain(document)))])
    _write_point(point, "failed", point.values() if values is None else values, seed)


def _headline(summary: Mapping[str, Any]) -> str:
    def fmt(key: str, unit: str) -> str:
        value = summary.get(key)
        return f"{key}={'-' if value is None else format(value, '.2f')}{unit}"

    return "  ".join(
        (fmt("request_throughput", " req/s"), fmt("output_throughput", " tok/s"),
         fmt("p99_ttft_ms", " ms"), fmt("p99_tpot_ms", " ms"))
    )


# ---------------------------------------------------------------- the sweep summary


def point_files(root: Path) -> list[Path]:
    """Every ``point.json`` under ``root``, in natural order of their directories."""
    def natural(path: Path) -> list:
        rel = path.parent.relative_to(root).parts
        return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in rel]

    found = [p for p in root.rglob(POINT_FILE) if not any(part.startswith(".") for part in p.relative_to(root).parts)]
    return sorted(found, key=natural)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _column(values: list[Any]) -> pa.Array:
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return from_pylist(values, pa.bool_())
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return from_pylist(values, pa.int64() if present else pa.float64())
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return from_pylist([None if v is None else float(v) for v in values], pa.float64())
    return from_pylist([None if v is None else (v if isinstance(v, str) else json.dumps(v)) for v in values],
                       pa.string())


def summary_table(root: str | Path) -> pa.Table:
    """One row per point under ``root``: run id, status, seed, parameters, metrics, errors.

    Parameters
    ----------
    root : str or Path
        A sweep directory (or a single job's directory holding batch points).

    Returns
    -------
    pyarrow.Table
        Columns ``run_id``, ``status`` (ok, failed or skipped), ``seed``, one
        column per swept key typed as in the requests tables, every summary
        metric (int64 counts, float64 others; null for a failed point), then
        ``error_type``, ``error``, ``overrides`` and ``path`` (the point's
        directory relative to ``root``).  Schema metadata ``parameters`` and
        ``failed`` (JSON lists of keys and of failed run ids).
    """
    root = Path(root)
    rows: list[dict[str, Any]] = []
    keys: list[str] = []
    metric_names: list[str] = []
    for path in point_files(root):
        point = _read_json(path)
        if point is None:
            continue
        row = {
            "run_id": point.get("run_id"),
            "status": point.get("status"),
            "seed": point.get("seed"),
            "parameters": point.get("parameters") or {},
            "overrides": " ".join(point.get("overrides") or []),
            "path": path.parent.relative_to(root).as_posix() or ".",
            "metrics": {},
            "error_type": None,
            "error": None,
        }
        for key in row["parameters"]:
            if key not in keys:
                keys.append(key)
        if row["status"] == "failed":
            failure = _read_json(path.parent / FAILURE_FILE) or {}
            row["error_type"] = failure.get("error_type")
            row["error"] = failure.get("error")
        else:
            summary = _read_json(path.parent / SUMMARY_FILE) or {}
            row["metrics"] = {
                k: v for k, v in summary.items()
                if k not in PROVENANCE_KEYS and not isinstance(v, (dict, list))
            }
            for name in row["metrics"]:
                if name not in metric_names:
                    metric_names.append(name)
        rows.append(row)
    keys = sorted(keys)
    fields = [
        pa.field("run_id", pa.string()),
        pa.field("status", pa.string()),
        pa.field("seed", pa.int64()),
    ]
    arrays = [
        from_pylist([r["run_id"] for r in rows], pa.string()),
        from_pylist([r["status"] for r in rows], pa.string()),
        from_pylist([params._coerce(r["seed"], pa.int64()) for r in rows], pa.int64()),
    ]
    for key in keys:
        field = params.parameter_field(key)
        fields.append(field)
        arrays.append(from_pylist([params._coerce(r["parameters"].get(key), field.type) for r in rows], field.type))
    for name in metric_names:
        column = _column([r["metrics"].get(name) for r in rows])
        fields.append(pa.field(name, column.type))
        arrays.append(column)
    for name in ("error_type", "error", "overrides", "path"):
        fields.append(pa.field(name, pa.string()))
        arrays.append(from_pylist([r[name] for r in rows], pa.string()))
    failed = [r["run_id"] for r in rows if r["status"] == "failed"]
    metadata = {"parameters": json.dumps(keys), "failed": json.dumps(failed)}
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata))


class PointLost(RuntimeError):
    """The process of a point ended while the point ran (killed, crashed or out of memory)."""

    @classmethod
    def of(cls, pid: Any, host: Any, how: str) -> PointLost:
        """The failure of a point whose process ``pid`` on ``host`` ended as ``how`` says."""
        return cls(f"the process of this point (pid {pid} on {host}) ended before the point finished: {how}")


def point_stamps(points: Sequence[Point]) -> dict[Path, tuple[int, int] | None]:
    """Identity (inode, mtime) of each point's ``point.json`` now, None where there is none.

    Taken before a job runs, so that :func:`record_crashed` can tell which
    points the job finished (their ``point.json`` was rewritten since).
    """
    def stamp(path: Path) -> tuple[int, int] | None:
        try:
            info = path.stat()
        except OSError:
            return None
        return info.st_ino, info.st_mtime_ns

    return {point.dir: stamp(point.dir / POINT_FILE) for point in points}


def unfinished_points(points: Sequence[Point], before: Mapping[Path, tuple[int, int] | None]) -> list[Point]:
    """The points that a job process which died did not finish.

    A point counts as finished when its ``point.json`` was rewritten since
    ``before`` (:func:`point_stamps`) with a final status, or when it holds a
    complete result set of its configuration (a point the job would have
    skipped).
    """
    rest = []
    now = point_stamps(points)
    for point in points:
        document = _read_json(point.dir / POINT_FILE) or {}
        if now[point.dir] != before.get(point.dir) and document.get("status") in STATUSES:
            continue
        try:
            config = load_config(point.mapping)
        except Exception:  # noqa: BLE001 - never ran far enough to be done
            config = None
        if config is not None and document.get("status") != RUNNING and is_done(point.dir, config.resolved):
            continue
        rest.append(point)
    return rest


def record_crashed(points: Sequence[Point], before: Mapping[Path, tuple[int, int] | None], pid: int,
                   how: str) -> list[str]:
    """Record the points of a job whose process died (``how``: ``killed by signal 11 (SIGSEGV)``) as failed.

    The points it finished (:func:`unfinished_points`) are left as they are;
    the others get ``failure.json`` (:class:`PointLost`).  Returns their run ids.
    """
    lost = []
    for point in unfinished_points(points, before):
        record_failure(point, PointLost.of(pid, socket.gethostname(), how))
        lost.append(point.run_id)
    return lost


def record_lost_points(root: Path) -> list[str]:
    """Record every point under ``root`` still marked running as failed (:class:`PointLost`).

    Called once every job of the sweep has returned, when no point can still
    be running.  Returns the run ids recorded.
    """
    lost = []
    for path in point_files(root):
        document = _read_json(path)
        if document is None or document.get("status") != RUNNING:
            continue
        runtime_info = document.get("runtime") or {}
        point = Point(path.parent, document.get("run_id"), {"seed": document.get("seed")},
                      tuple(document.get("overrides") or ()), tuple(sorted(document.get("parameters") or {})))
        lost_as = PointLost.of(runtime_info.get("pid"), runtime_info.get("host"), "killed, crashed or out of memory")
        record_failure(point, lost_as, values=document.get("parameters") or {})
        lost.append(point.run_id)
    return lost


def sweep_page(root: Path, table: pa.Table) -> str | None:
    """The sweep's ``report.html`` (:func:`runners.html_report.sweep_report`), or None.

    None when no point ran with ``output.report=true``; failed points are
    listed either way.  GPUs per point (the Pareto plot) from each point's
    ``summary.json`` config.
    """
    from runners.html_report import gpus_of, sweep_report

    gpus: dict[str, int | None] = {}
    wanted = False
    for run_id, rel, status in zip(table.column("run_id").to_pylist(), table.column("path").to_pylist(),
                                   table.column("status").to_pylist()):
        if status == "failed":
            continue
        config = (_read_json(root / rel / SUMMARY_FILE) or {}).get("config") or {}
        wanted = wanted or bool((config.get("output") or {}).get("report", True))
        gpus[run_id] = gpus_of(config)
    if not wanted:
        return None
    keys = json.loads((table.schema.metadata or {}).get(b"parameters", b"[]"))
    return sweep_report(table.to_pylist(), keys, gpus=gpus, where=str(root))


def write_summary(root: str | Path, *, quiet: bool = False) -> tuple[Path, pa.Table]:
    """Write ``summary.parquet`` and ``report.html`` at ``root`` (atomically) and report failed points.

    Parameters
    ----------
    root : str or Path
        The sweep directory.
    quiet : bool
        Print nothing.

    Returns
    -------
    Path
        The file written.
    pyarrow.Table
        Its content (:func:`summary_table`).
    """
    root = Path(root)
    record_lost_points(root)
    table = summary_table(root)
    writers = [(SWEEP_SUMMARY, parquet_file(table))]
    page = sweep_page(root, table)
    if page is not None:
        writers.insert(0, (REPORT_FILE, lambda path: path.write_text(page, encoding="utf-8")))
    path = write_atomic(root, writers)[-1]
    if not quiet:
        status = table.column("status").to_pylist()
        counts = ", ".join(f"{status.count(s)} {s}" for s in STATUSES if status.count(s))
        print(f"replaysim: sweep summary: {len(status)} points ({counts or 'none'}) -> {path}", flush=True)
        for run_id, error_type, error in zip(
            table.column("run_id").to_pylist(), table.column("error_type").to_pylist(), table.column("error").to_pylist()
        ):
            if error_type is not None:
                print(f"replaysim: failed point {run_id}: {error_type}: {error}", file=sys.stderr, flush=True)
    return path, table


__all__ = [
    "RUNNER_DEFAULTS",
    "Point",
    "RunnerOptions",
    "job_points",
    "presimulate",
    "record_failure",
    "run_point",
    "say",
    "simulate",
    "split_options",
    "summary_table",
    "write_summary",
]
