"""The ``replaysim-capacity`` command: the highest load each configuration sustains under an SLO.

Takes the config and overrides of ``replaysim`` plus the ``capacity.*`` keys
(:data:`CAPACITY_DEFAULTS`, ``docs/capacity.md``).  The configurations are the
cartesian product of the batch axes ``sweep.batch.<key>=[...]`` (or, with
``capacity.search=optuna``, the trials NSGA-II picks from it); every
configuration's capacity along ``capacity.axis`` is bisected
(:mod:`runners.capacity_search`), all configurations' probes of one step
simulated together by :func:`simcore.run_batch`.  Results, written atomically
into ``output.dir`` (default the Hydra run directory): ``capacity.parquet``,
``pareto.parquet``, ``probes.parquet`` and two PNGs; every simulated probe is
also kept in ``probes/`` so that a rerun into the same directory resumes.
Bad input exits 2 with one line, as ``replaysim`` does.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import signal
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, NoReturn, Sequence

import hydra
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.utils import to_absolute_path
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from tqdm import tqdm

from runners import cli, params
from runners.capacity_search import (
    AXES,
    GOODPUT_FRACTION,
    Bracket,
    Probe,
    Slo,
    pareto_mask,
    parse_slo,
)
from runners.hydra_private import args_parser
from runners.entry import wants_help
from runners.options import print_help
from runners.progress import interactive
from runners.report import TABLE_WIDTH
from runners.rundir import claimed_dir, missing_ancestors, remove_new_run_dir
from runners.sweep import Point, RunnerOptions, job_points, split_options
from runners.writer import check_writable, parquet_file, write_atomic
import simcore
from simcore.bounds import configured_size
from simcore.checks import count, number as checked_number, shown
from simcore.config import ConfigError, SimConfig, load_config
from simcore.units import INT64_MAX

PROG = "replaysim-capacity"
CONFIG_NAME = "capacity"
CAPACITY_CONFIG = "capacity_config"
EXIT_BAD_INPUT = 2

#: Defaults of the ``capacity.*`` keys (registered as ``capacity_config``).
CAPACITY_DEFAULTS: dict[str, Any] = {
    "axis": "load.request_rate",
    "lo": None,  # null: 1
    "hi": None,  # null: double lo until the SLO fails
    "tolerance": 0.01,
    "monotone_tolerance": 0.01,
    "max_doublings": 20,
    "slo": {},
    "seeds": 1,
    "seed_quantile": 1.0,
    "search": "grid",
    "trials": 64,
    "population": 16,
    "plots": True,
    "table_rows": 30,
}
#: The capacity.* keys documented (``replaysim --help``, docs/options.md, docs/capacity.md):
#: ``(key, unit, values, description)``, in :data:`CAPACITY_DEFAULTS`' order.
CAPACITY_KEY_DOCS: tuple[tuple[str, str, str, str], ...] = (
    ("axis", "", "load.request_rate | load.concurrency", "The load axis whose highest value meeting the SLO is searched."),
    ("lo", "axis unit", "number > 0 (rate: <= 1e9) or null", "The first probe; null: 1. A configuration failing there has no capacity."),
    ("hi", "axis unit", "number > lo (rate: <= 1e9) or null", "The upper end of the bracket; null: double lo until the SLO fails."),
    ("tolerance", "", "number >= 1e-9", "Relative: bisection stops when the lowest failing value is at most capacity x (1 + tolerance)."),
    ("monotone_tolerance", "", "number >= 0",
     "non_monotone (column and terminal) notes an SLO metric only when it improves with more load by more than "
     "this share (0.01: 1%)."),
    ("max_doublings", "", "integer 0 to 64",
     "Without hi: stop doubling after this many (status unbounded); lo x 2^max_doublings within the axis."),
    ("slo.<metric>", "ms", "number > 0",
     "An upper bound on a summary metric (<mean|median|max|p<P>>_<ttft|tpot|itl|e2el>_ms), or goodput_fraction "
     "as a lower bound. At least one."),
    ("seeds", "", "integer >= 1",
     "Workload seeds per probe: seed, seed + 1, ... (the search: at most 1e6 runs and 1e9 requests)."),
    ("seed_quantile", "", "number in [0, 1]", "Quantile over the seeds at which each SLO metric is judged (1: the worst seed)."),
    ("search", "", "grid | optuna", "grid: every point of the batch axes; optuna: NSGA-II over them."),
    ("trials", "", "integer 1 to 1e6", "optuna: trial budget."),
    ("population", "", "integer 1 to 1e6", "optuna: NSGA-II population, trials bisected together."),
    ("plots", "", "true | false", "Write the PNG plots."),
    ("table_rows", "lines", "integer >= 0", "Terminal lines per section (0: all)."),
)
SEARCHES = ("grid", "optuna")
#: Probes simulated per :func:`simcore.run_batch` call (bounds the results held at once).
BATCH_CHUNK = 512
PROBES_DIR = "probes"
CAPACITY_FILE = "capacity.parquet"
PARETO_FILE = "pareto.parquet"
PROBES_FILE = "probes.parquet"
PARETO_PNG = "capacity_pareto.png"
CAPACITY_PNG = "capacity_per_config.png"
PER_GPU = "output_tokens_per_s_per_gpu"
PER_USER = "output_tokens_per_s_per_user"


def register() -> None:
    """Store ``capacity_config`` in Hydra's ConfigStore; ``capacity.slo`` is left open (any SLO key)."""
    node = OmegaConf.create({"capacity": copy.deepcopy(CAPACITY_DEFAULTS)})
    OmegaConf.set_struct(node.capacity.slo, False)
    ConfigStore.instance().store(name=CAPACITY_CONFIG, node=node)


