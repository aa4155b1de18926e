"""Request tables (SPEC §1) and send instants (SPEC §2).

Mooncake and Azure trace files are read by :mod:`simcore.workload.traces`.

A workload is a struct of arrays, one per column, indexed by row = send
sequence number.  All randomness is drawn here, outside any kernel, from one
``numpy.random.Generator`` seeded with ``seed``, in a fixed order: input
lengths, then output lengths (or the shared_prefix cycle), then inter-send gaps.
"""

from __future__ import annotations

import csv
import io
import math
import mmap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from simcore.arrow_np import pc
from simcore.config import DEFAULTS, TRACE_SOURCES, ConfigError, LoadConfig, SimConfig, WorkloadConfig
from simcore.units import ms_array_to_ns
from simcore.values import integral
from simcore.workload.sessions import SESSION_COLUMNS, first_turns, session_requests, table_sessions
from simcore.workload.shared_prefix import shared_prefix_requests
from simcore.workload.settings import MAX_PRIORITY
from simcore.workload.table import RequestTable, default_ids, first_duplicate, utf8_text
from simcore.workload.traces import read_trace

REQUIRED_COLUMNS = ("request_id", "input_tokens", "output_tokens")


def synthetic_lengths(
    rng: np.random.Generator, dist: str, mean: int, std: float, range_ratio: float, n: int
) -> np.ndarray:
    """``n`` token lengths >= 1 of one column (SPEC §1).

    Parameters
    ----------
    rng : numpy.random.Generator
        The run's generator (draws advance it).
    dist : {"fixed", "uniform", "normal", "lognormal"}
        Length distribution.
    mean : int
        Mean length, tokens (uniform: the upper bound).
    std : float
        Standard deviation, tokens (normal, lognormal).
    range_ratio : float
        Uniform lower bound as a fraction of ``mean``.
    n : int
        Number of lengths.

    Returns
    -------
    ndarray(int64, ndim=1)
        Lengths, tokens.
    """
    if dist == "fixed":
        return np.full(n, mean, dtype=np.int64)
    if dist == "uniform":
        return rng.integers(math.floor(mean * range_ratio), mean, size=n, endpoint=True).astype(
            np.int64
        )
    if dist == "normal":
        draws = rng.normal(mean, std, size=n)
    else:  # lognormal with the given mean and std of the lengths themselves
        sigma2 = math.log1p((std / mean) ** 2)
        draws = rng.lognormal(math.log(mean) - sigma2 / 2, math.sqrt(sigma2), size=n)
    return np.maximum(np.rint(draws), 1).astype(np.int64)


def synthetic_requests(cfg: WorkloadConfig, rng: np.random.Generator) -> RequestTable:
    """Synthetic request table: input lengths, then output lengths, from ``rng``.

    Parameters
    ----------
    cfg : WorkloadConfig
        ``num_requests`` and the length distributions.
    rng : numpy.random.Generator

    Returns
    -------
    RequestTable
        Default ids, no send times.
    """
    n = cfg.num_requests
    inputs = synthetic_lengths(rng, cfg.input_dist, cfg.input_tokens, cfg.input_std, cfg.range_ratio, n)
    outputs = synthetic_lengths(
        rng, cfg.output_dist, cfg.output_tokens, cfg.output_std, cfg.range_ratio, n
    )
    return RequestTable(default_ids(n), inputs, outputs)


