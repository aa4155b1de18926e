"""Issue 13's fault injection: kills, signals, full disks and concurrent writers against result sets.

Each scenario runs the real ``replaysim`` command (or, for the 500 concurrent
writer trials, ``runners.writer.write_results`` in two forked processes
started at one instant) in a temporary directory and checks what a reader of
``output.dir`` sees afterwards: the previous complete set or the new complete
set (``runners.writer.verified_set``), never a mix, and what the process
printed and exited with.  Prints one CSV row per scenario
(``scenario,trials,ok,detail``) and every failing trial.

Scenarios: ``kill9-simulate``, ``kill9-write``, ``sigint``, ``sigterm``,
``full-disk`` (a small tmpfs, root only), ``read-only``, ``file-in-the-way``,
``writers`` (500 trials), ``writers-cli``, ``sweep-basic``, ``sweep-joblib``
(killed with SIGKILL; workers must be gone within a few seconds; a resume
reruns exactly the points without a verified manifest, one of which is
corrupted on purpose).  ``python bench/fault_injection.py`` (``--trials``,
``--writer-trials``, ``--only``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import simcore  # noqa: E402
from runners.reaper import LAUNCHER_PID_ENV  # noqa: E402
from runners.writer import verified_set, write_results  # noqa: E402

SMALL = ["workload.num_requests=8", "workload.input_tokens=64", "workload.output_tokens=4"]
#: A run that simulates for minutes in little memory (664 million decode passes one after another:
#: each request decodes until it fills the rank's KV cache).
ENDLESS = ["workload.num_requests=1600", "workload.output_tokens=10000000", "load.concurrency=1", "output.mode=bounded"]
#: A run whose result files take a good part of its time (1.6 million token rows).
BIG_WRITE = ["workload.num_requests=200000", "workload.input_tokens=16", "workload.output_tokens=8",
             "load.concurrency=512", "output.tokens=true", "output.passes=true"]


def env() -> dict:
    out = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    out["PYTHONPATH"] = str(ROOT)
    return out


def start(cwd: Path, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([shutil.which("replaysim"), f"hydra.run.dir={cwd / 'run'}", *args], cwd=cwd,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env(),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kwargs)


def temps(out: Path) -> list[str]:
    return [p.name for p in out.rglob("*.tmp")] if out.exists() else []


def result_names(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) if out.exists() else []


def set_seed(out: Path) -> int | None:
    """The seed of the complete set in ``out`` (summary and requests agree), or None when there is none."""
    if verified_set(out) is None:
        return None
    summary = json.loads((out / "summary.json").read_text())
    rows = pq.read_table(out / "requests.parquet").num_rows
    return summary["seed"] if rows == summary["num_requests"] else -1


class Tally:
    def __init__(self, name: str):
        self.name, self.trials, self.ok, self.failures, self.notes = name, 0, 0, [], []

    def check(self, ok: bool, why: str) -> None:
        self.trials += 1
        self.ok += ok
        if not ok:
            self.failures.append(why)

    def row(self) -> str:
        return f"{self.name},{self.trials},{self.ok},{'; '.join(self.notes)}"


def timed_run(cwd: Path, out: Path, args: list[str]) -> float:
    began = time.monotonic()
    run = start(cwd, f"output.dir={out}", *args)
    run.wait(600)
    return time.monotonic() - began


def kill_during_simulate(base: Path, trials: int, rng: random.Random) -> Tally:
    tally = Tally("kill9-simulate")
    for trial in range(trials):
        cwd = base / f"ks{trial}"
        cwd.mkdir()
        out = cwd / "out"
        run = start(cwd, f"output.dir={out}", "seed=2", *ENDLESS)
        time.sleep(rng.uniform(2.0, 5.0))
        run.kill()
        run.wait(60)
        names = result_names(out)
        tally.check(not names and not temps(out), f"trial {trial}: left {names} {temps(out)}")
    return tally


def previous_set(cwd: Path, out: Path) -> None:
    """A complete set of seed 1 in ``out``, as a previous run leaves it."""
    subprocess.run([shutil.which("replaysim"), f"hydra.run.dir={cwd / 'run0'}", f"output.dir={out}", "seed=1",
                    *SMALL], cwd=cwd, env=env(), capture_output=True, check=True)


def wait_for_write(run: subprocess.Popen, out: Path, timeout: float) -> float | None:
    """Poll until the run's first temporary result file appears (its write began); the instant, or None."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and run.poll() is None:
        if temps(out):
            return time.monotonic()
        time.sleep(0.005)
    return None