register()


# ---------------------------------------------------------------- options and bad input


def fail(message: object) -> NoReturn:
    """Print ``replaysim-capacity: error: <message>`` as one stderr line, remove a new run dir, exit 2."""
    text = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    remove_new_run_dir()
    _remove_created_out()
    print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_BAD_INPUT)


#: The ``output.dir`` directories the writability check created (deepest first), removed on bad input.
_created_out: list[Path] = []


def _remove_created_out() -> None:
    for directory in _created_out:
        try:
            directory.rmdir()  # only while empty
        except OSError:
            break
    _created_out.clear()


@dataclass(frozen=True)
class CapacityOptions:
    """The validated ``capacity.*`` keys."""

    axis: str
    lo: float
    hi: float | None
    tolerance: float
    monotone_tolerance: float
    max_doublings: int
    slo: Slo
    seeds: int
    search: str
    trials: int
    population: int
    plots: bool
    table_rows: int

    @property
    def integer(self) -> bool:
        return self.axis == "load.concurrency"

    def bracket(self) -> Bracket:
        return Bracket(self.lo, self.hi, self.tolerance, self.integer, self.max_doublings)


#: The highest request rate searched: at 1e9 requests/s one request is sent every ns, the
#: simulator's time unit (SPEC §0); above it every gap is 0 ns and the load no longer grows.
MAX_REQUEST_RATE = 1e9
#: The most doublings of ``capacity.lo`` (``2**64`` times lo is past every axis' range).
MAX_DOUBLINGS = 64
#: The narrowest relative bracket: float64 bisection needs its midpoints to differ from both ends.
MIN_TOLERANCE = 1e-9
#: The most trials, NSGA-II population, seeds (each a whole replay per probe).
MAX_TRIALS = 10**6
#: The most requests a search may simulate (configurations x seeds x probes x requests), and the
#: most probe runs (each run's summary, about 7 KB, is held until the end: 1e6 runs take about
#: 7 GB), checked before the first probe with the estimate in the message.  Batched runs go at
#: about 1e5 requests/s on 2 cores (docs/performance.md: 804 runs of 100 requests a second),
#: so 1e9 requests is some hours: past it a typo (an extra zero or three in capacity.seeds or a
#: grid axis) would start a search of days.
MAX_SIMULATED_REQUESTS = 10**9
MAX_RUNS = 10**6


def _number(key: str, value: Any, *, integer: bool = False, positive: bool = True,
            maximum: float | None = None, minimum: float | None = None) -> Any:
    """``capacity.<key>``: an int64 integer or a finite number, > 0 (``positive``) or >= 0, within the bounds."""
    path = f"capacity.{key}"
    if integer:
        number = count(path, value, 1 if positive else 0)
    else:
        number = checked_number(path, value, minimum=0.0, strict=positive)
        number = value if isinstance(value, int) else number  # an integer keeps its type (the table's)
    if minimum is not None and number < minimum:
        raise ConfigError(f"{path} must be >= {minimum:g}, got {shown(value)}")
    if maximum is not None and number > maximum:
        raise ConfigError(f"{path} must be <= {maximum:g}, got {shown(value)}")
    return number


def axis_maximum(axis: str) -> float:
    """The largest value the axis takes: :data:`MAX_REQUEST_RATE`, or an int64 concurrency."""
    return MAX_REQUEST_RATE if axis == "load.request_rate" else float(INT64_MAX)


def parse_options(raw: Mapping[str, Any]) -> CapacityOptions:
    """Validate the ``capacity`` section (unknown keys, types, ranges)."""
    unknown = sorted((str(key) for key in set(raw) - set(CAPACITY_DEFAULTS)))
    if unknown:
        key = unknown[0] if unknown[0].isprintable() else repr(unknown[0])  # one line
        raise ConfigError(f"capacity.{key} is not a capacity key (known: {', '.join(CAPACITY_DEFAULTS)})")
    merged = {**CAPACITY_DEFAULTS, **raw}
    axis = merged["axis"]
    if not isinstance(axis, str) or axis not in AXES:
        raise ConfigError(f"capacity.axis must be one of {', '.join(AXES)}, got {shown(axis)}")
    integer = axis == "load.concurrency"
    top = axis_maximum(axis)
    lo = 1 if merged["lo"] is None else _number("lo", merged["lo"], integer=integer, maximum=top)
    hi = None if merged["hi"] is None else _number("hi", merged["hi"], integer=integer, maximum=top)
    if hi is not None and hi <= lo:
        raise ConfigError(f"capacity.hi must be above capacity.lo ({lo}), got {hi}")
    if not isinstance(merged["search"], str) or merged["search"] not in SEARCHES:
        raise ConfigError(f"capacity.search must be one of {', '.join(SEARCHES)}, got {shown(merged['search'])}")
    if not isinstance(merged["plots"], bool):
        raise ConfigError(f"capacity.plots must be true or false, got {shown(merged['plots'])}")
    max_doublings = _number("max_doublings", merged["max_doublings"], integer=True, positive=False,
                            maximum=MAX_DOUBLINGS)
    if hi is None and lo * 2.0**max_doublings > top:
        most = max(0, math.floor(math.log2(top / lo)))
        raise ConfigError(
            f"capacity.max_doublings={max_doublings}: capacity.lo={lo} doubled that often reaches "
            f"{lo * 2.0**max_doublings:.4g}, above the largest {axis} ({top:.4g}"
            f"{', one request per ns' if not integer else ''}): at most {most} doublings, or set capacity.hi")
    return CapacityOptions(
        axis=axis,
        lo=lo,
        hi=hi,
        tolerance=_number("tolerance", merged["tolerance"], minimum=MIN_TOLERANCE),
        monotone_tolerance=_number("monotone_tolerance", merged["monotone_tolerance"], positive=False),
        max_doublings=max_doublings,
        slo=parse_slo(merged["slo"], merged["seed_quantile"]),
        seeds=_number("seeds", merged["seeds"], integer=True),
        search=merged["search"],
        trials=_number("trials", merged["trials"], integer=True, maximum=MAX_TRIALS),
        population=_number("population", merged["population"], integer=True, maximum=MAX_TRIALS),
        plots=merged["plots"],
        table_rows=_number("table_rows", merged["table_rows"], integer=True, positive=False),
    )


