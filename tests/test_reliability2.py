"""Bad input to the newer commands and readers, in process: each case of issue 32, and
property tests (Hypothesis) over every reader of a user file and every command's options.

The contract (docs/reliability.md): bad input is one ``ConfigError`` line naming the key, or
the file and its line or JSON path; what is accepted is bounded (finite, in range, the lists
consistent).  The command-line cases, run dirs and faults are in ``test_reliability2_commands.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import multiprocessing
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simcore
from runners import calibrate as cal
from runners import capacity as cap
from runners.rundir import claim
from simcore.config import ConfigError, load_config
from simcore.timing.allreduce import read_curve
from simcore.units import MAX_INSTANT_MS
from simcore.workload.api import build_requests

#: Examples per property (a few seconds each); REPLAYSIM_FUZZ_EXAMPLES raises it for a deeper search.
EXAMPLES = int(os.environ.get("REPLAYSIM_FUZZ_EXAMPLES", "60"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def one_line(error: BaseException, *names: str) -> str:
    """The error's text, checked to be one line naming one of ``names`` (a key, a file)."""
    text = str(error)
    assert "\n" not in text and text.strip() == text and text, repr(text)
    assert not names or any(name in text for name in names), (text, names)
    return text


# ---------------------------------------------------------------- run directories


def _claim_in_process(args):
    name, unique = args
    return claim(name, unique)[0]


def test_eight_processes_claiming_one_name_get_eight_directories(tmp_path):
    name = str(tmp_path / "runs" / "12-00-00")
    with multiprocessing.get_context("fork").Pool(8) as pool:
        used = pool.map(_claim_in_process, [(name, True)] * 8)
    # one process got the name itself, the others the first free suffixes, each a different one
    assert sorted(used) == sorted([name] + [f"{name}_{k}" for k in range(1, 8)])
    assert all(Path(u).is_dir() for u in used)


def test_a_fixed_name_is_reused_and_a_file_in_its_way_is_an_os_error(tmp_path):
    name = str(tmp_path / "preset")
    assert claim(name, False) == (name, [Path(name)])
    assert claim(name, False) == (name, [])  # already there: used as it is, nothing created
    (tmp_path / "file").write_text("x")
    with pytest.raises(OSError):
        claim(str(tmp_path / "file"), False)
    with pytest.raises(OSError):
        claim(str(tmp_path / "file" / "below"), True)


# ---------------------------------------------------------------- replaysim-calibrate: the measured runs

GOOD_ROW = {"request_id": "q0", "input_toks": 50, "output_toks": 5, "arrival_time": 100.0, "queued_ts": 10.0,
            "first_token_ts": 10.05, "last_token_ts": 10.1}
GOOD_VLLM = {"input_lens": [10, 20, 30], "output_lens": [3, 4, 2], "ttfts": [0.1, 0.2, 0.15],
             "itls": [[0.02, 0.03], [0.01, 0.01, 0.01], [0.05]], "start_times": [100.0, 100.5, 100.25],
             "errors": ["", "", ""]}


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def rows_with(index: int, **changes) -> list[dict]:
    rows = [dict(GOOD_ROW, request_id=f"q{i}", arrival_time=100.0 + i, queued_ts=10.0 + i,
                 first_token_ts=10.05 + i, last_token_ts=10.1 + i) for i in range(4)]
    rows[index].update(changes)
    return rows


def vllm_with(**changes) -> str:
    return json.dumps({**GOOD_VLLM, **changes})


