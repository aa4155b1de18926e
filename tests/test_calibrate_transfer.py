"""replaysim-calibrate across loads (issue 30): a synthetic pair made by replaysim itself with
known operator scales, a light load and three times its rate; the fit on the light one must
recover the scales and hold at the heavy one, on a dense deployment and on an MoE one with
expert parallelism (two attention-DP ranks in lock-step, DP padding, the all-to-all).  Also
several runs fitted together, aggregate
stages (vllm bench serve and inference-perf statistics), the stability figures and the
extrapolation warning."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

import simcore
from runners import calibrate as cal

LINEAR = {"type": "linear", "base_ms": 2.0, "per_prefill_token_us": 20.0, "per_decode_seq_us": 50.0,
          "per_kv_token_ns": 1000.0}
DEPLOYMENT = {"engine": {"aggregated": {"max_sequences": 16, "max_batched_tokens": 512}}, "timing": LINEAR}
SCALES = ["timing.prefill_token_scale", "timing.decode_attention_scale", "timing.decode_base_scale"]
#: An MoE model served with expert parallelism (vLLM --enable-expert-parallel --data-parallel-size 2):
#: the two ranks step together (docs/semantics.md, "Expert parallelism"), padded to a common
#: CUDA-graph size, each MoE layer's dispatch and combine on the link.
EP_DEPLOYMENT = {
    "engine": {"aggregated": {"max_sequences": 16, "max_batched_tokens": 512, "attention_dp": 2,
                              "expert_parallel": True}},
    "timing": dict(LINEAR, cuda_graph_sizes=[8, 16, 32, 64], num_layers=4, hidden_size=2048,
                   moe={"num_experts": 8, "top_k": 2,
                        "alltoall": {"latency_us": 10.0, "bandwidth_gb_per_second": 50.0}}),
}
DEPLOYMENTS = {"dense": DEPLOYMENT, "ep": EP_DEPLOYMENT}
N = 120
LIGHT_GAP_MS = 90.0  # mean gap between sends at the light load; the heavy load sends 3x as often


def workload(gap_ms: float, n: int = N, seed: int = 7) -> pa.Table:
    """The same prompts and outputs at any load: Poisson sends of mean gap ``gap_ms``."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0, n)
    lengths = np.random.default_rng(seed + 1)
    send_ms = np.cumsum(gaps) * gap_ms
    return pa.table({
        "request_id": [f"q{i}" for i in range(n)],
        "input_tokens": lengths.integers(50, 400, n),
        "output_tokens": lengths.integers(2, 80, n),
        "send_ms": send_ms - send_ms[0],
    })


def replay(requests: pa.Table, values: dict, deployment: dict = DEPLOYMENT) -> dict:
    cfg = json.loads(json.dumps(deployment))
    for key, value in values.items():
        cal.set_dotted(cfg, key, value)
    cfg.update(load={"type": "trace"}, workload={"num_requests": requests.num_rows})
    return simcore.run(cfg, requests=requests)


def write_measured(path, requests: pa.Table, values: dict, deployment: dict = DEPLOYMENT) -> None:
    """The replay under ``values`` written as an LLMServingSim JSONL (ground truth by construction)."""
    table = replay(requests, values, deployment).requests.to_pydict()
    send_ms = requests["send_ms"].to_numpy()
    with open(path, "w") as handle:
        for i in range(requests.num_rows):
            t0 = 50.0 + send_ms[i] / 1e3
            handle.write(json.dumps({
                "request_id": table["request_id"][i], "input_toks": int(table["input_tokens"][i]),
                "output_toks": int(table["output_tokens"][i]), "arrival_time": 1.7e9 + send_ms[i] / 1e3,
                "queued_ts": t0, "first_token_ts": t0 + table["ttft_ms"][i] / 1e3,
                "last_token_ts": t0 + table["e2el_ms"][i] / 1e3}) + "\n")


def means(summary: dict) -> dict:
    return {key: summary[f"mean_{key}_ms"] for key in ("ttft", "tpot", "e2el")}


