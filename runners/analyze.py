"""``replaysim-analyze DIR``: a sweep's tidy table, plots and report, or a single run's report.

Given a run directory (one holding ``summary.json``), it writes that run's
``report.html`` (:func:`runners.html_report.run_report`) and a one-row
``table.csv`` of its summary into ``DIR/analysis/`` and prints the summary
table.  Given a sweep:

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
- ``ttft_cdf.png``: per-request TTFT CDFs, one panel per family;
- ``report.html``: the same plots as inline SVG, the Pareto plot (tokens/s
  per GPU against tokens/s per user) and the table, in one self-contained page.

The printed table fits 100 columns: the least important columns are left out
(the line under it names them); ``table.csv`` has them all.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import textwrap
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from runners import html_report
from runners.report import fit_table, format_summary
from runners.sweep import SUMMARY_FILE, SWEEP_SUMMARY, point_files, summary_table
from simcore.metrics.registry import DISTRIBUTIONS, percentile_key, summary_key
from simcore.schema import TTFT_STAGES

PROG = "replaysim-analyze"
#: Load axes, in order of preference, that run along a knee curve.
LOAD_AXES = ("load.concurrency", "load.request_rate", "load.speedup")
#: Request-level distributions recomputed from requests.parquet (itl needs per-token data).
#: The distributions with one value per request (a request-table column).
REQUEST_METRICS = tuple(metric for metric in DISTRIBUTIONS if metric.column)
HEADLINE = ("request_throughput", "output_throughput", "p99_ttft_ms", "p99_tpot_ms", "mean_e2el_ms")
#: Importance of the printed columns (higher: kept longer when the table must fit); swept keys rank 5.
IMPORTANCE = {"run_id": 9, "output_throughput": 8, "p99_ttft_ms": 7, "p99_tpot_ms": 6, "request_throughput": 4,
              "mean_e2el_ms": 3, "status": 2}
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
        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as exc:
            raise AnalysisError(f"{path}: not a readable Parquet file ({' '.join(str(exc).split())[:200]})") from None
    elif point_files(root):
        table = summary_table(root)
    else:
        raise AnalysisError(f"{root} holds no {SUMMARY_FILE}, {SWEEP_SUMMARY} or point.json: "
                            "not a replaysim run or sweep")
    metadata = table.schema.metadata or {}
    try:
        keys = json.loads(metadata.get(b"parameters", b"[]"))
    except ValueError:
        raise AnalysisError(f"{path}: its parameters metadata is not JSON: not a replaysim sweep summary") from None
    if not isinstance(keys, list) or "seed" not in table.column_names:
        raise AnalysisError(f"{path}: no seed column or parameter list: not a replaysim sweep summary")
    frame = pl.from_arrow(table)
    if frame["seed"].n_unique() > 1:  # seeds swept (replicates): a parameter like the others
        keys = ["seed", *keys]
    return frame, keys


def percentiles_of(summary: pl.DataFrame) -> list[float]:
    """The configured percentiles, read back from the summary's ``p<P>_ttft_ms`` columns."""
    found = [float(m.group(1)) for c in summary.columns if (m := _PERCENTILE.match(c))]
    return sorted(found)


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
        col = pl.col(metric.column).drop_nulls()
        exprs += [
            col.mean().alias(summary_key("mean", metric)),
            col.quantile(0.5, interpolation="linear").alias(summary_key("median", metric)),
            col.std(ddof=0).alias(summary_key("std", metric)),
            col.min().alias(summary_key("min", metric)),
            col.max().alias(summary_key("max", metric)),
        ]
        exprs += [
            col.quantile(p / 100.0, interpolation="linear").alias(summary_key(percentile_key(p), metric))
            for p in percentiles
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

#: Units of swept keys, from the key's suffix (docs/semantics.md names them so), else by key.
SUFFIX_UNITS = {"_us": "µs", "_ms": "ms", "_s": "s", "_tokens": "tokens", "_gb": "GB"}
KEY_UNITS = {"load.request_rate": "req/s", "load.speedup": "×"}
#: Per-family line styles: coinciding curves stay visible as different markers and dashes.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", ":", "-.")
FONT = 8  # smallest text on the plots, in points


def unit_of(key: str) -> str | None:
    """The unit of a config key's values, or None (counts, names)."""
    if key in KEY_UNITS:
        return KEY_UNITS[key]
    return next((unit for suffix, unit in SUFFIX_UNITS.items() if key.endswith(suffix)), None)


def key_label(key: str) -> str:
    """The full key and its unit: ``detokenization.per_output_us (µs)``."""
    unit = unit_of(key)
    return key if unit is None else f"{key} ({unit})"


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_fmt(v) for v in value) + "]"
    return str(value)


