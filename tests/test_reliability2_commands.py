"""The commands as a user runs them: run directories of runs started together, environment
faults of the run directory, the cases of issue 32 from the command line, and kills during
calibration and capacity search (docs/reliability.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from runners.writer import verified_set

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
SMALL = ["workload.num_requests=8", "workload.input_tokens=64", "workload.output_tokens=4"]


def command(module: str, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def start(module: str, *args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def printed_dir(stdout: str) -> Path:
    (line,) = [line for line in stdout.splitlines() if line.startswith("Output directory: ")]
    return Path(line.removeprefix("Output directory: "))


def assert_one_line(done, code: int, prog: str, *named: str) -> str:
    assert done.returncode == code, (done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error:"), done.stderr
    assert all(n in lines[0] for n in named), (lines[0], named)
    return lines[0]


# ---------------------------------------------------------------- run directories


def test_eight_runs_started_in_one_second_get_eight_complete_result_sets(tmp_path):
    """Issue 32: runs started in the same second shared outputs/<date>/<time>/ and overwrote each other.

    The run directory is named by the day here, so that all eight take the same name for certain.
    """
    runs = [start("runners.cli", *SMALL, f"seed={seed}", "hydra.run.dir=runs/${now:%Y-%m-%d}", cwd=tmp_path)
            for seed in range(8)]
    outcomes = [run.communicate(timeout=300) for run in runs]
    dirs = []
    for seed, (run, (stdout, stderr)) in enumerate(zip(runs, outcomes)):
        assert run.returncode == 0, stderr
        out = printed_dir(stdout)
        dirs.append(out)
        assert sorted(verified_set(out)) == sorted(["report.html", "requests.parquet", "summary.json", "vllm_bench.json"])
        # the run's own overrides and results: no file of another run in its directory
        assert f"seed={seed}" in yaml.safe_load((out / ".hydra" / "overrides.yaml").read_text())
        assert json.loads((out / "summary.json").read_text())["config"]["seed"] == seed
        assert yaml.safe_load((out / ".hydra" / "hydra.yaml").read_text())["hydra"]["run"]["dir"] == str(
            out.relative_to(tmp_path))
    assert len(set(dirs)) == 8
    day = dirs[0].parent / dirs[0].name.split("_")[0]
    assert sorted(dirs) == sorted([day] + [Path(f"{day}_{k}") for k in range(1, 8)])


def test_two_sweeps_started_together_get_two_sweep_directories(tmp_path):
    sweeps = [start("runners.cli", "-m", *SMALL, f"seed={a},{b}", "hydra.sweep.dir=sweeps/${now:%Y-%m-%d}",
                    cwd=tmp_path) for a, b in ((1, 2), (3, 4))]
    for sweep in sweeps:
        _, stderr = sweep.communicate(timeout=300)
        assert sweep.returncode == 0, stderr
    roots = sorted(p for p in (tmp_path / "sweeps").iterdir())
    assert len(roots) == 2 and roots[1].name == f"{roots[0].name}_1"
    seeds = []
    for root in roots:
        table = pq.read_table(root / "summary.parquet")
        assert table.num_rows == 2 and set(table.column("status").to_pylist()) == {"ok"}
        seeds.append(sorted(json.loads((root / str(j) / "summary.json").read_text())["config"]["seed"]
                            for j in (0, 1)))
    assert sorted(seeds) == [[1, 2], [3, 4]]


@pytest.mark.parametrize("module, prog, extra", [
    ("runners.cli", "replaysim", SMALL),
    ("runners.capacity", "replaysim-capacity", [*SMALL, "load.type=poisson", "capacity.slo.p99_ttft_ms=500"]),
])
@pytest.mark.parametrize("options, reason", [("size=64k,ro", "Read-only file system"),
                                             ("size=4k", "No space left on device")])
def test_a_read_only_or_full_run_dir_is_one_line_and_exit_74(tmp_path, tmpfs, module, prog, extra, options, reason):
    """Issue 32: a read-only or full hydra.run.dir ended in a 30-line OSError traceback."""
    mount = tmpfs(options)
    if "ro" not in options:  # fill it: 4 KiB holds the directory but not Hydra's config files
        (mount / "fill").write_bytes(b"\0" * 3000)
    done = command(module, *extra, f"hydra.run.dir={mount}/run", cwd=tmp_path)
    line = assert_one_line(done, 74, prog, f"cannot write results to {mount}/run", reason)
    assert line.endswith(reason)
    assert not (mount / "run").exists()


def test_a_run_dir_below_a_file_is_one_line_and_exit_74(tmp_path):
    (tmp_path / "f").write_text("a file")
    done = command("runners.cli", *SMALL, "hydra.run.dir=f/run", cwd=tmp_path)
    line = assert_one_line(done, 74, "replaysim", f"cannot write results to {tmp_path / 'f'}")
    assert line.endswith(("File exists", "Not a directory")), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


# ---------------------------------------------------------------- the cases of issue 32 from the command line

ROW = {"input_toks": 50, "output_toks": 5, "arrival_time": 100.0, "queued_ts": 10.0, "first_token_ts": 10.05,
       "last_token_ts": 10.1}


def measured_file(path: Path, n: int = 4, **change) -> Path:
    rows = [dict(ROW, request_id=f"q{i}", arrival_time=100.0 + i) for i in range(n)]
    rows[-1].update(change)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("args, named", [
    (["--seed", "-1"], "--seed must be an integer from 0 to 4294967295, got -1"),
    (["--seed", str(2**63)], "--seed"),
    (["--fit-fraction"], "argument --fit-fraction: expected one argument"),
    (["--nope"], "unrecognized arguments: --nope"),
])
def test_calibrate_options_from_the_command_line(tmp_path, args, named):
    done = command("runners.calibrate", str(measured_file(tmp_path / "m.jsonl")), "--fit", "timing.decode_scale",
                   *args, "--out", "out", cwd=tmp_path)
    assert_one_line(done, 2, "replaysim-calibrate", named)
    assert done.stdout == "" and not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, named", [
    ({"input_toks": 2**63}, "m.jsonl:4: input_toks"),
    ({"last_token_ts": 1e300}, "m.jsonl:4: last_token_ts"),
])
def test_calibrate_measured_runs_from_the_command_line(tmp_path, change, named):
    done = command("runners.calibrate", str(measured_file(tmp_path / "m.jsonl", **change)), "--fit",
                   "timing.decode_scale", "--out", "out", cwd=tmp_path)
    assert_one_line(done, 2, "replaysim-calibrate", named)
    assert not (tmp_path / "out").exists()


CAPACITY = ["load.type=poisson", "workload.num_requests=50", "capacity.slo.p99_ttft_ms=500", "output.dir=out"]


@pytest.mark.parametrize("override, named", [
    ("capacity.lo=" + "9" * 400, "capacity.lo"),
    ("capacity.seeds=" + "9" * 400, "capacity.seeds"),
    ("capacity.seeds=1000000", "4.9e+07 runs"),
    ("capacity.max_doublings=2000", "capacity.max_doublings"),
    ("capacity.hi=1e300", "capacity.hi must be <= 1e+09"),
    ("capacity.lo=1e-300", "capacity.lo=1e-300 as load.request_rate"),
])
def test_capacity_keys_from_the_command_line(tmp_path, override, named):
    started = time.monotonic()
    done = command("runners.capacity", *CAPACITY, override, cwd=tmp_path)
    assert_one_line(done, 2, "replaysim-capacity", named)
    assert time.monotonic() - started < 60  # refused before any probe, not after minutes
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- kills during calibration and capacity search


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("signum, code", [(signal.SIGKILL, -signal.SIGKILL), (signal.SIGTERM, 143),
                                          (signal.SIGINT, 130)])
def test_a_calibration_killed_during_the_fit_writes_nothing(tmp_path, signum, code):
    path = measured_file(tmp_path / "m.jsonl", n=60)
    run = start("runners.calibrate", str(path), "--fit", "timing.decode_scale", "--fit", "timing.prefill_scale",
                "--max-evals", "100000", "--out", "out", cwd=tmp_path)
    wait_for(lambda: (tmp_path / "out").exists())  # the writability check: the fit starts next
    time.sleep(1.0)
    run.send_signal(signum)
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == code, stderr
    if signum != signal.SIGKILL:
        name = "SIGTERM" if signum == signal.SIGTERM else "SIGINT (Ctrl-C)"
        assert stderr == f"replaysim-calibrate: stopped by {name}; nothing was written\n"
    assert not any(p.name in ("calibration.json", "calibrated.yaml") for p in (tmp_path / "out").iterdir())


def test_a_capacity_search_killed_midway_leaves_no_result_and_resumes(tmp_path):
    args = ["load.type=poisson", "workload.num_requests=200", "capacity.slo.p99_ttft_ms=500", "capacity.seeds=4",
            "capacity.tolerance=0.001", "output.dir=out"]
    run = start("runners.capacity", *args, cwd=tmp_path)
    wait_for(lambda: len(list((tmp_path / "out" / "probes").glob("step-*.parquet"))) >= 2)
    run.send_signal(signal.SIGKILL)
    run.communicate(timeout=60)
    out = tmp_path / "out"
    assert not (out / "capacity.parquet").exists() and not (out / "probes.parquet").exists()
    stored = len(list((out / "probes").glob("step-*.parquet")))
    done = command("runners.capacity", *args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "probe runs reused" in done.stdout and stored >= 2
    assert pq.read_table(out / "capacity.parquet").num_rows == 1