def kill_during_write(base: Path, trials: int, rng: random.Random) -> Tally:
    tally = Tally("kill9-write")
    probe = base / "kw-probe"
    probe.mkdir()
    run = start(probe, f"output.dir={probe / 'out'}", "seed=2", *BIG_WRITE)
    began = wait_for_write(run, probe / "out", 600)
    run.wait(600)
    write_s = time.monotonic() - began if began else 1.0
    outcomes = {"previous": 0, "new": 0}
    left = 0
    for trial in range(trials):
        cwd = base / f"kw{trial}"
        cwd.mkdir()
        out = cwd / "out"
        previous_set(cwd, out)
        run = start(cwd, f"output.dir={out}", "seed=2", *BIG_WRITE)
        if wait_for_write(run, out, 600) is not None:
            time.sleep(rng.uniform(0.0, 1.1) * write_s)  # anywhere in the write, or just after it
        run.kill()
        run.wait(60)
        seed = set_seed(out)
        left += bool(temps(out))
        ok = seed in (1, 2)
        if ok:
            outcomes["previous" if seed == 1 else "new"] += 1
        # the next writer removes what the killed one left and commits its own set
        subprocess.run([shutil.which("replaysim"), f"hydra.run.dir={cwd / 'run3'}", f"output.dir={out}", "seed=3",
                        *SMALL], cwd=cwd, env=env(), capture_output=True)
        ok = ok and set_seed(out) == 3 and not temps(out)
        tally.check(ok, f"trial {trial}: seed after the kill {seed}, after the next run {set_seed(out)}, "
                        f"temps {temps(out)}")
    tally.notes.append(f"write phase {write_s:.2f} s; after the kill: previous set {outcomes['previous']}, new set "
                       f"{outcomes['new']}; hidden temp files left by SIGKILL in {left} (removed by the next run)")
    return tally


def signal_stop(base: Path, trials: int, rng: random.Random, signum: int) -> Tally:
    name, code, text = (("sigint", 130, "SIGINT (Ctrl-C)") if signum == signal.SIGINT else ("sigterm", 143, "SIGTERM"))
    tally = Tally(name)
    probe = base / f"{name}-probe"
    probe.mkdir()
    total = timed_run(probe, probe / "out", ["seed=2", *BIG_WRITE])
    latencies = []
    for trial in range(trials):
        cwd = base / f"{name}{trial}"
        cwd.mkdir()
        out = cwd / "out"
        previous_set(cwd, out)
        run = start(cwd, f"output.dir={out}", "seed=2", *BIG_WRITE)
        if trial % 2:  # during the write
            wait_for_write(run, out, 600)
            time.sleep(rng.uniform(0.0, 0.3))
        else:  # during the simulation
            time.sleep(rng.uniform(0.2, 0.6) * total)
        sent = time.monotonic()
        run.send_signal(signum)
        _, stderr = run.communicate(timeout=60)
        waited = time.monotonic() - sent
        lines = [line for line in stderr.splitlines() if line.strip()]
        seed = set_seed(out)
        if run.returncode == 0:  # finished before the signal came
            ok = seed == 2 and not temps(out)
        else:
            latencies.append(waited)
            ok = (run.returncode == code and waited < 1.0 and len(lines) == 1 and text in lines[0]
                  and seed == 1 and not temps(out) and "Traceback" not in stderr)
        tally.check(ok, f"trial {trial}: exit {run.returncode} after {waited:.2f} s, {len(lines)} stderr lines "
                        f"{lines[-1:]!r}, set seed {seed}, temps {temps(out)}")
    if latencies:
        tally.notes.append(f"stopped in {min(latencies):.2f}-{max(latencies):.2f} s ({len(latencies)} stopped, "
                           f"{trials - len(latencies)} had finished)")
    return tally