def quantity(key: str, value) -> str:
    """A value with its key's unit: ``61.6 µs``."""
    unit = unit_of(key)
    return _fmt(value) if unit is None else f"{_fmt(value)} {unit}"


def family_style(index: int) -> dict[str, object]:
    """Colour, marker, dash and sizes of the ``index``-th family's curve.

    Markers cycle every 8 families and dashes every 4, shifted by one at each
    turn of the markers, so the first 32 families differ in (marker, dash).
    Within each run of 4 families every curve is thinner with smaller hollow
    markers than the one before, so a curve drawn over an identical one leaves
    it visible around it.
    """
    shrink = index % 4
    return {
        "color": f"C{index % 10}",
        "marker": MARKERS[index % len(MARKERS)],
        "linestyle": LINESTYLES[(index + index // len(MARKERS)) % len(LINESTYLES)],
        "markersize": 9.0 - 1.5 * shrink,
        "linewidth": 2.4 - 0.4 * shrink,
        "markerfacecolor": "none",
        "markeredgewidth": 1.6,
    }


class Layout:
    """Which swept keys vary, which one runs along the curves, which define the families."""

    def __init__(self, table: pl.DataFrame, keys: Sequence[str], along: str | None):
        self.varying = [k for k in keys if len({repr(v) for v in table[k].to_list()}) > 1]
        if along is not None and along not in keys:
            raise AnalysisError(f"--along {along} is not a swept key (swept: {', '.join(keys) or 'none'})")
        if along is None:
            along = next((k for k in LOAD_AXES if k in self.varying), self.varying[0] if self.varying else None)
        self.along = along
        self.family_keys = [k for k in self.varying if k != along]

    def family_title(self) -> str | None:
        """The family keys with their units (a legend title)."""
        return ", ".join(key_label(k) for k in self.family_keys) or None

    def family_label(self, row: dict) -> str:
        """The family's values (the legend entry under :meth:`family_title`)."""
        if not self.family_keys:
            return "all points"
        return ", ".join(_fmt(row[k]) for k in self.family_keys)

    def family_heading(self, row: dict) -> str:
        """The family as ``key = value unit`` lines (a panel or group title)."""
        return "\n".join(f"{k} = {quantity(k, row[k])}" for k in self.family_keys) or "all points"

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


def save_figure(fig, path: Path) -> Path | None:
    """Write ``fig`` (None: nothing to plot) to ``path`` and close it."""
    if fig is None:
        return None
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return path


def _tail_key(table: pl.DataFrame, metric: str) -> str | None:
    names = [c for c in table.columns if re.fullmatch(rf"p(\d+(?:\.\d+)?)_{metric}_ms", c)]
    if f"p99_{metric}_ms" in names:
        return f"p99_{metric}_ms"
    return max(names, key=lambda c: float(c[1:].split("_")[0]), default=None)


def _overlap_area(a, b) -> float:
    """Area shared by two bounding boxes (pixels squared)."""
    return max(0.0, min(a.x1, b.x1) - max(a.x0, b.x0)) * max(0.0, min(a.y1, b.y1) - max(a.y0, b.y0))


#: Where a point label may sit, in points from its marker, in order of preference.
LABEL_OFFSETS = ((6, 5), (6, -12), (-6, 5), (-6, -12), (0, 10), (0, -17), (12, -3), (-12, -3))


def label_points(ax, points: Sequence[tuple[float, float, str]]) -> list:
    """Annotate points without labels on top of each other or of markers.

    A label equal to one already drawn within a few pixels (curves through the
    same point) is drawn once; otherwise the first offset of
    :data:`LABEL_OFFSETS` that overlaps nothing drawn is taken (the least
    overlapping one when all do).  Call after the axes' limits and layout are
    final: placement is done in pixels.
    """
    from matplotlib.transforms import Bbox

    renderer = ax.figure.canvas.get_renderer()
    to_pixels = ax.transData.transform
    pixel = {(x, y): tuple(to_pixels((x, y))) for x, y, _ in points}
    half = 6.0  # half a marker, pixels
    taken = [Bbox.from_extents(px - half, py - half, px + half, py + half) for px, py in pixel.values()]
    drawn: list[tuple[float, float, str]] = []
    annotations = []
    for x, y, text in points:
        px, py = pixel[(x, y)]
        if any(t == text and abs(px - qx) < 3 and abs(py - qy) < 3 for qx, qy, t in drawn):
            continue
        best = None
        for dx, dy in LABEL_OFFSETS:
            note = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=FONT,
                               ha="left" if dx > 0 else "right" if dx < 0 else "center",
                               bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none",
                                     "alpha": 0.8})
            box = note.get_window_extent(renderer)
            overlap = sum(_overlap_area(box, b) for b in taken)
            if best is None or overlap < best[0]:
                if best is not None:
                    best[1].remove()
                best = (overlap, note, box)
            else:
                note.remove()
            if overlap == 0:
                break
        taken.append(best[2])
        drawn.append((px, py, text))
        annotations.append(best[1])
    return annotations


