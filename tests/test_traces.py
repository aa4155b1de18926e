"""Mooncake and Azure trace sources (SPEC §1-2, §11): excerpts of the real traces,
send times, slicing, every bad-row class, drop_invalid, end-to-end runs and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import simcore
import simcore.workload.traces as traces
from simcore.config import ConfigError, load_config
from simcore.workload.api import build_requests, send_instants_ns

DATA = Path(__file__).resolve().parents[1] / "runners" / "samples"
MOONCAKE = DATA / "mooncake_conversation_300.jsonl"
AZURE = DATA / "azure_conv_300.csv"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
FULL_MOONCAKE = SHARED / "mooncake" / "conversation_trace.jsonl"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def workload(source: str, path, **workload_keys) -> dict:
    return {"source": source, "path": str(path), "num_requests": None, **workload_keys}


def load(source: str, path, load_type: str = "trace", **workload_keys):
    """The RequestTable that simcore.run would replay."""
    cfg = load_config({"workload": workload(source, path, **workload_keys), "load": {"type": load_type}})
    return build_requests(cfg, None, np.random.default_rng(0))


def mooncake_row(timestamp=0, input_length=5, output_length=2, hash_ids=(1,), **extra) -> str:
    row = {"timestamp": timestamp, "input_length": input_length, "output_length": output_length}
    row["hash_ids"] = list(hash_ids) if hash_ids is not None else None
    row.update(extra)
    return json.dumps({k: v for k, v in row.items() if v is not ...})


def write(tmp_path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


# ---------------------------------------------------------------- the excerpts


def test_mooncake_excerpt_loads():
    table = load("mooncake", MOONCAKE)
    assert len(table) == 300 and table.num_dropped == 0
    # first rows, read off the file by eye
    assert table.input_tokens[:3].tolist() == [6758, 7322, 7236]
    assert table.output_tokens[:3].tolist() == [500, 490, 794]
    assert table.hash_ids.type == pa.list_(pa.int64())
    assert table.hash_ids[0].as_py() == list(range(14))  # ceil(6758 / 512) = 14 blocks
    assert table.hash_ids[1].as_py() == [0, *range(14, 28)]
    assert table.request_id.to_pylist()[:2] == ["r0", "r1"] and table.request_id[299].as_py() == "r299"
    # timestamps are ms from the trace start; the file starts at 0
    assert table.send_ms[:11].tolist() == [0.0] * 10 + [3000.0]
    assert table.send_ms[-1] == 102_000.0 and table.input_tokens[-1] == 979 and table.output_tokens[-1] == 140
    assert table.input_tokens.sum() == 4_269_971 and table.output_tokens.sum() == 113_079
    # every row against a plain json parse
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    assert table.input_tokens.tolist() == [r["input_length"] for r in rows]
    assert table.output_tokens.tolist() == [r["output_length"] for r in rows]
    assert table.send_ms.tolist() == [float(r["timestamp"]) for r in rows]
    assert table.hash_ids.to_pylist() == [r["hash_ids"] for r in rows]


def test_azure_excerpt_loads():
    table = load("azure", AZURE)
    assert len(table) == 300 and table.num_dropped == 0 and table.hash_ids is None
    assert table.input_tokens[:3].tolist() == [374, 396, 879]
    assert table.output_tokens[:3].tolist() == [44, 109, 55]
    assert table.input_tokens[-1] == 212 and table.output_tokens[-1] == 183
    # 18:15:50.9951690 - 18:15:46.6805900 = 4.3145790 s; 18:15:51.2224670 - 18:15:46.6805900 = 4.5418770 s
    assert table.send_ms[:3].tolist() == [0.0, 4314.579, 4541.877]
    # 18:17:10.7096920 - 18:15:46.6805900 = 84.0291020 s
    assert table.send_ms[-1] == 84_029.102
    assert np.all(np.diff(table.send_ms) >= 0)
    ns = send_instants_ns(load_config({"load": {"type": "trace"}}).load, table, np.random.default_rng(0))
    assert ns[:3].tolist() == [0, 4_314_579_000, 4_541_877_000] and ns[-1] == 84_029_102_000


def test_azure_timestamps_keep_100ns_precision(tmp_path):
    path = write(tmp_path, "t.csv", [
        AZURE_HEADER.strip(),
        "2023-11-16 23:59:59.9999999,10,2",
        "2023-11-17 00:00:00.0000000,10,2",  # 100 ns later, across midnight
        "2023-11-17 00:00:00.0000001,10,2",
        "2023-11-17 01:00:00,10,2",  # no fractional part
    ])
    table = load("azure", path)
    ns = send_instants_ns(load_config({"load": {"type": "trace"}}).load, table, np.random.default_rng(0))
    assert ns.tolist() == [0, 100, 200, 3_600_000_000_100]


@pytest.mark.parametrize("speedup", [2.0, 0.5, 3.0])
def test_speedup_divides_send_times(speedup):
    for source, path in (("mooncake", MOONCAKE), ("azure", AZURE)):
        table = load(source, path)
        cfg = load_config({"workload": workload(source, path), "load": {"type": "trace", "speedup": speedup}})
        ns = send_instants_ns(cfg.load, table, np.random.default_rng(0))
        assert ns.tolist() == np.rint(table.send_ms / speedup * 1e6).astype(np.int64).tolist()
    assert ns[1] == round(4_314_579_000 / speedup)


def test_other_loads_use_only_the_lengths(tmp_path):
    closed = load("azure", AZURE, load_type="closed_loop")
    assert closed.send_ms is None and len(closed) == 300
    assert closed.input_tokens.tolist() == load("azure", AZURE).input_tokens.tolist()
    poisson = load_config({"workload": workload("mooncake", MOONCAKE), "load": {"type": "poisson", "request_rate": 5}})
    assert build_requests(poisson, None, np.random.default_rng(0)).send_ms is None
    # timestamps are not read then: a bad one is no error
    path = write(tmp_path, "t.jsonl", [mooncake_row(0), mooncake_row("soon"), mooncake_row(timestamp=...)])
    assert len(load("mooncake", path, load_type="closed_loop")) == 3
    with pytest.raises(ConfigError, match=r"t\.jsonl:2: timestamp must be a number of ms, got 'soon'"):
        load("mooncake", path)


# ---------------------------------------------------------------- slicing


def test_max_requests_and_num_requests_bound_the_rows():
    assert len(load("mooncake", MOONCAKE, max_requests=7)) == 7
    assert len(load("mooncake", MOONCAKE, max_requests=7, num_requests=5)) == 5
    assert len(load("mooncake", MOONCAKE, max_requests=5, num_requests=7)) == 5
    assert len(load("azure", AZURE, max_requests=1000)) == 300
    # num_requests keeps its default (640) unless set: an upper bound, as for workload.source=table
    cfg = load_config({"workload": {"source": "azure", "path": str(AZURE), "num_requests": 100}})
    assert len(build_requests(cfg, None, np.random.default_rng(0))) == 100
    cfg = load_config({"workload": {"source": "azure", "path": str(AZURE)}})
    assert cfg.workload.num_requests == 640 and len(build_requests(cfg, None, np.random.default_rng(0))) == 300
    first = load("mooncake", MOONCAKE, max_requests=7)
    assert first.input_tokens.tolist() == load("mooncake", MOONCAKE).input_tokens[:7].tolist()
    assert first.request_id.to_pylist() == [f"r{i}" for i in range(7)]


@pytest.mark.parametrize(
    ("window_ms", "rows"),
    [(3000, 10), (3000.5, 26), (5999, 26), (6000, 29), (10**9, 300)],  # ten rows at 0, sixteen at 3000, three at 5999
)
def test_time_window_mooncake(window_ms, rows):
    table = load("mooncake", MOONCAKE, time_window_ms=window_ms)
    assert len(table) == rows
    assert np.all(table.send_ms < window_ms)


def test_time_window_azure_is_exact_in_ns():
    # the second row is 4,314,579,000 ns after the first: the window excludes it at exactly that length
    # (the window is converted to ns once, like every duration: 4314.5790004 ms is 4,314,579,000 ns)
    assert len(load("azure", AZURE, time_window_ms=4314.579)) == 1
    assert len(load("azure", AZURE, time_window_ms=4314.5790004)) == 1
    assert len(load("azure", AZURE, time_window_ms=4314.579001)) == 2
    # with a closed loop the window still slices (by timestamp), send times are not kept
    closed = load("azure", AZURE, load_type="closed_loop", time_window_ms=4541.8771)
    assert len(closed) == 3 and closed.send_ms is None


def test_window_counts_from_the_first_replayed_row(tmp_path):
    path = write(tmp_path, "t.jsonl", [
        mooncake_row(1000, input_length=0),  # dropped: the window starts at the next row
        mooncake_row(2000),
        mooncake_row(2500),
        mooncake_row(3000),
    ])
    table = load("mooncake", path, time_window_ms=1000, drop_invalid=True)
    assert table.send_ms.tolist() == [0.0, 500.0] and table.num_dropped == 1


# ---------------------------------------------------------------- bad rows

GOOD = mooncake_row(0)

MOONCAKE_BAD = {
    "missing-input": ('{"timestamp": 1, "output_length": 2, "hash_ids": [1]}', "input_length is missing"),
    "missing-output": ('{"timestamp": 1, "input_length": 5, "hash_ids": [1]}', "output_length is missing"),
    "missing-hash-ids": ('{"timestamp": 1, "input_length": 5, "output_length": 2}', "hash_ids is missing"),
    "missing-timestamp": ('{"input_length": 5, "output_length": 2, "hash_ids": [1]}', "timestamp is missing"),
    "null-length": (mooncake_row(1, input_length=None), "input_length is missing"),
    "zero-input": (mooncake_row(1, input_length=0), "input_length must be an integer >= 1, got 0"),
    "negative-output": (mooncake_row(1, output_length=-3), "output_length must be an integer >= 1, got -3"),
    "fractional-input": (mooncake_row(1, input_length=5.5), "input_length must be an integer >= 1, got 5.5"),
    "string-output": (mooncake_row(1, output_length="7"), "output_length must be an integer >= 1, got '7'"),
    "boolean-input": (mooncake_row(1, input_length=True), "input_length must be an integer >= 1, got True"),
    "over-hash-cover": (
        mooncake_row(1, input_length=1025, hash_ids=[1, 2]),
        "input_length 1025 is more than hash_ids cover: 2 blocks x 512 tokens",
    ),
    "empty-hash-ids": (mooncake_row(1, hash_ids=[]), "input_length 5 is more than hash_ids cover: 0 blocks"),
    "bad-hash-id": (mooncake_row(1, hash_ids=[1, "x"]), "hash_ids must be a list of integers"),
    "null-hash-id": (mooncake_row(1, hash_ids=[1, None]), "hash_ids must be a list of integers, got a null item"),
    "string-timestamp": (mooncake_row("12:00"), "timestamp must be a number of ms, got '12:00'"),
    "nan-timestamp": ('{"timestamp": NaN, "input_length": 5, "output_length": 2, "hash_ids": [1]}',
                      "timestamp must be a finite number of ms within +-4.612e+12 (int64 ns), got nan"),
    # beyond the int64 ns clock: the row itself is bad (not the next one "before" it)
    "huge-timestamp": (mooncake_row(1e300), "timestamp must be a finite number of ms within +-4.612e+12 (int64 ns), "
                                            "got 1e+300"),
    "decreasing-timestamp": (mooncake_row(-1), "timestamp -1 is before 0 at line 1"),
    "alias-and-name": (mooncake_row(1, input_tokens=5), "input_length and its alias input_tokens are both given"),
    "created-time-and-timestamp": (mooncake_row(1, created_time=1), "timestamp and its alias created_time are both given"),
    "alias-zero": ('{"timestamp": 1, "input_tokens": 0, "output_length": 2, "hash_ids": [1]}',
                   "input_tokens must be an integer >= 1, got 0"),
    "not-json": ('{"timestamp": 1, "input_length": 5', "the row is not valid JSON"),
    "not-an-object": ("[1, 5, 2]", "the row must be a JSON object, got list"),
}


@pytest.mark.parametrize(("row", "message"), MOONCAKE_BAD.values(), ids=MOONCAKE_BAD.keys())
def test_mooncake_bad_rows_name_file_and_line(tmp_path, row, message):
    # a blank line before the bad row: line numbers count it
    path = write(tmp_path, "trace.jsonl", [GOOD, "", row, GOOD.replace('"timestamp": 0', '"timestamp": 5')])
    with pytest.raises(ConfigError) as error:
        load("mooncake", path)
    assert str(error.value).startswith(f"{path}:3: {message}"), str(error.value)
    assert "workload.drop_invalid=true" in str(error.value)
    table = load("mooncake", path, drop_invalid=True)
    assert len(table) == 2 and table.num_dropped == 1
    assert table.send_ms.tolist() == [0.0, 5.0]


AZURE_BAD = {
    "missing-input": ("2023-11-16 18:15:47.0000000,,44", "ContextTokens is missing"),
    "blank-output": ("2023-11-16 18:15:47.0000000,374,  ", "GeneratedTokens is missing"),
    "missing-timestamp": (",374,44", "TIMESTAMP is missing"),
    "zero-input": ("2023-11-16 18:15:47.0000000,0,44", "ContextTokens must be an integer >= 1, got '0'"),
    "negative-output": ("2023-11-16 18:15:47.0000000,374,-1", "GeneratedTokens must be an integer >= 1, got '-1'"),
    "fractional-input": ("2023-11-16 18:15:47.0000000,37.5,44", "ContextTokens must be an integer >= 1, got '37.5'"),
    "text-output": ("2023-11-16 18:15:47.0000000,374,many", "GeneratedTokens must be an integer >= 1, got 'many'"),
    "bad-timestamp": ("2023-11-16 25:15:47.0000000,374,44", "TIMESTAMP must be a date and time"),
    "text-timestamp": ("yesterday,374,44", "TIMESTAMP must be a date and time like"),
    "decreasing-timestamp": (
        "2023-11-16 18:15:46.6805899,374,44",
        "TIMESTAMP '2023-11-16 18:15:46.6805899' is before '2023-11-16 18:15:46.6805900' at line 2",
    ),
    "short-row": ("2023-11-16 18:15:47.0000000,374", "the row has 2 fields, the header has 3"),
}


@pytest.mark.parametrize(("row", "message"), AZURE_BAD.values(), ids=AZURE_BAD.keys())
def test_azure_bad_rows_name_file_and_line(tmp_path, row, message):
    path = write(tmp_path, "trace.csv", [
        AZURE_HEADER.strip(), "2023-11-16 18:15:46.6805900,374,44", "", row, "2023-11-16 18:15:48.0000000,10,2"
    ])
    with pytest.raises(ConfigError) as error:
        load("azure", path)
    assert str(error.value).startswith(f"{path}:4: {message}"), str(error.value)
    table = load("azure", path, drop_invalid=True)
    assert len(table) == 2 and table.num_dropped == 1
    assert table.send_ms.tolist() == [0.0, 1319.41]


def test_azure_bytes_that_are_not_utf8_name_their_line_in_any_column(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_bytes(AZURE_HEADER.encode() + b"2023-11-16 18:15:46.68\xff,374,44\n")
    # the timestamps are not read without load.type=trace; the file is still not text
    with pytest.raises(ConfigError, match=rf"^{path}:2: not UTF-8 text \(byte 0xff\)"):
        load("azure", path, load_type="closed_loop")


def test_file_level_errors(tmp_path):
    with pytest.raises(ConfigError, match="workload.path: no such file"):
        load("mooncake", tmp_path / "absent.jsonl")
    with pytest.raises(ConfigError, match=r"empty\.jsonl: the trace has no rows"):
        load("mooncake", write(tmp_path, "empty.jsonl", []))
    with pytest.raises(ConfigError, match=r"h\.csv:1: missing column\(s\) ContextTokens"):
        load("azure", write(tmp_path, "h.csv", ["TIMESTAMP,Context,GeneratedTokens", "2023-11-16 18:15:46,1,1"]))
    # TIMESTAMP is only needed when timestamps are used
    path = write(tmp_path, "lengths.csv", ["ContextTokens,GeneratedTokens", "5,2"])
    assert len(load("azure", path, load_type="closed_loop")) == 1
    with pytest.raises(ConfigError, match=r"lengths\.csv:1: missing column\(s\) TIMESTAMP"):
        load("azure", path)
    path = write(tmp_path, "all-bad.jsonl", [mooncake_row(0, input_length=0), mooncake_row(1, output_length=0)])
    with pytest.raises(ConfigError, match=r"all-bad\.jsonl: no replayable rows \(2 of 2 rows are invalid\)"):
        load("mooncake", path, drop_invalid=True)


def test_drop_invalid_counts_the_dropped_rows(tmp_path):
    path = write(tmp_path, "t.jsonl", [
        mooncake_row(0, input_length=600, hash_ids=[1, 2]),
        mooncake_row(1, input_length=0),
        "not json",
        mooncake_row(3, input_length=7, hash_ids=[3]),
        mooncake_row(2, input_length=8),  # before the previous valid row's 3
        mooncake_row(4, input_length=513, hash_ids=[4]),  # one token more than one block covers
        mooncake_row(5, input_length=9, hash_ids=[5, 6]),
    ])
    table = load("mooncake", path, drop_invalid=True)
    assert table.num_dropped == 4
    assert table.input_tokens.tolist() == [600, 7, 9]
    assert table.send_ms.tolist() == [0.0, 3.0, 5.0]
    assert table.hash_ids.to_pylist() == [[1, 2], [3], [5, 6]]
    assert table.request_id.to_pylist() == ["r0", "r1", "r2"]  # over the replayed rows
    # a larger block size makes row 6 replayable
    assert load("mooncake", path, drop_invalid=True, block_size=1024).num_dropped == 3
    # only rows the slice reaches are checked or counted
    assert load("mooncake", path, drop_invalid=True, max_requests=1).num_dropped == 0
    assert load("mooncake", path, drop_invalid=True, max_requests=2).num_dropped == 2
    assert len(load("mooncake", path, max_requests=1)) == 1
    with pytest.raises(ConfigError, match=r"t\.jsonl:2: input_length"):
        load("mooncake", path, max_requests=2)
    # the window ends before row 6 (5 - 0 >= 5); the bad rows before the first row outside it count
    assert load("mooncake", path, drop_invalid=True, time_window_ms=5).num_dropped == 4
    assert load("mooncake", path, drop_invalid=True, time_window_ms=3).num_dropped == 2


def test_aliases_and_request_ids(tmp_path):
    path = write(tmp_path, "a.jsonl", [
        '{"created_time": 10, "input_tokens": 5, "output_tokens": 2, "hash_ids": [1], "request_id": "a"}',
        '{"timestamp": 12.5, "input_length": 6, "output_tokens": 3, "hash_ids": [1], "request_id": 7, "session_id": "s"}',
        '{"timestamp": 13, "input_length": null, "input_tokens": 4, "output_length": 1, "hash_ids": [2], "request_id": "c"}',
    ])
    table = load("mooncake", path)
    assert table.input_tokens.tolist() == [5, 6, 4] and table.output_tokens.tolist() == [2, 3, 1]
    assert table.send_ms.tolist() == [0.0, 2.5, 3.0]
    assert table.request_id.to_pylist() == ["a", "7", "c"]
    duplicate = write(tmp_path, "d.jsonl", [mooncake_row(0, request_id="x"), mooncake_row(1, request_id="y"),
                                            mooncake_row(2, request_id="x")])
    with pytest.raises(ConfigError, match=r"d\.jsonl:3: duplicate request_id 'x' \(first at line 1\)"):
        load("mooncake", duplicate)
    partial = write(tmp_path, "p.jsonl", [mooncake_row(0, request_id="x"), mooncake_row(1)])
    with pytest.raises(ConfigError, match=r"p\.jsonl:2: request_id is missing"):
        load("mooncake", partial)


def test_mooncake_prompt_ids(tmp_path):
    """The optional prompt_id (speculative draws=prompt): kept per row, on every row or none, >= 0."""
    path = write(tmp_path, "a.jsonl", [mooncake_row(0, prompt_id=3), mooncake_row(1, prompt_id=0),
                                       mooncake_row(2, prompt_id=3)])
    assert load("mooncake", path).prompt_id.tolist() == [3, 0, 3]
    assert load("mooncake", write(tmp_path, "n.jsonl", [mooncake_row(0)])).prompt_id is None
    for name, rows, message in (
        ("p.jsonl", [mooncake_row(0, prompt_id=1), mooncake_row(1)], r"p\.jsonl:2: prompt_id is missing"),
        ("m.jsonl", [mooncake_row(0, prompt_id=-1)], r"m\.jsonl:1: prompt_id must be an integer >= 0, got -1"),
        ("s.jsonl", [mooncake_row(0, prompt_id="x")], r"s\.jsonl:1: prompt_id must be an integer >= 0, got 'x'"),
    ):
        with pytest.raises(ConfigError, match=message):
            load("mooncake", write(tmp_path, name, rows))


@pytest.mark.parametrize(("source", "path"), [("mooncake", MOONCAKE), ("azure", AZURE)])
def test_line_scan_fallback_reads_the_same_table(monkeypatch, source, path):
    fast = load(source, path)

    def refuse(*args, **kwargs):
        raise pa.ArrowInvalid("forced fallback")

    monkeypatch.setattr(traces.pa_json, "read_json", refuse)
    monkeypatch.setattr(traces.pa_csv, "read_csv", refuse)
    slow = load(source, path)
    assert slow.input_tokens.tolist() == fast.input_tokens.tolist()
    assert slow.output_tokens.tolist() == fast.output_tokens.tolist()
    assert slow.send_ms.tolist() == fast.send_ms.tolist()
    assert slow.request_id.equals(fast.request_id)
    assert (slow.hash_ids is None and fast.hash_ids is None) or slow.hash_ids.equals(fast.hash_ids)


@pytest.mark.parametrize(("source", "path"), [("mooncake", MOONCAKE), ("azure", AZURE)])
def test_clean_traces_take_the_bulk_path(monkeypatch, source, path):
    def no_scan(*args, **kwargs):
        raise AssertionError("line-by-line scan used on a clean trace")

    monkeypatch.setattr(traces, "_scan_mooncake", no_scan)
    monkeypatch.setattr(traces, "_scan_csv", no_scan)
    assert len(load(source, path)) == 300


@pytest.mark.skipif(not FULL_MOONCAKE.is_file(), reason="the shared Mooncake trace is not here")
def test_full_mooncake_conversation_trace_loads_fast():
    cfg = load_config({"workload": workload("mooncake", FULL_MOONCAKE), "load": {"type": "trace"}})
    start = time.perf_counter()
    table = build_requests(cfg, None, np.random.default_rng(0))
    elapsed = time.perf_counter() - start
    assert len(table) == 12_031 and table.send_ms[-1] == 3_536_999.0
    assert elapsed < 1.0, f"{elapsed:.3f} s"


# ---------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("workload_keys", "message"),
    [
        ({"block_size": 16}, "workload.block_size is only used by workload.source=mooncake, got 16 with workload.source=synthetic"),
        ({"drop_invalid": True}, "workload.drop_invalid is only used by workload.source=mooncake or azure"),
        ({"max_requests": 5}, "workload.max_requests is only used by workload.source=mooncake or azure"),
        ({"time_window_ms": 5}, "workload.time_window_ms is only used by workload.source=mooncake or azure"),
        ({"source": "table", "path": "x.csv", "drop_invalid": True}, "workload.drop_invalid is only used"),
        ({"source": "azure", "path": "x.csv", "block_size": 512}, "workload.block_size is only used by workload.source=mooncake"),
        ({"source": "mooncake"}, "workload.path must be set when workload.source=mooncake"),
        ({"source": "azure"}, "workload.path must be set when workload.source=azure"),
        ({"source": "mooncake", "path": "x", "block_size": 0}, "workload.block_size must be an integer >= 1"),
        ({"source": "mooncake", "path": "x", "max_requests": 0}, "workload.max_requests must be an integer >= 1"),
        ({"source": "azure", "path": "x", "time_window_ms": 0}, "workload.time_window_ms must be > 0"),
        ({"source": "azure", "path": "x", "time_window_ms": float("nan")}, "workload.time_window_ms must be a finite number"),
        ({"source": "azure", "path": "x", "drop_invalid": "yes"}, "workload.drop_invalid must be true or false"),
        ({"source": "parquet"}, "workload.source must be one of synthetic, table, mooncake, azure"),
    ],
)
def test_trace_config_errors_name_the_field(workload_keys, message):
    with pytest.raises(ConfigError) as error:
        load_config({"workload": workload_keys})
    assert message in str(error.value)


def test_trace_config_defaults():
    cfg = load_config({"workload": {"source": "mooncake", "path": "x.jsonl"}})
    assert cfg.workload.block_size == 512 and cfg.workload.drop_invalid is False
    assert cfg.workload.max_requests is None and cfg.workload.time_window_ms is None
    assert load_config({"workload": {"source": "azure", "path": "x.csv"}}).workload.block_size is None
    assert load_config().workload.block_size is None
    assert load_config({"workload": {"source": "mooncake", "path": "x", "block_size": 16}}).workload.block_size == 16


# ---------------------------------------------------------------- end to end


def test_mooncake_trace_replay_end_to_end():
    result = simcore.run({"workload": workload("mooncake", MOONCAKE), "load": {"type": "trace", "speedup": 2.0}})
    assert result.summary["num_requests"] == 300 and result.summary["completed"] == 300
    assert result.summary["dropped_requests"] == 0
    requests = result.requests
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    assert requests.column("send_ms").to_pylist() == [r["timestamp"] / 2 for r in rows]
    assert requests.column("input_tokens").to_pylist() == [r["input_length"] for r in rows]
    assert requests.column("generated_tokens").to_pylist() == [r["output_length"] for r in rows]
    assert result.summary["total_input_tokens"] == 4_269_971


def test_azure_trace_closed_loop_end_to_end(tmp_path):
    result = simcore.run({"workload": workload("azure", AZURE), "load": {"type": "closed_loop", "concurrency": 16}})
    assert result.summary["completed"] == 300 and result.summary["dropped_requests"] == 0
    assert result.requests.column("input_tokens").to_pylist()[:3] == [374, 396, 879]
    send = np.array(result.requests.column("send_ms").to_pylist())
    assert np.all(send[:16] == 0) and np.all(send[16:] > 0)  # a closed loop, not the trace's times
    # dropped rows reach the summary
    bad = tmp_path / "bad.csv"
    bad.write_text(AZURE.read_text().replace("2023-11-16 18:15:50.9951690,396,109", "2023-11-16 18:15:50.9951690,396,0"))
    result = simcore.run({"workload": workload("azure", bad, drop_invalid=True), "load": {"type": "trace"}})
    assert result.summary["dropped_requests"] == 1 and result.summary["num_requests"] == 299
    assert result.requests.column("send_ms")[1].as_py() == 4541.877


def test_synthetic_runs_report_no_dropped_requests():
    assert simcore.run({"workload": {"num_requests": 4, "output_tokens": 2}}).summary["dropped_requests"] == 0


def replaysim(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "runners.cli", f"hydra.run.dir={tmp_path / 'run'}", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=180,
    )


def test_cli_replays_a_mooncake_trace(tmp_path):
    done = replaysim(tmp_path, "workload.source=mooncake", f"workload.path={MOONCAKE}", "load.type=trace")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["num_requests"] == 300 and summary["completed"] == 300
    assert summary["dropped_requests"] == 0
    assert summary["config"]["workload"]["source"] == "mooncake"


def test_cli_bad_trace_row_exits_2(tmp_path):
    path = write(tmp_path, "t.jsonl", [GOOD, mooncake_row(1, output_length=0)])
    done = replaysim(tmp_path, "workload.source=mooncake", f"workload.path={path}", "load.type=trace")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and f"{path}:2: output_length must be an integer >= 1, got 0" in lines[0]
    assert not (tmp_path / "run" / "summary.json").exists()