# (file content, what the one line must name): every case of issue 32, and their neighbours.
MEASURED_CASES = {
    "negative-ttft": (vllm_with(ttfts=[0.1, -0.2, 0.15]), "ttfts[1]"),
    "negative-itl": (vllm_with(itls=[[0.02, -0.03], [0.01], [0.05]]), "itls[0][1]"),
    "nan-itl": ('{"ttfts": [0.1], "input_lens": [1], "output_lens": [2], "itls": [[NaN]], "start_times": [0]}',
                "itls[0][0]"),
    "short-input_lens": (vllm_with(input_lens=[10, 20]), "input_lens 2"),
    "short-ttfts": (vllm_with(ttfts=[0.1]), "ttfts has 1 entries"),
    "short-errors": (vllm_with(errors=[""]), "errors has 1 entries"),
    "long-itls": (vllm_with(itls=[[0.1]] * 4), "itls has 4 entries"),
    "latency-below-ttft": (vllm_with(latencies=[0.05, 0.3, 0.3]), "latencies[0]"),
    "error-not-string": (vllm_with(errors=["", 5, ""]), "errors[1]"),
    "vllm-input-2**63": (vllm_with(input_lens=[10, 2**63, 30]), "input_lens[1]"),
    "not-an-object": ("[1, 2, 3]", "m.jsonl:1: not a JSON object"),
    "vllm-huge-start": (vllm_with(start_times=[100.0, 1e300, 100.25]), "start_times[1]"),
    "last_token_ts-1e300": (jsonl(rows_with(2, last_token_ts=1e300)), "m.jsonl:3: last_token_ts"),
    "input_toks-2**63": (jsonl(rows_with(1, input_toks=2**63)), "m.jsonl:2: input_toks"),
    "input_toks-400-digits": (jsonl(rows_with(1, input_toks=10**400)), "m.jsonl:2"),
    "output_toks-0": (jsonl(rows_with(3, output_toks=0)), "m.jsonl:4: output_toks"),
    "arrival-string": (jsonl(rows_with(0, arrival_time="now")), "m.jsonl:1: arrival_time"),
    "arrival-span-beyond-int64-ns": (jsonl(rows_with(1, arrival_time=4e9) + [dict(GOOD_ROW, request_id="z",
                                                                                 arrival_time=-4e9)]),
                                     "arrival_time is"),
    "repeated-request_id": (jsonl(rows_with(1, request_id="q0")), "m.jsonl:2: request_id 'q0' repeats"),
    "request_id-list": (jsonl(rows_with(1, request_id=[1])), "m.jsonl:2: request_id"),
    "queued-after-first": (jsonl(rows_with(0, queued_ts=11.0)), "m.jsonl:1: need queued_ts"),
    "not-json": (jsonl(rows_with(0)) + "{oops\n", "m.jsonl:5: not valid JSON"),
    "deep-nesting": ("[" * 100_000 + "]" * 100_000 + "\n", "m.jsonl:1"),
    "empty": ("", "no requests"),
}
BYTE_CASES = {
    "latin-1": (jsonl(rows_with(0)).encode().replace(b'"q2"', b'"q\xe92"'), "m.jsonl:3: byte 0xe9"),
    "nul": (b"\x00" + jsonl(rows_with(0)).encode(), "m.jsonl:1: a NUL byte"),
    "utf-16": ('{"ttfts": []}'.encode("utf-16"), "m.jsonl:1"),
}


@pytest.mark.parametrize("case", sorted(MEASURED_CASES) + sorted(BYTE_CASES))
def test_a_bad_measured_run_is_one_line_naming_file_and_place(tmp_path, case):
    content, named = MEASURED_CASES.get(case) or BYTE_CASES[case]
    path = tmp_path / "m.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(ConfigError) as info:
        cal.read_measured(str(path))
    text = one_line(info.value, named)
    assert text.startswith(str(path)), text


def test_a_shorter_list_is_refused_not_dropped(tmp_path):
    """Issue 32: an input_lens list shorter than the others dropped the extra requests silently."""
    path = tmp_path / "b.json"
    path.write_text(vllm_with(input_lens=[10, 20]))
    with pytest.raises(ConfigError, match=r"output_lens has 3 entries, input_lens 2"):
        cal.read_measured(str(path))


