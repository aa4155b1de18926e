"""``replaysim-analyze SWEEP_DIR``: a sweep's tidy table and plots (polars + matplotlib).

Reads ``summary.parquet`` (one row per point) and every point's
``requests.parquet`` through one ``pl.scan_parquet`` (each row already carries
``run_id`` and the swept parameters, so no join is needed), recomputes the
request-level latency statistics in polars with the simulator's conventions
(``numpy.percentile`` linear interpolation, population std), and writes into
``SWEEP_DIR/analysis/`` (or ``--out``):

- ``table.csv`` / ``table.parquet``: one row per point, parameters then metrics;
- ``knee_ttft.png`` / ``knee_tpot.png``: output throughput vs p99 TTFT / TPOT,
  one curve per configuration family (the latency-throughput knee);
- ``ttft_stages.png``: mean TTFT split into its stages, one stacked bar per point;
- ``ttft_cdf.png``: per-request TTFT CDFs, one panel per family.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Sequence

import polars as pl
import pyarrow.parquet as pq

from runners.sweep import SWEEP_SUMMARY, point_files, summary_table
from simcore.schema import TTFT_STAGES

PROG = "replaysim-analyze"
#: Load axes, in order of preference, that run along a knee curve.
LOAD_AXES = ("load.concurrency", "load.request_rate", "load.speedup")
#: Request-level distributions recomputed from requests.parquet (itl needs per-token data).
REQUEST_METRICS = ("ttft", "tpot", "e2el")
HEADLINE = ("request_throughput", "output_throughput", "p99_ttft_ms", "p99_tpot_ms", "mean_e2el_ms")
_PERCENTILE = re.compile(r"^p(\d+(?:\.\d+)?)_ttft_ms$")


class AnalysisError(Exception):
    """The directory holds no analysable sweep."""


# ---------------------------------------------------------------- loading


def load_summary(root: Path) -> tuple[pl.DataFrame, list[str]]:
    """The sweep summary and its parameter keys.

    Parameters
    ----------
    root : Path
        A sweep directory: ``summary.parquet`` is read if present, else it is
        rebuilt from the points' ``point.json`` (an interrupted sweep).

    Returns
    -------
    polars.DataFrame
        One row per point.
    list of str
        The parameter columns (schema metadata ``parameters``).
    """
    path = root / SWEEP_SUMMARY
    if path.exists():
        table = pq.read_table(path)
    elif point_files(root):
        table = summary_table(root)
    else:
        raise AnalysisError(f"{root} holds no {SWEEP_SUMMARY} and no point.json: not a replaysim sweep")
    metadata = table.schema.metadata or {}
    keys = json.loads(metadata.get(b"parameters", b"[]"))
    frame = pl.from_arrow(table)
    if frame["seed"].n_unique() > 1:  # seeds swept (replicates): a parameter like the others
        keys = ["seed", *keys]
    return frame, keys


def percentiles_of(summary: pl.DataFrame) -> list[float]:
    """The configured percentiles, read back from the summary's ``p<P>_ttft_ms`` columns."""
    found = [float(m.group(1)) for c in summary.columns if (m := _PERCENTILE.match(c))]
    return sorted(found)


def _pkey(p: float) -> str:
    return f"p{int(p)}" if float(p).is_integer() else f"p{p}"


def request_stats(requests: pl.LazyFrame, percentiles: Sequence[float]) -> pl.DataFrame:
    """Per-run latency statistics computed in polars, with the simulator's conventions.

    Parameters
    ----------
    requests : polars.LazyFrame
        Rows of ``requests.parquet`` files (``run_id``, ``status``, ``ttft_ms``,
        ``tpot_ms``, ``e2el_ms``).
    percentiles : sequence of float
        Percentiles in [0, 100].

    Returns
    -------
    polars.DataFrame
        One row per ``run_id``: ``{mean,median,std,min,max}_<m>_ms`` and
        ``p<P>_<m>_ms`` for m in ttft, tpot, e2el, over completed requests
        (tpot: those with a value, i.e. >= 2 tokens).  Percentiles use
        ``interpolation="linear"`` (``numpy.percentile``'s default), std uses
        ``ddof=0``, as ``simcore`` and ``vllm bench serve`` do; an empty
        distribution gives null.
    """
    exprs = []
    for metric in REQUEST_METRICS:
        col = pl.col(f"{metric}_ms").drop_nulls()
        exprs += [
            col.mean().alias(f"mean_{metric}_ms"),
            col.quantile(0.5, interpolation="linear").alias(f"median_{metric}_ms"),
            col.std(ddof=0).alias(f"std_{metric}_ms"),
            col.min().alias(f"min_{metric}_ms"),
            col.max().alias(f"max_{metric}_ms"),
        ]
        exprs += [
            col.quantile(p / 100.0, interpolation="linear").alias(f"{_pkey(p)}_{metric}_ms") for p in percentiles
        ]
    return (
        requests.filter(pl.col("status").cast(pl.String) == "completed")
        .group_by("run_id")
        .agg(exprs)
        .collect()
    )