def read_table_file(path: str) -> pa.Table:
    """Read a CSV or Parquet request table; errors name the file (and line).

    Parameters
    ----------
    path : str
        A ``.csv``, ``.parquet`` or ``.pq`` file.

    Returns
    -------
    pyarrow.Table
        The raw columns (validated by :func:`table_requests`).
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"workload.path: no such file: {path}")
    suffix = file.suffix.lower()
    if suffix in (".parquet", ".pq"):
        try:
            return pq.read_table(file)
        except (pa.ArrowInvalid, OSError) as exc:
            raise ConfigError(f"{path}: not a readable Parquet file ({' '.join(str(exc).split())})") from None
    if suffix == ".csv":
        return _read_csv(file)
    raise ConfigError(f"workload.path: {path}: expected a .csv or .parquet file")


#: Column types of a CSV request table for pyarrow's reader (others are inferred, then refused).
CSV_TYPES = {
    "request_id": pa.string(), "input_tokens": pa.int64(), "output_tokens": pa.int64(), "send_ms": pa.float64(),
    "session_id": pa.string(), "turn": pa.int64(), "acceptance_length": pa.float64(),
    "priority": pa.int64(), "predicted_output_tokens": pa.int64(), "prompt_id": pa.int64(),
}
#: The spawn key of the synthetic priority draws under the run seed (the routers' are 1 and 2,
#: speculative acceptance 3): a stream of its own, so the other draws stay as they were.
PRIORITY_STREAM = 4


def _read_csv(file: Path) -> pa.Table:
    """pyarrow's CSV reader; a file it refuses is read again by :func:`_scan_csv`, which names the bad line.

    pyarrow reads a valid million-row table several times faster than the
    line-by-line reader but cannot say where a bad row is.  No value is taken
    as null (an empty or ``NA`` field fails the typed parse, and the scan
    reports it); header names and ids are whitespace-trimmed as the scan does.
    A duplicate header name is refused by either reader.
    """
    try:
        table = pa_csv.read_csv(
            file,
            convert_options=pa_csv.ConvertOptions(
                column_types=CSV_TYPES, null_values=[], strings_can_be_null=False, quoted_strings_can_be_null=False
            ),
        )
    except (pa.ArrowException, OSError):
        return _scan_csv(file)
    if _has_hex_prefix(file):  # pyarrow takes 0x10 as 16; the scan refuses it as a length
        return _scan_csv(file)
    try:
        names = table.column_names
    except UnicodeDecodeError:  # a header that is not UTF-8: the scan names its line
        return _scan_csv(file)
    if any(name != name.strip() for name in names) or len(set(names)) != len(names):
        return _scan_csv(file)
    if "request_id" in table.column_names:
        index = table.column_names.index("request_id")
        table = table.set_column(index, "request_id", pc.utf8_trim_whitespace(table.column(index)))
    return table


def _has_hex_prefix(file: Path) -> bool:
    """Whether ``0x`` or ``0X`` occurs anywhere in the file (searched in place, not read into memory)."""
    with open(file, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return data.find(b"0x") >= 0 or data.find(b"0X") >= 0


def _scan_csv(file: Path) -> pa.Table:
    """A small strict line-by-line CSV reader so that a bad row is reported with its line."""
    reader = csv.reader(io.StringIO(utf8_text(file.read_bytes(), str(file), "a CSV request table"), newline=""))
    try:
        header = [name.strip() for name in next(reader)]
    except StopIteration:
        raise ConfigError(f"{file}:1: empty file, expected a header row") from None
    except csv.Error as exc:
        raise ConfigError(f"{file}:{reader.line_num}: not a CSV header row ({exc})") from None
    twice = sorted({name for name in header if header.count(name) > 1})
    if twice:
        raise ConfigError(f"{file}:{reader.line_num}: duplicate column(s) {', '.join(twice)} in the header")
    columns: dict[str, list] = {name: [] for name in header}
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:  # a NUL byte, an unterminated quote
            raise ConfigError(f"{file}:{reader.line_num}: not a CSV row ({exc})") from None
        line = reader.line_num
        if not row:
            continue
        if len(row) != len(header):
            raise ConfigError(
                f"{file}:{line}: expected {len(header)} fields ({', '.join(header)}), got {len(row)}"
            )
        for name, value in zip(header, row):
            columns[name].append(_parse_field(file, line, name, value.strip()))
    return pa.table({name: pa.array(values, type=CSV_TYPES.get(name)) for name, values in columns.items()})


def _parse_field(file: Path, line: int, name: str, value: str):
    if name in ("request_id", "session_id"):
        return value
    try:
        number = float(value)
    except ValueError:
        raise ConfigError(f"{file}:{line}: {name} must be a number, got {value!r}") from None
    if name in ("input_tokens", "output_tokens"):
        length = integral(number)
        if length is None:
            raise ConfigError(f"{file}:{line}: {name} must be an integer, got {value!r}")
        if not 1 <= length <= MAX_LENGTH:
            raise ConfigError(f"{file}:{line}: {name} must be an integer from 1 to {MAX_LENGTH}, got {value!r}")
        return length
    if name == "turn":
        turn = integral(number)
        if turn is None or not 0 <= turn <= MAX_LENGTH:
            raise ConfigError(f"{file}:{line}: turn must be an integer from 0 to {MAX_LENGTH}, got {value!r}")
        return turn
    return number


#: The largest token length a table may give: lengths are int64 in the kernels.
MAX_LENGTH = 2**63 - 1
#: Milliseconds per unit of an Arrow timestamp or duration column.
MS_PER_UNIT = {"s": 1e3, "ms": 1.0, "us": 1e-3, "ns": 1e-6}


def _column_type_error(origin: str, name: str, kind: pa.DataType) -> ConfigError:
    expected = {"request_id": "strings or integers", "send_ms": "numbers (ms), a timestamp or a duration"}
    return ConfigError(
        f"{origin}: column {name} has type {kind}, expected {expected.get(name, 'integers (tokens)')}"
    )


def _lengths(column: pa.ChunkedArray, origin: str, name: str) -> np.ndarray:
    """A length column as int64: integers or integral floats from 1 to :data:`MAX_LENGTH`."""
    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):  # bool, decimal, string, ...
        raise _column_type_error(origin, name, kind)
    if column.null_count:
        raise ConfigError(f"{origin}: {name} has a missing value at {_row(origin, _first_null(column))}")
    values = column.to_numpy()
    if pa.types.is_floating(kind):
        bad = ~np.isfinite(values) | (values != np.round(values)) | (np.abs(values) >= 2.0**63)
    else:
        bad = values > MAX_LENGTH if values.dtype == np.uint64 else np.zeros(values.size, dtype=bool)
    if bad.any():
        i = int(np.argmax(bad))
        raise ConfigError(
            f"{origin}: {name} must be an integer from 1 to {MAX_LENGTH} at {_row(origin, i)}, got {values[i].item()!r}"
        )
    values = values.astype(np.int64)
    if (values < 1).any():
        i = int(np.argmax(values < 1))
        raise ConfigError(f"{origin}: {name} must be >= 1 at {_row(origin, i)}, got {values[i]}")
    return values


def _send_ms(column: pa.ChunkedArray, origin: str) -> np.ndarray:
    """``send_ms`` as float64 ms: numbers as they are, durations and timestamps with their unit.

    A timestamp column is an instant, so it is taken relative to its first
    row (the trace shift of SPEC §1 makes the first send t = 0 anyway).
    """
    kind = column.type
    if column.null_count:
        raise ConfigError(f"{origin}: send_ms has a missing value at {_row(origin, _first_null(column))}")
    if pa.types.is_timestamp(kind) or pa.types.is_duration(kind):
        raw = column.cast(pa.int64()).to_numpy()
        if pa.types.is_timestamp(kind) and raw.size:
            if int(raw.max()) - int(raw[0]) > MAX_LENGTH or int(raw.min()) - int(raw[0]) < -MAX_LENGTH:
                far = int(np.argmax(np.abs(raw.astype(np.float64) - float(raw[0]))))
                raise ConfigError(f"{origin}: send_ms ({kind}) at {_row(origin, far)} is further from the first "
                                  f"row's than int64 {kind.unit} hold")
            raw = raw - raw[0]
        return raw.astype(np.float64) * MS_PER_UNIT[kind.unit]
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        raise _column_type_error(origin, "send_ms", kind)
    return column.to_numpy().astype(np.float64)


def table_requests(table: pa.Table, origin: str, num_requests: int | None) -> RequestTable:
    """Validate a user request table (from a file or the Python API).

    Parameters
    ----------
    table : pyarrow.Table
        Columns ``input_tokens``, ``output_tokens`` (tokens, integers >= 1),
        optional ``request_id`` (unique) and ``send_ms`` (ms, finite, non-decreasing).
    origin : str
        Named in error messages (a path, or ``requests``).
    num_requests : int or None
        Keep at most this many rows from the top.

    Returns
    -------
    RequestTable

    Raises
    ------
    ConfigError
        A missing or unknown column, or a bad value (naming its line or row).
    """
    missing = [c for c in ("input_tokens", "output_tokens") if c not in table.column_names]
    if missing:
        raise ConfigError(
            f"{origin}: missing column(s) {', '.join(missing)}; a request table needs "
            "request_id (optional), input_tokens, output_tokens and, for load.type=trace, send_ms"
        )
    known = set(REQUIRED_COLUMNS) | {"send_ms", *SESSION_COLUMNS, "acceptance_length", "priority",
                                     "predicted_output_tokens", "prompt_id"}
    extra = [c for c in table.column_names if c not in known]
    if extra:
        raise ConfigError(f"{origin}: unknown column(s) {', '.join(extra)}")
    if num_requests is not None:  # at most this many rows, from the top
        table = table.slice(0, num_requests)
    n = table.num_rows
    if n == 0:
        raise ConfigError(f"{origin}: the request table has no rows")
    lengths = {name: _lengths(table.column(name), origin, name) for name in ("input_tokens", "output_tokens")}
    if "request_id" in table.column_names:
        column = table.column("request_id")
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)
                or pa.types.is_integer(column.type)):
            raise _column_type_error(origin, "request_id", column.type)
        ids = column.combine_chunks().cast(pa.string())
        if ids.null_count:
            raise ConfigError(f"{origin}: request_id has a missing value at {_row(origin, _first_null(ids))}")
        duplicate = first_duplicate(ids)
        if duplicate is not None:
            where, second = duplicate
            raise ConfigError(
                f"{origin}: duplicate request_id {ids[where].as_py()!r} at {_row(origin, second)} "
                f"(first at {_row(origin, where)})"
            )
    else:
        ids = default_ids(n)
    send_ms = None
    if "send_ms" in table.column_names:
        send_ms = _send_ms(table.column("send_ms"), origin)
        bad = ~np.isfinite(send_ms)
        if bad.any():
            i = int(np.argmax(bad))
            raise ConfigError(f"{origin}: send_ms must be finite at {_row(origin, i)}, got {send_ms[i]}")
        dec = np.flatnonzero(np.diff(send_ms) < 0)
        if dec.size:
            i = int(dec[0]) + 1
            raise ConfigError(
                f"{origin}: send_ms must be non-decreasing (rows are sent in order); "
                f"{_row(origin, i)} has {send_ms[i]} after {send_ms[i - 1]}"
            )
    sessions = {}
    if any(c in table.column_names for c in SESSION_COLUMNS):
        labels, session, turn = table_sessions(
            table, origin, lengths["input_tokens"], lengths["output_tokens"], lambda row: _row(origin, row)
        )
        sessions = dict(session_id=labels, session=session, turn=turn)
    if "acceptance_length" in table.column_names:
        sessions["acceptance_length"] = _acceptance_length(table.column("acceptance_length"), origin)
    if "priority" in table.column_names:
        sessions["priority"] = _priority(table.column("priority"), origin)
    if "predicted_output_tokens" in table.column_names:
        sessions["predicted_output_tokens"] = _lengths(table.column("predicted_output_tokens"), origin,
                                                       "predicted_output_tokens")
    if "prompt_id" in table.column_names:
        sessions["prompt_id"] = _prompt_id(table.column("prompt_id"), origin)
    return RequestTable(ids, lengths["input_tokens"], lengths["output_tokens"], send_ms, **sessions)


def _prompt_id(column: pa.ChunkedArray, origin: str) -> np.ndarray:
    """Each row's prompt id: integers (or integral floats) in [0, 2**63), no missing value."""
    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        raise ConfigError(f"{origin}: column prompt_id has type {kind}, expected integers")
    if column.null_count:
        raise ConfigError(f"{origin}: prompt_id has a missing value at {_row(origin, _first_null(column))}")
    values = column.to_numpy()
    with np.errstate(invalid="ignore"):
        if pa.types.is_floating(kind):
            bad = ~np.isfinite(values) | (values != np.round(values)) | (values < 0) | (values >= 2.0**63)
        elif values.dtype == np.uint64:
            bad = values >= np.uint64(2**63)
        else:
            bad = values < 0
    if bad.any():
        i = int(np.argmax(bad))
        raise ConfigError(f"{origin}: prompt_id must be an integer >= 0 at {_row(origin, i)}, got {values[i].item()!r}")
    return np.ascontiguousarray(values.astype(np.int64))


