"""The ``replaysim`` command line: result files, output directory, bad input (SPEC §10-11),
``--version``, shell completion, presets."""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
from omegaconf import OmegaConf
import pyarrow.parquet as pq
import pytest

import simcore
from runners.cli import CONFIG_DIR, check_overrides
from runners.sweep import RUNNER_DEFAULTS
from runners import params
from runners.writer import write_results
from simcore.config import load_config
from simcore.schema import PASSES_SCHEMA, REQUESTS_SCHEMA, SCHEMA_VERSION, TOKENS_SCHEMA

SMALL = [
    "workload.num_requests=8",
    "load.concurrency=2",
    "workload.input_tokens=64",
    "workload.output_tokens=4",
]
RESULT_NAMES = ("summary.json", "requests.parquet", "passes.parquet", "tokens.parquet")


def replaysim(tmp_path: Path, *args: str, script: bool = False, run_dir: bool = True,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the CLI in ``tmp_path`` with its Hydra run dir at ``tmp_path/run`` (unless ``run_dir`` is false)."""
    command = [shutil.which("replaysim")] if script else [sys.executable, "-m", "runners.cli"]
    run = [f"hydra.run.dir={tmp_path / 'run'}"] if run_dir else []
    return subprocess.run(
        [*command, *run, *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=None if env is None else {**os.environ, **env},
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
    "added-key-with-value": (["+engine.aggregated.replicas=2"], None, ["engine.aggregated.replicas=2"]),
    "unparsable": (["load.concurrency=[1,2"], None, ["load.concurrency=[1,2"]),
    "misspelled-launcher": (["hydra/launcher=lcoal"], None, ["lcoal is not an option of hydra/launcher", "local"]),
    "misspelled-group": (["hydra/launchr=local"], None, ["hydra/launchr is not a config group", "hydra/launcher"]),
    "unknown-preset": (["engine=pd_1p2x"], None, ["pd_1p2x is not an option of engine", "pd_1p2d"]),
    "added-preset": (["+engine=sglang"], None, ["engine=<option>"]),
    "unknown-sample": (["workload.source=mooncake", "workload.path=${sample:nope.jsonl}"], None,
                       ["workload.path", "nope.jsonl", "mooncake_conversation_300.jsonl"]),
    "missing-trace": (["workload=mooncake_sample", "workload.path=nope.jsonl"], None, ["workload.path", "nope.jsonl"]),
    "missing-column": ([TABLE, ALL_ROWS], "request_id,input_tokens\na,5\n", ["requests.csv", "output_tokens"]),
    "trace-without-send": (
        [TABLE, ALL_ROWS, "load.type=trace"], HEADER + "a,5,2\nb,6,3\n", ["load.type", "send_ms"]
    ),
    "duplicate-id": ([TABLE, ALL_ROWS], HEADER + "a,5,2\nb,6,3\na,7,1\n", ["requests.csv", "line 4", "'a'"]),
    "bad-value": ([TABLE, ALL_ROWS], HEADER + "a,5,2\nb,abc,3\n", ["requests.csv:3", "input_tokens", "abc"]),
    # a key below a null node of Hydra's own config fails an assertion inside OmegaConf
    "hydra-key-below-null": (["hydra.sweeper.params.x=1"], None, ["hydra.sweeper.params.x=1", "Hydra cannot apply"]),
    "hydra-node-interpolation": (["hydra.run.dir=${nope}"], None, ["hydra.run.dir", "'nope' not found"]),
    "no-key": (["=5"], None, ["=5: an override needs a key"]),
    "sweep-type-the-sweeper-refuses": (["hydra.mode=MULTIRUN", "load.concurrency=interval(1,2)"], None,
                                       ["load.concurrency=interval(1,2)", "interval() needs a sampling sweeper"]),
    "range-step-zero": (["hydra.mode=MULTIRUN", "load.concurrency=range(1,5,0)"], None,
                        ["load.concurrency=range(1,5,0)", "must not be 0"]),
    "flag-after-the-overrides": (["-m", "load.concurrency=1,2"], None,
                                 ["unrecognized arguments: load.concurrency=1,2", "flags such as -m go before"]),
    "output-dir-batch-axis": (["sweep.batch.output.dir=[a,b]"], None, ["sweep.batch.output.dir", "cannot be a batch axis"]),
}


@pytest.mark.parametrize(("args", "csv", "expected"), BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_exits_2_with_one_line(tmp_path, args, csv, expected):
    if csv is not None:
        (tmp_path / "requests.csv").write_text(csv)
        args = [*args, f"workload.path={tmp_path / 'requests.csv'}"]
    # A table or trace case replays its own rows: SMALL's lengths (and its concurrency
    # with a trace load) would have no effect there, which is an error of its own.
    replays_rows = TABLE in args or "workload=mooncake_sample" in args
    small = [] if replays_rows else SMALL
    done = replaysim(tmp_path, *small, *args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("replaysim: error: "), done.stderr
    for part in expected:
        assert part in lines[0]
    assert "Traceback" not in done.stderr + done.stdout
    assert result_files(tmp_path) == []
    assert not (tmp_path / "run").exists()  # the run dir Hydra made for the rejected run is gone


@pytest.mark.parametrize("args", [["timing.base_ms=nan"], ["engine=nope"], ["-m", "hydra/launcher=lcoal"],
                                  ["workload=mooncake_sample", "workload.path=nope.jsonl"]])
def test_rejected_run_leaves_no_outputs_dir(tmp_path, args):
    done = replaysim(tmp_path, *SMALL, *args, run_dir=False)
    assert done.returncode == 2, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_rejected_run_keeps_an_existing_run_dir(tmp_path):
    (tmp_path / "outputs").mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    done = replaysim(tmp_path, *SMALL, "timing.base_ms=nan")
    assert done.returncode == 2, done.stderr
    assert (run / "notes.txt").read_text() == "mine"
    assert (tmp_path / "outputs").is_dir()


def test_version():
    done = subprocess.run([sys.executable, "-m", "runners.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"replaysim {importlib.metadata.version('replaysim')}\n"


def test_shell_completion(tmp_path):
    done = replaysim(tmp_path, "--shell-completion", "install=bash", run_dir=False)
    assert done.returncode == 0, done.stderr
    assert "complete -o nospace -o default -F hydra_bash_completion" in done.stdout
    for line, expected in (("engine=", "engine=pd_1p2d"), ("hydra/launcher=lo", "hydra/launcher=local"),
                           ("load.concur", "load.concurrency=")):
        done = replaysim(tmp_path, "--shell-completion", "query=bash", run_dir=False,
                         env={"COMP_LINE": f"replaysim {line}"})
        assert done.returncode == 0, done.stderr
        assert expected in done.stdout.split(), (line, done.stdout)
    assert list(tmp_path.iterdir()) == []


def test_help_lists_the_presets(tmp_path):
    done = replaysim(tmp_path, "--help", run_dir=False)
    assert done.returncode == 0, done.stderr
    groups = dict(line.split(": ", 1) for line in done.stdout.splitlines() if line.startswith(("engine: ", "workload: ")))
    assert groups == {
        "engine": "attention_dp_2, h100, pd_1p2d, replicas_2, sglang, trtllm",
        "workload": "azure_sample, chat, long_context, mooncake_sample, sessions, shared_prefix",
    }


@pytest.mark.parametrize(
    "argv",
    [
        ["-m", "hydra/launcher=basic", "hydra.run.dir=x", "++hydra.job.chdir=false"],
        ["--cfg", "job", "metrics.goodput.ttft_ms=5", "metrics.goodput=null", "~max_time_ms"],
        ["engine.aggregated.replicas=2,4", "metrics.percentiles=[50,99.9]"],
        ["engine=pd_1p2d", "workload=mooncake_sample", "hydra/launcher=local"],
        ["-m", "engine=h100,sglang", "workload=null", "hydra/launcher=glob(*)"],
        ["--shell-completion", "install=bash"],
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


def compose(*overrides: str) -> dict:
    """The simulation config composed from ``runners/conf`` (runner keys and ``hydra`` left out)."""
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = OmegaConf.to_container(hydra_compose("config", overrides=list(overrides)), resolve=True)
    return {k: v for k, v in cfg.items() if k not in RUNNER_DEFAULTS}


def with_changes(changes: dict[str, object]) -> dict:
    expected = copy.deepcopy(simcore.DEFAULTS)
    for key, value in changes.items():
        params.assign(expected, key, value)
    return expected


SAMPLES = Path(__file__).resolve().parents[1] / "runners" / "samples"
PRESETS = {
    "engine=h100": {},
    "engine=replicas_2": {"engine.aggregated.replicas": 2},
    "engine=attention_dp_2": {"engine.aggregated.attention_dp": 2},
    "engine=pd_1p2d": {"engine.mode": "disaggregated", "engine.prefill.replicas": 1, "engine.decode.replicas": 2,
                       "engine.kv_transfer.bandwidth_gb_per_second": 25,
                       "engine.kv_transfer.bytes_per_token": 131072},
    "engine=sglang": {"engine.policy": "sglang"},
    "engine=trtllm": {"engine.policy": "trtllm"},
    "workload=mooncake_sample": {"workload.source": "mooncake", "workload.num_requests": None,
                                 "workload.path": str(SAMPLES / "mooncake_conversation_300.jsonl")},
    "workload=azure_sample": {"workload.source": "azure", "workload.num_requests": None,
                              "workload.path": str(SAMPLES / "azure_conv_300.csv")},
    "workload=chat": {"workload.input_dist": "lognormal", "workload.input_tokens": 1155, "workload.input_std": 1109,
                      "workload.output_dist": "lognormal", "workload.output_tokens": 211, "workload.output_std": 163},
    "workload=shared_prefix": {"workload.source": "shared_prefix", "workload.shared_prefix.system_prompt_len": 128,
                               "workload.shared_prefix.question_len": 64, "workload.shared_prefix.output_len": 64},
    "workload=sessions": {"workload.source": "sessions"},
    "workload=long_context": {"workload.input_dist": "lognormal", "workload.input_tokens": 12035,
                              "workload.input_std": 15801, "workload.output_dist": "lognormal",
                              "workload.output_tokens": 343, "workload.output_std": 250},
}


def test_default_composition_is_the_builtin_defaults():
    assert compose() == simcore.DEFAULTS


@pytest.mark.parametrize("override", PRESETS)
def test_preset_sets_only_its_keys(override):
    config = compose(override)
    assert config == with_changes(PRESETS[override])
    load_config(config)


def test_presets_run_from_any_directory(tmp_path):
    done = replaysim(tmp_path, "engine=pd_1p2d", "workload=mooncake_sample", "load.type=trace", "load.speedup=100",
                     script=shutil.which("replaysim") is not None)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["num_requests"] == summary["completed"] == 300  # the sample's rows
    assert summary["config"]["engine"]["mode"] == "disaggregated"


def test_config_dir_adds_user_presets(tmp_path):
    (tmp_path / "myconf" / "engine").mkdir(parents=True)
    (tmp_path / "myconf" / "engine" / "mine.yaml").write_text("policy: sglang\n")
    user = ["--config-dir", "myconf", f"hydra.run.dir={tmp_path / 'run'}", *SMALL]  # options before overrides
    done = replaysim(tmp_path, *user, "engine=mine", run_dir=False)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["config"]["engine"]["policy"] == "sglang"
    done = replaysim(tmp_path, *user, "engine=nope", run_dir=False)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("replaysim: error: ") and "engine/nope" in line and "mine" in line


def test_sweep_over_presets_names_them(tmp_path):
    done = replaysim(tmp_path, "-m", "engine=h100,pd_1p2d", *SMALL, f"hydra.sweep.dir={tmp_path / 'sweep'}",
                     run_dir=False)
    assert done.returncode == 0, done.stderr
    summary = pl.read_parquet(tmp_path / "sweep" / "summary.parquet").sort("run_id")
    assert summary["engine"].to_list() == ["h100", "pd_1p2d"]
    assert pl.read_parquet(tmp_path / "sweep" / "1" / "requests.parquet")["engine"].unique().to_list() == ["pd_1p2d"]
