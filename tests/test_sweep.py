"""Sweeps: multirun and batch results as Arrow tables, resume, failure isolation, launchers, export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import simcore
from runners import params
from runners.cli import CONFIG_DIR, check_overrides
from runners.export import DETAILED_KEYS, vllm_bench_document
from simcore.schema import REQUESTS_SCHEMA

SMALL = ["workload.num_requests=8", "workload.input_tokens=64", "workload.output_tokens=4"]
GRID = ["load.concurrency=1,4", "detokenization.base_ms=0,2.85"]
BATCH = ["sweep.batch.load.concurrency=[1,4]", "sweep.batch.detokenization.base_ms=[0,2.85]"]
PARAMS = {"detokenization.base_ms": pa.float64(), "load.concurrency": pa.int64(),
          "workload.input_tokens": pa.int64(), "workload.num_requests": pa.int64(),
          "workload.output_tokens": pa.int64()}
RESULTS = ("point.json", "requests.parquet", "summary.json", "vllm_bench.json")


def replaysim(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """Run the CLI as a subprocess in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "runners.cli", *args],
        cwd=cwd, capture_output=True, text=True, timeout=300,
    )


def sweep(root: Path, *args: str, failed: int = 0) -> subprocess.CompletedProcess:
    """Run a multirun into ``root``; ``failed`` points are expected to fail (then exit 1)."""
    done = replaysim(root.parent, "-m", f"hydra.sweep.dir={root}", *args)
    assert done.returncode == (1 if failed else 0), done.stderr
    if failed:
        plural = "s" * (failed != 1)
        assert done.stderr.splitlines()[-1] == (
            f"replaysim: error: {failed} point{plural} of the sweep failed (summary.parquet lists them)"
        )
    return done


def summary(root: Path) -> pl.DataFrame:
    return pl.read_parquet(root / "summary.parquet")


@pytest.fixture(scope="module")
def multirun(tmp_path_factory) -> Path:
    """A 2 x 2 multirun sweep with the basic launcher."""
    root = tmp_path_factory.mktemp("multirun") / "sweep"
    sweep(root, *GRID, *SMALL)
    return root


def test_multirun_writes_job_files_and_typed_summary(multirun):
    for job in ("0", "1", "2", "3"):
        assert {p.name for p in (multirun / job).iterdir()} >= set(RESULTS), job
    table = pq.read_table(multirun / "summary.parquet")
    schema = table.schema
    assert schema.field("run_id").type == pa.string() and schema.field("status").type == pa.string()
    assert schema.field("seed").type == pa.int64()
    for key, type_ in PARAMS.items():
        assert schema.field(key).type == type_, key
    assert schema.field("completed").type == pa.int64() and schema.field("p99_ttft_ms").type == pa.float64()
    frame = pl.from_arrow(table)
    assert frame["status"].to_list() == ["ok"] * 4
    assert frame["run_id"].to_list() == [f"sweep/{i}" for i in range(4)]
    assert frame["load.concurrency"].to_list() == [1, 1, 4, 4]
    assert frame["detokenization.base_ms"].to_list() == [0.0, 2.85, 0.0, 2.85]
    for row in frame.iter_rows(named=True):
        document = json.loads((multirun / row["path"] / "summary.json").read_text())
        assert row["p99_ttft_ms"] == document["p99_ttft_ms"] and row["completed"] == document["completed"]
    assert json.loads(schema.metadata[b"parameters"]) == sorted(PARAMS)
    assert json.loads(schema.metadata[b"failed"]) == []


def test_requests_scan_across_jobs_needs_no_join(multirun):
    files = sorted(multirun.glob("*/requests.parquet"))
    schemas = {pq.read_schema(f).remove_metadata() for f in files}
    assert len(files) == 4 and len(schemas) == 1
    requests = pl.scan_parquet(str(multirun / "**" / "requests.parquet")).collect()
    assert requests.columns[:2] == ["run_id", "seed"]
    assert requests.columns[2:7] == sorted(PARAMS) and requests.columns[7:] == REQUESTS_SCHEMA.names
    per_run = requests.group_by("run_id", "load.concurrency", "detokenization.base_ms").len().sort("run_id")
    assert per_run["len"].to_list() == [8] * 4
    assert per_run["load.concurrency"].to_list() == [1, 1, 4, 4]