def _acceptance_length(column: pa.ChunkedArray, origin: str) -> np.ndarray:
    """Each row's mean acceptance length (float64; a missing value: NaN, the pool's rates); finite, >= 1
    (the upper bound, 1 + the pool's proposals, is checked with the configuration)."""
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise ConfigError(f"{origin}: column acceptance_length has type {column.type}, expected numbers (tokens)")
    values = column.cast(pa.float64()).fill_null(np.nan).to_numpy()
    bad = np.isinf(values) | (values < 1)
    if bad.any():
        i = int(np.argmax(bad))
        raise ConfigError(f"{origin}: acceptance_length must be a number >= 1 at {_row(origin, i)}, got {float(values[i])!r}")
    return np.ascontiguousarray(values, dtype=np.float64)


def _priority(column: pa.ChunkedArray, origin: str) -> np.ndarray:
    """Each row's priority: integers (or integral floats) within +-:data:`MAX_PRIORITY`, no missing value."""
    kind = column.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        raise ConfigError(f"{origin}: column priority has type {kind}, expected integers")
    if column.null_count:
        raise ConfigError(f"{origin}: priority has a missing value at {_row(origin, _first_null(column))}")
    values = column.to_numpy()
    with np.errstate(invalid="ignore"):
        if pa.types.is_floating(kind):
            bad = ~np.isfinite(values) | (values != np.round(values)) | (np.abs(values) > MAX_PRIORITY)
        elif values.dtype == np.uint64:
            bad = values > MAX_PRIORITY
        else:
            bad = np.abs(values.astype(np.int64)) > MAX_PRIORITY
    if bad.any():
        i = int(np.argmax(bad))
        raise ConfigError(f"{origin}: priority must be an integer from -{MAX_PRIORITY} to {MAX_PRIORITY} at "
                          f"{_row(origin, i)}, got {values[i].item()!r}")
    return np.ascontiguousarray(values.astype(np.int64))


