"""The wheel holds what an installed ``replaysim`` reads: code, Hydra configs, sample traces, licence, metadata.

The wheel is built from a copy of the sources (a stale ``build/`` of the
checkout cannot leak into it); installing it into a fresh venv and running it
from another directory is ``.ci/run``'s job.
"""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import simcore

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "simcore", "runners")
PACKAGE_DATA = [p for d in ("runners/conf", "runners/samples", "runners/help", "simcore/models/data") for p in (ROOT / d).rglob("*")
                if p.is_file() and "__pycache__" not in p.parts] + [ROOT / "runners" / "compile_timeline.json"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("replaysim-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


def test_wheel_ships_the_code_configs_and_samples(wheel):
    names = set(wheel.namelist())
    code = {p.relative_to(ROOT).as_posix() for d in ("simcore", "runners") for p in (ROOT / d).rglob("*.py")}
    data = {p.relative_to(ROOT).as_posix() for p in PACKAGE_DATA}
    assert {"runners/conf/config.yaml", "runners/conf/engine/pd_1p2d.yaml",
            "runners/samples/mooncake_conversation_300.jsonl", "runners/samples/README.md",
            "simcore/models/data/models.json", "simcore/models/data/gpus.json"} <= data
    assert code | data <= names
    shipped = {n for n in names if ".dist-info/" not in n}
    assert shipped == code | data  # no tests, caches or numba index files


def test_wheel_metadata(wheel):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    dist_info = f"replaysim-{project['version']}.dist-info"
    metadata = email.message_from_bytes(wheel.read(f"{dist_info}/METADATA"))
    assert metadata["Version"] == simcore.__version__ == project["version"]
    assert metadata["License-Expression"] == "Apache-2.0 AND CC-BY-4.0"  # the Azure excerpt is CC-BY-4.0
    assert metadata["Requires-Python"] == ">=3.11"
    assert metadata["Author"] == "replaysim developers"
    assert "Programming Language :: Python :: 3.11" in metadata.get_all("Classifier")
    for licence in ("LICENSE", "runners/samples/README.md"):
        assert wheel.read(f"{dist_info}/licenses/{licence}") == (ROOT / licence).read_bytes()
    entry_points = wheel.read(f"{dist_info}/entry_points.txt").decode()
    assert "replaysim = runners.entry:replaysim" in entry_points
    assert "replaysim-capacity = runners.entry:replaysim_capacity" in entry_points
    assert "replaysim-analyze = runners.analyze:main" in entry_points
    assert "replaysim-models = runners.models:main" in entry_points