def test_valid_runs_still_read_with_integral_float_lengths(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(vllm_with(input_lens=[10.0, 20, 30]))
    measured = cal.read_measured(str(path))
    assert measured.input_tokens.tolist() == [10, 30, 20]  # ordered by start time


def _measured_file(tmp_path: Path, n: int = 4) -> Path:
    path = tmp_path / "good.jsonl"
    path.write_text(jsonl(rows_with(0)[:n]))
    return path


def _reached(*args, **kwargs):
    raise AssertionError("calibrate() reached: the options should have been refused")


@pytest.mark.parametrize("argv, named", [
    (["--seed", "-1"], "--seed"),
    (["--seed", str(2**63)], "--seed"),
    (["--seed", "9" * 5000], "--seed"),
    (["--max-evals", "0"], "--max-evals"),
    (["--max-evals", str(10**8)], "--max-evals"),
    (["--max-evals", "1e3"], "--max-evals"),
    (["--fit-fraction", "nan"], "--fit-fraction"),
    (["--loss", "nope"], "--loss"),
    (["--format", "csv"], "--format"),
    (["--bogus"], "unrecognized arguments"),
    (["--fit", "timing.base_ms=1:nan"], "LOW < HIGH"),
    (["--fit", "timing.base_ms=2:1"], "LOW < HIGH"),
    (["--fit", "timing.base_ms=1:2:3"], "LOW:HIGH"),
    (["load.request_rate=4"], "workload and load come from the measured run"),
])
def test_bad_calibrate_options_are_one_line_and_exit_2(tmp_path, capsys, monkeypatch, argv, named):
    monkeypatch.setattr(cal, "calibrate_runs", _reached)
    out = tmp_path / "out"
    code = cal.main([str(_measured_file(tmp_path)), "--fit", "timing.decode_scale", *argv, "--out", str(out)])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("replaysim-calibrate: error:") and named in err[0], err
    assert not out.exists()


def test_calibration_cost_is_bounded_before_the_fit_with_the_estimate(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cal, "MAX_SIMULATED_REQUESTS", 100)  # 4 requests x 30 candidates = 120
    monkeypatch.setattr(cal, "calibrate_runs", _reached)
    code = cal.main([str(_measured_file(tmp_path)), "--fit", "timing.decode_scale", "--max-evals", "30",
                     "--out", str(tmp_path / "out")])
    (err,) = capsys.readouterr().err.splitlines()
    assert code == 2 and "--max-evals 30 x 4 measured requests = 120 simulated requests" in err


def test_an_error_inside_the_optimiser_is_the_users_one_line(tmp_path, capsys, monkeypatch):
    """SciPy re-raises a ValueError of the objective as a 48-line RuntimeError; the user gets the ConfigError."""
    def refuse(configs, requests=None):
        raise ConfigError("timing.decode_scale gave a pass time beyond int64 ns")

    monkeypatch.setattr(cal.simcore, "run_batch", refuse)
    out = tmp_path / "out"
    code = cal.main([str(_measured_file(tmp_path)), "--fit", "timing.decode_scale", "--max-evals", "20",
                     "--out", str(out)])
    (err,) = capsys.readouterr().err.splitlines()
    assert code == 2 and err == "replaysim-calibrate: error: timing.decode_scale gave a pass time beyond int64 ns"
    assert not out.exists()


# ---------------------------------------------------------------- replaysim-capacity: the capacity.* keys


def capacity_options(**raw):
    return cap.parse_options({"slo": {"p99_ttft_ms": 100}, **raw})


@pytest.mark.parametrize("raw, named", [
    ({"lo": 10**400}, "capacity.lo"),
    ({"seeds": 10**400}, "capacity.seeds"),
    ({"population": 10**400}, "capacity.population"),
    ({"trials": 10**400}, "capacity.trials"),
    ({"seeds": 2**63}, "capacity.seeds"),
    ({"max_doublings": 2000}, "capacity.max_doublings"),
    ({"lo": 1000, "max_doublings": 20}, "capacity.max_doublings=20"),
    ({"hi": 1e300}, "capacity.hi"),
    ({"hi": math.inf}, "capacity.hi"),
    ({"lo": -1}, "capacity.lo"),
    ({"lo": 5, "hi": 5}, "capacity.hi"),
    ({"tolerance": 1e-300}, "capacity.tolerance"),
    ({"tolerance": 0}, "capacity.tolerance"),
    ({"table_rows": -1}, "capacity.table_rows"),
    ({"axis": ["load.request_rate"]}, "capacity.axis"),
    ({"search": {"a": 1}}, "capacity.search"),
    ({"plots": "yes"}, "capacity.plots"),
    ({"axis": "load.concurrency", "lo": 1.5}, "capacity.lo"),
    ({"seed_quantile": 2}, "capacity.seed_quantile"),
    ({"slo": {"p99_ttft_ms": 10**400}}, "capacity.slo.p99_ttft_ms"),
])
def test_bad_capacity_keys_are_one_line_naming_the_key(raw, named):
    with pytest.raises(ConfigError) as info:
        capacity_options(**raw)
    one_line(info.value, named)


CAPACITY_BASE = {"workload": {"num_requests": 50}, "load": {"type": "poisson"}}


@pytest.mark.parametrize("raw, named", [
    ({"lo": 1e-300}, "capacity.lo=1e-300 as load.request_rate"),
    ({"seeds": 1_000_000}, "4.9e+07 runs"),  # 1 configuration x 1e6 seeds x 49 probes x 50 requests
    ({"seeds": 10}, "capacity.seeds=10: the seeds from seed="),
])
def test_capacity_ends_seeds_and_cost_are_checked_before_any_probe(tmp_path, monkeypatch, capsys, raw, named):
    monkeypatch.setattr(cap.simcore, "run_batch", _reached)
    config = {**json.loads(json.dumps(CAPACITY_BASE)), "capacity": {"slo": {"p99_ttft_ms": 100}, **raw}}
    if raw.get("seeds") == 10:
        config["seed"] = 2**63 - 5
    with pytest.raises((ConfigError, SystemExit)) as info:
        options, runner, sim = cap.split_capacity(config)
        cap.run_capacity(sim, [], runner, options, tmp_path / "out")
    if isinstance(info.value, SystemExit):  # found in the search: the command's one line, exit 2
        (err,) = capsys.readouterr().err.splitlines()
        assert info.value.code == 2 and named in err, err
    else:
        one_line(info.value, named)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*"))


def test_most_probes_counts_doublings_and_halvings():
    # lo=1, 20 doublings, tolerance 0.01: 1 start + 20 doublings + ceil(log2((2^20 - 1) / 0.01)) + 1 halvings
    options = capacity_options()
    assert cap.most_probes(options) == 1 + 20 + math.ceil(math.log2((2**20 - 1) / 0.01)) + 1
    # a given hi: lo and hi probed together, then halvings of (hi - lo) / (lo x tolerance)
    options = capacity_options(lo=10, hi=20, tolerance=0.1)
    assert cap.most_probes(options) == 2 + math.ceil(math.log2(10 / 1.0)) + 1
    # the concurrency axis halves an integer range
    options = capacity_options(axis="load.concurrency", lo=4, hi=36)
    assert cap.most_probes(options) == 2 + 5 + 1


# ---------------------------------------------------------------- request tables, sessions, curves, the API


def read_table(path: Path, **workload):
    cfg = load_config({"workload": {"source": "table", "path": str(path), **workload},
                       "load": {"type": "closed_loop"}})
    return build_requests(cfg, None, np.random.default_rng(0))


@pytest.mark.parametrize("turn", ["9223372036854775808", "9" * 30, "-1", "1.5"])
def test_a_session_turn_beyond_int64_names_its_line(tmp_path, turn):
    path = tmp_path / "s.csv"
    path.write_text(f"request_id,session_id,turn,input_tokens,output_tokens\na,s0,0,100,10\nb,s0,{turn},200,10\n")
    with pytest.raises(ConfigError) as info:
        read_table(path)
    one_line(info.value, f"{path}:3: turn", "turn -1 at line 3")


def test_a_parquet_session_turn_beyond_int64_names_its_row(tmp_path):
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"session_id": ["s", "s"], "turn": pa.array([0, 2**63], pa.uint64()),
                             "input_tokens": [10, 100], "output_tokens": [5, 5]}), path)
    with pytest.raises(ConfigError) as info:
        read_table(path)
    one_line(info.value, "turn must be an integer from 0 to 9223372036854775807 at row 1")