def scan_requests(root: Path) -> pl.LazyFrame:
    """All points' requests under ``root`` as one lazy frame (no join, no hive columns)."""
    return pl.scan_parquet(str(root / "**" / "requests.parquet"), hive_partitioning=False)


# ---------------------------------------------------------------- the table


def tidy_table(summary: pl.DataFrame, stats: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """One row per point: ``run_id``, ``status``, ``seed``, parameters, then metrics.

    Request-level latency statistics come from :func:`request_stats` (polars);
    counts, throughputs, ITL and TTFT stage means from the summary.
    """
    recomputed = [c for c in stats.columns if c != "run_id"]
    base = summary.drop([c for c in recomputed if c in summary.columns])
    table = base.join(stats, on="run_id", how="left", maintain_order="left")
    first = ["run_id", "status", *dict.fromkeys(["seed", *keys])]
    metrics = [c for c in table.columns if c not in first and c not in ("error_type", "error", "overrides", "path")]
    ordered = [*first, *metrics, "error_type", "error", "overrides", "path"]
    table = table.select([c for c in ordered if c in table.columns])
    sortable = [k for k in keys if not isinstance(table.schema[k], (pl.List, pl.Array))]
    return table.sort(sortable or ["run_id"], nulls_last=True)


def check_against_summary(summary: pl.DataFrame, stats: pl.DataFrame) -> float:
    """Largest difference between polars statistics and the summary's, relative to the data's scale.

    Each difference is divided by the largest of the two values and the
    distribution's maximum (``max_<m>_ms``), so a population std of a constant
    distribution (0 in polars, ~1e-16 in numpy) counts as equal.
    """
    joined = summary.join(stats, on="run_id", how="inner", suffix="_polars")
    worst = 0.0
    for column in stats.columns:
        if column == "run_id" or column not in summary.columns:
            continue
        metric = column.rsplit("_", 2)[-2]
        a, b = pl.col(column).cast(pl.Float64), pl.col(f"{column}_polars").cast(pl.Float64)
        scale = pl.max_horizontal(a.abs(), b.abs(), pl.col(f"max_{metric}_ms").cast(pl.Float64).abs())
        diff = joined.select(((a - b).abs() / scale.clip(lower_bound=1e-300)).alias("d"))["d"]
        diff = diff.drop_nulls().drop_nans()
        if diff.len():
            worst = max(worst, float(diff.max()))
    return worst


def write_table(table: pl.DataFrame, out: Path) -> list[Path]:
    """``table.parquet`` and ``table.csv`` (list columns as JSON text in the CSV)."""
    out.mkdir(parents=True, exist_ok=True)
    parquet, csv = out / "table.parquet", out / "table.csv"
    table.write_parquet(parquet)
    flat = table.with_columns(
        [
            pl.col(c).map_elements(lambda v: json.dumps(list(v)), return_dtype=pl.String)
            for c, dtype in table.schema.items()
            if isinstance(dtype, pl.List)
        ]
    )
    flat.write_csv(csv)
    return [csv, parquet]


# ---------------------------------------------------------------- plots


def labels_for(keys: Sequence[str]) -> dict[str, str]:
    """Short labels: the last part of each key, or the whole key when that is ambiguous."""
    last = [key.rsplit(".", 1)[-1] for key in keys]
    return {key: (short if last.count(short) == 1 else key) for key, short in zip(keys, last)}


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_fmt(v) for v in value) + "]"
    return str(value)