@pytest.mark.parametrize("deployment", ["dense", "ep"])
@pytest.mark.parametrize("truth", [
    {key: 1.0 for key in SCALES},  # the uncalibrated replay is the truth
    {"timing.prefill_token_scale": 1.3, "timing.decode_attention_scale": 0.8, "timing.decode_base_scale": 1.1},
], ids=["unit", "scaled"])
def test_light_load_fit_recovers_the_scales_and_holds_at_three_times_the_rate(tmp_path, truth, deployment):
    deployment = DEPLOYMENTS[deployment]
    light, heavy = workload(LIGHT_GAP_MS), workload(LIGHT_GAP_MS / 3)
    write_measured(tmp_path / "light.jsonl", light, truth, deployment)
    write_measured(tmp_path / "heavy.jsonl", heavy, truth, deployment)
    run = cal.FitRun("light", deployment, measured=cal.read_measured(str(tmp_path / "light.jsonl")))
    scored = cal.FitRun("heavy", deployment, measured=cal.read_measured(str(tmp_path / "heavy.jsonl")))
    found = cal.calibrate_runs([run], cal.parse_fit(SCALES), fit_fraction=1.0, max_evals=1500, seed=2, score=[scored])
    for key, value in truth.items():
        assert found.values[key] == pytest.approx(value, rel=0.02), key
    # the heavy load mixes many more prompts into decode passes: a fit that scaled whole passes
    # would stretch their decodes; the operator scales keep to the truth there
    predicted = means(replay(heavy, found.values, deployment).summary)
    expected = means(replay(heavy, truth, deployment).summary)
    for key, value in expected.items():
        assert predicted[key] == pytest.approx(value, rel=0.10), key
    # three times the rate is outside what the fit saw: said, not silently extrapolated
    assert found.scored[0]["extrapolation"] > 1.0
    assert found.load_range["in_flight_max"] < found.scored[0]["in_flight"]


@pytest.mark.parametrize("deployment", ["dense", "ep"])
def test_the_heavy_load_mixes_more_passes(deployment):
    """The pair tests what it claims: the heavy run's share of mixed passes is larger."""
    shares = []
    for gap in (LIGHT_GAP_MS, LIGHT_GAP_MS / 3):
        cfg = json.loads(json.dumps(DEPLOYMENTS[deployment]))
        requests = workload(gap)
        cfg.update(load={"type": "trace"}, workload={"num_requests": N}, output={"passes": True})
        passes = simcore.run(cfg, requests=requests).passes
        mixed = (passes["prefill_tokens"].to_numpy() > 0) & (passes["num_decode"].to_numpy() > 0)
        shares.append(mixed.mean())
    assert shares[1] > 1.5 * shares[0], shares


def test_whole_pass_scales_fitted_light_run_away_where_operator_scales_hold(tmp_path):
    """The failure of issue 30 in miniature: the prompts alone are slower (prefill_token_scale 1.6);
    timing.prefill_scale fitted at the light load stretches every mixed pass's decodes at 3x."""
    truth = {"timing.prefill_token_scale": 1.6}
    light, heavy = workload(LIGHT_GAP_MS), workload(LIGHT_GAP_MS / 3)
    write_measured(tmp_path / "light.jsonl", light, truth)
    run = cal.FitRun("light", DEPLOYMENT, measured=cal.read_measured(str(tmp_path / "light.jsonl")))
    whole = cal.calibrate_runs([run], cal.parse_fit(["timing.prefill_scale", "timing.decode_scale"]),
                               fit_fraction=1.0, max_evals=800, seed=2)
    operators = cal.calibrate_runs([run], cal.parse_fit(SCALES), fit_fraction=1.0, max_evals=1500, seed=2)
    expected = means(replay(heavy, truth).summary)["tpot"]
    whole_error = abs(means(replay(heavy, whole.values).summary)["tpot"] / expected - 1)
    operator_error = abs(means(replay(heavy, operators.values).summary)["tpot"] / expected - 1)
    assert operator_error < 0.02 and operator_error < whole_error


