"""The compose-once sweeper's batches composed once (runners.multirun) against Hydra's own job path.

Each job that :func:`runners.multirun.compose` reads off one composition is
checked against the same job composed by Hydra (``load_sweep_config``) and set
up by Hydra's ``run_job``: the three ``.hydra/`` records byte for byte, the log
file, the resolved config the task would read, the job directory and run id.
The end-to-end tests run sweeps through the command with the composed path and
with it turned off (a ``sitecustomize`` hook, as in test_sweep_isolation) and
compare every file they write.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.core.utils import run_job
from hydra.types import HydraContext, RunMode
from omegaconf import OmegaConf, open_dict

import runners.conf_store  # noqa: F401  (base_config, runner_config, ${sample:...})
from runners import multirun
from runners.hydra_private import basic_sweeper

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["workload.num_requests=8", "workload.input_tokens=64", "workload.output_tokens=4"]


class _NoCallbacks:
    def on_job_start(self, **kwargs):
        pass

    def on_job_end(self, **kwargs):
        pass


@pytest.fixture(scope="module")
def loader():
    Plugins.instance()  # Hydra's plugin scan first (runners.hydra_private.basic_sweeper)
    with initialize_config_module(config_module="runners.conf", version_base="1.3"):
        yield GlobalHydra.instance().config_loader()


@pytest.fixture(autouse=True)
def _keep_logging():
    """run_job and launch reconfigure the root logger; leave it as found."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    hydra_cfg = HydraConfig.instance().cfg
    yield
    for handler in root.handlers:
        if handler not in handlers:
            handler.close()
    root.handlers[:] = handlers
    root.setLevel(level)
    HydraConfig.instance().cfg = hydra_cfg


def master_and_batch(loader, sweep_dir: Path, *overrides: str):
    master = loader.load_configuration(
        "config", [*overrides, f"hydra.sweep.dir={sweep_dir}", "hydra.mode=MULTIRUN"], RunMode.MULTIRUN)
    task = [line for line in OmegaConf.to_container(master.hydra.overrides.task)]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (batch,) = basic_sweeper().split_arguments(OverridesParser.create().parse_overrides(task), None)
    return master, batch