def environment_faults(base: Path) -> list[Tally]:
    tallies = []
    mounts = []

    def mount(where: Path, options: str) -> bool:
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
        if done.returncode == 0:
            mounts.append(where)
        return done.returncode == 0

    try:
        full = Tally("full-disk")
        for trial in range(3):
            cwd = base / f"full{trial}"
            cwd.mkdir()
            if not mount(cwd / "fs", "size=512k"):
                full.notes.append("skipped: cannot mount a tmpfs (needs root)")
                break
            out = cwd / "fs" / "out"
            previous_set(cwd, out)
            run = start(cwd, f"output.dir={out}", "seed=2", "workload.num_requests=300000", "output.tokens=true")
            _, stderr = run.communicate(timeout=600)
            lines = stderr.splitlines()
            full.check(run.returncode == 74 and len(lines) == 1 and "No space left on device" in lines[0]
                       and set_seed(out) == 1 and not temps(out),
                       f"trial {trial}: exit {run.returncode}, {stderr.strip()[-200:]!r}, seed {set_seed(out)}")
        tallies.append(full)
        for name, make, reason in (
            ("read-only", lambda cwd: cwd / "ro" if mount(cwd / "ro", "size=64k,ro") else None,
             "Read-only file system"),
            ("file-in-the-way", lambda cwd: (cwd / "f").write_text("x") and cwd / "f", "File exists"),
        ):
            tally = Tally(name)
            cwd = base / name
            cwd.mkdir()
            out = make(cwd)
            if out is None:
                tally.notes.append("skipped: cannot mount a tmpfs (needs root)")
            else:
                run = start(cwd, f"output.dir={out}", *SMALL)
                _, stderr = run.communicate(timeout=300)
                tally.check(run.returncode == 74 and stderr == f"replaysim: error: cannot write results to {out}: "
                                                                 f"{reason}\n" and not (cwd / "run").exists(),
                            f"exit {run.returncode}, {stderr!r}")
            tallies.append(tally)
    finally:
        for where in mounts:
            subprocess.run(["umount", str(where)], capture_output=True)
    return tallies


def _write(result, out: str, barrier) -> None:
    barrier.wait()
    write_results(result, out)