def _first_null(column) -> int:
    mask = pc.is_null(column)
    return int(pc.index(mask, True).as_py())


def _row(origin: str, index: int) -> str:
    """Where row ``index`` is: a CSV file line (after the header) or a row number."""
    if origin.lower().endswith(".csv"):
        return f"line {index + 2}"
    return f"row {index}"


def build_requests(cfg: SimConfig, requests: pa.Table | None, rng: np.random.Generator) -> RequestTable:
    """The run's request table (:func:`_build_requests`); a think time between turns needs sessions.

    Parameters
    ----------
    cfg : SimConfig
    requests : pyarrow.Table or None
    rng : numpy.random.Generator

    Returns
    -------
    RequestTable
    """
    table = _build_requests(cfg, requests, rng)
    classes = cfg.workload.priority_classes
    if classes is not None:
        if table.priority is not None:
            raise ConfigError("workload.priority_classes: the request table has a priority column already")
        table = replace(table, priority=priority_draws(classes, cfg.workload.priority_weights, len(table), cfg.seed))
    think = cfg.resolved["workload"]["sessions"]["think_time_ms"]
    if table.session is None and think != DEFAULTS["workload"]["sessions"]["think_time_ms"]:
        raise ConfigError(
            f"workload.sessions.think_time_ms has no effect here: the workload has no sessions "
            f"(session_id and turn columns), got {think!r}"
        )
    return table


