"""Bad input to the readers of user files and the options of the newer commands: counted.

    python bench/fuzz_readers.py [--examples 2000] [--cli 20] [--seed 2032]

In process, each reader and option parser is given ``--examples`` inputs drawn by the
property tests' own strategies (``tests/test_reliability2.py``: mostly good fields with one or
two bad ones, damaged lines, random bytes); every input must be either accepted and bounded
or refused with one line naming the file (and line or JSON path) or the key.  Then
``--cli`` cases per command run as a user runs them (a subprocess each): a measured run and
options for ``replaysim-calibrate``, a ``capacity`` section as overrides for
``replaysim-capacity``; each must exit 0, or exit 2 with one stderr line, no traceback and
nothing written.  Prints a table of inputs, refusals and unclean outcomes per reader and
command (docs/reliability.md).  Not a test: minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import test_reliability2 as t  # noqa: E402  (the strategies and checks of the property tests)


def tally(strategy: st.SearchStrategy, check, examples: int, seed: int) -> tuple[Counter, list]:
    """Run ``check`` over ``examples`` drawn inputs; count its outcomes, keep the unclean ones."""
    counts: Counter = Counter()
    unclean: list = []

    @settings(max_examples=examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(value):
        try:
            counts[check(value)] += 1
        except Exception as exc:  # noqa: BLE001 - every other outcome is a defect to report
            counts["unclean"] += 1
            unclean.append((repr(value)[:200], f"{type(exc).__name__}: {str(exc)[:300]}"))

    hypothesis_seed(seed)(run)()
    return counts, unclean


def readers(examples: int, seed: int, work: Path) -> dict[str, tuple[Counter, list]]:
    """Each in-process reader and option parser over ``examples`` inputs."""
    work.mkdir(parents=True, exist_ok=True)
    cases = {
        "measured run, JSONL (calibrate)": (t.jsonl_runs(), lambda x: t.check_measured(work / "run.jsonl", x)),
        "measured run, vllm bench JSON (calibrate)": (t.vllm_runs(), lambda x: t.check_measured(work / "b.json", x)),
        "measured run, any bytes (calibrate)": (st.binary(max_size=300),
                                                lambda x: t.check_measured(work / "bytes.jsonl", x)),
        "request and session table, CSV": (st.one_of(t.table_files(), st.binary(max_size=200)),
                                           lambda x: t.check_table(work / "table.csv", x)),
        "all-reduce curve": (st.one_of(t.curve_files(), st.binary(max_size=200)),
                             lambda x: t.check_curve(work / "curve.txt", x)),
        "replaysim-capacity capacity.* keys": (t.capacity_sections(), t.check_capacity_options),
        "replaysim-calibrate options": (t.CALIBRATE_OPTIONS, lambda argv: t.check_calibrate_argv(work, argv)),
    }
    return {name: tally(strategy, check, examples, seed) for name, (strategy, check) in cases.items()}


def command_case(module: str, args: list[str], cwd: Path, timeout: float) -> str:
    """Run one case; ``"ran"``, ``"refused"`` (exit 2, one line, nothing written) or ``"unclean: ..."``."""
    before = set(cwd.iterdir())
    try:
        done = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        return "ran"  # a valid search or fit that takes long: not bad input
    lines = done.stderr.splitlines()
    if done.returncode == 0:
        return "ran"
    if "Traceback" in done.stderr:
        return f"unclean: traceback {lines[-1][:200] if lines else ''}"
    if done.returncode != 2 or len(lines) != 1 or ": error: " not in lines[0]:
        return f"unclean: exit {done.returncode}, {len(lines)} lines: {done.stderr[:200]!r}"
    if set(cwd.iterdir()) - before - {cwd / "m.jsonl", cwd / "b.json"}:
        return f"unclean: wrote {sorted(p.name for p in set(cwd.iterdir()) - before)}"
    return "refused"


def commands(cases: int, seed: int, work: Path, timeout: float) -> dict[str, tuple[Counter, list]]:
    """``cases`` command-line cases each for replaysim-calibrate and replaysim-capacity."""
    out: dict[str, tuple[Counter, list]] = {}
    measured = st.one_of(t.jsonl_runs(), t.vllm_runs())
    calibrate_inputs = st.tuples(measured, t.CALIBRATE_OPTIONS)
    capacity_inputs = t.capacity_sections()
    for name, strategy, module in (("replaysim-calibrate (command line)", calibrate_inputs, "runners.calibrate"),
                                   ("replaysim-capacity (command line)", capacity_inputs, "runners.capacity")):
        counts: Counter = Counter()
        unclean: list = []
        drawn = []

        @settings(max_examples=cases, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def collect(value):
            drawn.append(value)

        hypothesis_seed(seed)(collect)()
        for index, value in enumerate(drawn[:cases]):
            cwd = work / f"{module}-{index}"
            cwd.mkdir(parents=True)
            if module == "runners.calibrate":
                text, argv = value
                (cwd / "m.jsonl").write_text(text)
                args = ["m.jsonl", "--out", "out", "--max-evals", "16", *argv]
            else:
                args = ["load.type=poisson", "workload.num_requests=20", "capacity.plots=false",
                        *(f"capacity.{key}={json.dumps(v) if not isinstance(v, str) else v}"
                          for key, v in _flat(value))]
            outcome = command_case(module, args, cwd, timeout)
            counts[outcome.split(":")[0]] += 1
            if outcome.startswith("unclean"):
                unclean.append((" ".join(args)[:200], outcome))
        out[name] = (counts, unclean)
    return out


def _flat(raw: dict, prefix: str = "") -> list[tuple[str, object]]:
    items = []
    for key, value in raw.items():
        if isinstance(value, dict) and value and prefix == "":
            items += _flat(value, f"{key}.")
        else:
            items.append((f"{prefix}{key}", value))
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=2000, help="inputs per reader or option parser")
    parser.add_argument("--cli", type=int, default=20, help="command-line cases per command")
    parser.add_argument("--seed", type=int, default=2032)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a command-line case may run")
    args = parser.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        results = readers(args.examples, args.seed, Path(tmp) / "readers")
        if args.cli:
            results.update(commands(args.cli, args.seed, Path(tmp) / "commands", args.timeout))
    print("| reader or command | inputs | accepted (valid, bounded) | refused in one line | unclean |")
    print("| --- | --- | --- | --- | --- |")
    totals: Counter = Counter()
    for name, (counts, _) in results.items():
        accepted = counts["accepted"] + counts["ran"]
        total = sum(counts.values())
        totals.update(inputs=total, accepted=accepted, refused=counts["refused"], unclean=counts["unclean"])
        print(f"| {name} | {total} | {accepted} | {counts['refused']} | {counts['unclean']} |")
    print(f"| all | {totals['inputs']} | {totals['accepted']} | {totals['refused']} | {totals['unclean']} |")
    for name, (_, unclean) in results.items():
        for value, error in unclean[:5]:
            print(f"UNCLEAN {name}: {value} -> {error}")
    print(f"{time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
