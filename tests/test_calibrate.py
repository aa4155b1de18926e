"""replaysim-calibrate: recovering known parameters from a "measurement" made by replaysim
itself (ground truth known by construction), the measured-run formats, the output files
and bad input."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest
import yaml

import simcore
from runners import calibrate as cal
from simcore.config import load_config

LINEAR = {"type": "linear", "base_ms": 2.0, "per_prefill_token_us": 20.0, "per_decode_seq_us": 50.0, "per_kv_token_ns": 10.0}
DEPLOYMENT = {"engine": {"aggregated": {"max_sequences": 16, "max_batched_tokens": 512}}, "timing": LINEAR}


def simulated_measurement(path, truth: dict, n: int = 120, seed: int = 3):
    """Replay a random workload with ``truth`` set and write it as an LLMServingSim JSONL."""
    rng = np.random.default_rng(seed)
    send_ms = np.cumsum(rng.exponential(60.0, n))
    send_ms -= send_ms[0]
    requests = pa.table(
        {
            "request_id": [f"q{i}" for i in range(n)],
            "input_tokens": rng.integers(50, 400, n),
            "output_tokens": rng.integers(2, 60, n),
            "send_ms": send_ms,
        }
    )
    cfg = json.loads(json.dumps(DEPLOYMENT))
    for key, value in truth.items():
        cal.set_dotted(cfg, key, value)
    cfg.update(load={"type": "trace"}, workload={"num_requests": n})
    table = simcore.run(cfg, requests=requests).requests.to_pydict()
    with open(path, "w") as handle:
        for i in range(n):
            t0 = 1000.0 + send_ms[i] / 1e3  # engine clock (s); arrival_time in another clock
            handle.write(
                json.dumps(
                    {
                        "request_id": table["request_id"][i],
                        "input_toks": int(table["input_tokens"][i]),
                        "output_toks": int(table["output_tokens"][i]),
                        "arrival_time": 1.7e9 + send_ms[i] / 1e3,
                        "queued_ts": t0,
                        "first_token_ts": t0 + table["ttft_ms"][i] / 1e3,
                        "last_token_ts": t0 + table["e2el_ms"][i] / 1e3,
                    }
                )
                + "\n"
            )
    return table


@pytest.mark.parametrize("loss", list(cal.LOSSES))
def test_recovers_known_parameters(tmp_path, loss):
    truth = {"timing.prefill_scale": 1.3, "timing.decode_scale": 0.8}
    path = tmp_path / "requests.jsonl"
    simulated_measurement(path, truth)
    measured = cal.read_measured(str(path))
    fit = cal.parse_fit(list(truth))
    result = cal.calibrate(measured, DEPLOYMENT, fit, loss=loss, max_evals=800, seed=1)
    for key, value in truth.items():
        assert result.values[key] == pytest.approx(value, rel=0.02), key
    # the simulator fits its own output on both parts
    for part in ("fit", "held_out"):
        for key, row in result.report[part]["calibrated"].items():
            assert abs(row["error"]) < 0.02, (part, key)
    assert result.report["fit"]["requests"] == 60 and result.report["held_out"]["requests"] == 60


def shared_prefix_trace(path, n: int = 120, seed: int = 5) -> None:
    """A Mooncake trace of ``n`` requests at 16-token blocks in which about half the prompts
    begin with the blocks of an earlier prompt (a later turn of its conversation)."""
    rng = np.random.default_rng(seed)
    send_ms = np.cumsum(rng.exponential(60.0, n))
    send_ms -= send_ms[0]
    blocks: list[list[int]] = []
    with open(path, "w") as handle:
        for i in range(n):
            own = [1000 * i + k for k in range(int(rng.integers(3, 20)))]
            earlier = blocks[int(rng.integers(0, i))] if i and rng.random() < 0.5 else []
            blocks.append(earlier + own)
            handle.write(json.dumps({
                "request_id": f"q{i}", "timestamp": float(send_ms[i]), "input_length": 16 * len(blocks[-1]),
                "output_length": int(rng.integers(2, 60)), "hash_ids": blocks[-1]}) + "\n")


def test_a_trace_of_the_measured_run_gives_its_shared_prompt_blocks(tmp_path):
    trace = tmp_path / "trace.jsonl"
    shared_prefix_trace(trace)
    deployment = json.loads(json.dumps(DEPLOYMENT))
    deployment["engine"]["aggregated"].update(prefix_caching=True, block_size=16)
    deployment["workload"] = {"source": "mooncake", "path": str(trace), "block_size": 16}
    truth = {"timing.prefill_scale": 1.3, "timing.decode_scale": 0.8}
    measured_cfg = json.loads(json.dumps(deployment))
    for key, value in truth.items():
        cal.set_dotted(measured_cfg, key, value)
    measured_cfg["load"] = {"type": "trace"}
    run = simcore.run(measured_cfg).requests.to_pydict()
    assert sum(run["cached_tokens"]) > 0  # the shared blocks are found cached
    path = tmp_path / "requests.jsonl"
    with open(path, "w") as handle:
        for i in reversed(range(len(run["request_id"]))):  # file order is not the trace's
            t0 = 1000.0 + run["send_ms"][i] / 1e3
            handle.write(json.dumps({
                "request_id": run["request_id"][i], "input_toks": run["input_tokens"][i],
                "output_toks": run["output_tokens"][i], "arrival_time": 1.7e9 + run["send_ms"][i] / 1e3,
                "queued_ts": t0, "first_token_ts": t0 + run["ttft_ms"][i] / 1e3,
                "last_token_ts": t0 + run["e2el_ms"][i] / 1e3}) + "\n")
    measured = cal.read_measured(str(path))
    fit = cal.parse_fit(list(truth))
    result = cal.calibrate(measured, deployment, fit, max_evals=800, seed=1)
    for key, value in truth.items():
        assert result.values[key] == pytest.approx(value, rel=0.02), key
    for part in ("fit", "held_out"):
        for key, row in result.report[part]["calibrated"].items():
            assert abs(row["error"]) < 0.02, (part, key)
    # from the lengths alone every prompt is its own: the same truth predicts other latencies
    lengths_only = json.loads(json.dumps(measured_cfg))
    lengths_only["workload"] = {"num_requests": len(measured.request_id)}
    alone = simcore.run(lengths_only, requests=measured.requests_table()).requests.to_pydict()
    assert sum(alone["ttft_ms"]) > 1.05 * sum(run["ttft_ms"])
    # a trace of another run is refused, naming what differs
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    rows[7]["output_length"] += 1
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in rows))
    deployment["workload"]["path"] = str(other)
    with pytest.raises(cal.ConfigError, match="request_id 'q7' has input/output lengths"):
        cal.calibrate(measured, deployment, fit, max_evals=8)
    rows[7]["request_id"] = "x7"
    other.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(cal.ConfigError, match="no request_id 'q7' of the measured run"):
        cal.calibrate(measured, deployment, fit, max_evals=8)
    deployment["workload"] = {"source": "synthetic"}
    with pytest.raises(cal.ConfigError, match="workload.source: the measured run is the workload"):
        cal.calibrate(measured, deployment, fit, max_evals=8)
    # on the command line: the trace is the run's workload, not part of the fitted deployment
    out = tmp_path / "cal"
    assert cal.main([str(path), "engine.aggregated.prefix_caching=true", "engine.aggregated.block_size=16",
                     "workload.source=mooncake", f"workload.path={trace}", "workload.block_size=16",
                     "--fit", "timing.decode_scale", "--max-evals", "8", "--out", str(out)]) == 0
    assert "workload" not in yaml.safe_load((out / "calibrated.yaml").read_text())
    assert json.loads((out / "calibration.json").read_text())["overrides"]["workload"]["path"] == str(trace)


def test_bench_loss_weighs_each_statistic_of_each_metric_alike():
    # Five requests; the fifth has one output token, so no TPOT.
    measured = {
        "ttft_ms": np.array([1000.0, 2000.0, 3000.0, 4000.0, 5000.0]),
        "tpot_ms": np.array([10.0, 20.0, 30.0, 40.0, np.nan]),
        "e2el_ms": np.array([2.0, 4.0, 6.0, 8.0, 10.0]),
    }
    predicted = {
        "ttft_ms": measured["ttft_ms"] + 1000.0,  # TTFT 1 s later each
        "tpot_ms": measured["tpot_ms"] * 1.1,  # TPOT 10% longer
        "e2el_ms": measured["e2el_ms"].copy(),  # E2E exact
    }
    rows = slice(0, 5)
    # TTFT: mean and median 3000 -> 4000 (1/3 each); p90 (numpy's linear rule, rank
    # 0.9 x 4 = 3.6) 4600 -> 5600: 1/4.6.  TPOT over the four with one: mean 25, median
    # 25, p90 37 (rank 2.7), every one 10% up: three terms of 0.1^2.  E2E: none.
    ttft = 2 * (1 / 3) ** 2 + (1 / 4.6) ** 2
    tpot = 3 * 0.1**2
    assert cal.LOSSES["bench"] == ("mean", "p50", "p90") and cal.LOSSES[cal.DEFAULT_LOSS] is None
    target = cal.part_metrics(measured, rows)
    assert target["p90_ttft_ms"] == pytest.approx(4600.0) and target["p50_tpot_ms"] == pytest.approx(25.0)
    run = cal.Measured(request_id=[f"r{i}" for i in range(5)], input_tokens=np.ones(5, dtype=np.int64),
                       output_tokens=np.array([5, 5, 5, 5, 1]), send_ms=np.zeros(5), latency=measured,
                       format="jsonl", dropped=0)
    assert cal.loss_value("bench", predicted, run, rows) == pytest.approx(ttft + tpot, rel=1e-12)
    # summary: the same without the medians
    assert cal.loss_value("summary", predicted, run, rows) == pytest.approx(
        (1 / 3) ** 2 + (1 / 4.6) ** 2 + 2 * 0.1**2, rel=1e-12)
    # requests: per metric sum (p - m)^2 / sum m^2; TTFT 5 x 1000^2 / 55e6, TPOT 0.1^2
    assert cal.loss_value("requests", predicted, run, rows) == pytest.approx(5e6 / 55e6 + 0.1**2, rel=1e-12)


def test_quantiles_loss_compares_sorted_values_not_pairs():
    # Four requests; the replay gives the run's values to other requests.
    measured = {
        "ttft_ms": np.array([100.0, 200.0, 300.0, 400.0]),
        "tpot_ms": np.array([10.0, 20.0, 30.0, np.nan]),  # the fourth has one output token
        "e2el_ms": np.array([1.0, 2.0, 3.0, 4.0]),
    }
    predicted = {
        "ttft_ms": measured["ttft_ms"][::-1].copy(),  # the same four values, reversed
        "tpot_ms": np.array([30.0, 10.0, 20.0, 99.0]),  # the three known ones rotated
        "e2el_ms": np.array([1.0, 2.0, 3.0, 8.0]),  # one value 4 ms off
    }
    run = cal.Measured(request_id=[f"r{i}" for i in range(4)], input_tokens=np.ones(4, dtype=np.int64),
                       output_tokens=np.array([5, 5, 5, 1]), send_ms=np.zeros(4), latency=measured,
                       format="jsonl", dropped=0)
    rows = slice(0, 4)
    # sorted, TTFT and TPOT agree; E2E: 4^2 / (1 + 4 + 9 + 16)
    assert cal.loss_value("quantiles", predicted, run, rows) == pytest.approx(16 / 30, rel=1e-12)
    # paired: TTFT (300^2 + 100^2 + 100^2 + 300^2) / 300,000; TPOT (20^2 + 10^2 + 10^2) / 1,400
    assert cal.loss_value("requests", predicted, run, rows) == pytest.approx(
        200_000 / 300_000 + 600 / 1400 + 16 / 30, rel=1e-12)
    # a shift of every value is a bias both see alike
    shifted = {key: value + 10.0 for key, value in measured.items()}
    assert cal.loss_value("quantiles", shifted, run, rows) == pytest.approx(
        cal.loss_value("requests", shifted, run, rows), rel=1e-12)


def test_jsonl_reader_anchors_latencies_at_queued_ts(tmp_path):
    path = tmp_path / "r.jsonl"
    rows = [
        {"request_id": 7, "input_toks": 10, "output_toks": 5, "arrival_time": 50.5, "queued_ts": 3.0, "first_token_ts": 3.25, "last_token_ts": 4.25},
        {"request_id": 6, "input_toks": 4, "output_toks": 1, "arrival_time": 50.0, "queued_ts": 2.0, "first_token_ts": 2.5, "last_token_ts": 2.5},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = cal.read_measured(str(path))
    assert m.request_id == ["6", "7"]  # ordered by arrival
    np.testing.assert_array_equal(m.send_ms, [0.0, 500.0])
    np.testing.assert_array_equal(m.latency["ttft_ms"], [500.0, 250.0])
    np.testing.assert_array_equal(m.latency["e2el_ms"], [500.0, 1250.0])
    assert math.isnan(m.latency["tpot_ms"][0]) and m.latency["tpot_ms"][1] == 1000.0 / 4


def test_vllm_bench_json_reader(tmp_path):
    doc = {
        "input_lens": [10, 20, 30],
        "output_lens": [3, 0, 2],
        "ttfts": [0.1, 0.0, 0.2],
        "itls": [[0.02, 0.03], [], [0.05]],
        "start_times": [100.0, 100.5, 100.25],
        "errors": ["", "timeout", ""],
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(doc))
    m = cal.read_measured(str(path))
    assert m.format == "vllm" and m.dropped == 1
    np.testing.assert_array_equal(m.input_tokens, [10, 30])
    np.testing.assert_array_equal(m.send_ms, [0.0, 250.0])
    np.testing.assert_allclose(m.latency["e2el_ms"], [150.0, 250.0], rtol=1e-12)  # TTFT + sum(ITL)
    np.testing.assert_allclose(m.latency["tpot_ms"], [25.0, 50.0], rtol=1e-12)


def test_main_writes_a_config_replaysim_accepts(tmp_path, capsys):
    path = tmp_path / "requests.jsonl"
    simulated_measurement(path, {"timing.decode_scale": 1.2}, n=40)
    out = tmp_path / "out"
    code = cal.main(
        [str(path), "engine.aggregated.max_sequences=16", "engine.aggregated.max_batched_tokens=512",
         "timing.base_ms=2.0", "timing.per_prefill_token_us=20.0", "timing.per_decode_seq_us=50.0",
         "timing.per_kv_token_ns=10.0", "--fit", "timing.decode_scale", "--max-evals", "60", "--out", str(out)]
    )
    assert code == 0
    doc = json.loads((out / "calibration.json").read_text())
    assert set(doc["errors"]) == {"fit", "held_out"} and doc["requests"] == 40
    tree = yaml.safe_load((out / "calibrated.yaml").read_text())
    assert tree.pop("defaults") == ["config", "_self_"]
    cfg = load_config(tree)
    assert cfg.timing.decode_scale == doc["parameters"]["timing.decode_scale"]["value"]
    assert cfg.engine.aggregated.max_sequences == 16


@pytest.mark.parametrize(
    "args, message",
    [
        (["MISSING", "--fit", "timing.decode_scale"], "cannot read"),
        (["GOOD", "--fit", "timing.nope"], "timing.nope"),
        (["GOOD", "--fit", "timing.base_ms"], "no default range"),
        (["GOOD", "--fit", "timing.base_ms=3:1"], "LOW < HIGH"),
        (["GOOD", "workload.num_requests=3", "--fit", "timing.decode_scale"], "workload"),
        (["GOOD", "engine.aggregated.max_sequences=0", "--fit", "timing.decode_scale"], "engine.aggregated.max_sequences"),
        (["GOOD", "--fit", "timing.decode_scale", "--fit-fraction", "0"], "--fit-fraction"),
        (["BAD", "--fit", "timing.decode_scale"], "bad.jsonl:2"),
        (["GOOD"], "--fit"),
    ],
)
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, args, message):
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"input_toks": 5, "output_toks": 2, "arrival_time": 0.0, "queued_ts": 0.0, "first_token_ts": 0.1, "last_token_ts": 0.2}) + "\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + '{"input_toks": 5, "output_toks": 2}\n')
    paths = {"GOOD": str(good), "BAD": str(bad), "MISSING": str(tmp_path / "missing.jsonl")}
    out = tmp_path / "out"
    code = cal.main([paths.get(a, a) for a in args] + ["--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("replaysim-calibrate: error:") and message in err[0]
    assert not out.exists()


def test_help_describes_every_option(capsys):
    with pytest.raises(SystemExit) as done:
        cal.main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "seed of the optimiser" in text and "(default 0)" in text
    assert "format of the measured run: jsonl" in text and "(default auto)" in text