def _build_requests(cfg: SimConfig, requests: pa.Table | None, rng: np.random.Generator) -> RequestTable:
    """The run's request table: the API override, the configured file, recurring prompts or synthetic.

    Parameters
    ----------
    cfg : SimConfig
    requests : pyarrow.Table or None
        A user table replacing the configured workload.
    rng : numpy.random.Generator
        Used for synthetic lengths and the shared_prefix cycle.

    Returns
    -------
    RequestTable
    """
    if requests is not None:  # replaces the whole configured workload
        table = table_requests(requests, "requests", None)
        _check_workload_unset(cfg, table)
        return table
    if cfg.workload.source == "table":
        table = read_table_file(cfg.workload.path)
        return table_requests(table, cfg.workload.path, cfg.workload.num_requests)
    if cfg.workload.source in TRACE_SOURCES:
        return read_trace(cfg.workload, send_times=cfg.load.type == "trace")
    if cfg.workload.source == "shared_prefix":
        return shared_prefix_requests(cfg.workload.shared_prefix, cfg.workload.num_requests, rng)
    if cfg.workload.source == "sessions":
        return session_requests(cfg.workload.sessions, rng)
    return synthetic_requests(cfg.workload, rng)


def priority_draws(classes: tuple[int, ...], weights: tuple[float, ...] | None, n: int, seed: int) -> np.ndarray:
    """Each request's priority class, drawn i.i.d. with the given weights from its own stream.

    Parameters
    ----------
    classes : tuple of int
        The priority values (``workload.priority_classes``).
    weights : tuple of float or None
        Their relative frequencies (None: equal).
    n : int
        Requests.
    seed : int
        The run seed; the draws use its stream :data:`PRIORITY_STREAM`.

    Returns
    -------
    ndarray(int64, ndim=1)
    """
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(PRIORITY_STREAM,)))
    p = None if weights is None else np.asarray(weights, dtype=np.float64) / math.fsum(weights)
    picks = rng.choice(len(classes), size=n, p=p)
    return np.ascontiguousarray(np.asarray(classes, dtype=np.int64)[picks])


