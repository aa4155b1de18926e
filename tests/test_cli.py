"""The ``replaysim`` command line: result files, output directory, bad input (SPEC §10-11)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

import simcore
from runners.cli import check_overrides
from runners.writer import write_results
from simcore.schema import PASSES_SCHEMA, REQUESTS_SCHEMA, SCHEMA_VERSION, TOKENS_SCHEMA

SMALL = [
    "workload.num_requests=8",
    "load.concurrency=2",
    "workload.input_tokens=64",
    "workload.output_tokens=4",
]
RESULT_NAMES = ("summary.json", "requests.parquet", "passes.parquet", "tokens.parquet")


def replaysim(tmp_path: Path, *args: str, script: bool = False) -> subprocess.CompletedProcess:
    """Run the CLI in ``tmp_path`` with its Hydra run dir at ``tmp_path/run``."""
    command = [shutil.which("replaysim")] if script else [sys.executable, "-m", "runners.cli"]
    return subprocess.run(
        [*command, f"hydra.run.dir={tmp_path / 'run'}", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )


def result_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name in RESULT_NAMES or p.suffix == ".tmp"]


def test_run_writes_summary_and_requests(tmp_path):
    done = replaysim(tmp_path, *SMALL)
    assert done.returncode == 0, done.stderr
    run = tmp_path / "run"
    assert sorted(p.name for p in result_files(tmp_path)) == ["requests.parquet", "summary.json"]
    assert pl.read_parquet(run / "requests.parquet").height == 8
    assert pq.read_schema(run / "requests.parquet").equals(REQUESTS_SCHEMA)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed"] == 8 and summary["num_requests"] == 8
    assert summary["config"]["workload"]["num_requests"] == 8
    assert summary["config"]["load"]["concurrency"] == 2
    assert summary["config"]["timing"] == simcore.DEFAULTS["timing"]
    assert summary["version"] == simcore.__version__
    assert summary["seed"] == 0 and summary["schema_version"] == SCHEMA_VERSION
    assert "git_sha" in summary
    assert "Requests completed" in done.stdout and str(run) in done.stdout


def test_passes_and_tokens(tmp_path):
    done = replaysim(tmp_path, *SMALL, "output.passes=true", "output.tokens=true")
    assert done.returncode == 0, done.stderr
    run = tmp_path / "run"
    for name, schema in (("passes", PASSES_SCHEMA), ("tokens", TOKENS_SCHEMA)):
        table = pq.read_table(run / f"{name}.parquet")
        assert table.schema.equals(schema), name
        assert table.num_rows > 0
    assert pl.read_parquet(run / "tokens.parquet").height == 8 * 4


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_output_dir(tmp_path, relative):
    target = "x" if relative else str(tmp_path / "x")
    done = replaysim(tmp_path, *SMALL, f"output.dir={target}", script=shutil.which("replaysim") is not None)
    assert done.returncode == 0, done.stderr
    assert sorted(p.relative_to(tmp_path).as_posix() for p in result_files(tmp_path)) == [
        "x/requests.parquet",
        "x/summary.json",
    ]


TABLE = "workload.source=table"
ALL_ROWS = "workload.num_requests=null"
HEADER = "request_id,input_tokens,output_tokens\n"

BAD_INPUT = {
    "nan": (["timing.base_ms=nan"], None, ["timing.base_ms"]),
    "inf": (["timing.base_ms=inf"], None, ["timing.base_ms"]),
    "negative": (["detokenization.base_ms=-1"], None, ["detokenization.base_ms"]),
    "zero-workers": (["tokenization.workers=0"], None, ["tokenization.workers"]),
    "bad-output-mode": (["output.mode=sketchy"], None, ["output.mode", "sketchy"]),
    "bounded-tokens": (["output.mode=bounded", "output.tokens=true"], None, ["output.tokens", "output.mode=detailed"]),
    "bounded-detailed-export": (["output.mode=bounded", "export.detailed=true"], None, ["export.detailed", "output.mode=detailed"]),
    "fractional-workers": (["detokenization.workers=1.5"], None, ["detokenization.workers"]),
    "unknown-key": (["engine.aggregated.foo=1"], None, ["engine.aggregated.foo"]),
    "unknown-added-key": (["+foo=1"], None, ["foo is not a known config key"]),
    "missing-column": ([TABLE, ALL_ROWS], "request_id,input_tokens\na,5\n", ["requests.csv", "output_tokens"]),
    "trace-without-send": (
        [TABLE, ALL_ROWS, "load.type=trace"], HEADER + "a,5,2\nb,6,3\n", ["load.type", "send_ms"]
    ),
    "duplicate-id": ([TABLE, ALL_ROWS], HEADER + "a,5,2\nb,6,3\na,7,1\n", ["requests.csv", "line 4", "'a'"]),
    "bad-value": ([TABLE, ALL_ROWS], HEADER + "a,5,2\nb,abc,3\n", ["requests.csv:3", "input_tokens", "abc"]),
}


@pytest.mark.parametrize(("args", "csv", "expected"), BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_exits_2_with_one_line(tmp_path, args, csv, expected):
    if csv is not None:
        (tmp_path / "requests.csv").write_text(csv)
        args = [*args, f"workload.path={tmp_path / 'requests.csv'}"]
    # A table case replays its own rows: SMALL's lengths (and its concurrency with a
    # trace load) would have no effect there, which is an error of its own.
    small = [] if TABLE in args else SMALL
    done = replaysim(tmp_path, *small, *args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("replaysim: error: "), done.stderr
    for part in expected:
        assert part in lines[0]
    assert "Traceback" not in done.stderr + done.stdout
    assert result_files(tmp_path) == []


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "hydra/launcher=basic", "hydra.run.dir=x", "++hydra.job.chdir=false"],
        ["--cfg", "job", "metrics.goodput.ttft_ms=5", "metrics.goodput=null", "~max_time_ms"],
        ["engine.aggregated.replicas=2,4", "metrics.percentiles=[50,99.9]"],
    ],
)
def test_known_overrides_pass_the_key_check(argv):
    check_overrides(argv)


def test_write_results_leaves_no_partial_file(tmp_path, monkeypatch):
    result = simcore.run({"workload": {"num_requests": 4, "output_tokens": 2}, "output": {"passes": True}})
    real_write = pq.write_table

    def write_then_fail(table, where, **kwargs):
        real_write(table, where, **kwargs)
        if table.schema.names == PASSES_SCHEMA.names:
            raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", write_then_fail)
    with pytest.raises(OSError, match="disk full"):
        write_results(result, tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []
