"""What a run tells its reader: the summary's header, report.html (in headless Chromium), trace.json."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import simcore
from runners import html_report, svg
from runners.report import cache_lines, described, fit_table, format_summary, warnings_for
from runners.sweep import RunnerOptions, export_documents, simulate
from runners.writer import write_results
from simcore.config import ConfigError, load_config
from tests import browser

ROOT = Path(__file__).resolve().parents[1]
RUN_PLOTS = {"ttft_cdf", "tpot_cdf", "itl_cdf", "e2el_cdf", "ttft_stages", "requests_timeline", "batch_timeline",
             "kv_timeline"}
SWEEP_PLOTS = {"knee_ttft", "knee_tpot", "pareto", "ttft_stages", "ttft_cdf"}


# ---------------------------------------------------------------- pieces


@pytest.mark.parametrize("low, high", [(0.0, 1.0), (0.0, 2615.3), (3.7, 4.2), (-5.0, 12.0), (0.0, 1e-4)])
def test_ticks_are_round_steps_covering_the_range(low, high):
    ticks = svg.nice_ticks(low, high)
    steps = np.diff(ticks)
    assert np.allclose(steps, steps[0])
    mantissa = steps[0] / 10 ** math.floor(math.log10(steps[0]))
    assert any(math.isclose(mantissa, m) for m in (1, 2, 5, 10))
    # from the last multiple of the step at or below low to the last at or below high
    assert ticks[0] <= low < ticks[0] + steps[0] and ticks[-1] <= high + 1e-12 < ticks[-1] + steps[0]
    assert 2 <= len(ticks) <= 12


def test_a_table_too_wide_leaves_out_its_least_important_columns_first():
    columns = [("id", ["a", "b"], 9), ("wide", ["x" * 30, "y"], 1), ("mid", ["1.5", "22.25"], 5),
               ("low", ["7", "8"], 2)]
    # At 20 columns a cell is cut to max(8, 20 // 3) = 8 characters: widths 2 + 8 + 5 + 3 and two
    # spaces between make 24 > 20, so wide (importance 1) is left out: 2 + 5 + 3 + 4 = 14 fits.
    lines = fit_table(columns, width=20)
    assert lines[0] == "id    mid  low"
    assert lines[1:3] == ["a     1.5    7", "b   22.25    8"]
    assert lines[3] == "(1 column left out to fit 20 characters: wide)"
    assert fit_table(columns, width=48)[0].split() == ["id", "wide", "mid", "low"]  # wide cut to 16: fits
    assert all(len(line) <= 100 for line in fit_table(columns * 5))


def test_the_pareto_front_keeps_the_points_nothing_beats_in_both():
    x = [1.0, 2.0, 3.0, 2.0, 0.5]
    y = [5.0, 4.0, 1.0, 3.0, 5.0]  # (2, 3) is beaten by (2, 4); (0.5, 5) by (1, 5)
    assert html_report.pareto_front(x, y) == [0, 1, 2]


def test_the_header_says_what_was_simulated():
    lines = dict(described(load_config({}).resolved))
    assert lines["Policy"] == "vllm"
    assert lines["Timing"].startswith("linear (5 ms + 30 µs/prefill token")
    assert lines["Deployment"] == "aggregated: 1 replica"
    assert lines["Workload"] == "synthetic, 640 requests of 1024 in / 128 out tokens"
    assert lines["Load"] == "closed loop, concurrency 64"
    assert lines["Detokenizer"] == "off (0 ms per job)" and "Tokenizer" not in lines
    pd = load_config({
        "engine": {"mode": "disaggregated", "policy": "sglang", "prefill": {"replicas": 1},
                   "decode": {"replicas": 2, "attention_dp": 2},
                   "kv_transfer": {"bandwidth_gb_per_second": 25.0, "bytes_per_token": 131072}},
        "load": {"type": "poisson", "request_rate": 20.0},
        "detokenization": {"workers": 2, "base_ms": 2.85, "per_output_us": 61.6},
    })
    lines = dict(described(pd.resolved))
    assert lines["Policy"] == "sglang"
    assert lines["Deployment"] == ("P/D disaggregated: prefill 1 replica, decode 2 replicas × attention-DP 2; "
                                   "KV transfer 25 GB/s")
    assert lines["Load"] == "poisson, 20 req/s"
    assert lines["Detokenizer"] == "2 servers, 2.85 ms/job + 61.6 µs/output token"
    roofline = load_config({"timing": {"type": "roofline", "model": "qwen3-30b-a3b", "gpu": "H200"}})
    assert dict(described(roofline.resolved))["Timing"] == (
        "roofline (the model's FLOPs and bytes against the GPU's peaks); GPU H200, model qwen3-30b-a3b")


def test_cache_and_offload_figures_appear_only_with_those_features():
    off = {"prefix_cache_hit_rate": 0.0, "config": {"engine": {"aggregated": {"prefix_caching": False}}}}
    assert cache_lines(off) == []
    on = {"prefix_cache_hit_rate": 0.5, "gpu_prefix_cache_hit_rate": 0.375, "cpu_prefix_cache_hit_rate": 0.125,
          "kv_offload_loaded_gb": 1.5, "kv_offload_stored_gb": 2.25,
          "config": {"engine": {"aggregated": {"prefix_caching": True}}}}
    assert cache_lines(on) == [
        ("Prefix cache", "50.0% of prompt tokens reused (GPU 37.5%, CPU 12.5%)"),
        ("KV offload", "1.500 GB loaded CPU -> GPU, 2.250 GB stored GPU -> CPU"),
    ]


def test_a_concurrency_far_above_the_requests_is_warned_about():
    def summary(concurrency: int) -> dict:
        return {"num_requests": 640, "config": {"load": {"type": "closed_loop", "concurrency": concurrency}}}

    assert warnings_for(summary(6400)) == []  # ten times: not yet
    (line,) = warnings_for(summary(1_000_000_000))
    assert line.startswith("load.concurrency=1000000000 is more than 10 times the workload's 640 requests")
    sessions = {**summary(6401), "num_sessions": 8}
    assert "8 sessions" in warnings_for(sessions)[0]


def test_the_summary_table_heads_with_the_run_and_fits_100_columns():
    result = simcore.run(load_config({"workload": {"num_requests": 16}}))
    text = format_summary({**result.summary, "config": result.config.resolved}, "/tmp/out")
    lines = text.splitlines()
    assert lines[1].startswith("Policy:      vllm") and any(line.startswith("Load:") for line in lines)
    assert max(map(len, lines)) <= 100


# ---------------------------------------------------------------- trace


def test_the_trace_holds_each_pass_and_each_detokenizer_job_worked_by_hand(tmp_path):
    # Fixed timing, 2 requests of 16 in / 3 out, both admitted at once (concurrency 2): pass 1 is a
    # prefill pass [0, 30] ms emitting both first tokens, then two decode passes [30, 38], [38, 46].
    # One detokenizer server, a job per pass of k = 2 tokens: 1 + 500 µs × 2 / 1000 = 2 ms
    # (SPEC §7): [30, 32], then max(38, 32) = 38 -> [38, 40], then [46, 48].
    config = load_config({
        "workload": {"num_requests": 2, "input_tokens": 16, "output_tokens": 3},
        "load": {"concurrency": 2},
        "timing": {"type": "fixed", "prefill_ms": 30.0, "decode_ms": 8.0},
        "detokenization": {"base_ms": 1.0, "per_output_us": 500.0},
        "output": {"trace": True},
    })
    options = RunnerOptions(vllm_bench=False)
    result, tokens = simulate(config, options)
    written = write_results(result, tmp_path, extra=export_documents(result, tokens, options, False))
    names = {path.name for path in written}
    assert {"trace.json", "report.html"} <= names and "passes.parquet" not in names  # recorded for the trace only
    trace = json.loads((tmp_path / "trace.json").read_text())
    events = trace["traceEvents"]
    passes = [(e["ts"], e["dur"]) for e in events if e.get("name") == "pass"]
    jobs = [(e["ts"], e["dur"], e["args"]["tokens"]) for e in events if e.get("name") == "detokenize"]
    assert passes == [(0.0, 30000.0), (30000.0, 8000.0), (38000.0, 8000.0)]
    assert jobs == [(30000.0, 2000.0, 2), (38000.0, 2000.0, 2), (46000.0, 2000.0, 2)]
    assert {"worker 0 (aggregated)", "rank 0 passes", "detokenizer server 0"} <= {
        e["args"]["name"] for e in events if e["ph"] == "M" and "name" in e.get("args", {})}


def test_a_pd_trace_has_one_kv_transfer_per_handed_off_request():
    config = load_config({
        "workload": {"num_requests": 4, "input_tokens": 64, "output_tokens": 2},
        "engine": {"mode": "disaggregated", "kv_transfer": {"bandwidth_gb_per_second": 1.0, "bytes_per_token": 1000}},
        "output": {"trace": True},
    })
    result, tokens = simulate(config, RunnerOptions(vllm_bench=False))
    extra = export_documents(result, tokens, RunnerOptions(vllm_bench=False), False)
    events = extra["trace.json"]["traceEvents"]
    begins = [e for e in events if e.get("name") == "KV transfer" and e["ph"] == "b"]
    ends = [e for e in events if e.get("name") == "KV transfer" and e["ph"] == "e"]
    assert len(begins) == len(ends) == 4
    # 64 tokens × 1000 B at 1 GB/s = 64 µs each
    assert sorted(e["ts"] for e in ends) == pytest.approx(sorted(b["ts"] + 64.0 for b in begins))


def test_a_bounded_trace_with_a_detokenizer_is_refused_naming_the_keys():
    with pytest.raises(ConfigError, match="^output.trace=true needs output.mode=detailed"):
        load_config({"output": {"trace": True, "mode": "bounded"}, "detokenization": {"base_ms": 1.0}})
    load_config({"output": {"trace": True, "mode": "bounded"}})  # no detokenizer: passes and transfers only


def test_report_false_writes_no_report(tmp_path):
    config = load_config({"workload": {"num_requests": 4}, "output": {"report": False}})
    result, tokens = simulate(config, RunnerOptions())
    assert "report.html" not in export_documents(result, tokens, RunnerOptions(), False)


# ---------------------------------------------------------------- in a browser


def _chromium_or_skip() -> str:
    found = browser.find_chromium()
    if found is None:
        if os.environ.get("REPLAYSIM_CI"):  # set by .ci/run
            pytest.fail("CI needs Chromium for the report test (apt-get install -y chromium)")
        pytest.skip("no Chromium on this machine (apt-get install -y chromium); CI runs this test")
    return found


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    return done


def test_a_run_and_a_sweep_report_open_in_chromium_without_errors(tmp_path):
    executable = _chromium_or_skip()
    run = tmp_path / "run"
    _cli("runners.cli", f"hydra.run.dir={run}", "workload.num_requests=64", "output.passes=true",
         "detokenization.base_ms=1", cwd=tmp_path)
    found = browser.inspect(run / "report.html", run / "report.png", executable)
    assert found["errors"] == []
    assert {p["name"] for p in found["plots"]} == RUN_PLOTS
    assert all(p["shapes"] > 0 for p in found["plots"]), found["plots"]
    assert (run / "report.png").read_bytes().startswith(b"\x89PNG")
    done = _cli("runners.analyze", str(run), cwd=tmp_path)  # a single run
    assert "replaysim result" in done.stdout and (run / "analysis" / "report.html").is_file()
    sweep = tmp_path / "sweep"
    _cli("runners.cli", "-m", "load.concurrency=1,8", "workload.num_requests=32", f"hydra.sweep.dir={sweep}",
         cwd=tmp_path)
    _cli("runners.analyze", str(sweep), cwd=tmp_path)
    for page in (sweep / "report.html", sweep / "analysis" / "report.html"):
        found = browser.inspect(page, None, executable)
        assert found["errors"] == [], page
        names = {p["name"] for p in found["plots"]}
        assert SWEEP_PLOTS - {"ttft_cdf"} <= names, page
    assert "ttft_cdf" in names  # analyze adds the per-point CDFs


def test_the_browser_check_reports_errors_and_network_use(tmp_path):
    executable = _chromium_or_skip()
    page = tmp_path / "bad.html"
    page.write_text('<!DOCTYPE html><html><head><title>t</title>'
                    '<link rel="stylesheet" href="https://cdn.example.com/x.css"></head>'
                    '<body><script>console.error("boom")</script></body></html>')
    errors = browser.inspect(page, None, executable)["errors"]
    assert any("boom" in e for e in errors) and any("cdn.example.com" in e for e in errors)


def test_the_trace_changes_no_other_result():
    base = {"workload": {"num_requests": 24, "output_tokens": 8}, "detokenization": {"base_ms": 1.0}}
    plain, _ = simulate(load_config(base), RunnerOptions())
    traced, _ = simulate(load_config({**base, "output": {"trace": True}}), RunnerOptions())
    assert traced.requests.equals(plain.requests)
    assert json.dumps(traced.summary, sort_keys=True) == json.dumps(plain.summary, sort_keys=True)


def test_many_percentiles_keep_the_summary_table_within_100_columns():
    result = simcore.run(load_config({"workload": {"num_requests": 16},
                                      "metrics": {"percentiles": [1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9]}}))
    text = format_summary({**result.summary, "config": result.config.resolved}, "/tmp/out")
    assert max(map(len, text.splitlines())) <= 100
    header = next(line for line in text.splitlines() if line.startswith("Latency (ms)"))
    # (100 - 28) // 10 - 1 = 6 percentile columns: the lowest, then the five highest
    assert header.split()[2:] == ["mean", "p1", "p75", "p90", "p95", "p99", "p99.9"]
    assert "(p5, p10, p25, p50 left out to fit 100 columns: see summary.json)" in text


def test_the_timeline_counts_spans_and_the_pass_running_at_each_instant():
    import pyarrow as pa

    # spans [0, 2), [1, 3), [1, open): at 0 -> 1, 1 -> 3, 2 -> 2, 3 -> 1; a NaN start never counts
    starts = np.array([0.0, 1.0, 1.0, np.nan])
    ends = np.array([2.0, 3.0, np.nan, 1.0])
    assert html_report._occupancy(starts, ends, np.array([0.0, 1.0, 2.0, 3.0])).tolist() == [1, 3, 2, 1]
    # rank 0 runs passes [0, 10) of 3 sequences and [12, 20) of 5; rank 1 one pass [0, 20) of 2
    passes = pa.table({
        "pool": pa.array(["aggregated"] * 3).dictionary_encode(),
        "worker": pa.array([0, 0, 0], pa.int32()), "rank": pa.array([0, 1, 0], pa.int32()),
        "start_ms": [0.0, 0.0, 12.0], "end_ms": [10.0, 20.0, 20.0],
        "num_prefill": [1, 0, 0], "num_decode": [2, 2, 5], "blocks_in_use": [4, 7, 9],
    })
    grid = np.array([5.0, 11.0, 15.0])
    sizes = np.array([3.0, 2.0, 5.0])
    assert html_report._per_rank_at(passes, grid, sizes)["aggregated"].tolist() == [5, 2, 7]
    # KV blocks as of each rank's latest pass start: 4 + 7, then 4 + 7 (held between passes), then 9 + 7
    assert html_report._held_blocks(passes, grid)["aggregated"].tolist() == [11, 11, 16]


def test_polyline_points_are_the_per_pair_format():
    from runners.svg import polyline_points

    rng = np.random.default_rng(7)
    for size in (1, 2, 1599):
        for scale in (1e-3, 1.0, 1e4):
            px, py = rng.normal(size=size) * scale, rng.normal(size=size) * scale
            px[0], py[-1] = -0.04, 0.05  # round to -0.0 and 0.1
            assert polyline_points(px, py) == " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px, py))
