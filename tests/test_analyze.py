"""``replaysim-analyze``: tidy table, plots, and polars statistics equal to the simulator's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from runners.analyze import analyze, percentiles_of, request_stats, scan_requests

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("knee_ttft.png", "knee_tpot.png", "ttft_stages.png", "ttft_cdf.png")


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> Path:
    """A 3 x 2 batch sweep with varied lengths and a non-integral percentile."""
    root = tmp_path_factory.mktemp("analyze") / "grid"
    done = subprocess.run(
        [
            sys.executable, "-m", "runners.cli", f"hydra.run.dir={root}",
            "sweep.batch.load.concurrency=[1,4,16]", "sweep.batch.detokenization.per_output_us=[0,200]",
            "detokenization.base_ms=1", "workload.num_requests=48", "workload.input_tokens=256",
            "workload.output_tokens=16", "workload.input_dist=uniform", "workload.output_dist=uniform",
            "workload.range_ratio=0.25", "metrics.percentiles=[50,90,99,99.9]",
        ],
        cwd=root.parent, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return root


def test_analyze_writes_table_and_plots(batch):
    done = subprocess.run(
        [sys.executable, "-m", "runners.analyze", str(batch)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    out = batch / "analysis"
    for name in PLOTS:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5_000, name
    table = pl.read_parquet(out / "table.parquet")
    assert table.height == 6 and table.columns[:5] == [
        "run_id", "status", "seed", "detokenization.base_ms", "detokenization.per_output_us"
    ]
    assert table.schema["load.concurrency"] == pl.Int64 and table.schema["p99.9_ttft_ms"] == pl.Float64
    csv = pl.read_csv(out / "table.csv")
    assert csv.height == 6 and csv["metrics.percentiles"][0] == "[50.0, 90.0, 99.0, 99.9]"
    assert "load.concurrency" in done.stdout and "match summary.json" in done.stdout
    assert all(f"wrote {out / name}" in done.stdout for name in PLOTS)


def test_polars_percentiles_equal_the_summary(batch):
    summary = pl.read_parquet(batch / "summary.parquet")
    percentiles = percentiles_of(summary)
    assert percentiles == [50.0, 90.0, 99.0, 99.9]
    stats = request_stats(scan_requests(batch), percentiles)
    joined = summary.join(stats, on="run_id", suffix="_polars")
    assert joined.height == 6
    checked = 0
    for column in stats.columns[1:]:
        metric = column.rsplit("_", 2)[-2]
        for row in joined.iter_rows(named=True):
            expected, got = row[column], row[f"{column}_polars"]
            assert (expected is None) == (got is None), column
            if expected is None:
                continue
            # numpy's std of a constant sample is ~1e-16, not 0: compare on the data's scale
            scale = max(abs(expected), abs(row[f"max_{metric}_ms"]))
            assert abs(expected - got) <= 1e-12 * scale, (column, row["run_id"], expected, got)
            checked += 1
    assert checked >= 6 * 3 * 8
    assert analyze(batch, batch / "again", plots=False, quiet=True)["max_rel_diff"] <= 1e-12


def test_analyze_rejects_a_directory_without_a_sweep(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "runners.analyze", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "not a replaysim sweep" in done.stderr