def test_a_timestamp_span_beyond_int64_names_its_row(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"input_tokens": [10, 100], "output_tokens": [5, 5],
                             "send_ms": pa.array([-2**63 + 5, 2**63 - 1], pa.timestamp("ns"))}), path)
    with pytest.raises(ConfigError) as info:
        read_table(path)
    one_line(info.value, "send_ms (timestamp[ns]) at row 1")


def curve_timing(path: Path) -> dict:
    return {"type": "linear", "tp": 2, "num_layers": 2, "hidden_size": 1024, "allreduce": {"curve": str(path)}}


@pytest.mark.parametrize("content, named", [
    (bytes(range(256)), ":1: a NUL byte"),
    (b"# nccl\n1024 256 float sum -1 \xff\xfe 0 0 0\n", ":2: not UTF-8 text"),
    (b"# nccl\n1024 256 float sum -1 10 0 0 0\n2048 512 float sum -1 1e300 0 0 0\n", ":3: need a size"),
    (b"# nccl\n1e30 256 float sum -1 10 0 0 0\n", ":2: need a size"),
    (b"size,num_workers,time_stats.all_reduce.median\n1024,2,inf\n", ":2: need a size"),
    (b"size,num_workers,time_stats.all_reduce.median\n1024," + b"9" * 5000 + b",1\n", ":2: expected numbers"),
    (b"", "no data rows (timing.allreduce.curve)"),
])
def test_a_bad_allreduce_curve_names_file_and_line(tmp_path, content, named):
    path = tmp_path / "ar.txt"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        read_curve(str(path), 2)
    one_line(info.value, f"{path}{named}" if named.startswith(":") else named)