class Layout:
    """Which swept keys vary, which one runs along the curves, which define the families."""

    def __init__(self, table: pl.DataFrame, keys: Sequence[str], along: str | None):
        varying = [k for k in keys if len({repr(v) for v in table[k].to_list()}) > 1]
        if along is not None and along not in keys:
            raise AnalysisError(f"--along {along} is not a swept key (swept: {', '.join(keys) or 'none'})")
        if along is None:
            along = next((k for k in LOAD_AXES if k in varying), varying[0] if varying else None)
        self.along = along
        self.family_keys = [k for k in varying if k != along]
        self.labels = labels_for(varying)

    def family_label(self, row: dict) -> str:
        if not self.family_keys:
            return "all points"
        return ", ".join(f"{self.labels[k]}={_fmt(row[k])}" for k in self.family_keys)

    def point_label(self, row: dict) -> str:
        keys = [*self.family_keys, *([self.along] if self.along else [])]
        return ", ".join(f"{self.labels[k]}={_fmt(row[k])}" for k in keys) or str(row["run_id"])

    def families(self, table: pl.DataFrame) -> list[tuple[str, pl.DataFrame]]:
        """(label, rows sorted along the curve) per family, in table order."""
        out: dict[str, list[dict]] = {}
        for row in table.iter_rows(named=True):
            out.setdefault(self.family_label(row), []).append(row)
        result = []
        for label, rows in out.items():
            frame = pl.DataFrame(rows, schema=table.schema)
            if self.along is not None:
                frame = frame.sort(self.along)
            result.append((label, frame))
        return result


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _tail_key(table: pl.DataFrame, metric: str) -> str | None:
    names = [c for c in table.columns if re.fullmatch(rf"p(\d+(?:\.\d+)?)_{metric}_ms", c)]
    if f"p99_{metric}_ms" in names:
        return f"p99_{metric}_ms"
    return max(names, key=lambda c: float(c[1:].split("_")[0]), default=None)