# ------------------------------------------------------------------ aggregate stages


def stage_config(rate: float, values: dict) -> dict:
    cfg = json.loads(json.dumps(DEPLOYMENT))
    for key, value in values.items():
        cal.set_dotted(cfg, key, value)
    cfg.update(load={"type": "poisson", "request_rate": rate},
               workload={"num_requests": 100, "input_tokens": 200, "output_tokens": 40},
               metrics={"percentiles": [50, 99]})
    return cfg


def vllm_result(rate: float, values: dict) -> dict:
    """A ``vllm bench serve --save-result`` object of a replay (the statistics it writes)."""
    summary = simcore.run(stage_config(rate, values)).summary
    doc = {"request_rate": rate, "burstiness": 1.0, "max_concurrency": None, "completed": 100,
           "total_input_tokens": 100 * 200, "total_output_tokens": 100 * 40, "num_prompts": 100}
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "p99"):
            doc[f"{stat}_{metric}_ms"] = summary[f"{stat}_{metric}_ms"]
    return doc


def test_aggregate_stages_recover_known_scales_and_report_stability(tmp_path, capsys):
    truth = {"timing.prefill_token_scale": 1.25, "timing.decode_base_scale": 0.9}
    path = tmp_path / "bench.jsonl"  # --append-result: one result a line
    path.write_text("".join(json.dumps(vllm_result(rate, truth)) + "\n" for rate in (4.0, 12.0)))
    stages = cal.read_input(str(path))
    assert [s.load for s in stages] == [{"type": "poisson", "request_rate": 4.0},
                                        {"type": "poisson", "request_rate": 12.0}]
    out = tmp_path / "out"
    code = cal.main([str(path), "engine.aggregated.max_sequences=16", "engine.aggregated.max_batched_tokens=512",
                     *(f"timing.{k}={v}" for k, v in LINEAR.items()), "--fit", "timing.prefill_token_scale",
                     "--fit", "timing.decode_base_scale", "--max-evals", "800", "--seed", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    doc = json.loads((out / "calibration.json").read_text())
    for key, value in truth.items():
        assert doc["parameters"][key]["value"] == pytest.approx(value, rel=0.02), key
    stability = doc["stability"]
    assert stability["method"] == "leave-one-stage-out" and stability["fits"] == 2
    for key in truth:
        p = stability["parameters"][key]
        assert p["min"] <= p["max"] and len(p["values"]) == 2 and p["spread"] == pytest.approx(
            (p["max"] - p["min"]) / p["value"])
    assert [r["kind"] for r in doc["runs"]] == ["stage", "stage"]
    assert "stability (leave-one-stage-out, 2 fits)" in printed


def test_inference_perf_stage_reader(tmp_path):
    doc = {"load_summary": {"count": 50, "requested_rate": 2.5, "achieved_rate": 2.4},
           "successes": {"count": 48, "latency": {
               "time_to_first_token": {"mean": 0.05, "median": 0.04, "p90": 0.09, "min": 0.01, "max": 0.2},
               "time_per_output_token": {"mean": 0.012},
               "request_latency": {"mean": 1.5, "p99": 3.0}},
               "prompt_tokens": {"total": 4800.0, "mean": 100.0}, "output_len": {"mean": 120.0}},
           "failures": {"count": 2}}
    path = tmp_path / "stage_0_lifecycle_metrics.json"
    path.write_text(json.dumps(doc))
    (stage,) = cal.read_input(str(path))
    assert stage.format == "inference-perf" and stage.num_requests == 48
    assert stage.load == {"type": "constant_rate", "request_rate": 2.5}
    assert stage.targets == pytest.approx({"mean_ttft_ms": 50.0, "median_ttft_ms": 40.0, "p90_ttft_ms": 90.0,
                                           "mean_tpot_ms": 12.0, "mean_e2el_ms": 1500.0, "p99_e2el_ms": 3000.0})
    assert (stage.input_tokens, stage.output_tokens) == (100.0, 120.0)
    assert stage.in_flight == pytest.approx(2.5 * 1.5)  # Little's law
    doc["load_summary"]["concurrency"] = 8
    path.write_text(json.dumps(doc))
    (stage,) = cal.read_input(str(path))
    assert stage.load["type"] == "closed_loop" and stage.load["concurrency"] == 8 and stage.in_flight == 8


@pytest.mark.parametrize("change, message", [
    ({"request_rate": 4.0, "max_concurrency": 8}, "an open loop capped by a concurrency is not modelled"),
    ({"request_rate": "inf"}, "every request sent at once"),
    ({"request_rate": -1.0}, "request_rate"),
    ({"completed": 0}, "completed"),
    ({"mean_ttft_ms": "fast"}, "mean_ttft_ms"),
    ({"p120_ttft_ms": 3.0}, "p120_ttft_ms"),
])
def test_bad_stage_files_exit_2_with_one_line(tmp_path, capsys, change, message):
    doc = {"request_rate": 4.0, "max_concurrency": None, "completed": 10, "total_input_tokens": 1000,
           "total_output_tokens": 500, "mean_ttft_ms": 30.0, "mean_tpot_ms": 10.0}
    doc.update(change)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    code = cal.main([str(path), "--fit", "timing.decode_base_scale", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("replaysim-calibrate: error:") and message in err[0], err
    assert not out.exists()


def test_extrapolation_is_warned_of_or_refused(tmp_path, capsys):
    light, heavy = workload(LIGHT_GAP_MS, n=40), workload(LIGHT_GAP_MS / 6, n=40)
    write_measured(tmp_path / "light.jsonl", light, {})
    write_measured(tmp_path / "heavy.jsonl", heavy, {})
    deployment = ["engine.aggregated.max_sequences=16", "engine.aggregated.max_batched_tokens=512",
                  *(f"timing.{k}={v}" for k, v in LINEAR.items())]
    args = [str(tmp_path / "light.jsonl"), *deployment, "--fit", "timing.decode_base_scale", "--max-evals", "40",
            "--stability-fits", "2", "--score", str(tmp_path / "heavy.jsonl"), "--max-extrapolation", "1.5"]
    assert cal.main(args + ["--out", str(tmp_path / "a")]) == 0
    captured = capsys.readouterr()
    assert "replaysim-calibrate: warning:" in captured.err and "outside the fitted loads" in captured.err
    doc = json.loads((tmp_path / "a" / "calibration.json").read_text())
    assert doc["warnings"] and doc["scored"][0]["extrapolation"] > 1.5
    assert doc["stability"]["method"] == "bootstrap" and doc["stability"]["fits"] == 2
    assert "requests in flight" in (tmp_path / "a" / "calibrated.yaml").read_text()
    assert cal.main(args + ["--refuse-extrapolation", "--out", str(tmp_path / "b")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "outside the fitted loads" in line and not (tmp_path / "b").exists()


def test_several_runs_are_fitted_together(tmp_path):
    truth = {"timing.decode_attention_scale": 1.4}
    runs = []
    for i, gap in enumerate((LIGHT_GAP_MS, LIGHT_GAP_MS / 2)):
        path = tmp_path / f"run{i}.jsonl"
        write_measured(path, workload(gap, n=60, seed=11 + i), truth)
        runs.append(cal.FitRun(str(path), DEPLOYMENT, measured=cal.read_measured(str(path))))
    found = cal.calibrate_runs(runs, cal.parse_fit(list(truth)), fit_fraction=1.0, max_evals=400, seed=0,
                               stability_fits=1)
    assert found.values["timing.decode_attention_scale"] == pytest.approx(1.4, rel=0.02)
    assert len(found.runs) == 2 and found.stability["method"] == "leave-one-stage-out"
    assert found.load_range["in_flight_min"] < found.load_range["in_flight_max"]