def most_probes(options: CapacityOptions) -> int:
    """The most probes one configuration's bisection can take (doubling, then halving to the tolerance)."""
    if options.hi is None:
        first, top, doublings = 1, options.lo * 2.0**options.max_doublings, options.max_doublings
    else:
        first, top, doublings = 2, float(options.hi), 0
    lo = float(options.lo)
    if options.integer:
        bits = math.log2(max(top - lo, 1.0))
    else:  # log2((top - lo) / (lo x tolerance)), without the product underflowing (lo = 5e-324)
        bits = math.log2(top - lo) - math.log2(lo) - math.log2(options.tolerance) if top > lo else 0.0
    halvings = max(0, math.ceil(bits)) + 1
    return first + doublings + halvings


def check_cost(options: CapacityOptions, configurations: int, requests: int, where: str) -> None:
    """Refuse a search that could simulate more than :data:`MAX_SIMULATED_REQUESTS` requests.

    Parameters
    ----------
    options : CapacityOptions
    configurations : int
        Configurations bisected (grid points, or ``capacity.trials``).
    requests : int
        Requests of the largest run (``workload.num_requests``, or sessions x turns).
    where : str
        What gives ``configurations`` (for the message).
    """
    probes = most_probes(options)
    runs = configurations * options.seeds * probes
    total = runs * requests
    if total > MAX_SIMULATED_REQUESTS or runs > MAX_RUNS:
        raise ConfigError(
            f"capacity search could simulate {runs:.3g} runs of {requests} requests, {total:.3g} requests "
            f"({configurations} configurations ({where}) x capacity.seeds={options.seeds} x up to {probes} probes "
            f"(capacity.lo, hi, max_doublings, tolerance)), above the bounds of {MAX_RUNS:.0e} runs and "
            f"{MAX_SIMULATED_REQUESTS:.0e} requests: lower capacity.seeds, the grid or the requests")


def check_axis_ends(mapping: Mapping[str, Any], options: CapacityOptions) -> None:
    """The base config must be valid at both ends of the search, else the error names the capacity key."""
    ends = [("lo", options.lo)]
    if options.hi is not None:
        ends.append(("hi", options.hi))
    elif options.max_doublings:
        ends.append(("max_doublings", options.lo * 2**options.max_doublings))
    seed = params.lookup(mapping, "seed", simcore.DEFAULTS["seed"])
    if isinstance(seed, int) and seed + options.seeds - 1 > INT64_MAX:
        raise ConfigError(f"capacity.seeds={options.seeds}: the seeds from seed={seed} pass the largest seed "
                          f"({INT64_MAX}, int64)")
    for name, value in ends:
        try:
            probe_config(mapping, options.axis, value, seed)
        except ConfigError as exc:
            given = getattr(options, name)
            what = f"capacity.{name}={given}" + (f" (up to {options.axis}={value:g})" if name == "max_doublings"
                                                 else f" as {options.axis}")
            raise ConfigError(f"{what}: {exc}") from None


def check_overrides(argv: Sequence[str]) -> None:
    """Reject, before Hydra composes, an override that cannot be parsed or names no key.

    ``capacity.*`` keys are checked here (``capacity.slo.*`` when the config is
    validated); the others as ``replaysim`` checks them.  A multirun (``-m``)
    is refused: the configurations are given as batch axes.
    """
    args = args_parser().parse_args(list(argv))
    if args.multirun and not args.shell_completion:
        fail("-m: replaysim-capacity searches in one process; give the grid as sweep.batch.<key>=[values]")
    problem = cli.override_problem(argv, own_keys={"capacity": _capacity_key_message})
    if problem is not None:
        fail(problem)


def _capacity_key_message(key: str) -> str | None:
    """Why ``key`` is not a ``capacity`` key, or None (``capacity.slo.<any>`` is checked later)."""
    parts = key.split(".")
    if len(parts) == 1 or (parts[1] in CAPACITY_DEFAULTS and (len(parts) == 2 or parts[1] == "slo")):
        return None
    return f"{key} is not a known config key (known keys under capacity: {', '.join(CAPACITY_DEFAULTS)})"


# ---------------------------------------------------------------- configurations and probes


def gpu_count(config: SimConfig) -> int:
    """GPUs of a deployment: ranks of every pool (both pools in P/D) × its ``timing.tp`` (a pool's own
    ``engine.<pool>.timing.tp`` where set)."""
    return sum(pool.num_ranks * (config.timing_of(i).tp or 1) for i, pool in enumerate(config.engine.pools))


def check_axis(mapping: Mapping[str, Any], options: CapacityOptions, where: str) -> None:
    """Raise ConfigError if the capacity axis cannot drive the load of the simcore ``mapping``."""
    load_type = params.lookup(mapping, "load.type", params.lookup(simcore.DEFAULTS, "load.type"))
    if options.axis == "load.concurrency" and load_type != "closed_loop":
        raise ConfigError(f"capacity.axis=load.concurrency needs load.type=closed_loop, got {load_type} ({where})")
    if options.axis == "load.request_rate" and load_type in ("closed_loop", "trace"):
        raise ConfigError(
            f"capacity.axis=load.request_rate needs an open-loop load.type (constant_rate, poisson, gamma), "
            f"got {load_type} ({where})"
        )


