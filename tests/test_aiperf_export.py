"""The aiperf export: aiperf's tags, units and statistic blocks from a run's own tables."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import subprocess
import sys

import numpy as np
import polars as pl
import pytest

import simcore
from runners.export import AIPERF_CSV_STATS, AIPERF_PERCENTILES, aiperf_csv, aiperf_document, vllm_bench_document

CONFIG = {
    "workload": {"num_requests": 40, "input_tokens": 64, "output_tokens": 6, "output_dist": "uniform", "range_ratio": 0.2},
    "load": {"concurrency": 8},
    "detokenization": {"workers": 1, "base_ms": 1.0, "per_output_us": 50.0, "chunk_size": 2},
    "metrics": {"goodput": {"ttft_ms": 40.0}},
    "output": {"tokens": True},
}


def stats(values) -> dict:
    """aiperf's record statistics, written out: numpy-linear percentiles, population std."""
    values = np.asarray(values, dtype=np.float64)
    out = {"avg": values.mean(), "min": values.min(), "max": values.max(), "std": values.std(ddof=0)}
    out.update({f"p{p}": np.percentile(values, p) for p in AIPERF_PERCENTILES})
    return out


def assert_block(block: dict, unit: str, values) -> None:
    assert block["unit"] == unit
    for key, value in stats(values).items():
        assert block[key] == pytest.approx(value, rel=1e-12), key


@pytest.fixture(scope="module")
def run():
    return simcore.run(CONFIG)


def test_record_metrics_follow_aiperf_definitions(run):
    document = aiperf_document(run, run.tokens)
    requests = pl.from_arrow(run.requests).filter(pl.col("status") == "completed")
    assert_block(document["time_to_first_token"], "ms", requests["ttft_ms"])
    assert_block(document["request_latency"], "ms", requests["e2el_ms"])
    # aiperf's inter_token_latency is the per-request average: replaysim's TPOT.
    tpot = requests["tpot_ms"].drop_nulls()
    assert_block(document["inter_token_latency"], "ms", tpot)
    assert document["inter_token_latency"]["avg"] == pytest.approx(run.summary["mean_tpot_ms"], rel=1e-12)
    assert_block(document["output_token_throughput_per_user"], "tokens/sec/user", 1000.0 / tpot)
    assert_block(document["output_sequence_length"], "tokens", requests["generated_tokens"])
    assert_block(document["input_sequence_length"], "tokens", requests["input_tokens"])
    # inter_chunk_latency: every gap between consecutive receipts, pooled.
    tokens = pl.from_arrow(run.tokens).sort("request_id", "index")
    gaps = tokens.group_by("request_id", maintain_order=True).agg(pl.col("received_ms").diff().drop_nulls())
    pooled = gaps["received_ms"].explode().drop_nulls()
    assert len(pooled) == int((requests["generated_tokens"] - 1).sum())
    assert_block(document["inter_chunk_latency"], "ms", pooled)
    assert document["inter_chunk_latency"]["avg"] == pytest.approx(run.summary["mean_itl_ms"], rel=1e-12)


def test_aggregate_metrics_carry_unit_and_avg_only(run):
    document = aiperf_document(run, run.tokens)
    summary = run.summary
    expected = {
        "request_count": ("requests", summary["completed"]),
        "request_throughput": ("requests/sec", summary["request_throughput"]),
        "output_token_throughput": ("tokens/sec", summary["output_throughput"]),
        "benchmark_duration": ("sec", summary["duration_s"]),
        "total_isl": ("tokens", 40 * 64),
        "total_osl": ("tokens", summary["total_output_tokens"]),
        "goodput": ("requests/sec", summary["request_goodput"]),
        "good_request_count": ("requests", int((pl.from_arrow(run.requests)["ttft_ms"] <= 40.0).sum())),
    }
    for tag, (unit, avg) in expected.items():
        assert document[tag] == {"unit": unit, "avg": avg}, tag
    assert "error_request_count" not in document and document["error_summary"] == []
    assert document["input_config"] == {"endpoint": {"model_names": []}}


def test_without_tokens_the_gap_block_keeps_the_summary_percentiles_only():
    result = simcore.run({**CONFIG, "output": {"tokens": False}})
    block = aiperf_document(result, None)["inter_chunk_latency"]
    summary = result.summary
    assert block == {"unit": "ms", "avg": summary["mean_itl_ms"],
                     **{f"p{p}": summary[f"p{p}_itl_ms"] for p in (50, 90, 95, 99)},
                     "min": summary["min_itl_ms"], "max": summary["max_itl_ms"], "std": summary["std_itl_ms"]}


def test_the_csv_has_aiperf_two_sections(run):
    document = aiperf_document(run, run.tokens)
    sections = aiperf_csv(document).split("\r\n\r\n")
    assert len(sections) == 2
    records = list(csv.reader(io.StringIO(sections[0])))
    assert records[0] == ["Metric", *AIPERF_CSV_STATS]
    names = [row[0] for row in records[1:]]
    assert names[0] == "Input Sequence Length (tokens)" and "Time to First Token (ms)" in names
    ttft = next(row for row in records if row[0] == "Time to First Token (ms)")
    assert ttft[1:] == [f"{document['time_to_first_token'][k]:.2f}" for k in AIPERF_CSV_STATS]
    single = dict(csv.reader(io.StringIO(sections[1])))
    assert single.pop("Metric") == "Value"
    assert single["Request Count"] == "40" and single["GoodRequestCount"] == str(document["good_request_count"]["avg"])
    assert single["Benchmark Duration (sec)"] == f"{run.summary['duration_s']:.2f}"


def test_rejected_requests_are_errors():
    result = simcore.run({"workload": {"num_requests": 4, "input_tokens": 64, "output_tokens": 2},
                          "engine": {"aggregated": {"context_length": 32}}})
    document = aiperf_document(result, None)
    assert document["error_request_count"] == {"unit": "requests", "avg": 4}
    assert document["error_summary"][0]["count"] == 4 and document["error_summary"][0]["error_details"]["type"] == "rejected"
    assert "request_throughput" not in document and document["request_count"] == {"unit": "requests", "avg": 0}


def test_model_id_comes_from_timing_model(run):
    config = dataclasses.replace(run.config, timing=dataclasses.replace(run.config.timing, model="meta-llama/Meta-Llama-3.1-8B"))
    named = dataclasses.replace(run, config=config)
    assert aiperf_document(named, None)["input_config"] == {"endpoint": {"model_names": ["meta-llama/Meta-Llama-3.1-8B"]}}
    assert vllm_bench_document(named, None, detailed=False)["model_id"] == "meta-llama/Meta-Llama-3.1-8B"
    assert vllm_bench_document(run, None, detailed=False)["model_id"] is None


def test_the_cli_writes_both_files_and_a_rerun_without_the_export_removes_them(tmp_path):
    def replaysim(*args):
        done = subprocess.run(
            [sys.executable, "-m", "runners.cli", *args, f"output.dir={tmp_path}", f"hydra.run.dir={tmp_path / 'h'}",
             "workload.num_requests=8", "workload.input_tokens=32", "workload.output_tokens=3"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr

    replaysim("export.aiperf=true")
    document = json.loads((tmp_path / "profile_export_aiperf.json").read_text())
    assert document["request_count"] == {"unit": "requests", "avg": 8}
    assert (tmp_path / "profile_export_aiperf.csv").read_text().startswith("Metric,avg,min,max,p1,")
    replaysim()
    assert not (tmp_path / "profile_export_aiperf.json").exists() and not (tmp_path / "profile_export_aiperf.csv").exists()