def test_a_curve_extended_below_zero_names_the_curve(tmp_path):
    """Issue 32: the refusal blamed timing.type=linear alone."""
    path = tmp_path / "ar.txt"
    path.write_text("# nccl\n1024 256 float sum -1 10 0 0 0\n2048 512 float sum -1 1e12 0 0 0\n"
                    "4096 512 float sum -1 20 0 0 0\n")
    with pytest.raises(ConfigError) as info:
        simcore.run({"workload": {"num_requests": 8}, "timing": curve_timing(path)})
    one_line(info.value, f"timing.allreduce.curve={path}")


def test_a_tiny_speedup_is_one_error_without_warnings(tmp_path):
    """Issue 32: load.speedup=5e-324 printed two RuntimeWarning lines first (warnings are errors here)."""
    path = tmp_path / "t.csv"
    path.write_text("input_tokens,output_tokens,send_ms\n10,2,0\n10,2,5\n")
    with pytest.raises(ConfigError) as info:
        simcore.run({"workload": {"source": "table", "path": str(path)}, "load": {"type": "trace", "speedup": 5e-324}})
    one_line(info.value, "load.speedup=5e-324")


@pytest.mark.parametrize("configs", [None, 5, "abc", b"x", {"seed": 1}, 1.5, object()])
def test_run_batch_takes_a_list_of_configurations(configs):
    with pytest.raises(ConfigError) as info:
        simcore.run_batch(configs)
    one_line(info.value, "configs must be a list")


@pytest.mark.parametrize("value", [(p for p in [50, 99]), iter([50]), {50: 1}, "50", 50, None, [50, 50],
                                   [101], [math.nan], [10**400], [True]])
def test_bad_percentiles_are_one_line_naming_the_key(value):
    with pytest.raises(ConfigError) as info:
        load_config({"metrics": {"percentiles": value}})
    one_line(info.value, "metrics.percentiles")


# ---------------------------------------------------------------- property tests over the readers

