"""replaysim-capacity: capacities that follow from hand arithmetic, the Pareto front, bad input, resume.

The hand-built deployment: one worker, fixed timing (every pass 10 ms),
requests of 1,000 prompt tokens and one output token, a 1,000-token pass
budget, so each request is exactly one 10 ms prefill pass and passes run one
request at a time.  Sent at a constant rate r (gap g = 1000 / r ms), request n
(from 0) starts at max(n·g, 10·n) and its TTFT is 10 ms while g >= 10, else
10 + n·(10 − g): the server is exactly busy at r = 100 req/s.  In a closed loop
of C clients every request after the first C waits for the C − 1 ahead of it:
TTFT = 10·C ms.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import simcore
from runners import capacity as cap
from runners.capacity_search import Bracket, Probe, Slo, pareto_mask, parse_slo

ROOT = Path(__file__).resolve().parents[1]
N = 101  # requests: the p99 of N TTFTs is the one at index 0.99·(N − 1) = 99, no interpolation
PASS_MS = 10.0
BUSY = {
    "workload": {"num_requests": N, "input_tokens": 1000, "output_tokens": 1},
    "timing": {"type": "fixed", "prefill_ms": PASS_MS, "decode_ms": 5.0},
    "engine": {"aggregated": {"max_batched_tokens": 1000}},
}


def mapping(load: dict, capacity: dict, **extra) -> dict:
    out = json.loads(json.dumps(BUSY))
    out["load"] = load
    out["capacity"] = capacity
    out.update(extra)
    return out


def search(config: dict, out_dir: Path, batch: dict | None = None):
    """Run the capacity search in-process as the command does; returns (capacity table, options)."""
    if batch:
        config = {**config, "sweep": {"batch": batch}}
    options, runner, sim = cap.split_capacity(config)
    table = cap.run_capacity(sim, [], runner, options, out_dir)
    return table, options


def p99_ttft(config: dict, axis: str, value: float) -> float:
    run = json.loads(json.dumps({k: v for k, v in config.items() if k != "capacity"}))
    section, key = axis.split(".")
    run[section][key] = value
    return simcore.run(run).summary["p99_ttft_ms"]


def test_open_loop_capacity_is_the_rate_where_the_p99_slo_is_crossed(tmp_path):
    slack, tol = 0.099, 0.01
    # p99 TTFT = 10 + 99·(10 − g) <= 10 + slack  <=>  g >= 10 − slack/99
    exact = 1000.0 / (PASS_MS - slack / 99)
    config = mapping({"type": "constant_rate"},
                     {"axis": "load.request_rate", "tolerance": tol, "slo": {"p99_ttft_ms": PASS_MS + slack}})
    table, _ = search(config, tmp_path)
    (row,) = table.to_pylist()
    found = row["capacity"]
    assert row["status"] == "ok"
    assert found <= exact <= found * (1 + tol)
    assert row["slo_p99_ttft_ms"] <= PASS_MS + slack
    assert p99_ttft(config, "load.request_rate", found) <= PASS_MS + slack
    assert p99_ttft(config, "load.request_rate", found * (1 + 2 * tol)) > PASS_MS + slack
    # Doubling from 1 brackets it in [64, 128], then bisection halves a 64-wide bracket
    # until hi <= lo·1.01 (~1 req/s wide): 8 doublings + 6 halvings.
    assert row["probes"] == 8 + 6


def test_closed_loop_capacity_is_the_concurrency_where_ttft_crosses_the_slo(tmp_path):
    limit = 45.0  # TTFT = 10·C <= 45  <=>  C <= 4
    config = mapping({"type": "closed_loop"}, {"axis": "load.concurrency", "slo": {"p99_ttft_ms": limit}})
    table, _ = search(config, tmp_path)
    (row,) = table.to_pylist()
    assert (row["capacity"], row["status"]) == (4, "ok")
    assert row["p99_ttft_ms"] == pytest.approx(40.0)
    assert p99_ttft(config, "load.concurrency", 4) <= limit
    assert p99_ttft(config, "load.concurrency", math.ceil(4 * 1.02)) > limit  # the next integer above 4·(1 + 2·tol)


def test_goodput_fraction_slo(tmp_path):
    # TTFT_n = 10 + n·(10 − g) <= 10.5 for n <= 0.5/(10 − g); a share >= 0.5 of 101 requests
    # needs 51 good ones (n = 0..50): 0.5/(10 − g) >= 50  <=>  g >= 9.99.
    exact = 1000.0 / 9.99
    config = mapping({"type": "constant_rate"},
                     {"axis": "load.request_rate", "tolerance": 0.005, "slo": {"goodput_fraction": 0.5}},
                     metrics={"goodput": {"ttft_ms": 10.5}})
    table, _ = search(config, tmp_path)
    (row,) = table.to_pylist()
    assert row["capacity"] <= exact <= row["capacity"] * 1.005
    assert row["slo_goodput_fraction"] >= 0.5


def test_given_bounds_report_an_infeasible_and_a_censored_capacity(tmp_path):
    below = mapping({"type": "constant_rate"},
                    {"axis": "load.request_rate", "lo": 150, "hi": 300, "slo": {"p99_ttft_ms": 10.5}})
    (row,) = search(below, tmp_path / "below")[0].to_pylist()
    assert (row["capacity"], row["status"], row["probes"], row["on_pareto"]) == (None, "below_lo", 2, False)
    above = mapping({"type": "constant_rate"},
                    {"axis": "load.request_rate", "lo": 10, "hi": 50, "slo": {"p99_ttft_ms": 10.5}})
    (row,) = search(above, tmp_path / "above")[0].to_pylist()
    assert (row["capacity"], row["status"], row["probes"]) == (50, "above_hi", 2)


def test_pd_gpu_count_adds_both_pools():
    config = simcore.config.load_config({
        "engine": {"mode": "disaggregated", "prefill": {"replicas": 1, "attention_dp": 2},
                   "decode": {"replicas": 3}},
    })
    assert cap.gpu_count(config) == 1 * 2 + 3 * 1


def _staircase(threshold: float, bracket: Bracket) -> Bracket:
    while not bracket.done:
        values = bracket.next_values()
        bracket.record([Probe(v, v <= threshold, {"p99_ttft_ms": v}, {}) for v in values])
    return bracket


@pytest.mark.parametrize("threshold", [0.7, 1.0, 37.3, 1000.0])
def test_bisection_brackets_a_step_within_tolerance(threshold):
    bracket = _staircase(threshold, Bracket(0.5, None, 0.01, False, 30))
    assert bracket.status == "ok"
    assert bracket.capacity <= threshold < bracket.capacity * 1.01
    assert bracket.hi <= bracket.capacity * 1.01


@pytest.mark.parametrize("threshold", [1, 2, 7, 100])
def test_integer_bisection_finds_the_step_exactly(threshold):
    bracket = _staircase(threshold + 0.5, Bracket(1, None, 0.01, True, 30))
    assert (bracket.capacity, bracket.hi) == (threshold, threshold + 1)


def test_doubling_gives_up_after_max_doublings():
    bracket = _staircase(math.inf, Bracket(1.0, None, 0.01, False, 3))
    assert (bracket.status, bracket.capacity, len(bracket.probes)) == ("unbounded", 8.0, 4)


def test_non_monotone_metric_is_reported():
    slo = parse_slo({"p99_ttft_ms": 50}, 1.0)
    bracket = Bracket(1.0, None, 0.01, False, 5)
    bracket.probes = [Probe(1.0, True, {"p99_ttft_ms": 30.0}, {}), Probe(2.0, True, {"p99_ttft_ms": 20.0}, {}),
                      Probe(3.0, True, {"p99_ttft_ms": 25.0}, {}), Probe(3.5, True, {"p99_ttft_ms": 24.0}, {}),
                      Probe(4.0, False, {"p99_ttft_ms": 60.0}, {})]
    # drops: 30 -> 20 (a third) and 25 -> 24 (4%); the largest is reported
    assert bracket.non_monotone(slo) == ["p99_ttft_ms falls 33.33% from 1 to 2 (30 -> 20)"]
    rising = Slo({"goodput_fraction": 0.5}, 1.0)
    bracket.probes = [Probe(1.0, True, {"goodput_fraction": 0.8}, {}), Probe(2.0, True, {"goodput_fraction": 0.9}, {})]
    assert bracket.non_monotone(rising) == ["goodput_fraction rises 12.50% from 1 to 2 (0.8 -> 0.9)"]


def test_improvements_within_the_monotone_tolerance_are_not_noted():
    slo = parse_slo({"p99_ttft_ms": 50, "p99_tpot_ms": 10}, 1.0)
    bracket = Bracket(1.0, None, 0.01, False, 5)
    # ttft falls 30 -> 29.8 (0.67%), tpot 5 -> 4 (20%): with 1% only tpot is noted
    bracket.probes = [Probe(1.0, True, {"p99_ttft_ms": 30.0, "p99_tpot_ms": 5.0}, {}),
                      Probe(2.0, True, {"p99_ttft_ms": 29.8, "p99_tpot_ms": 4.0}, {})]
    assert bracket.non_monotone(slo, 0.01) == ["p99_tpot_ms falls 20.00% from 1 to 2 (5 -> 4)"]
    assert len(bracket.non_monotone(slo, 0.0)) == 2
    assert bracket.non_monotone(slo, 0.25) == []
    assert cap.parse_options({"slo": {"p99_ttft_ms": 50}}).monotone_tolerance == 0.01


def test_off_a_terminal_the_search_prints_a_line_every_interval():
    import io
    import time

    out = io.StringIO()
    bar = cap.StepBar(4, interval=0.05, stream=out, enabled=False)
    bar(1, 4)
    time.sleep(0.3)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2 and all(line.startswith("replaysim-capacity: 1/4 configurations done, ") for line in lines)


def test_slo_judged_at_the_seed_quantile():
    slo = Slo({"p99_ttft_ms": 3.0, "goodput_fraction": 0.5}, 0.75)
    summaries = [
        {"p99_ttft_ms": v, "request_goodput": g, "duration_s": 10.0, "num_requests": 100}
        for v, g in [(1.0, 9.0), (2.0, 8.0), (3.0, 7.0), (5.0, 6.0)]
    ]
    judged = slo.judged(summaries)
    # linear quantile 0.75 of 1, 2, 3, 5: position 2.25 -> 3 + 0.25·2; goodput shares 0.6..0.9 at 0.25: 0.675
    assert judged["p99_ttft_ms"] == pytest.approx(3.5)
    assert judged["goodput_fraction"] == pytest.approx(0.675)
    assert not slo.holds(judged, summaries)
    assert Slo({"p99_ttft_ms": 3.5}, 0.75).holds({"p99_ttft_ms": 3.5}, summaries)


def _dominated_brute_force(x, y):
    n = len(x)
    return np.array([any(x[j] >= x[i] and y[j] >= y[i] and (x[j] > x[i] or y[j] > y[i]) for j in range(n))
                     for i in range(n)])


@pytest.mark.parametrize("seed", range(5))
def test_pareto_mask_is_the_set_of_non_dominated_points(seed):
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, 6, 40).astype(float), rng.integers(0, 6, 40).astype(float)  # many ties
    assert (pareto_mask(x, y) == ~_dominated_brute_force(x, y)).all()


def test_capacity_table_front_holds_no_dominated_configuration(tmp_path):
    config = mapping({"type": "constant_rate"}, {"axis": "load.request_rate", "tolerance": 0.05,
                                                  "slo": {"p99_ttft_ms": 30.0}})
    config["workload"] = {"num_requests": 60, "input_tokens": 500, "output_tokens": 8}
    config["timing"] = {"type": "linear"}
    batch = {"engine.aggregated.max_batched_tokens": [512, 2048], "engine.aggregated.replicas": [1, 2],
             "engine.aggregated.max_sequences": [2, 8, 64]}
    table, _ = search(config, tmp_path, batch)
    rows = table.to_pylist()
    assert len(rows) == 12
    feasible = [r for r in rows if r["capacity"] is not None]
    assert feasible
    x = np.array([r[cap.PER_USER] for r in feasible])
    y = np.array([r[cap.PER_GPU] for r in feasible])
    front = np.array([r["on_pareto"] for r in feasible])
    assert (front == ~_dominated_brute_force(x, y)).all()
    pareto = pq.read_table(tmp_path / cap.PARETO_FILE).to_pylist()
    assert sorted(r["config_id"] for r in pareto) == sorted(r["config_id"] for r in feasible if r["on_pareto"])
    for r in rows:  # GPUs = replicas (one rank, tp 1); rates per GPU and per user from the summary at capacity
        assert r["gpus"] == r["engine.aggregated.replicas"]
        if r["capacity"] is not None:
            assert r[cap.PER_GPU] == r["output_throughput"] / r["gpus"]
            assert r[cap.PER_USER] == 1000.0 / r["mean_tpot_ms"]


def test_optuna_trials_find_the_grid_capacities(tmp_path):
    pytest.importorskip("optuna")
    config = mapping({"type": "constant_rate"}, {"axis": "load.request_rate", "slo": {"p99_ttft_ms": 10.5}})
    batch = {"timing.prefill_ms": [10.0, 20.0], "engine.aggregated.replicas": [1]}
    grid, _ = search(config, tmp_path / "grid", batch)
    trials = {**config, "capacity": {**config["capacity"], "search": "optuna", "trials": 4, "population": 2}}
    found, _ = search(trials, tmp_path / "optuna", batch)
    by_params = {r["timing.prefill_ms"]: r["capacity"] for r in grid.to_pylist()}
    assert found.num_rows >= 1
    for r in found.to_pylist():
        assert r["capacity"] == by_params[r["timing.prefill_ms"]]


# ---------------------------------------------------------------- the command


def command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "runners.capacity", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


BUSY_ARGS = ("timing.type=fixed", "timing.prefill_ms=10", f"workload.num_requests={N}", "workload.input_tokens=1000",
             "workload.output_tokens=1", "engine.aggregated.max_batched_tokens=1000", "load.type=constant_rate")


@pytest.mark.parametrize("args, field", [
    (("capacity.axis=load.speedup", "capacity.slo.p99_ttft_ms=20"), "capacity.axis"),
    (("capacity.tolerance=0.01",), "capacity.slo"),
    (("capacity.slo.p97_ttft_ms=20",), "capacity.slo.p97_ttft_ms"),
    (("capacity.slo.p99_ttfx_ms=20",), "capacity.slo.p99_ttfx_ms"),
    (("capacity.bogus=1", "capacity.slo.p99_ttft_ms=20"), "capacity.bogus"),
    (("capacity.axis=load.concurrency", "capacity.slo.p99_ttft_ms=20"), "load.type=closed_loop"),
    (("capacity.slo.p99_ttft_ms=20", "sweep.batch.engine.aggregated.replicas=[1,0]"), "engine.aggregated.replicas"),
    (("capacity.slo.p99_ttft_ms=20", "sweep.batch.load.request_rate=[1,2]"), "sweep.batch.load.request_rate"),
    (("-m", "capacity.slo.p99_ttft_ms=20"), "-m"),
    (("capacity.slo.p99_ttft_ms=20", "capacity.hi=0.5"), "capacity.hi"),
])
def test_bad_input_exits_2_with_one_line_and_no_output(tmp_path, args, field):
    flags = [a for a in args if a.startswith("-")]  # Hydra's flags come before the overrides
    done = command(*flags, *BUSY_ARGS, *(a for a in args if a not in flags), "output.dir=out", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("replaysim-capacity: error:")
    assert field in done.stderr
    assert done.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_command_writes_tables_and_plots_and_resumes(tmp_path):
    args = (*BUSY_ARGS, "capacity.slo.p99_ttft_ms=10.5", "capacity.hi=400",
            "sweep.batch.engine.aggregated.replicas=[1,2]", "output.dir=out")
    first = command(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    out = tmp_path / "out"
    for name in (cap.CAPACITY_FILE, cap.PARETO_FILE, cap.PROBES_FILE, cap.PARETO_PNG, cap.CAPACITY_PNG):
        assert (out / name).stat().st_size > 0
    assert "reused" not in first.stdout
    table = pq.read_table(out / cap.CAPACITY_FILE)
    probes = pq.read_table(out / cap.PROBES_FILE)
    assert table.column("probes").to_pylist() == [
        len(list(g)) for _, g in itertools.groupby(probes.column("config_id").to_pylist())]
    second = command(*args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert f"{probes.num_rows} probe runs reused" in second.stdout  # one seed per probe
    assert pq.read_table(out / cap.CAPACITY_FILE).equals(table)


def test_seeds_are_judged_at_their_quantile(tmp_path):
    config = mapping({"type": "poisson"}, {"axis": "load.request_rate", "tolerance": 0.05, "seeds": 3,
                                            "seed_quantile": 1.0, "slo": {"p99_ttft_ms": 30.0}}, seed=7)
    (row,) = search(config, tmp_path)[0].to_pylist()
    worst = max(p99_ttft({**config, "seed": seed}, "load.request_rate", row["capacity"]) for seed in (7, 8, 9))
    assert row["slo_p99_ttft_ms"] == worst <= 30.0
    assert row["p99_ttft_ms"] == p99_ttft(config, "load.request_rate", row["capacity"])  # the configured seed's run


def test_bad_input_found_while_simulating_removes_the_stored_runs(tmp_path, monkeypatch):
    calls = []
    run_batch = simcore.run_batch

    def failing_second_step(configs):
        calls.append(len(configs))
        if len(calls) == 2:
            raise simcore.ConfigError("timing.type=table gave a negative pass time")
        return run_batch(configs)

    monkeypatch.setattr(cap.simcore, "run_batch", failing_second_step)
    config = mapping({"type": "constant_rate"}, {"axis": "load.request_rate", "slo": {"p99_ttft_ms": 10.5}})
    with pytest.raises(SystemExit) as exit_info:
        search(config, tmp_path / "out")
    assert exit_info.value.code == 2
    assert len(calls) == 2
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*"))


def test_the_terminal_table_fits_100_columns_with_long_labels(tmp_path):
    import pyarrow as pa

    options = cap.parse_options({"slo": {"p99_ttft_ms": 50}})
    key = "workload.path"
    capacity = pa.table({
        "config_id": [0, 1], key: ["/data/" + "a" * 80 + ".csv", "/data/" + "b" * 80 + ".csv"],
        "capacity": [2.5, 3.0], "status": ["ok", "ok"], "gpus": [1, 1],
        cap.PER_GPU: [100.0, 120.0], cap.PER_USER: [50.0, 40.0], "on_pareto": [True, True],
        "non_monotone": [None, "p99_ttft_ms falls 20.00% from 1 to 2 (5 -> 4); " * 4],
    })
    text = cap.format_table(capacity, [key], options, tmp_path)
    assert max(len(line) for line in text.splitlines() if not line.startswith("Output directory")) <= 100
    assert "path=/data/aaaa" in text and "…" in text