def test_batch_axes_give_the_multirun_rows(multirun, tmp_path):
    done = replaysim(tmp_path, f"hydra.run.dir={tmp_path / 'batch'}", *BATCH, *SMALL)
    assert done.returncode == 0, done.stderr
    batch = tmp_path / "batch"
    assert sorted(p.name for p in batch.glob("point-*")) == [f"point-00{i}" for i in range(4)]
    keys = ["load.concurrency", "detokenization.base_ms", "request_id"]
    one = pl.scan_parquet(str(multirun / "**" / "requests.parquet")).collect()
    two = pl.scan_parquet(str(batch / "**" / "requests.parquet")).collect()
    assert one.schema == two.schema
    assert one.drop("run_id").sort(keys).equals(two.drop("run_id").sort(keys))
    assert two["run_id"].unique().sort().to_list() == [f"batch/point-00{i}" for i in range(4)]
    drop = ["run_id", "path", "overrides"]
    assert summary(multirun).drop(drop).equals(summary(batch).drop(drop))


def test_batch_rejects_a_bad_point_before_writing(tmp_path):
    done = replaysim(tmp_path, f"hydra.run.dir={tmp_path / 'run'}", "sweep.batch.load.concurrency=[1,0]", *SMALL)
    assert done.returncode == 2
    assert done.stderr.startswith("replaysim: error: run/point-001 (load.concurrency=0): load.concurrency")
    assert not list(tmp_path.rglob("summary.json")) and not list(tmp_path.rglob("*.parquet"))


def test_failure_is_isolated_and_resume_skips_done_points(tmp_path):
    root = tmp_path / "sweep"
    first = sweep(root, "load.concurrency=1,0", *SMALL, failed=1)
    assert "sweep/1: failed: ConfigError: load.concurrency must be an integer >= 1, got 0" in first.stderr
    failure = json.loads((root / "1" / "failure.json").read_text())
    assert failure["error_type"] == "ConfigError" and "load.concurrency" in failure["error"]
    assert failure["overrides"][0] == "load.concurrency=0"
    assert not (root / "1" / "summary.json").exists() and (root / "0" / "summary.json").exists()
    table = summary(root)
    assert table["status"].to_list() == ["ok", "failed"]
    assert table["load.concurrency"].to_list() == [1, 0]
    assert table["error_type"].to_list() == [None, "ConfigError"]
    assert table["p99_ttft_ms"][1] is None
    assert json.loads(pq.read_schema(root / "summary.parquet").metadata[b"failed"]) == ["sweep/1"]

    done_at = (root / "0" / "summary.json").stat().st_mtime_ns
    second = sweep(root, "load.concurrency=1,0", *SMALL, failed=1)
    assert "sweep/0: skipped" in second.stdout
    assert summary(root)["status"].to_list() == ["skipped", "failed"]
    assert (root / "0" / "summary.json").stat().st_mtime_ns == done_at

    third = sweep(root, "load.concurrency=1,0", *SMALL, "force=true", failed=1)
    assert "sweep/0: ok" in third.stdout
    assert summary(root)["status"].to_list() == ["ok", "failed"]
    assert (root / "0" / "summary.json").stat().st_mtime_ns != done_at


def test_a_changed_config_is_not_skipped(tmp_path):
    root = tmp_path / "sweep"
    sweep(root, "load.concurrency=1,2", *SMALL)
    again = sweep(root, "load.concurrency=1,3", *SMALL)
    assert "sweep/0: skipped" in again.stdout and "sweep/1: ok" in again.stdout
    assert summary(root)["load.concurrency"].to_list() == [1, 3]


def test_joblib_preset_runs_a_sweep(multirun, tmp_path):
    root = tmp_path / "sweep"
    done = sweep(root, "hydra/launcher=local", "load.concurrency=1,4", "detokenization.base_ms=2.85", *SMALL)
    assert "numba cache warmed" in done.stdout
    assert summary(root)["status"].to_list() == ["ok", "ok"]
    reference = summary(multirun).filter(pl.col("detokenization.base_ms") == 2.85)
    assert summary(root)["p99_ttft_ms"].to_list() == reference["p99_ttft_ms"].to_list()
    expected = os.environ.get("NUMBA_NUM_THREADS")
    for job in ("0", "1"):
        runtime = json.loads((root / job / "point.json").read_text())["runtime"]
        # loky limits numba threads to cores // n_jobs (1 with n_jobs=-1) unless the env sets them
        assert runtime["numba_threads"] == (int(expected) if expected else 1)


def test_submitit_local_runs_the_job_path(tmp_path):
    pytest.importorskip("submitit")
    root = tmp_path / "sweep"
    sweep(root, "hydra/launcher=submitit_local", "load.concurrency=1,0", *SMALL, failed=1)
    assert summary(root)["status"].to_list() == ["ok", "failed"]
    assert (root / ".submitit").is_dir() and (root / "0" / "requests.parquet").exists()


