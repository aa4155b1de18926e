"""Request tables checked against a column schema: each class of bad column or file gives one ConfigError."""

from __future__ import annotations

import decimal
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from simcore.config import ConfigError
from simcore.workload.api import read_table_file, table_requests
from simcore.workload.traces import read_trace
from simcore.config import load_config


def parquet(tmp_path, **columns) -> str:
    path = tmp_path / "requests.parquet"
    pq.write_table(pa.table(columns), path)
    return str(path)


def read(path: str):
    return table_requests(read_table_file(path), path, None)


LENGTHS = {"input_tokens": pa.array([4, 5]), "output_tokens": pa.array([2, 3])}


@pytest.mark.parametrize("unit, factor", [("s", 1000.0), ("ms", 1.0), ("us", 1e-3), ("ns", 1e-6)])
def test_a_duration_send_ms_is_converted_with_its_unit(tmp_path, unit, factor):
    path = parquet(tmp_path, **LENGTHS, send_ms=pa.array([0, 3], type=pa.duration(unit)))
    assert read(path).send_ms.tolist() == [0.0, 3 * factor]


@pytest.mark.parametrize("unit, factor", [("s", 1000.0), ("ms", 1.0), ("us", 1e-3), ("ns", 1e-6)])
def test_a_timestamp_send_ms_is_taken_from_its_first_row_with_its_unit(tmp_path, unit, factor):
    start = 1_700_000_000 * {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[unit]
    path = parquet(tmp_path, **LENGTHS, send_ms=pa.array([start, start + 7], type=pa.timestamp(unit)))
    assert read(path).send_ms.tolist() == [0.0, 7 * factor]


@pytest.mark.parametrize("name, column, kind", [
    ("input_tokens", pa.array([True, True]), "bool"),
    ("input_tokens", pa.array([decimal.Decimal("4"), decimal.Decimal("5")]), "decimal128(1, 0)"),
    ("input_tokens", pa.array(["4", "5"]), "string"),
    ("output_tokens", pa.array([[1], [2]]), "list<element: int64>"),  # Parquet names list items "element"
    ("output_tokens", pa.array([{"a": 1}, {"a": 2}]), "struct<a: int64>"),
    ("send_ms", pa.array(["0", "1"]), "string"),
    ("request_id", pa.array([[1], [2]]), "list<element: int64>"),
])
def test_a_column_of_the_wrong_type_is_one_error_naming_it(tmp_path, name, column, kind):
    columns = {**LENGTHS, name: column}
    path = parquet(tmp_path, **columns)
    with pytest.raises(ConfigError) as info:
        read(path)
    assert str(info.value) == f"{path}: column {name} has type {kind}, expected " + {
        "request_id": "strings or integers", "send_ms": "numbers (ms), a timestamp or a duration",
    }.get(name, "integers (tokens)")


@pytest.mark.parametrize("column, shown", [
    (pa.array([4.0, 1e30]), "1e+30"),
    (pa.array([4.0, 2.0**63]), "9.223372036854776e+18"),
    (pa.array([4, 2**63], type=pa.uint64()), "9223372036854775808"),
])
def test_a_huge_length_is_rejected_with_its_row(tmp_path, column, shown):
    path = parquet(tmp_path, input_tokens=column, output_tokens=pa.array([2, 3]))
    with pytest.raises(ConfigError, match=rf"input_tokens must be an integer from 1 to {2**63 - 1} at row 1, got {re.escape(shown)}$"):
        read(path)


def csv_file(tmp_path, data: bytes) -> str:
    path = tmp_path / "requests.csv"
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("data, message", [
    (b"input_tokens,output_tokens\n4,2\n\xff\xfe,3\n", r":3: not UTF-8 text \(byte 0xff\)"),
    (b"input_tokens,output_tokens\n4,2\n5\x00,3\n", r":3: input_tokens must be a number, got '5\\x00'"),
    (b"input_tokens,output_tokens,output_tokens\n4,2,2\n", r":1: duplicate column\(s\) output_tokens in the header"),
    (b"input_tokens,output_tokens\n4,2\n1e30,3\n", rf":3: input_tokens must be an integer from 1 to {2**63 - 1}, got '1e30'"),
    (b"input_tokens,output_tokens\n4,2\n9223372036854775808,3\n", r":3: input_tokens must be an integer from 1 to"),
    # pyarrow's integer parser takes hex; the scan's decimal rule is the one both readers keep
    (b"input_tokens,output_tokens\n4,2\n0x10,3\n", r":3: input_tokens must be a number, got '0x10'"),
    # binary: pyarrow reads a header of bytes it cannot name
    (b"\xad\x01\x02\n\x03\n", r":1: not UTF-8 text \(byte 0xad\)"),
])
def test_a_bad_csv_names_its_file_and_line(tmp_path, data, message):
    path = csv_file(tmp_path, data)
    with pytest.raises(ConfigError, match=f"^{path}{message}"):
        read(path)


def test_an_azure_trace_with_a_duplicate_header_names_its_line(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text("\nTIMESTAMP,ContextTokens,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,4,4,3\n")
    cfg = load_config({"workload": {"source": "azure", "path": str(path), "num_requests": None}}).workload
    with pytest.raises(ConfigError, match=rf"^{path}:2: duplicate column\(s\) ContextTokens in the header$"):
        read_trace(cfg, send_times=False)


def test_a_damaged_parquet_file_is_one_line_naming_it(tmp_path):
    path = tmp_path / "requests.parquet"
    pq.write_table(pa.table({"input_tokens": [4, 5], "output_tokens": [1, 2]}), path)
    data = path.read_bytes()
    path.write_bytes(data[:-12] + bytes(8) + data[-4:])  # the footer's length zeroed: pyarrow's message has a newline
    with pytest.raises(ConfigError) as error:
        read(str(path))
    assert str(error.value).startswith(f"{path}: not a readable Parquet file") and "\n" not in str(error.value)


@pytest.mark.parametrize("n", [0, 1, 10, 11, 1001])
def test_default_ids_are_r0_to_rn_as_a_plain_string_array(n):
    """Built from its buffers: the same array as ``pa.array`` of the Python list."""
    from simcore.workload.table import default_ids

    ids = default_ids(n)
    ids.validate(full=True)
    assert ids.type == pa.string() and ids.null_count == 0
    assert ids.equals(pa.array([f"r{i}" for i in range(n)], type=pa.string()))
