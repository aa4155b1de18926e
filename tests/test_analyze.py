"""``replaysim-analyze``: tidy table, plots, and polars statistics equal to the simulator's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from runners.analyze import (
    Layout, analyze, cdf_figure, family_style, knee_figure, load_summary, percentiles_of, request_stats,
    scan_requests, stages_figure,
)

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
    assert "match summary.json" in done.stdout
    header = next(line for line in done.stdout.splitlines() if line.startswith("run_id"))
    assert "concurrency" in header.split()  # a swept key by its last part
    assert max(len(line) for line in done.stdout.splitlines() if not line.startswith("wrote ")) <= 100
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


@pytest.fixture(scope="module")
def layout(batch, tmp_path_factory):
    """The batch grid's table (failed points excluded, as the plots see it) and its layout."""
    table = analyze(batch, tmp_path_factory.mktemp("table"), plots=False, quiet=True)["table"]
    _, keys = load_summary(batch)
    return table, Layout(table, keys, None)


def _overlap(a, b) -> float:
    return max(0.0, min(a.x1, b.x1) - max(a.x0, b.x0)) * max(0.0, min(a.y1, b.y1) - max(a.y0, b.y0))


def test_every_family_has_its_own_marker_and_dashes(layout):
    table, plan = layout
    assert plan.along == "load.concurrency" and plan.family_keys == ["detokenization.per_output_us"]
    fig = knee_figure(table, plan, "ttft")
    ax = fig.axes[0]
    curves = [line for line in ax.lines if line.get_label() in ("0", "200")]
    assert len(curves) == 2
    assert len({(line.get_marker(), line.get_linestyle()) for line in curves}) == 2
    legend = ax.get_legend()
    assert legend.get_title().get_text() == "detokenization.per_output_us (µs)"
    assert [t.get_text() for t in legend.get_texts()] == ["0", "200"]
    # and beyond this grid: no two of the first 32 families look alike
    styles = {(family_style(i)["marker"], family_style(i)["linestyle"]) for i in range(32)}
    assert len(styles) == 32


def test_point_labels_do_not_cover_each_other(layout):
    table, plan = layout
    fig = knee_figure(table, plan, "tpot")
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    notes = [child for child in ax.texts if child.get_text()]
    boxes = [note.get_window_extent(renderer) for note in notes]
    assert all(_overlap(a, b) == 0 for i, a in enumerate(boxes) for b in boxes[i + 1:])
    # every concurrency is named at least once; a point shared by both curves once
    assert {note.get_text() for note in notes} == {"1", "4", "16"}
    positions = [tuple(note.xy) for note in notes]
    assert len(positions) == len(set(positions))


def test_stage_bars_are_shares_of_the_mean_ttft_they_are_labelled_with(layout):
    table, plan = layout
    fig = stages_figure(table, plan)
    ax = fig.axes[0]
    per_bar: dict[float, float] = {}
    for patch in ax.patches:
        per_bar[round(patch.get_x(), 6)] = per_bar.get(round(patch.get_x(), 6), 0.0) + patch.get_height()
    assert len(per_bar) == table.height
    assert all(abs(total - 100.0) < 1e-9 for total in per_bar.values())
    above = [t for t in ax.texts if t.xycoords == "data"]  # group names sit in axes coordinates
    totals = sorted(float(t.get_text().replace(",", "")) for t in above)
    expected = sorted(table["mean_ttft_ms"].to_list())
    assert len(totals) == len(expected)
    assert all(abs(shown - value) <= 0.01 * value for shown, value in zip(totals, expected))


def test_cdf_grid_has_a_panel_per_family_and_no_empty_one(layout, batch):
    table, plan = layout
    fig = cdf_figure(table, scan_requests(batch), plan)
    assert len(fig.axes) == 2  # two families, no spare panel
    for ax in fig.axes:
        assert len(ax.lines) == 3  # one CDF per concurrency
        assert ax.get_title().startswith("detokenization.per_output_us = ")
    legend = fig.legends[0]
    assert legend.get_title().get_text() == "load.concurrency"
    assert [t.get_text() for t in legend.get_texts()] == ["1", "4", "16"]
    assert min(t.get_fontsize() for t in legend.get_texts()) >= 8


def test_analyze_rejects_a_directory_without_a_sweep(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "runners.analyze", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "not a replaysim run or sweep" in done.stderr
