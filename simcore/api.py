"""The Python API: ``simcore.run(config, requests=None) -> Result``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from simcore import bounds
from simcore.config import GENERATED_SOURCES, ConfigError, InstantOverflow, SimConfig, load_config
from simcore.engine.api import prepare, run_prepared, simulate_engine
from simcore.engine.batch import batch_key, run_prepared_batch
from simcore.metrics.api import (
    RequestColumns,
    passes_table,
    rejection_reasons,
    requests_table,
    saturation,
    summarize,
    tokens_table,
)
from simcore.metrics.scaling import failure_summary, scaling_summary, scaling_table
from simcore.workload.api import build_requests, send_instants_ns

__version__ = "0.1.0"


@dataclass(frozen=True)
class Result:
    """The results of one run.

    Attributes
    ----------
    requests : pyarrow.Table
        One row per request (``simcore.schema.REQUESTS_SCHEMA``).
    summary : dict
        Summary metrics (SPEC §10), ``vllm bench serve`` key names.
    passes : pyarrow.Table or None
        One row per rank per pass (``output.passes=true``).
    tokens : pyarrow.Table or None
        One row per emitted token (``output.tokens=true``).
    config : SimConfig
        The validated configuration.
    scaling : pyarrow.Table or None
        Autoscaling: one row per scaling event (``simcore.metrics.scaling``); None without.
    """

    requests: pa.Table
    summary: dict
    passes: pa.Table | None
    tokens: pa.Table | None
    config: SimConfig
    scaling: pa.Table | None = None


def run(
    config: Mapping[str, Any] | SimConfig | None = None,
    requests: pa.Table | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> Result:
    """Simulate one configuration.

    Parameters
    ----------
    config : mapping or SimConfig, optional
        The nested configuration (the shape of the Hydra config; omitted keys
        take their defaults).  Invalid values raise ``simcore.ConfigError``.
    requests : pyarrow.Table, optional
        A request table (``request_id``, ``input_tokens``, ``output_tokens``
        and, for ``load.type=trace``, ``send_ms``) that replaces the configured
        workload.
    progress : callable, optional
        ``progress(done, total)``: requests finished or rejected out of the
        run's requests, called about every 0.2 s while the engine runs and
        once at its end (a bounded run repeated for its ITL sketch reports
        from 0 again).

    Returns
    -------
    Result
    """
    if progress is not None and not callable(progress):
        raise ConfigError(f"progress must be callable as progress(done, total), got {progress!r}")
    cfg, table, send_ns = _inputs(config, requests)
    engine = simulate_engine(cfg, table, send_ns, record_passes=cfg.output.passes, on_progress=progress)
    return _result(cfg, table, engine)


def run_batch(
    configs: Sequence[Mapping[str, Any] | SimConfig | None], requests: pa.Table | None = None
) -> list[Result]:
    """Simulate many configurations; those of one shape share one parallel kernel call.

    Configurations whose requests count, output lengths, workers and ranks,
    detokenization mode and prefix-cache sizes agree (and that record no pass
    log) run together in ``simcore.engine.batch`` (``prange`` over
    configurations, ``NUMBA_NUM_THREADS`` threads); the rest run one by one as
    in :func:`run`.  Every result equals what :func:`run` gives for its
    configuration.

    Parameters
    ----------
    configs : sequence of (mapping or SimConfig)
        The configurations, as for :func:`run`.
    requests : pyarrow.Table, optional
        A request table that replaces every configuration's workload.

    Returns
    -------
    list of Result
        In the order of ``configs``.
    """
    if isinstance(configs, (str, bytes, Mapping)) or not isinstance(configs, Sequence):
        kind = "None" if configs is None else f"{type(configs).__module__}.{type(configs).__qualname__}".removeprefix(
            "builtins.")
        raise ConfigError(f"configs must be a list of configurations (mappings or SimConfig), got {kind}")
    inputs = [_inputs(config, requests) for config in configs]
    preps = [
        prepare(cfg, table, send_ns, record_passes=cfg.output.passes) for cfg, table, send_ns in inputs
    ]
    groups: dict[tuple, list[int]] = {}
    for index, prep in enumerate(preps):
        groups.setdefault(batch_key(prep) if not prep.record_passes else ("single", index), []).append(index)
    engines: list = [None] * len(preps)
    for members in groups.values():
        if len(members) == 1:
            engines[members[0]] = run_prepared(preps[members[0]])
            continue
        for index, engine in zip(members, run_prepared_batch([preps[i] for i in members])):
            engines[index] = engine
    return [_result(cfg, table, engine) for (cfg, table, _), engine in zip(inputs, engines)]


def _inputs(config: Mapping[str, Any] | SimConfig | None, requests: pa.Table | None):
    """The validated config, its request table and open-loop send instants (None: closed loop).

    Every bad argument is a ConfigError; the run's worst-case instants and
    buffer sizes are checked here, before the engine allocates anything.
    """
    if requests is not None and not isinstance(requests, pa.Table):
        raise ConfigError(
            f"requests must be a pyarrow.Table (pyarrow.table(...) of request_id, input_tokens, "
            f"output_tokens[, send_ms]), got {type(requests).__module__}.{type(requests).__qualname__}"
        )
    if config is not None and not isinstance(config, (Mapping, SimConfig)):
        raise ConfigError(f"config must be a mapping or a SimConfig, got {type(config).__qualname__}")
    cfg = config if isinstance(config, SimConfig) else load_config(config)
    rng = np.random.default_rng(cfg.seed)
    table = build_requests(cfg, requests, rng)
    if requests is not None:
        where = "requests"
    else:
        where = "workload" if cfg.workload.source in GENERATED_SOURCES else cfg.workload.path
    try:
        send_ns = send_instants_ns(cfg.load, table, rng)
    except InstantOverflow as exc:  # a send instant beyond int64 ns: name what spread them
        if cfg.load.type == "trace":
            raise ConfigError(f"{where}: send_ms at load.speedup={cfg.load.speedup!r} gives send instants "
                              f"beyond int64 ns: {exc}") from None
        raise ConfigError(f"load.request_rate={cfg.load.request_rate!r} gives send instants beyond int64 ns: "
                          f"{exc}") from None
    size = bounds.table_size(cfg, table.input_tokens, table.output_tokens, send_ns, where)
    bounds.check_run(cfg, size, bounds.model_pass_ms(cfg))
    return cfg, table, send_ns


def _result(cfg: SimConfig, table, engine) -> Result:
    cols = RequestColumns(engine)
    summary = summarize(cols, table.input_tokens, cfg.metrics, table.turn)
    summary["dropped_requests"] = table.num_dropped  # trace rows dropped (workload.drop_invalid)
    lost = None if engine.failures is None else (engine.failures > 0) & (engine.reject_ns >= 0)
    summary.update(rejection_reasons(cols, table.input_tokens, cfg.engine, lost))
    summary.update(saturation(cols))
    aic_timings = [t for i, t in enumerate(cfg.pool_timing or (cfg.timing,))
                   if t.type == "aic" and not any(t is u for u in (cfg.pool_timing or (cfg.timing,))[:i])]
    if aic_timings:  # an operator priced beyond the database: which, and how (docs/timing.md)
        from simcore.timing import aic

        notes = [note for t in aic_timings for note in aic.extrapolation_notes(t)]
        if notes:
            summary["timing_warnings"] = notes
    scaling = None
    pools = cfg.engine.pools
    if cfg.engine.scaled:
        gpus = [pool.attention_dp * (cfg.timing_of(i).tp or 1) for i, pool in enumerate(pools)
                for _ in range(pool.replicas)]
        summary.update(scaling_summary(engine.scale_log, cols, cfg.metrics.goodput, len(gpus),
                                       gpus[0] if len(pools) == 1 else gpus, engine.cap_ns))
    if engine.failures is not None:
        fail = cfg.engine.failures
        summary.update(failure_summary(engine.scale_log, engine.failures, engine.reject_ns,
                                       fail.on_failure == "retry", fail.max_retries))
    if engine.scale_log is not None:
        scaling = scaling_table(engine.scale_log)
    requests = requests_table(
        table.request_id, table.input_tokens, table.output_tokens, cols, table.session_id, table.turn,
        table.priority,
    )
    if engine.failures is not None:  # attempts lost to worker failures (docs/failures.md)
        requests = requests.append_column("failures", pa.array(engine.failures, type=pa.int64()))
    return Result(
        requests=requests,
        summary=summary,
        passes=passes_table(engine) if cfg.output.passes else None,
        tokens=tokens_table(table.request_id, engine) if cfg.output.tokens else None,
        config=cfg,
        scaling=scaling,
    )