class ProbeStore:
    """Summaries of simulated probe runs by the hash of their resolved config, kept in ``probes/``.

    Each step's new runs go to one more Parquet file (atomically), so a rerun
    into the same directory reuses every run a former, perhaps interrupted,
    search finished.  The simulation is deterministic, so a stored summary is
    the one a new run would give.

    Parameters
    ----------
    out_dir : Path or None
        The search's output directory; None keeps the runs in memory only.
    reuse : bool
        Read the runs stored there (False: remove them).
    """

    def __init__(self, out_dir: Path | None, reuse: bool = True):
        self.dir = None if out_dir is None else out_dir / PROBES_DIR
        self.summaries: dict[str, dict] = {}
        self.reused = 0
        self.written: list[Path] = []
        if self.dir is None or not self.dir.is_dir():
            return
        for path in sorted(self.dir.glob("step-*.parquet")):
            if not reuse:
                path.unlink()
                continue
            table = pq.read_table(path)
            for key, text in zip(table.column("key").to_pylist(), table.column("summary").to_pylist()):
                self.summaries[key] = json.loads(text)

    @staticmethod
    def key(config: SimConfig) -> str:
        text = json.dumps(config.resolved, sort_keys=True, separators=(",", ":"), allow_nan=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def add(self, summaries: Mapping[str, dict]) -> None:
        self.summaries.update(summaries)
        if not summaries or self.dir is None:
            return
        table = pa.table({
            "key": pa.array(list(summaries), type=pa.string()),
            "summary": pa.array([json.dumps(s, allow_nan=True) for s in summaries.values()], type=pa.string()),
        })
        self.written += write_atomic(self.dir, [(f"step-{uuid.uuid4().hex}.parquet", parquet_file(table))])

    def discard_written(self) -> None:
        """Remove the files this store wrote (a search that ends on bad input leaves no file)."""
        for path in self.written:
            path.unlink(missing_ok=True)
        if self.dir is not None and self.dir.is_dir() and not any(self.dir.iterdir()):
            self.dir.rmdir()
        self.written.clear()


def probe_config(base: Mapping[str, Any], axis: str, value: float, seed: int) -> SimConfig:
    """``base`` with the axis at ``value`` and the given seed, validated."""
    mapping = copy.deepcopy(dict(base))
    params.assign(mapping, axis, value)
    mapping["seed"] = seed
    return load_config(mapping)


def simulate_step(
    requests: Sequence[tuple[Mapping[str, Any], int, float]],
    options: CapacityOptions,
    store: ProbeStore,
) -> list[Probe]:
    """Judge each (configuration mapping, its seed, axis value) over ``capacity.seeds`` seeds from its seed.

    Runs missing from ``store`` are simulated together (:func:`simcore.run_batch`,
    in chunks of ``BATCH_CHUNK``) and added to it.
    """
    runs: list[list[str]] = []
    todo: dict[str, SimConfig] = {}
    for mapping, seed, value in requests:
        keys = []
        for offset in range(options.seeds):
            config = probe_config(mapping, options.axis, value, seed + offset)
            key = store.key(config)
            keys.append(key)
            if key not in store.summaries:
                todo[key] = config
            else:
                store.reused += 1
        runs.append(keys)
    pending = list(todo.items())
    for start in range(0, len(pending), BATCH_CHUNK):
        chunk = pending[start : start + BATCH_CHUNK]
        results = simcore.run_batch([config for _, config in chunk])
        store.add({key: result.summary for (key, _), result in zip(chunk, results)})
    probes = []
    for (_, _, value), keys in zip(requests, runs):
        summaries = [store.summaries[key] for key in keys]
        judged = options.slo.judged(summaries)
        probes.append(Probe(value, options.slo.holds(judged, summaries), judged, summaries[0]))
    return probes


def bisect_all(
    configs: Sequence[tuple[Mapping[str, Any], SimConfig]],
    options: CapacityOptions,
    store: ProbeStore,
    on_step: Callable[[int, int], None] | None = None,
) -> list[Bracket]:
    """Bisect every configuration's capacity, one batch of probes per step.

    Parameters
    ----------
    configs : sequence of (mapping, SimConfig)
        The configurations: simcore mapping and its validated config.
    options : CapacityOptions
    store : ProbeStore
        Simulated runs (reused and extended).
    on_step : callable, optional
        ``on_step(finished, total)`` configurations after every step.

    Returns
    -------
    list of Bracket
        One finished bracket per configuration, in order.
    """
    brackets = [options.bracket() for _ in configs]
    while True:
        asks = [(index, bracket.next_values()) for index, bracket in enumerate(brackets) if not bracket.done]
        if not asks:
            return brackets
        flat = [(configs[index][0], configs[index][1].seed, value) for index, values in asks for value in values]
        probes = iter(simulate_step(flat, options, store))
        for index, values in asks:
            brackets[index].record([next(probes) for _ in values])
        if on_step is not None:
            on_step(sum(b.done for b in brackets), len(brackets))


# ---------------------------------------------------------------- tables


@dataclass(frozen=True)
class Found:
    """A configuration and its finished bisection."""

    point: Point
    config: SimConfig
    bracket: Bracket


def rates_at_capacity(found: Found) -> tuple[float | None, float | None]:
    """Output tokens/s per GPU and per user at the capacity (None: no capacity or no TPOT).

    Per user is ``1000 / mean_tpot_ms``, the decode rate one stream sees.
    """
    probe = found.bracket.at_capacity()
    if probe is None:
        return None, None
    throughput, tpot = probe.summary.get("output_throughput"), probe.summary.get("mean_tpot_ms")
    per_gpu = None if throughput is None else throughput / gpu_count(found.config)
    return per_gpu, (None if tpot is None or tpot <= 0 else 1000.0 / tpot)


def _metric_column(values: list) -> pa.Array:
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pa.array(values, type=pa.int64())
    return pa.array([None if v is None else float(v) for v in values], type=pa.float64())


def capacity_table(found: Sequence[Found], options: CapacityOptions, keys: Sequence[str]) -> pa.Table:
    """One row per configuration: parameters, capacity, GPUs, per-GPU and per-user rates, summary at capacity.

    ``slo_<key>`` is the SLO metric judged over the seeds.
    """
    columns: dict[str, pa.Array] = {"config_id": pa.array(range(len(found)), type=pa.int64())}
    fields = [pa.field("config_id", pa.int64())]
    for key in keys:
        field = params.parameter_field(key)
        fields.append(field)
        values = [f.point.values(f.config.resolved).get(key) for f in found]
        columns[key] = pa.array([params._coerce(v, field.type) for v in values], type=field.type)
    at = [f.bracket.at_capacity() for f in found]
    summaries = [p.summary if p is not None else {} for p in at]
    gpus = [gpu_count(f.config) for f in found]
    per_gpu, per_user = zip(*(rates_at_capacity(f) for f in found)) if found else ((), ())
    feasible = [i for i, (x, y) in enumerate(zip(per_gpu, per_user)) if x is not None and y is not None]
    on_front = np.zeros(len(found), dtype=bool)
    if feasible:
        on_front[feasible] = pareto_mask([per_user[i] for i in feasible], [per_gpu[i] for i in feasible])
    derived = {
        "axis": pa.array([options.axis] * len(found), type=pa.string()),
        "capacity": pa.array([f.bracket.capacity for f in found], type=pa.float64()),
        "status": pa.array([f.bracket.status for f in found], type=pa.string()),
        "on_pareto": pa.array(on_front, type=pa.bool_()),
        "probes": pa.array([len(f.bracket.probes) for f in found], type=pa.int64()),
        "non_monotone": pa.array(["; ".join(n) or None for n in (f.bracket.non_monotone(options.slo, options.monotone_tolerance) for f in found)],
                                 type=pa.string()),
        "gpus": pa.array(gpus, type=pa.int64()),
        PER_GPU: pa.array(per_gpu, type=pa.float64()),
        PER_USER: pa.array(per_user, type=pa.float64()),
    }
    for key in options.slo.limits:
        derived[f"slo_{key}"] = pa.array([None if p is None else p.judged[key] for p in at], type=pa.float64())
    names = list(dict.fromkeys(name for s in summaries for name in s))
    for name in names:
        derived[name] = _metric_column([s.get(name) for s in summaries])
    for name, array in derived.items():
        fields.append(pa.field(name, array.type))
        columns[name] = array
    metadata = {
        "parameters": json.dumps(list(keys)),
        "axis": options.axis,
        "slo": json.dumps(options.slo.limits),
        "seed_quantile": json.dumps(options.slo.quantile),
        "seeds": json.dumps(options.seeds),
        "tolerance": json.dumps(options.tolerance),
        "monotone_tolerance": json.dumps(options.monotone_tolerance),
    }
    return pa.Table.from_arrays(list(columns.values()), schema=pa.schema(fields, metadata=metadata))


def pareto_table(capacity: pa.Table) -> pa.Table:
    """The rows of ``capacity`` on the front, by increasing tokens/s per user."""
    front = capacity.filter(capacity.column("on_pareto"))
    return front.sort_by([(PER_USER, "ascending"), (PER_GPU, "descending")])


def probes_table(found: Sequence[Found], options: CapacityOptions) -> pa.Table:
    """Every probe: configuration, axis value, whether the SLO held, the judged SLO metrics."""
    rows = [(i, p) for i, f in enumerate(found) for p in sorted(f.bracket.probes, key=lambda p: p.value)]
    columns = {
        "config_id": pa.array([i for i, _ in rows], type=pa.int64()),
        "value": pa.array([p.value for _, p in rows], type=pa.float64()),
        "holds": pa.array([p.holds for _, p in rows], type=pa.bool_()),
    }
    for key in options.slo.limits:
        columns[f"slo_{key}"] = pa.array([p.judged[key] for _, p in rows], type=pa.float64())
    return pa.table(columns)


# ---------------------------------------------------------------- terminal and plots


def labels_for(keys: Sequence[str]) -> dict[str, str]:
    """Short labels: the last part of each key, or the whole key when that is ambiguous."""
    last = [key.rsplit(".", 1)[-1] for key in keys]
    return {key: (short if last.count(short) == 1 else key) for key, short in zip(keys, last)}


def config_labels(capacity: pa.Table, keys: Sequence[str]) -> list[str]:
    """``policy=vllm replicas=2 ...`` per row: the parameters that vary between rows."""
    varying = [k for k in keys if len(set(map(str, capacity.column(k).to_pylist()))) > 1]
    short = labels_for(varying)
    rows = capacity.select(varying).to_pylist() if varying else [{} for _ in range(capacity.num_rows)]
    return [" ".join(f"{short[k]}={params.format_value(row[k])}" for k in varying) or "default" for row in rows]


def _fmt(value: Any, spec: str = ".4g") -> str:
    return "-" if value is None else format(value, spec)


def format_table(capacity: pa.Table, keys: Sequence[str], options: CapacityOptions, out_dir: Path) -> str:
    """The terminal table: one line per configuration (front first, then by tokens/s per GPU)."""
    labels = config_labels(capacity, keys)
    rows = capacity.select(["config_id", "capacity", "status", "gpus", PER_GPU, PER_USER, "on_pareto",
                            "non_monotone"]).to_pylist()
    order = sorted(range(len(rows)), key=lambda i: (not rows[i]["on_pareto"], -(rows[i][PER_GPU] or 0.0)))
    # the configuration column takes what the others leave of TABLE_WIDTH (its labels cut with …)
    room = TABLE_WIDTH - 69
    labels = [label if len(label) <= room else label[: room - 1] + "…" for label in labels]
    width = max([len(label) for label in labels] + [13])
    slo = ", ".join(f"{k} {'>=' if k == GOODPUT_FRACTION else '<='} {v:g}" for k, v in options.slo.limits.items())
    lines = [f"capacity along {options.axis} under {slo}",
             f"{'id':>4}  {'configuration':<{width}}  {'capacity':>10}  {'status':<9}  {'GPUs':>4}  "
             f"{'tok/s/GPU':>10}  {'tok/s/user':>10}  pareto"]
    shown = order[: options.table_rows] if options.table_rows else order
    for i in shown:
        r = rows[i]
        lines.append(f"{r['config_id']:>4}  {labels[i]:<{width}}  {_fmt(r['capacity']):>10}  {r['status']:<9}  "
                     f"{r['gpus']:>4}  {_fmt(r[PER_GPU]):>10}  {_fmt(r[PER_USER]):>10}  {'*' if r['on_pareto'] else ''}")
    if len(shown) < len(rows):
        lines.append(f"... {len(rows) - len(shown)} more rows in {CAPACITY_FILE}")
    flagged = [i for i, r in enumerate(rows) if r["non_monotone"]]
    if flagged:
        lines.append(f"not monotone in {options.axis} by more than {options.monotone_tolerance:.2%} "
                     "(column non_monotone):")
    for i in flagged[: options.table_rows] if options.table_rows else flagged:
        lines += textwrap.wrap(f"config {rows[i]['config_id']} ({labels[i]}): {rows[i]['non_monotone']}",
                               width=TABLE_WIDTH, initial_indent="  ", subsequent_indent="    ")
    if options.table_rows and len(flagged) > options.table_rows:
        lines.append(f"  ... {len(flagged) - options.table_rows} more in {CAPACITY_FILE}")
    lines.append(f"Output directory: {out_dir}")
    return "\n".join(line.rstrip() for line in lines)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_writers(capacity: pa.Table, keys: Sequence[str], options: CapacityOptions) -> list[tuple[str, Callable]]:
    """Writers (for :func:`write_atomic`) of the Pareto plot and the capacity-per-configuration plot."""
    plt = _pyplot()
    labels = config_labels(capacity, keys)
    data = capacity.select(["config_id", "capacity", PER_GPU, PER_USER, "on_pareto"]).to_pylist()
    slo = ", ".join(f"{k} {'≥' if k == GOODPUT_FRACTION else '≤'} {v:g}" for k, v in options.slo.limits.items())

    def pareto_png(path: Path) -> None:
        feasible = [r for r in data if r["capacity"] is not None and r[PER_GPU] is not None and r[PER_USER] is not None]
        front = sorted((r for r in feasible if r["on_pareto"]), key=lambda r: r[PER_USER])
        fig, ax = plt.subplots(figsize=(11, 5.5))
        ax.scatter([r[PER_USER] for r in feasible], [r[PER_GPU] for r in feasible], s=14, color="0.6",
                   label="configuration at its capacity")
        ax.plot([r[PER_USER] for r in front], [r[PER_GPU] for r in front], "o-", color="C3", label="Pareto front")
        listed = front[:25]  # ids on the plot, their parameters beside it
        for r in listed:
            ax.annotate(f"{r['config_id']}", (r[PER_USER], r[PER_GPU]), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
        key = "\n".join(f"{r['config_id']}: {labels[r['config_id']]}" for r in listed)
        if len(front) > len(listed):
            key += f"\n... {len(front) - len(listed)} more in {PARETO_FILE}"
        fig.text(0.64, 0.88, f"front (config_id: parameters)\n{key}", fontsize=7, va="top", family="monospace")
        ax.set_xlabel("output tokens/s per user (1000 / mean TPOT)")
        ax.set_ylabel("output tokens/s per GPU")
        ax.set_title(f"Capacity along {options.axis} under {slo}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.subplots_adjust(left=0.07, right=0.62, bottom=0.1, top=0.92)
        fig.savefig(path, dpi=120, format="png")
        plt.close(fig)

    def capacity_png(path: Path) -> None:
        order = sorted(range(len(data)), key=lambda i: data[i]["capacity"] or 0.0)
        shown = order[-60:]  # the 60 largest; the table has them all
        fig, ax = plt.subplots(figsize=(8, max(3.0, 0.22 * len(shown) + 1.2)))
        values = [data[i]["capacity"] or 0.0 for i in shown]
        colors = ["C3" if data[i]["on_pareto"] else "C0" for i in shown]
        ax.barh(range(len(shown)), values, color=colors)
        ax.set_yticks(range(len(shown)), [labels[i] for i in shown], fontsize=7)
        ax.set_xlabel(f"capacity: highest {options.axis} meeting the SLO (red: on the Pareto front)")
        title = f"Capacity per configuration under {slo}"
        if len(shown) < len(data):
            title += f" ({len(shown)} largest of {len(data)})"
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=120, format="png")
        plt.close(fig)

    return [(PARETO_PNG, pareto_png), (CAPACITY_PNG, capacity_png)]


# ---------------------------------------------------------------- searches


#: Off a terminal, seconds between the search's progress lines.
HEARTBEAT_S = 5.0


class StepBar:
    """Configurations finished out of the total: a tqdm bar on a terminal, else a line every few seconds.

    Off a terminal (a log file, a batch job) a background thread prints
    ``replaysim-capacity: 3/12 configurations done, 41.2 s`` on stdout every
    ``interval`` seconds (:data:`HEARTBEAT_S`) until :meth:`close`, so a long
    step, during which no configuration finishes, still shows the search is alive.
    """

    def __init__(self, total: int, interval: float = HEARTBEAT_S, stream=None, enabled: bool | None = None):
        terminal = interactive() if enabled is None else enabled
        self._bar = tqdm(total=total, desc="capacity", unit="config", disable=not terminal)
        self.done, self.total = 0, total
        self._stream = sys.stdout if stream is None else stream
        self._start = time.monotonic()
        self._stop = threading.Event()
        self._thread = None
        if not terminal:
            self._thread = threading.Thread(target=self._beat, args=(interval,), name="capacity-progress",
                                            daemon=True)
            self._thread.start()

    def line(self) -> str:
        return (f"{PROG}: {self.done}/{self.total} configurations done, "
                f"{time.monotonic() - self._start:.1f} s")

    def _beat(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self._stream.write(self.line() + "\n")
            self._stream.flush()

    def __call__(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        self._bar.total = total
        self._bar.update(done - self._bar.n)  # tqdm takes increments

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._bar.close()


def validated_points(points: Sequence[Point], options: CapacityOptions) -> list[SimConfig]:
    """Each point's config, checked for the capacity search.

    Raises
    ------
    ConfigError
        The first bad point, named by its overrides.
    """
    configs = []
    for point in points:
        try:
            check_axis(point.mapping, options, point.run_id)
            config = load_config(point.mapping)
            options.slo.check_config(config, point.run_id)
        except ValueError as exc:
            raise ConfigError(f"{point.run_id} ({' '.join(point.overrides)}): {exc}") from exc
        configs.append(config)
    return configs


def run_requests(config: SimConfig) -> int:
    """Requests of one probe run of ``config`` (a file workload counts as ``workload.num_requests`` or 1)."""
    size = configured_size(config).num_requests
    return max(size, config.workload.num_requests or 1)


def grid_search(points: Sequence[Point], options: CapacityOptions, store: ProbeStore) -> list[Found]:
    """Bisect every point of the grid."""
    configs = validated_points(points, options)
    check_cost(options, len(configs), max(run_requests(c) for c in configs), "the grid")
    bar = StepBar(len(points))
    try:
        brackets = bisect_all([(p.mapping, c) for p, c in zip(points, configs)], options, store, bar)
    finally:
        bar.close()
    return [Found(p, c, b) for p, c, b in zip(points, configs, brackets)]


def optuna_search(
    make_point: Callable[[dict[str, Any]], Point],
    axes: Mapping[str, list],
    options: CapacityOptions,
    store: ProbeStore,
    seed: int,
) -> list[Found]:
    """NSGA-II over the batch axes, ``capacity.trials`` trials, each a capacity bisection.

    Trials are asked a population at a time and their bisections run
    together; objectives (both maximised) are tokens/s per GPU and per user at
    the capacity; a configuration without capacity is a failed trial.  A
    configuration picked twice is bisected once.
    """
    try:
        import optuna
    except ImportError:
        fail("capacity.search=optuna needs Optuna: pip install 'replaysim[capacity]'")
    first = make_point({key: values[0] for key, values in axes.items()})
    check_cost(options, options.trials, run_requests(validated_points([first], options)[0]), "capacity.trials")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.NSGAIISampler(population_size=options.population, seed=seed)
    study = optuna.create_study(directions=["maximize", "maximize"], sampler=sampler)
    choices = {key: list(range(len(values))) for key, values in axes.items()}
    found: dict[tuple, Found] = {}
    bar = StepBar(options.trials)
    try:
        told = 0
        while told < options.trials:
            trials = [study.ask() for _ in range(min(options.population, options.trials - told))]
            combos = [tuple(t.suggest_categorical(key, index) for key, index in choices.items()) for t in trials]
            new = list(dict.fromkeys(c for c in combos if c not in found))
            points = [make_point({key: axes[key][i] for key, i in zip(axes, combo)}) for combo in new]
            configs = validated_points(points, options)
            brackets = bisect_all([(p.mapping, c) for p, c in zip(points, configs)], options, store)
            found.update({c: Found(p, cfg, b) for c, p, cfg, b in zip(new, points, configs, brackets)})
            for trial, combo in zip(trials, combos):
                per_gpu, per_user = rates_at_capacity(found[combo])
                if per_gpu is None or per_user is None:
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                else:
                    study.tell(trial, [per_gpu, per_user])
            told += len(trials)
            bar(told, options.trials)
    finally:
        bar.close()
    return list(found.values())


# ---------------------------------------------------------------- the command


def split_capacity(mapping: dict[str, Any]) -> tuple[CapacityOptions, RunnerOptions, dict[str, Any]]:
    """The capacity options, the runner options (batch axes, force) and the simcore mapping."""
    raw = mapping.pop("capacity", None) or {}
    options = parse_options(raw)
    runner, sim = split_options(mapping)
    if options.axis in runner.batch:
        raise ConfigError(f"sweep.batch.{options.axis}: the capacity axis is searched, not a batch axis")
    if "seed" in runner.batch and options.seeds > 1:
        raise ConfigError("sweep.batch.seed: with capacity.seeds > 1 the seeds are capacity.seeds")
    check_axis(sim, options, "the base config")
    check_axis_ends(sim, options)
    params.assign(sim, options.axis, options.lo)  # the search sets the axis; lo makes the mapping valid
    return options, runner, sim


def _search(
    sim: Mapping[str, Any],
    overrides: Sequence[str],
    runner: RunnerOptions,
    options: CapacityOptions,
    out_dir: Path,
    store: ProbeStore,
) -> tuple[list[Found], tuple[str, ...]]:
    """The configurations searched (grid or optuna) with their bisections, and the parameter keys."""
    if options.search == "grid":
        points = job_points(out_dir, out_dir.name, sim, overrides, runner)
        found = grid_search(points, options, store)
        keys = points[0].keys
    else:
        if not runner.batch:
            fail("capacity.search=optuna searches the batch axes: give sweep.batch.<key>=[values]")

        def make_point(combo: dict[str, Any]) -> Point:
            single = RunnerOptions(batch={key: [value] for key, value in combo.items()})
            return job_points(out_dir, out_dir.name, sim, overrides, single)[0]

        seed = load_config(sim).seed
        found = optuna_search(make_point, runner.batch, options, store, seed)
        keys = make_point({k: v[0] for k, v in runner.batch.items()}).keys
    return found, keys


def run_capacity(
    sim: Mapping[str, Any],
    overrides: Sequence[str],
    runner: RunnerOptions,
    options: CapacityOptions,
    out_dir: Path,
) -> pa.Table:
    """Search, write the result files into ``out_dir``, print the table; returns ``capacity.parquet``'s table.

    Bad input (a bad point, or a bad trace or timing found while simulating)
    exits 2 and removes the probe runs this invocation stored.
    """
    store = ProbeStore(out_dir, reuse=not runner.force)
    try:
        found, keys = _search(sim, overrides, runner, options, out_dir, store)
    except ConfigError as exc:
        store.discard_written()
        fail(exc)
    keys = tuple(k for k in keys if k != options.axis)
    capacity = capacity_table(found, options, keys)
    writers = [
        (PROBES_FILE, parquet_file(probes_table(found, options))),
        (PARETO_FILE, parquet_file(pareto_table(capacity))),
    ]
    if options.plots:
        writers += plot_writers(capacity, keys, options)
    writers.append((CAPACITY_FILE, parquet_file(capacity)))  # last: marks a finished search
    write_atomic(out_dir, writers)
    print(format_table(capacity, keys, options, out_dir), flush=True)
    if store.reused:
        print(f"{PROG}: {store.reused} probe runs reused from {out_dir / PROBES_DIR}", flush=True)
    return capacity


@hydra.main(version_base="1.3", config_path=cli.CONFIG_PATH, config_name=CONFIG_NAME)
def task(cfg: DictConfig) -> None:
    """Validate the composed config and run the capacity search."""
    hydra_cfg = HydraConfig.get()
    overrides = OmegaConf.to_container(hydra_cfg.overrides.task)
    try:
        mapping = OmegaConf.to_container(cfg, resolve=True)
        mapping.pop("hydra", None)
        options, runner, sim = split_capacity(mapping)
        load_config(sim)
    except OmegaConfBaseException as exc:
        fail(f"{exc.full_key}: {str(exc).splitlines()[0]}")
    except ValueError as exc:
        fail(exc)
    out = params.lookup(sim, "output.dir")
    out_dir = Path(to_absolute_path(out)) if out else Path(hydra_cfg.runtime.output_dir)
    _created_out[:] = missing_ancestors(out_dir)
    try:
        check_writable(out_dir)  # before the search, not after it
    except OSError as exc:
        fail_environment(exc, out_dir)
    run_capacity(sim, overrides, runner, options, out_dir)


def fail_environment(exc: OSError, out_dir: Path | None) -> NoReturn:
    """One line naming the path and the OS error, exit :data:`cli.EXIT_ENVIRONMENT` (74)."""
    path = exc.filename or out_dir or Path.cwd()
    reason = os.strerror(exc.errno) if exc.errno else " ".join(str(exc).split())
    remove_new_run_dir()
    _remove_created_out()
    print(f"{PROG}: error: cannot write results to {path}: {reason}", file=sys.stderr, flush=True)
    raise SystemExit(cli.EXIT_ENVIRONMENT)


def stopped(signum: int, frame: object = None) -> NoReturn:
    """Ctrl-C or SIGTERM: one line, exit 130 or 143 at once; the result files are written last, atomically."""
    name, code = ("SIGTERM", cli.EXIT_SIGTERM) if signum == signal.SIGTERM else ("SIGINT (Ctrl-C)", cli.EXIT_SIGINT)
    os.write(2, f"{PROG}: stopped by {name}; the result files were not written (probe runs in probes/ "
                "are kept for a rerun)\n".encode())
    os._exit(code)


def main() -> None:
    """Console-script entry point: ``--version``, check the overrides, run the Hydra app."""
    argv = sys.argv[1:]
    if "--version" in argv:
        print(f"{PROG} {cli.installed_version()}", flush=True)
        return
    if wants_help(argv):
        print_help(PROG)
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where the shell ignores it
        signal.signal(signal.SIGINT, stopped)
    signal.signal(signal.SIGTERM, stopped)
    check_overrides(argv)
    own_report = "HYDRA_FULL_ERROR" not in os.environ
    if own_report:
        os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        task()
    except CompactHydraException as exc:
        if not own_report:
            raise
        fail(str(exc).split("Config search path:")[0])
    except OSError as exc:  # the run directory's .hydra/ files, or the result files (a full disk)
        fail_environment(exc, claimed_dir())


if __name__ == "__main__":
    main()