def _check_workload_unset(cfg: SimConfig, table: RequestTable) -> None:
    """A workload key set beside a ``requests`` table is an error: the table is the whole workload.

    ``num_requests`` may state the table's row count (callers size the
    configured bounds check with it), and a table of sessions takes
    ``sessions.think_time_ms``; any other value, and any other workload
    key that differs from its default, would be silently ignored.
    """
    num_rows = len(table)
    for key, default in DEFAULTS["workload"].items():
        value = cfg.resolved["workload"][key]
        if key == "num_requests" and value == num_rows:
            continue
        if key == "sessions" and table.session is not None:
            value = {**value, "think_time_ms": default["think_time_ms"]}
        if value != default:
            raise ConfigError(
                f"workload.{key} has no effect with a requests table passed to simcore.run "
                f"(its {num_rows} rows are the whole workload), got {value!r}"
            )


def send_instants_ns(load: LoadConfig, requests: RequestTable, rng: np.random.Generator) -> np.ndarray | None:
    """Open-loop send instants, ns (SPEC §2); None for a closed loop.

    Parameters
    ----------
    load : LoadConfig
    requests : RequestTable
        ``send_ms`` is read for ``load.type=trace``.
    rng : numpy.random.Generator
        Used for poisson and gamma gaps.

    Returns
    -------
    ndarray(int64, ndim=1) or None
        One send instant per request, ns, non-decreasing, the first at 0.
    """
    if load.type == "closed_loop":
        return None
    # With sessions the load sends first turns only (later ones follow receipts): -1 elsewhere.
    senders = None if requests.session is None else first_turns(requests)
    n = len(requests) if senders is None else senders.shape[0]
    if load.type == "trace":
        if requests.send_ms is None:
            raise ConfigError(
                "load.type=trace needs send times: a Mooncake or Azure trace "
                "(workload.source=mooncake or azure) or a request table (workload.source=table) "
                "with a send_ms column"
            )
        given = requests.send_ms if senders is None else requests.send_ms[senders]
        with np.errstate(over="ignore"):  # an overflow is the inf that ms_array_to_ns reports in one line
            send_ms = (given - given[0]) / load.speedup
    elif load.type == "constant_rate":
        send_ms = np.arange(n, dtype=np.float64) * 1000 / load.request_rate
    else:
        mean_gap_ms = 1000 / load.request_rate
        if load.type == "poisson":
            gaps = rng.exponential(mean_gap_ms, size=n - 1)
        else:  # gamma: shape = burstiness, mean gap kept at 1000 / rate
            gaps = rng.gamma(load.burstiness, mean_gap_ms / load.burstiness, size=n - 1)
        send_ms = np.concatenate(([0.0], np.cumsum(gaps)))
    if senders is None:
        return ms_array_to_ns(send_ms)
    send_ns = np.full(len(requests), -1, dtype=np.int64)
    send_ns[senders] = ms_array_to_ns(send_ms)
    return send_ns