def concurrent_writers(base: Path, trials: int) -> Tally:
    tally = Tally("writers")
    small = {"workload": {"num_requests": 8, "input_tokens": 64, "output_tokens": 4, "output_dist": "uniform"}}
    results = {seed: simcore.run({**small, "seed": seed, "output": {"passes": True}}) for seed in (1, 2)}
    winners = {1: 0, 2: 0}
    context = multiprocessing.get_context("fork")
    for trial in range(trials):
        out = base / f"w{trial}"
        barrier = context.Barrier(2)
        procs = [context.Process(target=_write, args=(results[seed], str(out), barrier)) for seed in (1, 2)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(60)
        seed = set_seed(out)
        ok = seed in (1, 2) and all(p.exitcode == 0 for p in procs) and not temps(out)
        if ok:  # the set is the winner's, whole: its requests table equals that run's
            ok = pq.read_table(out / "requests.parquet").equals(results[seed].requests)
            winners[seed] += ok
        tally.check(ok, f"trial {trial}: set seed {seed}, exits {[p.exitcode for p in procs]}")
        shutil.rmtree(out, ignore_errors=True)
    tally.notes.append(f"last writer seed 1: {winners[1]}, seed 2: {winners[2]}")
    return tally


def concurrent_cli_writers(base: Path, trials: int) -> Tally:
    tally = Tally("writers-cli")
    for trial in range(trials):
        cwd = base / f"wc{trial}"
        cwd.mkdir()
        out = cwd / "out"
        runs = [subprocess.Popen([shutil.which("replaysim"), f"hydra.run.dir={cwd / str(seed)}", f"output.dir={out}",
                                  f"seed={seed}", *SMALL, "workload.output_dist=uniform"], cwd=cwd, env=env(),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for seed in (1, 2)]
        codes = [run.wait(300) for run in runs]
        seed = set_seed(out)
        tally.check(codes == [0, 0] and seed in (1, 2) and not temps(out), f"trial {trial}: {codes}, seed {seed}")
    return tally


def workers_of(launcher_pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"{LAUNCHER_PID_ENV}={launcher_pid}".encode() in environ:
            found.append(int(entry.name))
    return found


def killed_sweep(base: Path, launcher: str) -> Tally:
    tally = Tally(f"sweep-{launcher}")
    cwd = base / f"sweep-{launcher}"
    cwd.mkdir()
    sweep_dir = cwd / "multirun"
    points = "1,2,3,4,5,6"
    args = ["-m", f"hydra.sweep.dir={sweep_dir}", f"seed={points}", "workload.num_requests=300000",
            "workload.input_tokens=64", "workload.output_tokens=32", "load.concurrency=256"]
    if launcher == "joblib":
        args.append("hydra/launcher=local")
    run = subprocess.Popen([shutil.which("replaysim"), *args], cwd=cwd, env=env(), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # kill it once some point is done and others are not
        done = [d for d in sweep_dir.glob("*") if d.is_dir() and verified_set(d)] if sweep_dir.exists() else []
        if done:
            break
        time.sleep(0.2)
    run.kill()  # at once: the points take about a second each, so the others are not done yet
    run.wait(60)
    time.sleep(4.0)  # the reaper's poll and grace period
    alive = workers_of(run.pid)
    tally.check(not alive, f"workers alive 4 s after the launcher died: {alive}")
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    dirs = sorted(d for d in sweep_dir.iterdir() if d.is_dir() and d.name.isdigit())
    complete = [d for d in dirs if verified_set(d)]
    tally.notes.append(f"{len(complete)} of 6 points complete when killed")
    corrupted = None
    if complete:  # a complete point whose requests file is damaged afterwards must be rerun
        corrupted = complete[0]
        with open(corrupted / "requests.parquet", "r+b") as handle:
            handle.seek(10)
            handle.write(b"\xff\xff\xff\xff")
    stamps = {d.name: (d / "summary.json").stat().st_mtime_ns for d in complete}
    resumed = subprocess.run([shutil.which("replaysim"), *args], cwd=cwd, env=env(), capture_output=True, text=True,
                             timeout=900)
    after = sorted(d for d in sweep_dir.iterdir() if d.is_dir() and d.name.isdigit())
    all_done = len(after) == 6 and all(verified_set(d) for d in after)
    skipped = [name for name, stamp in stamps.items() if (sweep_dir / name / "summary.json").stat().st_mtime_ns == stamp]
    expected_skipped = sorted(d.name for d in complete if d != corrupted)
    tally.check(resumed.returncode == 0 and all_done, f"resume exit {resumed.returncode}, all complete {all_done}: "
                                                      f"{resumed.stderr.strip()[-300:]!r}")
    tally.check(sorted(skipped) == expected_skipped, f"resume skipped {skipped}, expected {expected_skipped}")
    tally.check(pq.read_table(sweep_dir / "summary.parquet").num_rows == 6, "summary.parquet has not 6 rows")
    tally.notes.append(f"resume skipped {len(skipped)} verified points and reran the corrupted one and the rest")
    return tally


SCENARIOS = ("kill9-simulate", "kill9-write", "sigint", "sigterm", "environment", "writers", "writers-cli",
             "sweep-basic", "sweep-joblib")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--trials", type=int, default=5, help="trials of each kill and signal scenario")
    parser.add_argument("--writer-trials", type=int, default=500)
    parser.add_argument("--only", default=",".join(SCENARIOS))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    only = args.only.split(",")
    base = Path(tempfile.mkdtemp(prefix="replaysim-faults-"))
    tallies: list[Tally] = []
    try:
        if "kill9-simulate" in only:
            tallies.append(kill_during_simulate(base, args.trials, rng))
        if "kill9-write" in only:
            tallies.append(kill_during_write(base, args.trials * 2, rng))
        if "sigint" in only:
            tallies.append(signal_stop(base, args.trials, rng, signal.SIGINT))
        if "sigterm" in only:
            tallies.append(signal_stop(base, args.trials, rng, signal.SIGTERM))
        if "environment" in only:
            tallies += environment_faults(base)
        if "writers" in only:
            tallies.append(concurrent_writers(base, args.writer_trials))
        if "writers-cli" in only:
            tallies.append(concurrent_cli_writers(base, args.trials * 2))
        for launcher in ("basic", "joblib"):
            if f"sweep-{launcher}" in only:
                tallies.append(killed_sweep(base, launcher))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print("scenario,trials,ok,detail")
    for tally in tallies:
        print(tally.row())
    for tally in tallies:
        for why in tally.failures:
            print(f"FAIL [{tally.name}] {why}")
    print(f"{sum(t.trials for t in tallies)} fault trials: {sum(t.ok for t in tallies)} as specified")


if __name__ == "__main__":
    main()