def plot_knee(table: pl.DataFrame, layout: Layout, metric: str, path: Path) -> Path | None:
    """Output throughput (x) vs tail latency of ``metric`` (y), one curve per family."""
    ykey = _tail_key(table, metric)
    if ykey is None:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    values = []
    for label, rows in layout.families(table):
        rows = rows.filter(pl.col("output_throughput").is_not_null() & pl.col(ykey).is_not_null())
        if rows.height == 0:
            continue
        x, y = rows["output_throughput"].to_list(), rows[ykey].to_list()
        values += y
        ax.plot(x, y, marker="o", label=label)
        if layout.along is not None:
            for xi, yi, a in zip(x, y, rows[layout.along].to_list()):
                ax.annotate(_fmt(a), (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 50:
        ax.set_yscale("log")
    ax.set_xlabel("output throughput (tok/s)")
    ax.set_ylabel(f"{ykey.split('_')[0]} {metric.upper()} (ms)")
    along = f", points labelled by {layout.labels.get(layout.along, layout.along)}" if layout.along else ""
    ax.set_title(f"Throughput vs {ykey.split('_')[0]} {metric.upper()}{along}", fontsize=10)
    ax.grid(True, alpha=0.3)
    if values:
        ax.legend(fontsize=7, title=", ".join(layout.labels[k] for k in layout.family_keys) or None, title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_stages(table: pl.DataFrame, layout: Layout, path: Path) -> Path | None:
    """Mean TTFT split into its stages, one stacked bar per point."""
    stages = [s for s in TTFT_STAGES if f"mean_{s}" in table.columns]
    if not stages or table.height == 0:
        return None
    plt = _pyplot()
    rows = [row for _, frame in layout.families(table) for row in frame.iter_rows(named=True)]
    labels = [layout.point_label(row) for row in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(rows) + 2), 4.8))
    bottom = [0.0] * len(rows)
    for stage in stages:
        heights = [row[f"mean_{stage}"] or 0.0 for row in rows]
        if not any(heights):
            continue
        ax.bar(range(len(rows)), heights, bottom=bottom, label=stage.removesuffix("_ms"))
        bottom = [b + h for b, h in zip(bottom, heights)]
    ax.set_xticks(range(len(rows)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("mean TTFT (ms)")
    ax.set_title("TTFT stage breakdown (completed requests, mean)", fontsize=10)
    if any(bottom):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_cdfs(table: pl.DataFrame, requests: pl.LazyFrame, layout: Layout, path: Path) -> Path | None:
    """Per-request TTFT CDF of every point, one panel per family."""
    ids = table["run_id"].to_list()
    ttft = (
        requests.filter(pl.col("run_id").is_in(ids) & (pl.col("status").cast(pl.String) == "completed"))
        .select("run_id", "ttft_ms")
        .collect()
    )
    if ttft.height == 0:
        return None
    by_run = {key[0]: frame["ttft_ms"].sort().to_numpy() for key, frame in ttft.group_by("run_id")}
    families = layout.families(table)
    plt = _pyplot()
    cols = min(3, len(families))
    nrows = -(-len(families) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
    cmap = plt.get_cmap("viridis")
    positive = ttft.filter(pl.col("ttft_ms") > 0)["ttft_ms"]
    log_x = positive.len() > 0 and float(positive.max()) / float(positive.min()) > 50
    for ax, (label, rows) in zip(axes.flat, families):
        n = rows.height
        for i, row in enumerate(rows.iter_rows(named=True)):
            values = by_run.get(row["run_id"])
            if values is None or values.size == 0:
                continue
            y = [(k + 1) / values.size for k in range(values.size)]
            name = f"{layout.labels[layout.along]}={_fmt(row[layout.along])}" if layout.along else row["run_id"]
            ax.step(values, y, where="post", color=cmap(i / max(n - 1, 1)), label=name)
        if log_x:
            ax.set_xscale("log")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("TTFT (ms)")
        ax.set_ylabel("fraction of requests")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(families):]:
        ax.set_visible(False)
    fig.suptitle("Per-request TTFT CDF (completed requests)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- command


def analyze(root: str | Path, out: str | Path | None = None, along: str | None = None,
            plots: bool = True, quiet: bool = False) -> dict[str, object]:
    """Build the tidy table and the plots of a sweep.

    Parameters
    ----------
    root : str or Path
        The sweep directory.
    out : str or Path, optional
        Where to write (default ``<root>/analysis``).
    along : str, optional
        The swept key the knee curves run along (default: the first varying of
        ``load.concurrency``, ``load.request_rate``, ``load.speedup``).
    plots : bool
        Write the PNGs.
    quiet : bool
        Print nothing.

    Returns
    -------
    dict
        ``table`` (DataFrame), ``files`` (paths written), ``max_rel_diff``
        (polars statistics vs the summary's).
    """
    root = Path(root)
    out = root / "analysis" if out is None else Path(out)
    summary, keys = load_summary(root)
    ok = summary.filter(pl.col("status") != "failed")
    percentiles = percentiles_of(summary)
    requests = scan_requests(root)
    stats = request_stats(requests.filter(pl.col("run_id").is_in(ok["run_id"].to_list())), percentiles)
    worst = check_against_summary(ok, stats)
    table = tidy_table(summary, stats, keys)
    files = write_table(table, out)
    good = table.filter(pl.col("status") != "failed")
    layout = Layout(good, keys, along)
    if plots:
        for written in (
            plot_knee(good, layout, "ttft", out / "knee_ttft.png"),
            plot_knee(good, layout, "tpot", out / "knee_tpot.png"),
            plot_stages(good, layout, out / "ttft_stages.png"),
            plot_cdfs(good, requests, layout, out / "ttft_cdf.png"),
        ):
            if written is not None:
                files.append(written)
    if not quiet:
        varying = [k for k in keys if k in layout.labels]
        shown = [c for c in ("run_id", "status", *varying, *HEADLINE) if c in table.columns]
        constant = [k for k in keys if k not in layout.labels]
        if constant and good.height:
            print("fixed: " + " ".join(f"{k}={_fmt(good[k].to_list()[0])}" for k in constant))
        with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=1000, tbl_hide_dataframe_shape=True,
                       fmt_str_lengths=40, float_precision=3, tbl_hide_column_data_types=True):
            print(table.select(shown))
        failed = table.filter(pl.col("status") == "failed")
        for row in failed.iter_rows(named=True):
            print(f"failed point {row['run_id']}: {row['error_type']}: {row['error']}", file=sys.stderr)
        agree = "match" if worst <= 1e-9 else "DIFFER FROM"
        print(f"request-level statistics recomputed in polars {agree} summary.json "
              f"(max relative difference {worst:.1e})")
        for path in files:
            print(f"wrote {path}")
    return {"table": table, "files": files, "max_rel_diff": worst}


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", help="a sweep directory (hydra.sweep.dir) or a batch run's directory")
    parser.add_argument("--out", help="output directory (default: SWEEP_DIR/analysis)")
    parser.add_argument("--along", help="swept key the knee curves run along (default: the load axis)")
    parser.add_argument("--no-plots", action="store_true", help="write the table only")
    args = parser.parse_args(argv)
    try:
        analyze(args.sweep_dir, args.out, args.along, plots=not args.no_plots)
    except (AnalysisError, FileNotFoundError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