NUMBERS = st.one_of(
    st.integers(min_value=-2**70, max_value=2**70), st.just(10**400), st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 1e300, -1e300, 5e-324, 2**63, 2**63 - 1, 2**64]),
)
JUNK = st.one_of(st.none(), st.booleans(), st.text(max_size=6), st.lists(st.integers(), max_size=3),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
VALUES = st.one_of(NUMBERS, JUNK)


def _field(good: object) -> st.SearchStrategy:
    """Mostly the good value, else any number or junk (so a file has one or two bad fields)."""
    return st.sampled_from([True] + [False] * 9).flatmap(lambda bad: VALUES if bad else st.just(good))


@st.composite
def jsonl_runs(draw):
    rows = []
    for i in range(draw(st.integers(min_value=0, max_value=5))):
        row = {}
        for key, good in rows_with(0)[0].items():
            good = f"q{i}" if key == "request_id" else (good + i if isinstance(good, float) else good)
            if not draw(st.integers(min_value=0, max_value=30)) == 0:  # now and then a missing field
                row[key] = draw(_field(good))
        rows.append(row)
    lines = [json.dumps(r) for r in rows]
    if lines and draw(st.sampled_from([True, False, False, False])):  # now and then a damaged line
        at = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        lines[at] = lines[at][: draw(st.integers(min_value=0, max_value=len(lines[at])))]
    return "\n".join(lines) + "\n"


@st.composite
def vllm_runs(draw):
    n = draw(st.integers(min_value=0, max_value=4))
    doc = {}
    for key, good in GOOD_VLLM.items():
        size = n if draw(st.integers(min_value=0, max_value=10)) else draw(st.integers(min_value=0, max_value=5))
        values = [draw(_field(good[i % 3])) for i in range(size)]
        doc[key] = values if draw(st.integers(min_value=0, max_value=20)) else draw(VALUES)
    if draw(st.booleans()):
        doc["latencies"] = [draw(_field(1.0)) for _ in range(n)]
    return json.dumps(doc)


def check_measured(path: Path, text: str | bytes) -> str:
    """Read ``text`` as a measured run: ``"accepted"`` (and bounded) or ``"refused"`` (one line naming the file)."""
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    try:
        measured = cal.read_measured(str(path))
    except ConfigError as exc:
        one_line(exc, str(path))
        assert str(exc).startswith(str(path)) or str(exc).startswith("--format"), str(exc)
        return "refused"
    n = len(measured.request_id)
    assert n >= 1 and len(set(measured.request_id)) == n
    assert measured.input_tokens.shape == measured.output_tokens.shape == measured.send_ms.shape == (n,)
    assert (measured.input_tokens >= 1).all() and (measured.output_tokens >= 1).all()
    assert np.isfinite(measured.send_ms).all() and (measured.send_ms >= 0).all()
    assert measured.send_ms.max() < MAX_INSTANT_MS
    for column in ("ttft_ms", "e2el_ms"):
        values = measured.latency[column]
        assert np.isfinite(values).all() and (values >= 0).all(), column
    return "accepted"


@PROPERTY
@given(text=jsonl_runs())
def test_property_jsonl_measured_runs(tmp_path, text):
    check_measured(tmp_path / "run.jsonl", text)


@PROPERTY
@given(text=vllm_runs())
def test_property_vllm_measured_runs(tmp_path, text):
    check_measured(tmp_path / "bench.json", text)


@PROPERTY
@given(data=st.binary(max_size=200))
def test_property_any_bytes_as_a_measured_run(tmp_path, data):
    check_measured(tmp_path / "bytes.jsonl", data)


@st.composite
def curve_files(draw):
    if draw(st.booleans()):
        header = "size,num_workers,time_stats.all_reduce.median"
        rows = [",".join(str(draw(_field(good))) for good in (1024 * (i + 1), 2, 0.01 * (i + 1)))
                for i in range(draw(st.integers(min_value=0, max_value=4)))]
        return "\n".join([header, *rows]) + "\n"
    rows = [" ".join(str(draw(_field(good))) for good in (1024 * (i + 1), 256, "float", "sum", -1, 10.0 * (i + 1), 0))
            for i in range(draw(st.integers(min_value=0, max_value=4)))]
    return "\n".join(["# nccl", *rows]) + "\n"


def check_curve(path: Path, text: str | bytes) -> str:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    try:
        sizes, times = read_curve(str(path), 2)
    except ConfigError as exc:
        one_line(exc, str(path), "timing.allreduce.curve")
        return "refused"
    assert sizes.size >= 1 and np.isfinite(sizes).all() and np.isfinite(times).all()
    assert (sizes > 0).all() and (times >= 0).all() and (np.diff(sizes) > 0).all()
    return "accepted"


@PROPERTY
@given(text=st.one_of(curve_files(), st.binary(max_size=120)))
def test_property_allreduce_curves(tmp_path, text):
    check_curve(tmp_path / "curve.txt", text)


@st.composite
def table_files(draw):
    columns = ["request_id", "session_id", "turn", "input_tokens", "output_tokens", "send_ms"]
    keep = [c for c in columns if draw(st.integers(min_value=0, max_value=8)) or c in ("input_tokens",)]
    rows = []
    for i in range(draw(st.integers(min_value=0, max_value=4))):
        good = {"request_id": f"r{i}", "session_id": f"s{i // 2}", "turn": i % 2, "input_tokens": 10 * (i + 1),
                "output_tokens": 3, "send_ms": 1.5 * i}
        rows.append(",".join(str(draw(_field(good[c]))).replace(",", ";").replace("\n", " ") for c in keep))
    return "\n".join([",".join(keep), *rows]) + "\n"


def check_table(path: Path, text: str | bytes) -> str:
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    try:
        table = read_table(path)
    except ConfigError as exc:
        one_line(exc, str(path), "workload.")
        return "refused"
    assert len(table) >= 1 and (table.input_tokens >= 1).all() and (table.output_tokens >= 1).all()
    return "accepted"


@PROPERTY
@given(text=st.one_of(table_files(), st.binary(max_size=120)))
def test_property_request_and_session_tables(tmp_path, text):
    check_table(tmp_path / "table.csv", text)


# ---------------------------------------------------------------- property tests over the options

CAPACITY_KEYS = {"axis": "load.request_rate", "lo": 1, "hi": 100.0, "tolerance": 0.01, "max_doublings": 20,
                 "seeds": 1, "seed_quantile": 1.0, "search": "grid", "trials": 64, "population": 16,
                 "plots": True, "table_rows": 30}


def check_capacity_options(raw: dict) -> str:
    try:
        options = cap.parse_options(raw)
    except ConfigError as exc:
        one_line(exc, "capacity.")
        return "refused"
    top = cap.axis_maximum(options.axis)
    assert 0 < options.lo <= top and (options.hi is None or options.lo < options.hi <= top)
    assert 0 <= options.max_doublings <= cap.MAX_DOUBLINGS and options.tolerance >= cap.MIN_TOLERANCE
    assert options.hi is not None or options.lo * 2.0**options.max_doublings <= top
    assert 1 <= options.seeds <= 2**63 - 1 and 1 <= options.trials <= cap.MAX_TRIALS
    probes = cap.most_probes(options)  # finite and bounded: the cost estimate cannot overflow
    # halvings: log2 of (largest axis value / smallest float64 x the tolerance), below 30 + 1075 + 30
    assert 1 <= probes <= 2 + cap.MAX_DOUBLINGS + 30 + 1075 + math.ceil(math.log2(1 / cap.MIN_TOLERANCE)) + 1
    return "accepted"


@st.composite
def capacity_sections(draw):
    raw = {"slo": {"p99_ttft_ms": draw(_field(100.0))}}
    for key, good in CAPACITY_KEYS.items():
        if draw(st.booleans()):
            raw[key] = draw(_field(good))
    if draw(st.integers(min_value=0, max_value=10)) == 0:
        raw[draw(st.text(min_size=1, max_size=5))] = 1
    return raw


@PROPERTY
@given(raw=capacity_sections())
def test_property_capacity_options(raw):
    check_capacity_options(raw)


OPTION_TEXT = st.one_of(st.text(max_size=8), st.sampled_from(["-1", "0", "1", "nan", "inf", "1e3", str(2**63),
                                                               "9" * 400, "0.5", "2:1", "1:2", "0x10"]))
CALIBRATE_FLAGS = ["--seed", "--max-evals", "--fit-fraction", "--loss", "--format", "--fit", "--bogus"]


def check_calibrate_argv(tmp_path: Path, argv: list[str]) -> str:
    class Reached(Exception):
        pass

    def reached(runs, fit, *, fit_fraction, loss, max_evals, seed, stability_fits, score, max_extrapolation,
                refuse_extrapolation):
        assert runs and 0 <= stability_fits <= cal.MAX_STABILITY_FITS and max_extrapolation >= 1
        assert 0 <= seed <= cal.MAX_SEED and 1 <= max_evals <= cal.MAX_EVALS and 0 < fit_fraction <= 1
        assert fit and all(math.isfinite(lo) and math.isfinite(hi) and lo < hi for _, lo, hi in fit)
        raise Reached

    original = cal.calibrate_runs
    cal.calibrate_runs = reached
    out = tmp_path / f"out-{uuid.uuid4().hex}"  # one per example (a refused one must leave none)
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            code = cal.main([str(_measured_file(tmp_path)), "--out", str(out), *argv])
    except Reached:
        shutil.rmtree(out, ignore_errors=True)
        return "accepted"
    finally:
        cal.calibrate_runs = original
    err = stderr.getvalue().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("replaysim-calibrate: error:"), (code, err)
    assert not out.exists()
    return "refused"


@PROPERTY
@given(pairs=st.lists(st.tuples(st.sampled_from(CALIBRATE_FLAGS), OPTION_TEXT), max_size=3),
       fit=st.sampled_from([[], ["--fit", "timing.decode_scale"], ["--fit", "timing.base_ms=0:5"]]))
def test_property_calibrate_options(tmp_path, pairs, fit):
    check_calibrate_argv(tmp_path, calibrate_argv(pairs, fit))


def calibrate_argv(pairs: list[tuple[str, str]], fit: list[str]) -> list[str]:
    argv = [*fit]
    for flag, value in pairs:
        argv += [flag] if flag == "--bogus" else [flag, value]
    return argv


CALIBRATE_OPTIONS = st.builds(calibrate_argv, st.lists(st.tuples(st.sampled_from(CALIBRATE_FLAGS), OPTION_TEXT),
                                                       max_size=3),
                              st.sampled_from([[], ["--fit", "timing.decode_scale"], ["--fit", "timing.base_ms=0:5"]]))


# ---------------------------------------------------------------- timing.profile (timing.type=table)


@pytest.mark.parametrize("file, change, named", [
    ("dense.csv", (b"embedding", b"emb\xe9dding"), "dense.csv:2: not UTF-8 text"),
    ("dense.csv", (b"embedding", b"emb\x00dding"), "dense.csv:2: a NUL byte"),
    ("dense.csv", (b"10.0", b"1e300"), "dense.csv:6: time_us must be a number from 0 to"),
    ("dense.csv", (b"101", b"1e300"), "dense.csv:3: tokens must be an integer from 1 to 9223372036854775807"),
    ("attention.csv", (b"\n16,", b"\n1e300,"), "attention.csv:6: prefill_chunk must be an integer"),
    ("per_sequence.csv", None, "per_sequence.csv:1: a NUL byte"),
    ("meta.yaml", (b"", b"\xff\xfe"), "meta.yaml:1: not UTF-8 text"),
    ("meta.yaml", (b"", b"num_layers: [1,\n"), "meta.yaml:2: not valid YAML"),
    ("meta.yaml", (b"", b"num_layers: " + b"9" * 400 + b"\n"), "meta.yaml: num_layers must be an integer from 1"),
])
def test_a_bad_profile_file_names_file_and_line(tmp_path, file, change, named):
    from tests.test_timing_models import write_profile

    profile = Path(write_profile(tmp_path / "p"))
    path = profile / file
    if change is None:
        path.write_bytes(bytes(range(256)))
    elif change[0] == b"":
        path.write_bytes(change[1])
    else:
        path.write_bytes(path.read_bytes().replace(*change, 1))
    timing = {"type": "table", "profile": str(profile)}
    if file != "meta.yaml":
        timing["num_layers"] = 2
    with pytest.raises(ConfigError) as info:
        simcore.run({"workload": {"num_requests": 4}, "timing": timing})
    one_line(info.value, f"{profile}/{named}")


# ---------------------------------------------------------------- replaysim-analyze


@pytest.mark.parametrize("argv, named, code", [
    (["{tmp}/bad"], "bad/summary.parquet: not a readable Parquet file", 2),
    (["{tmp}/nothing"], "holds no summary.json, summary.parquet or point.json", 2),
    (["{tmp}/bad", "--nope"], "unrecognized arguments: --nope", 2),
    ([], "the following arguments are required: DIR", 2),
])
def test_replaysim_analyze_errors_are_one_line(tmp_path, capsys, argv, named, code):
    from runners import analyze

    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "summary.parquet").write_bytes(b"not parquet")
    with pytest.raises(SystemExit) as info:
        analyze.main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err.splitlines()
    assert info.value.code == code and len(err) == 1 and err[0].startswith("replaysim-analyze: error:")
    assert named in err[0], err


