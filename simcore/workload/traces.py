"""Mooncake and Azure LLM inference trace files as request tables (SPEC §1).

``workload.source=mooncake`` reads Mooncake JSONL (one JSON object a line:
``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids``; aliases
``created_time``, ``input_tokens``, ``output_tokens``; optional ``request_id`` and
``prompt_id``, an integer >= 0 read by ``speculative.draws=prompt``).
``workload.source=azure`` reads the Azure LLM inference CSV (``TIMESTAMP`` wall
clock, ``ContextTokens``, ``GeneratedTokens``).  Both read ``workload.path``.

The bulk of a file is parsed by pyarrow (``pyarrow.json`` with an explicit
schema, ``pyarrow.csv`` as strings) and every row is checked with vectorised
NumPy / Arrow compute.  Only when pyarrow cannot read the file as a whole (a
value of the wrong JSON type, a line that is not JSON, a CSV row with a wrong
field count) is it scanned line by line in Python, which yields the same
columns and marks those rows bad.  Either way a bad row is named by its file
line (1-based, counting blank lines and the CSV header).

Rows that cannot be replayed (a missing field, a length that is not an integer
>= 1, more input than ``hash_ids`` cover at ``workload.block_size``, an
unparsable or non-finite timestamp, a timestamp before an earlier row's, a
field given both under its name and under its alias) are a
:class:`~simcore.config.ConfigError` ``"<path>:<line>: <field> ..."``, or are
dropped with ``workload.drop_invalid=true`` and counted.  Timestamps are read
only when they are used (``load.type=trace`` or ``workload.time_window_ms``).

Rows are selected in file order: the valid rows, then those within
``time_window_ms`` of the first one, then the first ``max_requests`` and
``num_requests`` of those.  Only the rows the selection reaches are checked:
up to the last kept row when a count bound is reached, else up to the first
valid row outside the window, else the whole file.  So a slice of a large trace
does not fail on a bad row it never reaches (as with ``workload.source=table``),
and ``num_dropped`` counts the bad rows among those reached.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json

from simcore.arrow_np import pc
from simcore.errors import ConfigError
from simcore.workload.settings import WorkloadConfig
from simcore.units import MAX_INSTANT_MS, NS_PER_MS, ms_to_ns
from simcore.values import integral
from simcore.workload.table import RequestTable, default_ids, first_duplicate, utf8_text

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

#: Mooncake fields read as lengths and times: canonical name -> alias.
MOONCAKE_ALIASES = {
    "input_length": "input_tokens",
    "output_length": "output_tokens",
    "timestamp": "created_time",
}
#: Azure LLM inference trace columns.
AZURE_TIME, AZURE_INPUT, AZURE_OUTPUT = "TIMESTAMP", "ContextTokens", "GeneratedTokens"

_DROP_HINT = "(workload.drop_invalid=true drops such rows)"
_NUMBER_TEXT = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


class _Fallback(Exception):
    """pyarrow read the file, but not one row per non-blank line: scan it instead."""


class _Checks:
    """Row checks in order of preference: the first failing check names a bad row."""

    def __init__(self, n: int, problems: dict[int, str]):
        """Start with the rows the reader already found unparsable (``problems``)."""
        self.n = n
        self.items: list[tuple[np.ndarray, Callable[[int], str]]] = []
        rows = np.zeros(n, dtype=bool)
        rows[list(problems)] = True
        self.add(rows, problems.__getitem__)

    def add(self, mask: Any, describe: Callable[[int], str]) -> None:
        mask = np.asarray(mask, dtype=bool)
        if mask.any():
            self.items.append((mask, describe))

    def bad(self) -> np.ndarray:
        out = np.zeros(self.n, dtype=bool)
        for mask, _ in self.items:
            out |= mask
        return out

    def describe(self, row: int) -> str:
        return next(describe(row) for mask, describe in self.items if mask[row])


@dataclass
class _Trace:
    """Parsed, checked rows of one trace file (one entry per non-blank data row)."""

    path: str
    line: np.ndarray  # int64, 1-based file line of each row
    checks: _Checks
    input_tokens: np.ndarray  # int64 (meaningless on bad rows)
    output_tokens: np.ndarray
    time: np.ndarray | None  # float64 ms (mooncake) or int64 ns (azure); None if not read
    time_ns: bool  # time is int64 ns (exact wall-clock differences), not float64 ms
    show_time: Callable[[int], str] | None
    time_name: str | None
    hash_ids: pa.ListArray | None = None
    request_id: pa.Array | None = None
    prompt_id: np.ndarray | None = None  # int64 (Mooncake's optional prompt_id)


def read_trace(cfg: WorkloadConfig, send_times: bool) -> RequestTable:
    """The request table of a Mooncake or Azure trace file (``cfg.path``).

    Parameters
    ----------
    cfg : WorkloadConfig
        ``source`` (``mooncake`` or ``azure``), ``path``, ``block_size``,
        ``drop_invalid``, ``max_requests``, ``time_window_ms``, ``num_requests``.
    send_times : bool
        ``load.type=trace``: keep the timestamps as ``send_ms`` (ms, shifted so
        the first replayed row is at 0; ``load.speedup`` divides them later).

    Returns
    -------
    RequestTable
        ``request_id`` (the trace's ``request_id`` or ``"r{index}"`` over the
        replayed rows), ``input_tokens``, ``output_tokens`` (int64, >= 1),
        ``send_ms`` (float64 ms or None), ``hash_ids`` (mooncake:
        ``list<int64>`` per row; azure: None) and ``num_dropped``.

    Raises
    ------
    ConfigError
        A missing file, a missing column, a bad row (``"<path>:<line>: ..."``,
        unless ``drop_invalid``), duplicate request ids, or no row to replay.
    """
    file = Path(cfg.path)
    if not file.is_file():
        raise ConfigError(f"workload.path: no such file: {cfg.path}")
    data = file.read_bytes()
    with_times = send_times or cfg.time_window_ms is not None
    if cfg.source == "mooncake":
        trace = _read_mooncake(cfg.path, data, with_times, cfg.block_size)
    else:
        trace = _read_azure(cfg.path, data, with_times)
    return _select(trace, cfg, send_times)


# ---------------------------------------------------------------- selection


def _select(trace: _Trace, cfg: WorkloadConfig, send_times: bool) -> RequestTable:
    path, n, checks = trace.path, trace.checks.n, trace.checks
    if n == 0:
        raise ConfigError(f"{path}: the trace has no rows")
    if trace.time is not None:
        _check_order(trace)
    bad = checks.bad()
    valid = np.flatnonzero(~bad)
    in_window = valid.size
    if in_window and cfg.time_window_ms is not None:  # valid times are non-decreasing
        since_first = trace.time[valid] - trace.time[valid[0]]
        window = ms_to_ns(cfg.time_window_ms) if trace.time_ns else cfg.time_window_ms
        in_window = int(np.count_nonzero(since_first < window))
    bounds = [b for b in (cfg.max_requests, cfg.num_requests) if b is not None]
    count = min([in_window, *bounds])
    kept = valid[:count]
    # The rows checked: up to the last one the selection could still have taken.
    if bounds and count == min(bounds):
        end = int(kept[-1])  # full: nothing after the last kept row is replayed
    elif in_window < valid.size:
        end = int(valid[in_window]) - 1  # up to the first valid row outside the window
    else:
        end = n - 1
    dropped = np.flatnonzero(bad[: end + 1])
    if dropped.size and not cfg.drop_invalid:
        row = int(dropped[0])
        raise ConfigError(f"{path}:{trace.line[row]}: {checks.describe(row)} {_DROP_HINT}")
    if count == 0:
        raise ConfigError(f"{path}: no replayable rows ({dropped.size} of {n} rows are invalid)")
    take = pa.array(kept, type=pa.int64())
    if trace.request_id is not None:
        request_id = trace.request_id.take(take)
        _check_unique(path, request_id, trace.line[kept])
    else:
        request_id = default_ids(count)
    send_ms = None
    if send_times:
        since_first = trace.time[kept] - trace.time[kept[0]]  # exact for int64 ns
        send_ms = since_first / NS_PER_MS if trace.time_ns else since_first
    return RequestTable(
        request_id=request_id,
        input_tokens=trace.input_tokens[kept],
        output_tokens=trace.output_tokens[kept],
        send_ms=send_ms,
        hash_ids=None if trace.hash_ids is None else trace.hash_ids.take(take),
        num_dropped=int(dropped.size),
        prompt_id=None if trace.prompt_id is None else np.ascontiguousarray(trace.prompt_id[kept]),
    )


def _check_order(trace: _Trace) -> None:
    """A row whose timestamp is before an earlier valid row's is bad."""
    checks = trace.checks
    rows = np.flatnonzero(~checks.bad())
    if rows.size < 2:
        return
    times = trace.time[rows]
    running_max = np.maximum.accumulate(times)
    # position (in rows) of the row holding the running maximum
    holder = np.maximum.accumulate(np.where(times == running_max, np.arange(rows.size), 0))
    late = np.flatnonzero(times[1:] < running_max[:-1]) + 1
    if not late.size:
        return
    mask = np.zeros(checks.n, dtype=bool)
    mask[rows[late]] = True
    earlier = dict(zip(rows[late].tolist(), rows[holder[late - 1]].tolist()))

    def describe(row: int) -> str:
        before = earlier[row]
        return (
            f"{trace.time_name} {trace.show_time(row)} is before {trace.show_time(before)} at line "
            f"{trace.line[before]} (trace rows must be in time order)"
        )

    checks.add(mask, describe)