def knee_figure(table: pl.DataFrame, layout: Layout, metric: str):
    """Output throughput (x) vs tail latency of ``metric`` (y), one styled curve per family; None without data."""
    ykey = _tail_key(table, metric)
    if ykey is None:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    values, points = [], []
    for index, (label, rows) in enumerate(layout.families(table)):
        rows = rows.filter(pl.col("output_throughput").is_not_null() & pl.col(ykey).is_not_null())
        if rows.height == 0:
            continue
        x, y = rows["output_throughput"].to_list(), rows[ykey].to_list()
        values += y
        ax.plot(x, y, label=label, **family_style(index))
        if layout.along is not None:
            points += [(xi, yi, _fmt(a)) for xi, yi, a in zip(x, y, rows[layout.along].to_list())]
    if not values:
        plt.close(fig)
        return None
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 50:
        ax.set_yscale("log")
    tail = ykey.split("_")[0]
    ax.set_xlabel("output throughput (tok/s)")
    ax.set_ylabel(f"{tail} {metric.upper()} (ms)")
    along = f"; points labelled by {key_label(layout.along)}" if layout.along else ""
    ax.set_title(f"Throughput vs {tail} {metric.upper()}{along}", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=FONT, title=layout.family_title(), title_fontsize=FONT, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.margins(x=0.08, y=0.08)
    fig.tight_layout()
    label_points(ax, points)
    return fig


def stages_figure(table: pl.DataFrame, layout: Layout):
    """Each point's mean TTFT as shares of its stages (stacked to 100 %), the total in ms above; None without data.

    Shares, not milliseconds: a 38 ms TTFT and a 4,000 ms one sit side by
    side, and a stage of a few ms stays visible in both.  Bars are grouped by
    family, labelled by the value along the curves.
    """
    stages = [s for s in TTFT_STAGES if f"mean_{s}" in table.columns]
    stages = [s for s in stages if any(v for v in table[f"mean_{s}"].to_list() if v is not None)]
    if not stages or table.height == 0:
        return None
    plt = _pyplot()
    families = layout.families(table)
    positions, rows, groups = [], [], []
    for _, frame in families:
        start = len(positions) + len(groups)  # one empty slot between families
        members = list(frame.iter_rows(named=True))
        positions += [start + i for i in range(len(members))]
        rows += members
        groups.append((start, start + len(members) - 1, members[0]))
    totals = [sum(row[f"mean_{s}"] or 0.0 for s in stages) for row in rows]
    fig, ax = plt.subplots(figsize=(max(7.0, 0.42 * (positions[-1] + 1) + 3), 5.2))
    bottom = [0.0] * len(rows)
    colors = plt.get_cmap("tab10")
    for index, stage in enumerate(stages):
        shares = [100.0 * (row[f"mean_{stage}"] or 0.0) / t if t > 0 else 0.0 for row, t in zip(rows, totals)]
        ax.bar(positions, shares, bottom=bottom, width=0.8, color=colors(index), label=stage.removesuffix("_ms"))
        bottom = [b + s for b, s in zip(bottom, shares)]
    for x, total in zip(positions, totals):
        ax.annotate(f"{total:,.0f}" if total >= 100 else f"{total:.3g}", (x, 100.0), textcoords="offset points",
                    xytext=(0, 3), ha="center", va="bottom", fontsize=FONT, rotation=90 if len(rows) > 30 else 0)
    ticks = [_fmt(row[layout.along]) if layout.along else str(row["run_id"]) for row in rows]
    ax.set_xticks(positions, ticks, fontsize=FONT, rotation=0 if layout.along else 60)
    ax.set_xlim(-0.7, positions[-1] + 0.7)
    ax.set_ylim(0, 118)
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylabel("share of mean TTFT (%)")
    if layout.along:
        ax.set_xlabel(key_label(layout.along))
    if layout.family_keys:
        for first, _, _ in groups[1:]:
            ax.axvline(first - 1, color="0.6", linewidth=0.8)
        ax.xaxis.labelpad = 6 + 11 * len(layout.family_keys)
    ax.set_title("Mean TTFT by stage (completed requests)\n"
                 "bars: each stage's share; numbers above them: mean TTFT (ms)", fontsize=10)
    handles, names = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], names[::-1], fontsize=FONT, title="stage (top first)", title_fontsize=FONT,
              loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.tight_layout()
    if layout.family_keys:
        _group_labels(ax, layout, groups)
    return fig