def hydra_job(loader, master, overrides, num: int) -> dict:
    """What Hydra's basic launcher and run_job make of one job: files under its directory, the task's config."""
    seen = {}

    def task(cfg):
        seen["mapping"] = OmegaConf.to_container(cfg, resolve=True)
        seen["dir"] = HydraConfig.get().runtime.output_dir

    cfg = loader.load_sweep_config(master, list(overrides))
    with open_dict(cfg):
        cfg.hydra.job.id = num
        cfg.hydra.job.num = num
    ret = run_job(hydra_context=HydraContext(config_loader=loader, callbacks=_NoCallbacks()), task_function=task,
                  config=cfg, job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
    assert ret.status.name == "COMPLETED", ret._return_value
    for handler in logging.getLogger().handlers:
        handler.flush()
    out = Path(seen["dir"])
    return {"files": {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()},
            "mapping": seen["mapping"], "dir": out}


SWEEPS = [
    ("load.concurrency=1,2,3", *SMALL),
    ("engine=pd_1p2d", "load.concurrency=1,4", "detokenization.base_ms=0,2.85", *SMALL),
    ("workload=azure_sample", "load.speedup=0.5,1.0", "metrics.percentiles=[50,99],[90]"),
    ("workload.path='1e3','a b',plain", "+sweep.batch.seed=[0,1]", "export.aiperf=true,false"),
    ("load.concurrency=1,2", "hydra.sweep.subdir=${hydra.job.override_dirname}",
     "hydra.job.config.override_dirname.exclude_keys=[seed]", "seed=3"),
    ("load.concurrency=range(1,4)", "hydra/job_logging=disabled", "hydra.output_subdir=null"),
]


@pytest.mark.parametrize("overrides", SWEEPS, ids=[" ".join(s) for s in SWEEPS])
def test_composed_jobs_are_hydras_jobs(loader, tmp_path, overrides):
    sweep_dir = tmp_path / "sweep"
    master, batch = master_and_batch(loader, sweep_dir, *overrides)
    composed = multirun.compose(loader, master, batch, 0)
    assert composed is not None and len(composed.jobs) == len(batch)
    for num, (job, lines) in enumerate(zip(composed.jobs, batch)):
        expected = hydra_job(loader, master, lines, num)
        shutil.rmtree(sweep_dir)
        assert job.num == num and job.overrides == list(lines)
        assert job.dir == expected["dir"] and job.mapping == expected["mapping"]
        assert job.run_id == f"sweep/{expected['dir'].relative_to(sweep_dir).as_posix()}"
        subdir = master.hydra.output_subdir
        multirun.write_records(job, None if subdir is None else str(subdir))
        got = {p.relative_to(job.dir).as_posix(): p.read_bytes() for p in sorted(job.dir.rglob("*")) if p.is_file()}
        assert got == expected["files"]
        shutil.rmtree(sweep_dir)


@pytest.mark.parametrize("overrides", [
    ("engine=pd_1p2d,sglang", *SMALL),  # a config-group choice differs
    ("+extra=1,2",),  # an added key
    ("load.concurrency=${seed},2",),  # an interpolation
    ("load.concurrency=1,2", "load={concurrency: 3}"),  # a key above the swept one
    ("load.concurrency=1,2", "hydra/launcher=local"),  # another launcher
    ("load.concurrency=1,2", "hydra.job.chdir=true"),
])
def test_batches_that_do_not_qualify_are_left_to_hydra(loader, tmp_path, overrides):
    master, batch = master_and_batch(loader, tmp_path / "sweep", *overrides)
    try:
        composed = multirun.compose(loader, master, batch, 0)
    except Exception:  # noqa: BLE001 - Hydra's composition of the first job refuses it, as its sweeper would
        return
    assert composed is None


def test_jobs_naming_different_keys_are_left_to_hydra(loader, tmp_path):
    master, batch = master_and_batch(loader, tmp_path / "sweep", "load.concurrency=1,2")
    batch[1] = ["load.request_rate=2"]
    assert multirun.compose(loader, master, batch, 0) is None


def test_yaml_is_omegaconfs():
    documents = [
        {"a": "1e3", "b": "true", "c": "007", "d": "a b", "e": None, "f": [1, 2.5, "x"], "g": {}, "h": [],
         "i": "ünï", "j": "multi\nline", "k": "  padded ", "l": "key: value", "m": "- item", "n": 1e300,
         "o": float("inf"), "p": "null", "q": "~", "r": "${x}", "s": "", "t": "#", "u": True},
        ["load.concurrency=1", "x='a,b'"],
    ]
    for document in documents:
        assert multirun.to_yaml(document) == OmegaConf.to_yaml(OmegaConf.create(document))


HOOK = '''
import runners.multirun as multirun

multirun.compose = lambda *args, **kwargs: None
'''


def command_sweep(where: Path, *args: str, hydra_path: bool) -> subprocess.CompletedProcess:
    """A multirun into ``where/sweep``; ``hydra_path``: every batch through Hydra's launcher."""
    where.mkdir(parents=True)
    paths = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    if hydra_path:
        (where / "hook").mkdir()
        (where / "hook" / "sitecustomize.py").write_text(HOOK)
        paths.insert(0, str(where / "hook"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run([sys.executable, "-m", "runners.cli", "-m", f"hydra.sweep.dir={where / 'sweep'}", *args],
                          cwd=where, env=env, capture_output=True, text=True, timeout=300)


def files_of(root: Path, replace: str) -> dict[str, bytes]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes().replace(replace.encode(), b"<ROOT>")
            if path.name == "point.json":  # where it ran: the process id differs
                data = b"\n".join(line for line in data.splitlines() if b'"pid"' not in line)
            elif path.name == "vllm_bench.json":  # the wall-clock date of the export
                data = re.sub(rb'"date":"[0-9-]+"', b'"date":""', data)
            elif path.name == "manifest.json":  # the export's digest follows its date
                document = json.loads(data)
                document["files"].pop("vllm_bench.json", None)
                data = json.dumps(document).encode()
            out[path.relative_to(root).as_posix()] = data
    return out


@pytest.mark.slow
@pytest.mark.parametrize("args", [
    ("load.concurrency=1,2,4", "detokenization.base_ms=0,2.85", *SMALL),
    ("load.concurrency=1,3", "sweep.batch.seed=[0,1]", "export.aiperf=true", *SMALL),
    ("engine=pd_1p2d", "load.concurrency=2,5", "output.tokens=true", "output.trace=true", *SMALL),
])
def test_a_composed_sweep_writes_what_hydras_launcher_does(tmp_path, args):
    composed = command_sweep(tmp_path / "a", *args, hydra_path=False)
    hydra = command_sweep(tmp_path / "b", *args, hydra_path=True)
    assert composed.returncode == 0 and hydra.returncode == 0, (composed.stderr, hydra.stderr)
    got = files_of(tmp_path / "a" / "sweep", str(tmp_path / "a"))
    expected = files_of(tmp_path / "b" / "sweep", str(tmp_path / "b"))
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert got[name] == expected[name], name