def test_slurm_preset_renders_an_sbatch_array(tmp_path, monkeypatch):
    """The cluster preset's keys reach submitit's sbatch script (srun is faked: no Slurm here)."""
    submitit = pytest.importorskip("submitit")
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    (tmp_path / "srun").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    overrides = ["hydra/launcher=slurm", "hydra.launcher.partition=cpu", "hydra.launcher.timeout_min=30",
                 "hydra.launcher.cpus_per_task=2", f"hydra.sweep.dir={tmp_path}"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    launcher = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert launcher["_target_"].endswith("SlurmLauncher")
    # what hydra_submitit_launcher's BaseSubmititLauncher.launch does with its parameters
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    resources = {k if k in base else f"slurm_{k}": v for k, v in launcher.items()
                 if k not in ("_target_", "submitit_folder", "max_num_timeout")}
    executor = submitit.AutoExecutor(cluster="slurm", folder=str(tmp_path / ".submitit/%j"))
    executor.update_parameters(**resources)
    executor._executor.parameters["map_count"] = 100
    script = executor._executor._make_submission_file_text("python -m submitit.core._submit x", "uid")
    for line in ("#SBATCH --partition=cpu", "#SBATCH --time=30", "#SBATCH --cpus-per-task=2",
                 "#SBATCH --array=0-99%64", "export NUMBA_NUM_THREADS=2"):
        assert line in script, line


def test_runner_keys_pass_the_key_check_and_typos_do_not(capsys):
    check_overrides(["sweep.batch.load.concurrency=[1,2]", "+sweep.batch.seed=[0,1]", "force=true",
                     "export.detailed=false", "++sweep.batch.engine.aggregated.replicas=[1,2]"])
    for bad, expected in (
        ("sweep.batch.load.concurency=[1]", "did you mean load.concurrency"),
        ("sweep.bach.load.concurrency=[1]", "known keys under sweep"),
        ("export.csv=true", "known keys under export"),
        ("sweep.batch.force=[true]", "only config keys can be batch axes"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            check_overrides([bad])
        assert exit_info.value.code == 2
        assert expected in capsys.readouterr().err


def test_single_run_exports_vllm_bench_json(tmp_path):
    done = replaysim(tmp_path, f"hydra.run.dir={tmp_path / 'plain'}", *SMALL, "detokenization.base_ms=1")
    assert done.returncode == 0, done.stderr
    plain = json.loads((tmp_path / "plain" / "vllm_bench.json").read_text())
    # Without export.detailed: no per-request arrays, and no per-token receipts for the peak.
    assert set(plain).isdisjoint(DETAILED_KEYS) and plain["max_output_tokens_per_s"] is None
    done = replaysim(tmp_path, f"hydra.run.dir={tmp_path / 'run'}", *SMALL, "detokenization.base_ms=1",
                     "export.detailed=true")
    assert done.returncode == 0, done.stderr
    run = tmp_path / "run"
    assert pq.read_schema(run / "requests.parquet").equals(REQUESTS_SCHEMA)
    assert not (run / "point.json").exists() and not (run / "tokens.parquet").exists()
    bench = json.loads((run / "vllm_bench.json").read_text())
    document = json.loads((run / "summary.json").read_text())
    requests = pl.read_parquet(run / "requests.parquet")
    assert bench["duration"] == document["duration_s"] and bench["completed"] == 8 and bench["failed"] == 0
    assert bench["request_rate"] == "inf" and bench["max_concurrency"] == 64
    assert bench["ttfts"] == pytest.approx((requests["ttft_ms"] / 1000).to_list(), rel=1e-12)
    assert bench["input_lens"] == requests["input_tokens"].to_list() and bench["output_lens"] == [4] * 8
    itls = [gap for gaps in bench["itls"] for gap in gaps]
    assert len(itls) == 8 * 3 and np.mean(itls) * 1000 == pytest.approx(document["mean_itl_ms"], rel=1e-12)
    for key in ("mean_ttft_ms", "median_tpot_ms", "std_itl_ms", "p99_e2el_ms", "output_throughput"):
        assert bench[key] == document[key], key
    assert {key: plain[key] for key in plain if key not in ("date", "max_output_tokens_per_s")} == {
        key: bench[key] for key in plain if key not in ("date", "max_output_tokens_per_s")}


def test_vllm_bench_failed_requests_and_open_loop():
    result = simcore.run({
        "workload": {"num_requests": 6, "input_tokens": 32, "output_tokens": 3},
        "load": {"type": "constant_rate", "request_rate": 50.0},
        "max_time_ms": 60.0,
        "output": {"tokens": True},
    })
    bench = vllm_bench_document(result, result.tokens)
    status = result.requests.column("status").cast(pa.string()).to_pylist()
    assert bench["request_rate"] == 50.0 and bench["max_concurrency"] is None
    assert bench["failed"] == sum(s != "completed" for s in status) > 0
    assert bench["errors"] == ["" if s == "completed" else s for s in status]
    assert all(n == 0 for n, s in zip(bench["output_lens"], status) if s != "completed")
    assert "generated_texts" not in bench
    assert set(vllm_bench_document(result, None, detailed=False)).isdisjoint({"ttfts", "itls", "input_lens"})


def test_parameter_columns_take_declared_types():
    table = params.id_columns("s/0", 3, ["detokenization.base_ms", "load.concurrency", "metrics.percentiles",
                                         "workload.path", "seed"],
                              {"detokenization.base_ms": 0, "load.concurrency": 1.5,
                               "metrics.percentiles": [50, 99.9], "workload.path": None})
    assert table.column_names == ["run_id", "seed", "detokenization.base_ms", "load.concurrency",
                                  "metrics.percentiles", "workload.path"]
    assert table.to_pylist() == [{"run_id": "s/0", "seed": 3, "detokenization.base_ms": 0.0,
                                  "load.concurrency": None, "metrics.percentiles": [50.0, 99.9],
                                  "workload.path": None}]
    assert table.schema.field("metrics.percentiles").type == pa.list_(pa.float64())


@pytest.mark.parametrize("damage", ["delete", "corrupt"])
def test_resume_reruns_a_point_whose_results_are_damaged(tmp_path, damage):
    root = tmp_path / "sweep"
    sweep(root, "load.concurrency=1,2", *SMALL)
    requests = root / "1" / "requests.parquet"
    if damage == "delete":
        requests.unlink()
    else:
        data = bytearray(requests.read_bytes())
        data[len(data) // 2] ^= 0xFF
        requests.write_bytes(bytes(data))
    again = sweep(root, "load.concurrency=1,2", *SMALL)
    assert "sweep/0: skipped" in again.stdout and "sweep/1: ok" in again.stdout
    assert summary(root)["status"].to_list() == ["skipped", "ok"]
    assert pq.read_table(requests).num_rows == 8


def test_a_point_left_running_is_a_failed_point(tmp_path):
    """A point whose process died (point.json still says running) is recorded as failed at the summary."""
    root = tmp_path / "sweep"
    sweep(root, "load.concurrency=1,2", *SMALL)
    point = json.loads((root / "1" / "point.json").read_text())
    (root / "1" / "point.json").write_text(json.dumps({**point, "status": "running"}))
    (root / "1" / "manifest.json").unlink()  # killed before its manifest
    from runners.sweep import write_summary

    _, table = write_summary(root, quiet=True)
    assert table.column("status").to_pylist() == ["ok", "failed"]
    assert table.column("error_type").to_pylist() == [None, "PointLost"]
    failure = json.loads((root / "1" / "failure.json").read_text())
    assert "ended before the point finished" in failure["error"]
    assert not (root / "1" / "requests.parquet").exists()
    assert json.loads((root / "1" / "point.json").read_text())["parameters"] == point["parameters"]


def descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("when", ["workers started", "a point runs"])
def test_joblib_workers_die_with_their_parent(tmp_path, when):
    """SIGKILL to the launching process: no worker (idle or busy) survives it by more than a few seconds."""
    root = tmp_path / "sweep"
    command = [sys.executable, "-m", "runners.cli", "-m", f"hydra.sweep.dir={root}", "hydra/launcher=local",
               "hydra.launcher.n_jobs=2", "load.concurrency=1,2,3,4", "workload.num_requests=400000"]
    parent = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if when == "workers started":  # the reaper and two loky workers, none with a point yet
        ready = lambda: len(descendants(parent.pid)) >= 3  # noqa: E731
    else:
        ready = lambda: list(root.glob("*/point.json"))  # noqa: E731
    deadline = time.monotonic() + 240
    while not ready():
        assert parent.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    workers = descendants(parent.pid)
    parent.kill()
    parent.wait()
    time.sleep(5)
    assert [pid for pid in workers if alive(pid)] == []