def _group_labels(ax, layout: Layout, groups: Sequence[tuple[int, int, dict]]) -> None:
    """Name each family under its bars: ``key = value unit``, or the values alone when that is wider than the group."""
    renderer = ax.figure.canvas.get_renderer()
    notes = []
    for first, last, row in groups:
        notes.append(ax.annotate(layout.family_heading(row), ((first + last) / 2, 0.0),
                                 xycoords=("data", "axes fraction"), xytext=(0, -18), textcoords="offset points",
                                 ha="center", va="top", fontsize=FONT))
    span = [ax.transData.transform((last + 0.5, 0))[0] - ax.transData.transform((first - 0.5, 0))[0]
            for first, last, _ in groups]
    if all(note.get_window_extent(renderer).width <= width for note, width in zip(notes, span)):
        return
    for note, (_, _, row) in zip(notes, groups):
        note.set_text("\n".join(quantity(k, row[k]) for k in layout.family_keys))
    ax.set_xlabel(f"{ax.get_xlabel()}, in groups of {', '.join(layout.family_keys)}")


def cdf_grid(count: int) -> tuple[int, int]:
    """(rows, columns) of a panel grid for ``count`` panels: near square, at most 4 columns."""
    cols = min(4, max(1, math.ceil(math.sqrt(count))))
    return -(-count // cols), cols


def cdf_figure(table: pl.DataFrame, requests: pl.LazyFrame, layout: Layout):
    """Per-request TTFT CDF of every point, one panel per family, one shared legend; None without data."""
    ids = table["run_id"].to_list()
    ttft = (
        requests.filter(pl.col("run_id").is_in(ids) & (pl.col("status").cast(pl.String) == "completed"))
        .select("run_id", "ttft_ms")
        .collect()
    )
    if ttft.height == 0:
        return None
    by_run = {key[0]: frame["ttft_ms"].sort().to_numpy() for key, frame in ttft.group_by("run_id")}
    families = [(label, rows) for label, rows in layout.families(table)
                if any(by_run.get(r) is not None for r in rows["run_id"].to_list())]
    # one colour per value along the curves, the same in every panel, in sorted order
    def along_value(row: dict):
        return row[layout.along] if layout.along else row["run_id"]

    seen = {_fmt(along_value(row)): along_value(row) for _, rows in families for row in rows.iter_rows(named=True)}
    try:
        names = sorted(seen, key=seen.__getitem__)
    except TypeError:  # values that do not compare: first-seen order
        names = list(seen)
    plt = _pyplot()
    cmap = plt.get_cmap("viridis")
    color = {name: cmap(0.88 * i / max(len(names) - 1, 1)) for i, name in enumerate(names)}
    nrows, cols = cdf_grid(len(families))
    fig, axes = plt.subplots(nrows, cols, figsize=(3.6 * cols + 2.2, 3.0 * nrows + 0.8), squeeze=False,
                             sharex=True, sharey=True, layout="constrained")
    for ax in list(axes.flat)[len(families):]:
        fig.delaxes(ax)  # no empty panels
    positive = ttft.filter(pl.col("ttft_ms") > 0)["ttft_ms"]
    log_x = positive.len() > 0 and float(positive.max()) / float(positive.min()) > 50
    legend: dict[str, object] = {}
    for ax, (_, rows) in zip(axes.flat, families):
        for row in rows.iter_rows(named=True):
            values = by_run.get(row["run_id"])
            if values is None or values.size == 0:
                continue
            name = _fmt(along_value(row))
            fraction = (1.0 + np.arange(values.size)) / values.size
            (line,) = ax.step(values, fraction, where="post", color=color[name], linewidth=1.6)
            legend.setdefault(name, line)
        if log_x:
            ax.set_xscale("log")
        ax.set_title(layout.family_heading(rows.row(0, named=True)), fontsize=FONT + 1)
        ax.xaxis.set_tick_params(labelbottom=True)
        ax.yaxis.set_tick_params(labelleft=True)
        ax.set_xlabel("TTFT (ms)", fontsize=FONT + 1)
        ax.set_ylabel("fraction of requests", fontsize=FONT + 1)
        ax.grid(True, alpha=0.3)
    shown = [name for name in names if name in legend]
    fig.legend([legend[name] for name in shown], shown, loc="outside right upper", fontsize=FONT + 1,
               title=key_label(layout.along) if layout.along else "run", title_fontsize=FONT + 1)
    fig.suptitle("Per-request TTFT CDF (completed requests), one panel per configuration", fontsize=10)
    return fig


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
    if (root / SUMMARY_FILE).is_file():
        return analyze_run(root, out, quiet=quiet)
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
            save_figure(knee_figure(good, layout, "ttft"), out / "knee_ttft.png"),
            save_figure(knee_figure(good, layout, "tpot"), out / "knee_tpot.png"),
            save_figure(stages_figure(good, layout), out / "ttft_stages.png"),
            save_figure(cdf_figure(good, requests, layout), out / "ttft_cdf.png"),
        ):
            if written is not None:
                files.append(written)
    files.append(write_sweep_report(root, out, table, keys, layout, requests))
    if not quiet:
        shown = [c for c in ("run_id", "status", *layout.varying, *HEADLINE) if c in table.columns]
        constant = [k for k in keys if k not in layout.varying]
        if constant and good.height:
            fixed = "fixed: " + " ".join(f"{k}={_fmt(good[k].to_list()[0])}" for k in constant)
            print("\n".join(textwrap.wrap(fixed, width=100, subsequent_indent="       ", break_on_hyphens=False)))
        print("\n".join(printed_table(table, shown)))
        failed = table.filter(pl.col("status") == "failed")
        for row in failed.iter_rows(named=True):
            print(f"failed point {row['run_id']}: {row['error_type']}: {row['error']}", file=sys.stderr)
        agree = "match" if worst <= 1e-9 else "DIFFER FROM"
        print(f"request-level statistics recomputed in polars {agree} summary.json "
              f"(max relative difference {worst:.1e})")
        for path in files:
            print(f"wrote {path}")
    return {"table": table, "files": files, "max_rel_diff": worst}


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.3f}" if abs(value) < 1e6 else f"{value:.4g}"
    return _fmt(value)