def _check_unique(path: str, ids: pa.Array, lines: np.ndarray) -> None:
    duplicate = first_duplicate(ids)
    if duplicate is not None:
        first, second = duplicate
        raise ConfigError(
            f"{path}:{lines[second]}: duplicate request_id {ids[first].as_py()!r} (first at line {lines[first]})"
        )


def _nonblank_lines(lines: list[bytes], blank: Callable[[bytes], bool]) -> list[int]:
    return [number for number, text in enumerate(lines, 1) if not blank(text)]


def _line_spans(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Start and end offsets of the lines of ``data`` split at ``\\n`` (as ``data.split(b"\\n")``)."""
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == ord("\n"))
    return np.concatenate(([0], ends + 1)), np.append(ends, len(data))


def _csv_row_lines(data: bytes, starts: np.ndarray, stops: np.ndarray) -> list[int]:
    """1-based numbers of the lines that hold more than carriage returns (vectorised: a trace has many)."""
    held = stops > starts
    # Only a line that starts with a carriage return can hold nothing else: those few are checked one by one.
    first = np.frombuffer(data, dtype=np.uint8)[starts[held]] == ord("\r")
    for line in np.flatnonzero(held)[first]:
        held[line] = bool(data[starts[line] : stops[line]].rstrip(b"\r"))
    return (np.flatnonzero(held) + 1).tolist()


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------- Mooncake


def _mooncake_schema(with_times: bool) -> pa.Schema:
    fields = [
        ("input_length", pa.int64()),
        ("input_tokens", pa.int64()),
        ("output_length", pa.int64()),
        ("output_tokens", pa.int64()),
        ("hash_ids", pa.list_(pa.int64())),
        ("request_id", pa.string()),
        ("prompt_id", pa.int64()),
    ]
    if with_times:
        fields += [("timestamp", pa.float64()), ("created_time", pa.float64())]
    return pa.schema(fields)


def _read_mooncake(path: str, data: bytes, with_times: bool, block_size: int) -> _Trace:
    schema = _mooncake_schema(with_times)
    lines = data.split(b"\n")
    numbers = _nonblank_lines(lines, lambda text: not text.strip())
    longest = max(map(len, lines), default=0)
    problems: dict[int, str] = {}
    try:
        table = pa_json.read_json(
            io.BytesIO(data),
            read_options=pa_json.ReadOptions(block_size=max(1 << 20, 2 * longest + 2)),
            parse_options=pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
        if table.num_rows != len(numbers):
            raise _Fallback
        table = table.select(schema.names)
    except (pa.ArrowException, _Fallback):
        table, numbers, problems = _scan_mooncake(lines, schema)
    return _mooncake_rows(path, table, np.array(numbers, dtype=np.int64), problems, with_times, block_size)


def _scan_mooncake(lines: list[bytes], schema: pa.Schema) -> tuple[pa.Table, list[int], dict[int, str]]:
    """Line-by-line JSON parse: the same columns as pyarrow, bad values as row problems."""
    columns: dict[str, list] = {name: [] for name in schema.names}
    numbers: list[int] = []
    problems: dict[int, str] = {}
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        row = len(numbers)
        numbers.append(number)
        problem = None
        record: Any = {}
        try:
            record = json.loads(raw.decode("utf-8").removeprefix("\ufeff"))
        except UnicodeDecodeError:
            problem = "the row is not UTF-8 text"
        except json.JSONDecodeError as exc:
            problem = f"the row is not valid JSON ({exc.msg} at column {exc.colno})"
        if problem is None and not isinstance(record, dict):
            problem = f"the row must be a JSON object, got {type(record).__name__}"
        if problem is not None:
            record = {}
        for field in schema:
            value, error = _json_value(field.name, field.type, record.get(field.name))
            columns[field.name].append(value)
            problem = problem or error
        if problem is not None:
            problems[row] = problem
    table = pa.table({f.name: pa.array(columns[f.name], type=f.type) for f in schema})
    return table, numbers, problems


def _json_value(name: str, kind: pa.DataType, value: Any) -> tuple[Any, str | None]:
    """One JSON value converted to its column type, or (None, why it cannot be)."""
    if value is None:
        return None, None
    if kind == pa.int64():  # a length; an integral float (12.0) is accepted
        length = integral(value)
        if length is not None and _INT64_MIN <= length <= _INT64_MAX:
            return length, None
        return None, f"{name} must be an integer >= {0 if name == 'prompt_id' else 1}, got {_show(value)}"
    if kind == pa.float64():  # a timestamp, ms
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value), None
            except OverflowError:
                pass
        return None, f"{name} must be a number of ms, got {_show(value)}"
    if kind == pa.string():  # request_id; an integer id is kept as its decimal text
        if isinstance(value, str) or type(value) is int:
            return str(value), None
        return None, f"{name} must be a string, got {_show(value)}"
    if isinstance(value, list) and all(
        item is None or (type(item) is int and _INT64_MIN <= item <= _INT64_MAX) for item in value
    ):
        return value, None
    return None, f"{name} must be a list of integers, got {_show(value)}"


def _mooncake_rows(
    path: str, table: pa.Table, line: np.ndarray, problems: dict[int, str], with_times: bool, block_size: int
) -> _Trace:
    n = table.num_rows
    checks = _Checks(n, problems)

    def column(name: str) -> pa.Array:
        return table.column(name).combine_chunks()

    values: dict[str, pa.Array] = {}
    names: dict[str, np.ndarray] = {}  # per row: True where the alias was the one given
    for canonical, alias in MOONCAKE_ALIASES.items():
        if canonical == "timestamp" and not with_times:
            continue
        main, other = column(canonical), column(alias)
        checks.add(
            pc.and_(main.is_valid(), other.is_valid()).to_numpy(zero_copy_only=False),
            lambda row, c=canonical, a=alias: f"{c} and its alias {a} are both given",
        )
        checks.add(
            pc.and_(main.is_null(), other.is_null()).to_numpy(zero_copy_only=False),
            lambda row, c=canonical, a=alias: f"{c} is missing (or its alias {a})",
        )
        values[canonical] = pc.coalesce(main, other)
        names[canonical] = pc.and_(main.is_null(), other.is_valid()).to_numpy(zero_copy_only=False)

    def used(canonical: str, row: int) -> str:
        return MOONCAKE_ALIASES[canonical] if names[canonical][row] else canonical

    lengths = {}
    for canonical in ("input_length", "output_length"):
        present = values[canonical].is_valid().to_numpy(zero_copy_only=False)
        tokens = values[canonical].fill_null(1).to_numpy(zero_copy_only=False).astype(np.int64)
        checks.add(
            present & (tokens < 1),
            lambda row, c=canonical, t=tokens: f"{used(c, row)} must be an integer >= 1, got {t[row]}",
        )
        lengths[canonical] = tokens

    hash_ids = column("hash_ids")
    has_hashes = hash_ids.is_valid().to_numpy(zero_copy_only=False)
    checks.add(~has_hashes, lambda row: "hash_ids is missing")
    null_items = np.zeros(n, dtype=bool)
    parents = pc.list_parent_indices(hash_ids).to_numpy()
    null_items[parents[pc.is_null(pc.list_flatten(hash_ids)).to_numpy(zero_copy_only=False)]] = True
    checks.add(null_items, lambda row: "hash_ids must be a list of integers, got a null item")
    blocks = pc.list_value_length(hash_ids).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    inputs = lengths["input_length"]
    has_input = values["input_length"].is_valid().to_numpy(zero_copy_only=False)
    needed = -(-inputs // block_size)  # ceil, no overflow
    checks.add(
        has_hashes & has_input & (inputs >= 1) & (needed > blocks),
        lambda row: (
            f"{used('input_length', row)} {inputs[row]} is more than hash_ids cover: {blocks[row]} "
            f"blocks x {block_size} tokens (workload.block_size) = {blocks[row] * block_size}"
        ),
    )

    request_id = column("request_id")
    if request_id.null_count < n:
        checks.add(
            request_id.is_null().to_numpy(zero_copy_only=False),
            lambda row: "request_id is missing (other rows of the trace have one)",
        )
    else:
        request_id = None

    prompt_id = column("prompt_id")
    if prompt_id.null_count < n:
        checks.add(
            prompt_id.is_null().to_numpy(zero_copy_only=False),
            lambda row: "prompt_id is missing (other rows of the trace have one)",
        )
        prompt_id = prompt_id.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        checks.add(prompt_id < 0, lambda row, v=prompt_id: f"prompt_id must be an integer >= 0, got {v[row]}")
    else:
        prompt_id = None

    time = show_time = None
    if with_times:
        present = values["timestamp"].is_valid().to_numpy(zero_copy_only=False)
        time = values["timestamp"].fill_null(0.0).to_numpy(zero_copy_only=False).astype(np.float64)
        checks.add(  # beyond the int64 ns clock no send instant can be derived from it (nan fails too)
            present & ~(np.abs(time) < MAX_INSTANT_MS),
            lambda row: f"{used('timestamp', row)} must be a finite number of ms within +-{MAX_INSTANT_MS:.4g} "
                        f"(int64 ns), got {show_time(row)}",
        )

        def show_time(row: int) -> str:
            value = time[row]
            return f"{int(value)}" if value.is_integer() and abs(value) < 1e15 else f"{float(value)!r}"

    return _Trace(
        path=path,
        line=line,
        checks=checks,
        input_tokens=lengths["input_length"],
        output_tokens=lengths["output_length"],
        time=time,
        time_ns=False,
        show_time=show_time,
        time_name="timestamp",
        hash_ids=hash_ids,
        request_id=request_id,
        prompt_id=prompt_id,
    )


# ---------------------------------------------------------------- Azure


def _read_azure(path: str, data: bytes, with_times: bool) -> _Trace:
    utf8_text(data, path, "an Azure LLM inference trace (CSV)")  # in any column, read or not
    starts, stops = _line_spans(data)
    numbers = _csv_row_lines(data, starts, stops)
    if not numbers:
        raise ConfigError(f"{path}:1: empty file, expected a header row ({AZURE_TIME},{AZURE_INPUT},{AZURE_OUTPUT})")
    first = numbers[0] - 1
    header_text = data[starts[first] : stops[first]].decode("utf-8", errors="replace").removeprefix("\ufeff")
    header = [name.strip() for name in next(csv.reader([header_text]))]
    twice = sorted({name for name in header if header.count(name) > 1})
    if twice:
        raise ConfigError(f"{path}:{numbers[0]}: duplicate column(s) {', '.join(twice)} in the header")
    needed = [AZURE_INPUT, AZURE_OUTPUT] + ([AZURE_TIME] if with_times else [])
    missing = [name for name in needed if name not in header]
    if missing:
        raise ConfigError(
            f"{path}:{numbers[0]}: missing column(s) {', '.join(missing)}; an Azure LLM inference "
            f"trace has {AZURE_TIME}, {AZURE_INPUT}, {AZURE_OUTPUT}"
        )
    problems: dict[int, str] = {}
    try:
        table = pa_csv.read_csv(
            io.BytesIO(data),
            convert_options=pa_csv.ConvertOptions(
                include_columns=needed,
                column_types={name: pa.string() for name in needed},
                null_values=[""],
                strings_can_be_null=True,
            ),
        )
        numbers = numbers[1:]
        if table.num_rows != len(numbers):
            raise _Fallback
    except (pa.ArrowException, _Fallback):
        table, numbers, problems = _scan_csv(data, needed)
    return _azure_rows(path, table, np.array(numbers, dtype=np.int64), problems, with_times)


def _scan_csv(data: bytes, needed: list[str]) -> tuple[pa.Table, list[int], dict[int, str]]:
    """Line-by-line CSV parse: string columns, rows with a wrong field count as problems."""
    reader = csv.reader(io.StringIO(data.decode("utf-8", errors="replace").removeprefix("\ufeff"), newline=""))
    header: list[str] | None = None
    columns: dict[str, list] = {name: [] for name in needed}
    numbers: list[int] = []
    problems: dict[int, str] = {}
    start = 1
    for fields in reader:
        number, start = start, reader.line_num + 1
        if not fields:
            continue
        if header is None:
            header = [name.strip() for name in fields]
            continue
        row = len(numbers)
        numbers.append(number)
        if len(fields) != len(header):
            problems[row] = f"the row has {len(fields)} fields, the header has {len(header)} ({', '.join(header)})"
            fields = [""] * len(header)
        for name in needed:
            columns[name].append(fields[header.index(name)] or None)
    table = pa.table({name: pa.array(columns[name], type=pa.string()) for name in needed})
    return table, numbers, problems


def _trimmed(column: pa.Array) -> pa.Array:
    """Whitespace-trimmed strings; empty -> null (missing)."""
    text = pc.utf8_trim_whitespace(column)
    return pc.if_else(pc.equal(text, ""), pa.scalar(None, pa.string()), text)


def _parse_count(text: str) -> int | None:
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    if _NUMBER_TEXT.fullmatch(text):
        return integral(float(text))
    return None


def _counts(text: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Integers of a string column (0 where missing) and where a present value is not one."""
    try:
        values = pc.cast(text, pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        return values.astype(np.int64), np.zeros(len(text), dtype=bool)
    except pa.ArrowException:
        parsed = [None if s is None else _parse_count(s) for s in text.to_pylist()]
        present = text.is_valid().to_numpy(zero_copy_only=False)
        unparsed = np.array([p is None for p in parsed], dtype=bool) & present
        values = np.array([0 if p is None or not _INT64_MIN <= p <= _INT64_MAX else p for p in parsed], dtype=np.int64)
        return values, unparsed


def _instants_ns(text: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Wall-clock strings to int64 ns (exact: Arrow parses up to 9 fractional digits)."""
    ns_type = pa.timestamp("ns")
    try:
        values = pc.cast(text, ns_type).cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        return values.astype(np.int64), np.zeros(len(text), dtype=bool)
    except pa.ArrowException:
        values = np.zeros(len(text), dtype=np.int64)
        unparsed = np.zeros(len(text), dtype=bool)
        for row, item in enumerate(text.to_pylist()):
            if item is None:
                continue
            try:
                values[row] = pc.cast(pa.array([item]), ns_type).cast(pa.int64())[0].as_py()
            except pa.ArrowException:
                unparsed[row] = True
        return values, unparsed


def _azure_rows(
    path: str, table: pa.Table, line: np.ndarray, problems: dict[int, str], with_times: bool
) -> _Trace:
    n = table.num_rows
    checks = _Checks(n, problems)
    text = {name: _trimmed(table.column(name).combine_chunks()) for name in table.column_names}
    for name in table.column_names:
        checks.add(text[name].is_null().to_numpy(zero_copy_only=False), lambda row, c=name: f"{c} is missing")
    lengths = {}
    for name in (AZURE_INPUT, AZURE_OUTPUT):
        values, unparsed = _counts(text[name])
        present = text[name].is_valid().to_numpy(zero_copy_only=False)
        checks.add(
            unparsed | (present & (values < 1)),
            lambda row, c=name: f"{c} must be an integer >= 1, got {text[c][row].as_py()!r}",
        )
        lengths[name] = values
    time = show_time = None
    if with_times:
        time, unparsed = _instants_ns(text[AZURE_TIME])
        checks.add(
            unparsed,
            lambda row: (
                f"{AZURE_TIME} must be a date and time like '2023-11-16 18:15:46.6805900', "
                f"got {_show(text[AZURE_TIME][row].as_py())}"
            ),
        )

        def show_time(row: int) -> str:
            return repr(text[AZURE_TIME][row].as_py())

    return _Trace(
        path=path,
        line=line,
        checks=checks,
        input_tokens=lengths[AZURE_INPUT],
        output_tokens=lengths[AZURE_OUTPUT],
        time=time,
        time_ns=True,
        show_time=show_time,
        time_name=AZURE_TIME,
    )