@pytest.mark.parametrize("load, named", [
    (lambda: load_config({"a\nb": 1}), "'a\\nb' is not a known key"),
    (lambda: load_config({"workload": {"x\ry": 1}}), "workload.'x\\ry' is not a known key"),
    (lambda: capacity_options(**{"x\ny": 1}), "capacity.'x\\ny' is not a capacity key"),
    (lambda: cap.parse_options({"slo": {"p99\n": 1}}), "capacity.slo.'p99\\n' is not an SLO key"),
])
def test_a_key_with_a_line_break_is_named_on_one_line(load, named):
    """Found by the capacity property: the unknown key's own newline split the error line."""
    with pytest.raises(ConfigError) as info:
        load()
    one_line(info.value, named)


# ---------------------------------------------------------------- prompt prefixes of a trace (Mooncake hash_ids)


@pytest.mark.parametrize("hash_ids, named", [
    ([2**63, 3], "mc.jsonl:2: hash_ids must be a list of integers"),
    ([10**400, 3], "mc.jsonl:2: hash_ids must be a list of integers"),
    ("ab", "mc.jsonl:2: hash_ids must be a list of integers"),
    ([1.5, 3], "mc.jsonl:2: hash_ids must be a list of integers"),
    ([[1], 3], "mc.jsonl:2: hash_ids must be a list of integers"),
    ([True, 3], "mc.jsonl:2: hash_ids must be a list of integers"),
    (None, "mc.jsonl:2: hash_ids is missing"),
    ([1], "mc.jsonl:2: input_length 20 is more than hash_ids cover"),
])
def test_bad_prompt_prefixes_of_a_trace_name_file_and_line(tmp_path, hash_ids, named):
    rows = [{"timestamp": 0, "input_length": 20, "output_length": 5, "hash_ids": [1, 2]},
            {"timestamp": 1, "input_length": 20, "output_length": 5, "hash_ids": hash_ids}]
    path = tmp_path / "mc.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config({"workload": {"source": "mooncake", "path": str(path), "block_size": 16},
                       "load": {"type": "trace"}, "engine": {"aggregated": {"prefix_caching": True}}})
    with pytest.raises(ConfigError) as info:
        build_requests(cfg, None, np.random.default_rng(0))
    one_line(info.value, f"{tmp_path}/{named}")