def printed_table(table: pl.DataFrame, shown: Sequence[str]) -> list[str]:
    """The terminal table of ``shown`` columns, fitted to 100 characters (:func:`runners.report.fit_table`).

    Swept keys are headed by their last part when that is unambiguous.
    """
    last = [c.rsplit(".", 1)[-1] for c in shown]
    columns = []
    for column, short in zip(shown, last):
        header = short if last.count(short) == 1 else column
        columns.append((header, [_cell(v) for v in table[column].to_list()], IMPORTANCE.get(column, 5)))
    return fit_table(columns)


def sweep_gpus(root: Path, table: pl.DataFrame) -> dict[str, int | None]:
    """GPUs of each point (:func:`runners.html_report.gpus_of` of its ``summary.json`` config), by run id."""
    gpus: dict[str, int | None] = {}
    if "path" not in table.columns:
        return gpus
    for run_id, rel in zip(table["run_id"].to_list(), table["path"].to_list()):
        try:
            config = json.loads((root / str(rel) / SUMMARY_FILE).read_text(encoding="utf-8")).get("config") or {}
        except (OSError, ValueError):
            continue
        gpus[run_id] = html_report.gpus_of(config)
    return gpus


def write_sweep_report(root: Path, out: Path, table: pl.DataFrame, keys: Sequence[str], layout: Layout,
                       requests: pl.LazyFrame | None) -> Path:
    """``report.html`` of a sweep into ``out`` (with per-point TTFT CDFs when ``requests`` are given)."""
    rows = table.to_dicts()
    ttft = None
    if requests is not None:
        ok = [r["run_id"] for r in rows if r.get("status") != "failed"]
        frame = (requests.filter(pl.col("run_id").is_in(ok) & (pl.col("status").cast(pl.String) == "completed"))
                 .select("run_id", "ttft_ms").collect())
        ttft = {key[0]: group["ttft_ms"].to_numpy() for key, group in frame.group_by("run_id")}
    page = html_report.sweep_report(rows, keys, along=layout.along, gpus=sweep_gpus(root, table), ttft=ttft,
                                    where=str(root))
    out.mkdir(parents=True, exist_ok=True)
    path = out / html_report.REPORT_FILE
    path.write_text(page, encoding="utf-8")
    return path


