"""Every ``replaysim`` command in the code blocks of README.md and docs/*.md runs as written.

Each documented command line runs in a fresh directory laid out like a fresh
clone (``<tmp>/clone``, holding the ``docs/`` the examples read, with the
project's ``shared/`` beside it as ``<tmp>/shared``), with ``workload.num_requests``
capped by an appended override so that the million-request and sweep examples
stay small.  Each must exit 0 and write the files it promises.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.slurm_cluster import nodes_up

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROGRAMS = {
    "replaysim": "runners.cli",
    "replaysim-analyze": "runners.analyze",
    "replaysim-calibrate": "runners.calibrate",
    "replaysim-capacity": "runners.capacity",
    "replaysim-models": "runners.models",
}
#: Requests per run at most: enough for every metric, small enough for the suite.
MAX_REQUESTS = 200


def documented_commands() -> list[tuple[str, list[list[str]]]]:
    """``(file:line, [argv, ...])`` for each shell line of a code block that runs a documented program.

    Continuation lines are joined, ``# comments`` dropped, ``a && b`` split into
    its commands; other programs of a line (``pip install ...``) are left out.
    """
    found = []
    for document in DOCUMENTS:
        text = document.read_text()
        for block in re.finditer(r"^```([^\n]*)\n(.*?)^```", text, flags=re.M | re.S):
            if block.group(1).strip() not in ("", "sh", "bash", "shell", "console"):
                continue
            first = text.count("\n", 0, block.start(2)) + 1
            lines = block.group(2).split("\n")
            start = 0
            while start < len(lines):
                end, line = start, lines[start]
                while line.endswith("\\") and end + 1 < len(lines):
                    end += 1
                    line = line[:-1] + " " + lines[end]
                commands = []
                if re.match(r"\s*(\S+ .*&& )?replaysim", line):  # a shell line, not a directory tree
                    commands = [argv for argv in split_and(shlex.split(line, comments=True)) if argv[0] in PROGRAMS]
                if commands and all(commands != seen for _, seen in found):  # docs repeat some
                    found.append((f"{document.relative_to(ROOT)}:{first + start}", commands))
                start = end + 1
    return found


def split_and(tokens: list[str]) -> list[list[str]]:
    """The commands of a tokenised ``a && b`` line (empty ones left out)."""
    commands: list[list[str]] = [[]]
    for token in tokens:
        if token == "&&":
            commands.append([])
        else:
            commands[-1].append(token)
    return [command for command in commands if command]


COMMANDS = documented_commands()


def test_the_docs_have_commands():
    assert any(where.startswith("README.md") for where, _ in COMMANDS)


def skip_reason(argv: list[str]) -> str | None:
    """Why a documented command cannot run here, or None."""
    if "timing.type=aic" in argv and importlib.util.find_spec("aiconfigurator_core") is None:
        return "needs the optional extra aic (pip install -e '.[aic]'), not installed"
    if "capacity.search=optuna" in argv and importlib.util.find_spec("optuna") is None:
        return "needs the optional extra capacity (pip install -e '.[capacity]'), not installed"
    if any("../shared" in arg for arg in argv) and not SHARED.is_dir():
        return f"needs the project's shared data beside the checkout ({SHARED})"
    if "hydra/launcher=slurm" in argv and not nodes_up():
        return "needs a Slurm cluster with a node up (start one with .ci/slurm-up.sh)"
    return None


def value_of(argv: list[str], key: str) -> str | None:
    """The last value an ``argv`` gives ``key`` (``key=value``), or None."""
    values = [arg.split("=", 1)[1] for arg in argv if arg.startswith(f"{key}=")]
    return values[-1] if values else None


def shrunk(argv: list[str]) -> list[str]:
    """``argv`` with ``workload.num_requests`` capped at :data:`MAX_REQUESTS` (a later override wins)."""
    requests = value_of(argv, "workload.num_requests")
    if argv[0] == "replaysim" and requests is not None and requests.isdigit() and int(requests) > MAX_REQUESTS:
        return [*argv, f"workload.num_requests={MAX_REQUESTS}"]
    return argv


def expected_files(argv: list[str], cwd: Path) -> list[Path]:
    """The files the documented command promises (docs/results.md, docs/sweeps.md)."""
    if argv[0] == "replaysim-analyze":
        return [cwd / argv[1] / "analysis" / "table.csv"]
    if argv[0] == "replaysim-calibrate":
        out = cwd / argv[argv.index("--out") + 1]
        return [out / "calibrated.yaml", out / "calibration.json"]
    if argv[0] == "replaysim-capacity":
        return [cwd / value_of(argv, "output.dir") / name for name in ("capacity.parquet", "pareto.parquet")]
    if argv[0] == "replaysim-models":
        return []  # prints only
    if "-m" in argv:
        given = value_of(argv, "hydra.sweep.dir")
        sweeps = [cwd / given] if given is not None else list(cwd.glob("multirun/*/*"))
        assert len(sweeps) == 1, sweeps  # one sweep directory, multirun/<date>/<time>/ by default
        sweep = sweeps[0]
        return [sweep / "summary.parquet", sweep / "0" / "summary.json", sweep / "0" / "requests.parquet"]
    out = value_of(argv, "output.dir")
    if any(arg.startswith("sweep.batch.") for arg in argv):
        return [cwd / out / "summary.parquet"]
    if out is not None:
        return [cwd / out / "summary.json", cwd / out / "requests.parquet"]
    runs = sorted(cwd.glob("outputs/*/*/summary.json"))
    assert len(runs) == 1, runs  # one Hydra run directory, outputs/<date>/<time>/
    return [runs[0], runs[0].with_name("requests.parquet")]


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run a documented program as its console script (or ``python -m`` when not installed)."""
    script = shutil.which(argv[0])
    command = [script] if script else [sys.executable, "-m", PROGRAMS[argv[0]]]
    return subprocess.run([*command, *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("commands", [c for _, c in COMMANDS], ids=[where for where, _ in COMMANDS])
def test_documented_command_runs(tmp_path, commands):
    for argv in commands:
        reason = skip_reason(argv)
        if reason is not None:
            pytest.skip(reason)
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / "docs").symlink_to(ROOT / "docs")
    if SHARED.is_dir():
        (tmp_path / "shared").symlink_to(SHARED)
    for argv in commands:
        done = run(shrunk(argv), clone)
        assert done.returncode == 0, f"{shlex.join(argv)}\n{done.stderr}"
        for path in expected_files(argv, clone):
            assert path.is_file(), f"{shlex.join(argv)}: no {path.relative_to(clone)}"
