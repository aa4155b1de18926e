"""Result sets as a whole: manifest, lock, stale temporary files, environment errors, signals, resume."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import simcore
from runners import writer
from runners.writer import MANIFEST_FILE, file_digest, locked, verified_set, write_results

SMALL = ["workload.num_requests=8", "workload.input_tokens=64", "workload.output_tokens=4"]


@pytest.fixture(scope="module")
def result():
    return simcore.run({"workload": {"num_requests": 4, "output_tokens": 2}, "output": {"passes": True}})


def replaysim(cwd: Path, *args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runners.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, **kwargs)


def test_the_manifest_lists_every_file_with_its_size_and_checksum(tmp_path, result):
    written = write_results(result, tmp_path)
    files = json.loads((tmp_path / MANIFEST_FILE).read_text())["files"]
    assert list(files) == [path.name for path in written]
    for path in written:
        assert files[path.name] == {"size": path.stat().st_size, "sha256": file_digest(path)}
    assert verified_set(tmp_path) == [path.name for path in written]


def test_a_damaged_or_missing_file_makes_the_set_incomplete(tmp_path, result):
    write_results(result, tmp_path)
    (tmp_path / "passes.parquet").unlink()
    assert verified_set(tmp_path) is None
    write_results(result, tmp_path)
    data = bytearray((tmp_path / "requests.parquet").read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other content
    (tmp_path / "requests.parquet").write_bytes(bytes(data))
    assert verified_set(tmp_path) is None


def test_a_rerun_removes_only_files_of_the_previous_set(tmp_path, result):
    write_results(result, tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "tokens.parquet").write_text("not written by replaysim")
    fewer = simcore.run({"workload": {"num_requests": 4, "output_tokens": 2}})
    write_results(fewer, tmp_path)
    assert not (tmp_path / "passes.parquet").exists()  # the previous set's, not this one's
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "tokens.parquet").read_text() == "not written by replaysim"


def test_the_temporary_files_of_a_killed_writer_are_removed_by_the_next_one(tmp_path, result):
    stale = tmp_path / ".requests.parquet.0123456789ab.tmp"
    stale.write_bytes(b"half")
    other = tmp_path / ".requests.parquet.keep.tmp"  # not replaysim's pattern
    other.write_bytes(b"x")
    write_results(result, tmp_path)
    assert not stale.exists() and other.exists()


def test_a_failed_write_leaves_the_previous_set(tmp_path, result, monkeypatch):
    write_results(result, tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def full_disk(path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(writer, "json_file", lambda document, compact=False: full_disk)
    with pytest.raises(OSError):
        write_results(result, tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_a_writer_waits_for_the_lock_of_another(tmp_path, result):
    order = []
    with locked(tmp_path):
        thread = threading.Thread(target=lambda: (write_results(result, tmp_path), order.append("written")))
        thread.start()
        time.sleep(0.3)
        order.append("released")
    thread.join(10)
    assert order == ["released", "written"]


def test_concurrent_runs_into_one_directory_do_not_mix(tmp_path):
    out = tmp_path / "out"
    runs = [subprocess.Popen([sys.executable, "-m", "runners.cli", f"output.dir={out}", f"seed={seed}",
                              f"hydra.run.dir={tmp_path / str(seed)}", *SMALL, "workload.output_dist=uniform"],
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for seed in (1, 2, 3)]
    assert [run.wait(300) for run in runs] == [0, 0, 0]
    assert verified_set(out) is not None
    seed = json.loads((out / "summary.json").read_text())["seed"]
    completed = json.loads((out / "summary.json").read_text())["completed"]
    assert pq.read_table(out / "requests.parquet").num_rows == completed == 8 and seed in (1, 2, 3)
    expected = simcore.run({"seed": seed, "workload": {"num_requests": 8, "input_tokens": 64, "output_tokens": 4,
                                                       "output_dist": "uniform"}})
    assert pq.read_table(out / "requests.parquet").equals(expected.requests)


@pytest.mark.parametrize("make, reason", [
    (lambda out: out.write_text("a file"), "File exists"),
    (lambda out: (out.mkdir(), out.chmod(0o500)), "Permission denied"),
])
def test_an_unwritable_output_dir_is_one_line_and_exit_74(tmp_path, make, reason):
    if reason == "Permission denied" and os.geteuid() == 0:
        pytest.skip("root writes into a read-only directory")
    out = tmp_path / "out"
    make(out)
    done = replaysim(tmp_path, f"output.dir={out}", f"hydra.run.dir={tmp_path / 'run'}", *SMALL)
    assert done.returncode == 74
    assert done.stderr == f"replaysim: error: cannot write results to {out}: {reason}\n"


def test_a_full_disk_is_one_line_and_exit_74(tmp_path):
    """The write raises ENOSPC (the Parquet writer is patched in a child process)."""
    out = tmp_path / "out"
    script = (
        "import errno, os, sys, pyarrow.parquet as pq\n"
        "def full(*a, **k): raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
        "pq.write_table = full\n"
        "from runners.cli import main\n"
        f"sys.argv = ['replaysim', 'output.dir={out}', 'hydra.run.dir={tmp_path / 'run'}', *{SMALL!r}]\n"
        "main()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 74, done.stderr
    assert done.stderr.splitlines()[-1] == f"replaysim: error: cannot write results to {out}: No space left on device"
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("signum, code, name", [(signal.SIGINT, 130, "SIGINT (Ctrl-C)"), (signal.SIGTERM, 143, "SIGTERM")])
def test_a_signal_stops_a_run_with_one_line_and_no_file(tmp_path, signum, code, name):
    out = tmp_path / "out"
    run = subprocess.Popen([sys.executable, "-m", "runners.cli", f"output.dir={out}", f"hydra.run.dir={tmp_path}",
                            # each request decodes until it fills the rank's KV cache, one after another:
                            # 664 million passes, far more than a signal's 4 s, in little memory (64
                            # requests took under 4 s once decode passes got fast, and ended first)
                            "workload.num_requests=1600", "workload.output_tokens=10000000", "load.concurrency=1",
                            "output.mode=bounded"],
                           cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           # a shell's background job inherits SIGINT ignored; a terminal's Ctrl-C is not
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(4)  # in the simulation (or its compilation)
    sent = time.monotonic()
    run.send_signal(signum)
    _, stderr = run.communicate(timeout=60)
    waited = time.monotonic() - sent
    assert run.returncode == code, stderr
    assert stderr.strip().splitlines()[-1] == f"replaysim: stopped by {name}; results of unfinished runs were not written"
    assert not out.exists() or list(out.iterdir()) == []
    print(f"stopped {waited:.2f} s after {name}")


@pytest.mark.parametrize("options, sub, reason", [
    ("size=64k", "out", "No space left on device"),   # a real full disk: the tables do not fit
    ("size=64k,ro", "", "Read-only file system"),
    ("size=64k,ro", "out", "Read-only file system"),
])
def test_a_real_full_or_read_only_file_system_is_one_line_and_exit_74(tmp_path, tmpfs, options, sub, reason):
    out = tmpfs(options) / sub if sub else tmpfs(options)
    done = replaysim(tmp_path, f"output.dir={out}", f"hydra.run.dir={tmp_path / 'run'}", "workload.num_requests=20000")
    assert done.returncode == 74, done.stderr
    assert done.stderr == f"replaysim: error: cannot write results to {out}: {reason}\n"
    assert not out.exists() or list(out.iterdir()) == []


def test_an_environment_error_leaves_no_outputs_dir(tmp_path):
    """As for bad input, the Hydra run directory made for the failed run is removed (output.dir elsewhere)."""
    (tmp_path / "f").write_text("a file")
    done = replaysim(tmp_path, "output.dir=f/out", *SMALL)
    assert done.returncode == 74, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_a_manifest_naming_files_elsewhere_is_not_trusted(tmp_path, result):
    out = tmp_path / "out"
    write_results(result, out)
    outside = tmp_path / "precious.txt"
    outside.write_text("keep")
    document = json.loads((out / MANIFEST_FILE).read_text())
    document["files"]["../precious.txt"] = {"size": 4, "sha256": file_digest(outside)}
    (out / MANIFEST_FILE).write_text(json.dumps(document))
    assert verified_set(out) is None
    write_results(result, out)  # the previous manifest is not read as a list of files to remove
    assert outside.read_text() == "keep"