def analyze_run(root: Path, out: Path, quiet: bool = False) -> dict[str, object]:
    """A single run's ``report.html`` and one-row ``table.csv`` into ``out``; prints its summary table.

    Parameters
    ----------
    root : Path
        The run directory (``summary.json``, ``requests.parquet``; ``passes.parquet``
        and ``tokens.parquet`` are read when present).
    out : Path
        Where to write.
    quiet : bool
        Print nothing.

    Returns
    -------
    dict
        ``table`` (one-row DataFrame of the summary's scalar metrics) and ``files``.
    """
    try:
        document = json.loads((root / SUMMARY_FILE).read_text(encoding="utf-8"))
    except ValueError as exc:
        raise AnalysisError(f"{root / SUMMARY_FILE} is not JSON: {exc}") from None
    if not (root / "requests.parquet").is_file():
        raise AnalysisError(f"{root} holds {SUMMARY_FILE} but no requests.parquet: not a complete replaysim run")

    def optional(name: str):
        path = root / f"{name}.parquet"
        return pq.read_table(path) if path.is_file() else None

    requests = pq.read_table(root / "requests.parquet")
    page = html_report.run_report(document, requests, optional("passes"), optional("tokens"),
                                  html_report.kv_blocks_of(document.get("config") or {}), where=str(root),
                                  scaling=optional("scaling"))
    out.mkdir(parents=True, exist_ok=True)
    report = out / html_report.REPORT_FILE
    report.write_text(page, encoding="utf-8")
    scalars = {k: v for k, v in document.items() if not isinstance(v, (dict, list)) and k != "git_sha"}
    table = pl.DataFrame([scalars])
    csv = out / "table.csv"
    table.write_csv(csv)
    files = [csv, report]
    if not quiet:
        print(format_summary(document, root))
        for path in files:
            print(f"wrote {path}")
    return {"table": table, "files": files}


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point."""
    parser = _Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", metavar="DIR",
                        help="a sweep directory (hydra.sweep.dir), a batch run's directory, or a single run's "
                             "directory (one holding summary.json)")
    parser.add_argument("--out", help="output directory (default: DIR/analysis)")
    parser.add_argument("--along", help="swept key the knee curves run along (default: the load axis)")
    parser.add_argument("--no-plots", action="store_true", help="write the table only")
    args = parser.parse_args(argv)
    try:
        analyze(args.sweep_dir, args.out, args.along, plots=not args.no_plots)
    except (AnalysisError, FileNotFoundError) as exc:
        _error(exc, 2)
    except (pa.ArrowException, pl.exceptions.PolarsError) as exc:  # a damaged points' file
        _error(f"{args.sweep_dir}: a result file cannot be read ({type(exc).__name__}: {exc})", 2)
    except OSError as exc:  # the analysis cannot be written
        reason = os.strerror(exc.errno) if exc.errno else exc
        _error(f"cannot write results to {exc.filename or args.out or args.sweep_dir}: {reason}", 74)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line (argparse's own prints the usage too)
        _error(message, 2)


def _error(message: object, code: int):
    text = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    print(f"{PROG}: error: {text}", file=sys.stderr, flush=True)
    raise SystemExit(code)


if __name__ == "__main__":
    main()
