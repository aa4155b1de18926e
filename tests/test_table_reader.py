"""The table workload's CSV reader: pyarrow for valid files, file:line errors for bad rows."""

from __future__ import annotations

import numpy as np
import pytest

from simcore.config import ConfigError
from simcore.workload import api as workload
from simcore.workload.api import read_table_file, table_requests

HEADER = "request_id,input_tokens,output_tokens,send_ms\n"


def write(tmp_path, text: str):
    path = tmp_path / "requests.csv"
    path.write_text(text)
    return path


def requests(path):
    return table_requests(read_table_file(str(path)), str(path), None)


def test_a_clean_file_is_read_by_pyarrow_without_the_scan(tmp_path, monkeypatch):
    path = write(tmp_path, HEADER + "a,5,2,0.5\n\nb,6,3,1.25\n")
    monkeypatch.setattr(workload, "_scan_csv", lambda file: pytest.fail("the line scan was used"))
    got = requests(path)
    assert got.request_id.to_pylist() == ["a", "b"]
    assert got.input_tokens.tolist() == [5, 6] and got.output_tokens.tolist() == [2, 3]
    assert got.send_ms.tolist() == [0.5, 1.25]


@pytest.mark.parametrize("body", [
    "a,5,2,0.5\nb,6,3,1.25\n",
    " a ,5,2,0.5\n\"b\",6,3,1.25\n",      # ids trimmed, quoted
    "a,5.0,2,0.5\nb,6,3e0,1.25\n",        # integral floats: the scan accepts them
    "a, 5,2 ,0.5\nb,6,3,1.25\n",          # spaces around numbers
])
def test_pyarrow_and_the_line_scan_read_the_same_requests(tmp_path, body):
    path = write(tmp_path, HEADER + body)
    fast, scanned = requests(path), table_requests(workload._scan_csv(path), str(path), None)
    assert fast.request_id.to_pylist() == scanned.request_id.to_pylist() == ["a", "b"]
    for name in ("input_tokens", "output_tokens", "send_ms"):
        assert np.array_equal(getattr(fast, name), getattr(scanned, name)), name


@pytest.mark.parametrize(("body", "expected"), [
    ("a,5,2,0.5\nb,6,3\n", "requests.csv:3: expected 4 fields"),
    ("a,5,2,0.5\n\nb,abc,3,1\n", "requests.csv:4: input_tokens must be a number, got 'abc'"),
    ("a,5,2,0.5\nb,,3,1\n", "requests.csv:3: input_tokens must be a number, got ''"),
    ("a,5,2,0.5\nb,NA,3,1\n", "requests.csv:3: input_tokens must be a number, got 'NA'"),
    ("a,5,2.5,0.5\n", "requests.csv:2: output_tokens must be an integer, got '2.5'"),
    ("a,5,2,0.5\nb,6,3,later\n", "requests.csv:3: send_ms must be a number, got 'later'"),
])
def test_bad_rows_are_reported_with_file_and_line(tmp_path, body, expected):
    path = write(tmp_path, HEADER + body)
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.")):
        requests(path)


def test_an_empty_file_names_line_1(tmp_path):
    with pytest.raises(ConfigError, match=r"requests\.csv:1: empty file"):
        requests(write(tmp_path, ""))
