"""Small inline-SVG charts for the HTML reports: no JavaScript, no network, no plotting library.

Each function returns one ``<svg>`` element as text, sized in CSS pixels,
with a ``data-plot`` attribute naming the chart (the browser test counts
them), a ``<title>`` for screen readers, axes with round-number ticks (linear,
or decades on a log axis) and a legend to the right.  Values that are None or
not finite are left out.
"""

from __future__ import annotations

import math
from html import escape
from typing import Iterable, Sequence

import numpy as np

#: matplotlib's tab10 colours, so the report's plots look like the PNGs of replaysim-analyze.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")
DASHES = ("", "6 3", "2 2", "8 3 2 3")
WIDTH, HEIGHT = 580, 270
LEFT, RIGHT, TOP, BOTTOM = 64, 160, 30, 46
#: Points a line is drawn with at most (longer series are thinned evenly, ends kept).
MAX_POINTS = 800


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def _floats(values: Sequence) -> np.ndarray:
    if isinstance(values, np.ndarray):
        return values.astype(float, copy=False)
    return np.asarray([np.nan if v is None else v for v in values], dtype=float)


def _finite(xs: Sequence, ys: Sequence) -> tuple[np.ndarray, np.ndarray]:
    x, y = _floats(xs), _floats(ys)
    keep = np.isfinite(x) & np.isfinite(y)
    return x[keep], y[keep]


def thin(x: np.ndarray, y: np.ndarray, limit: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most ``limit`` points of a series, evenly spaced by index, the first and last kept."""
    if x.size <= limit:
        return x, y
    index = np.unique(np.linspace(0, x.size - 1, limit).round().astype(np.int64))
    return x[index], y[index]


def polyline_points(px: np.ndarray, py: np.ndarray) -> str:
    """``x,y x,y ...`` with one decimal, as ``" ".join(f"{x:.1f},{y:.1f}" ...)`` writes it, in one format call."""
    pairs = np.empty(2 * px.size, dtype=float)
    pairs[0::2], pairs[1::2] = px, py
    return " ".join(["%.1f,%.1f"] * px.size) % tuple(pairs.tolist())


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round-number ticks (1, 2 or 5 × 10^k apart), from the last multiple of the step at or below
    ``low`` to the last at or below ``high``."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return []
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(count, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9 and len(ticks) < 50:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _log_ticks(low: float, high: float) -> list[float]:
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    decades = [10.0 ** k for k in range(first, last + 1)]
    if len(decades) <= 3:
        decades = sorted({m * d for d in decades for m in (1, 2, 5)})
    return decades


def tick_label(value: float) -> str:
    """A tick's text: ``0``, ``2.5``, ``1,200``, ``3e+06``."""
    if value == 0:
        return "0"
    if abs(value) >= 1e6 or abs(value) < 1e-3:
        return f"{value:.0e}"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:.4g}"


class Axes:
    """Data -> pixel mapping of one chart, linear or log on each axis."""

    def __init__(self, xs: np.ndarray, ys: np.ndarray, *, log_x: bool = False, log_y: bool = False,
                 y_zero: bool = True, x_range: tuple[float, float] | None = None,
                 y_range: tuple[float, float] | None = None, width: int = WIDTH, height: int = HEIGHT):
        self.width, self.height = width, height
        self.log_x = log_x and xs.size > 0 and bool((xs > 0).all())
        self.log_y = log_y and ys.size > 0 and bool((ys > 0).all())
        self.x0, self.x1 = x_range or self._range(xs, self.log_x, zero=False)
        self.y0, self.y1 = y_range or self._range(ys, self.log_y, zero=y_zero)

    @staticmethod
    def _range(values: np.ndarray, log: bool, zero: bool) -> tuple[float, float]:
        if values.size == 0:
            return (1.0, 10.0) if log else (0.0, 1.0)
        low, high = float(values.min()), float(values.max())
        if log:
            return 10.0 ** math.floor(math.log10(low)), 10.0 ** math.ceil(math.log10(high))
        if zero and low >= 0:
            low = 0.0
        if high == low:
            high = low + (abs(low) or 1.0)
        ticks = nice_ticks(low, high)
        return min(low, ticks[0]), max(high, ticks[-1])

    def _frac(self, value: np.ndarray, low: float, high: float, log: bool) -> np.ndarray:
        if log:
            return (np.log10(value) - math.log10(low)) / (math.log10(high) - math.log10(low))
        return (value - low) / (high - low)

    def px(self, x) -> np.ndarray:
        frac = self._frac(np.asarray(x, dtype=float), self.x0, self.x1, self.log_x)
        return LEFT + frac * (self.width - LEFT - RIGHT)

    def py(self, y) -> np.ndarray:
        frac = self._frac(np.asarray(y, dtype=float), self.y0, self.y1, self.log_y)
        return self.height - BOTTOM - frac * (self.height - TOP - BOTTOM)

    def frame(self, xlabel: str, ylabel: str, y_ticks: bool = True, x_ticks: bool = True) -> list[str]:
        """Grid lines, ticks, tick labels and axis labels (``x_ticks``, ``y_ticks`` False: none on that axis)."""
        right, bottom = self.width - RIGHT, self.height - BOTTOM
        parts = [f'<rect x="{LEFT}" y="{TOP}" width="{right - LEFT}" height="{bottom - TOP}" class="frame"/>']
        xticks = _log_ticks(self.x0, self.x1) if self.log_x else nice_ticks(self.x0, self.x1)
        for value in xticks if x_ticks else ():
            if not self.x0 - 1e-12 <= value <= self.x1 * (1 + 1e-12) + 1e-12:
                continue
            x = float(self.px(value))
            parts.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{bottom}" class="grid"/>')
            parts.append(f'<text x="{x:.1f}" y="{bottom + 14}" class="tick" text-anchor="middle">'
                         f'{tick_label(value)}</text>')
        yticks = _log_ticks(self.y0, self.y1) if self.log_y else nice_ticks(self.y0, self.y1)
        for value in yticks if y_ticks else ():
            if not self.y0 - 1e-12 <= value <= self.y1 * (1 + 1e-12) + 1e-12:
                continue
            y = float(self.py(value))
            parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" class="grid"/>')
            parts.append(f'<text x="{LEFT - 5}" y="{y + 4:.1f}" class="tick" text-anchor="end">'
                         f'{tick_label(value)}</text>')
        parts.append(f'<text x="{(LEFT + right) / 2:.0f}" y="{self.height - 8}" class="label" '
                     f'text-anchor="middle">{escape(xlabel)}</text>')
        parts.append(f'<text transform="translate(14 {(TOP + bottom) / 2:.0f}) rotate(-90)" class="label" '
                     f'text-anchor="middle">{escape(ylabel)}</text>')
        return parts


def _svg(name: str, title: str, parts: Iterable[str], width: int = WIDTH, height: int = HEIGHT) -> str:
    body = "".join(parts)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" data-plot="{escape(name)}" '
            f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">'
            f'<title>{escape(title)}</title>'
            f'<text x="{LEFT}" y="18" class="title">{escape(title)}</text>{body}</svg>')


def _legend(entries: Sequence[tuple[str, str, str]], width: int = WIDTH, title: str | None = None) -> list[str]:
    """(label, colour, dash) entries right of the axes."""
    x = width - RIGHT + 12
    y = TOP + 6
    parts = []
    if title:
        parts.append(f'<text x="{x}" y="{y + 4}" class="legend-title">{escape(title[:28])}</text>')
        y += 16
    for label, stroke, dash in entries[:14]:
        parts.append(f'<line x1="{x}" y1="{y}" x2="{x + 18}" y2="{y}" stroke="{stroke}" stroke-width="2"'
                     + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        parts.append(f'<text x="{x + 23}" y="{y + 4}" class="legend">{escape(label[:24])}</text>')
        y += 15
    if len(entries) > 14:
        parts.append(f'<text x="{x}" y="{y + 4}" class="legend">… {len(entries) - 14} more</text>')
    return parts


def empty(name: str, title: str, why: str) -> str:
    """A chart's place when there is nothing to draw, saying why."""
    return _svg(name, title, [f'<text x="{LEFT}" y="{HEIGHT / 2:.0f}" class="note">{escape(why)}</text>'],
                height=HEIGHT // 2)


def lines(name: str, title: str, series: Sequence[dict], xlabel: str, ylabel: str, *,
          log_x: bool = False, log_y: bool = False, step: bool = False, markers: bool = False,
          y_range: tuple[float, float] | None = None, legend_title: str | None = None,
          annotate: bool = False) -> str:
    """A line chart: ``series`` are dicts with ``label``, ``x``, ``y`` and optional ``color``,
    ``dash``, ``marker`` (draw circles), ``labels`` (text beside each point, with ``annotate``).

    ``step``: drawn as a step function (a CDF), each value held until the next x.
    """
    cleaned = []
    for index, entry in enumerate(series):
        x, y = _finite(entry["x"], entry["y"])
        if x.size == 0:
            continue
        cleaned.append((index, entry, x, y))
    if not cleaned:
        return empty(name, title, "no data")
    all_x = np.concatenate([c[2] for c in cleaned])
    all_y = np.concatenate([c[3] for c in cleaned])
    axes = Axes(all_x, all_y, log_x=log_x, log_y=log_y, y_range=y_range)
    parts = axes.frame(xlabel, ylabel)
    legend = []
    for index, entry, x, y in cleaned:
        stroke = entry.get("color") or color(index)
        dash = entry.get("dash", "")
        tx, ty = thin(x, y)
        px, py = axes.px(tx), axes.py(ty)
        if step and px.size > 1:
            xs = np.repeat(px, 2)[1:]
            ys = np.repeat(py, 2)[:-1]
            px, py = xs, ys
        points = polyline_points(px, py)
        if px.size > 1 and not entry.get("marker_only"):
            parts.append(f'<polyline points="{points}" fill="none" stroke="{stroke}" stroke-width="1.8"'
                         + (f' stroke-dasharray="{dash}"' if dash else "") + "/>")
        if markers or entry.get("marker") or px.size == 1:
            for a, b in zip(axes.px(tx), axes.py(ty)):
                parts.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3.2" fill="white" stroke="{stroke}" '
                             f'stroke-width="1.6"/>')
        if annotate and entry.get("labels") is not None:
            texts = [t for t, xv, yv in zip(entry["labels"], entry["x"], entry["y"])
                     if xv is not None and yv is not None and math.isfinite(xv) and math.isfinite(yv)]
            for text, a, b in zip(texts, axes.px(x), axes.py(y)):
                parts.append(f'<text x="{a + 5:.1f}" y="{b - 5:.1f}" class="point">{escape(str(text))}</text>')
        legend.append((entry["label"], stroke, dash))
    if len(legend) > 1 or legend_title:
        parts += _legend(legend, title=legend_title)
    return _svg(name, title, parts)


def cdf(name: str, title: str, series: Sequence[tuple[str, np.ndarray]], xlabel: str,
        log_x: bool | None = None, legend_title: str | None = None) -> str:
    """Empirical CDFs (fraction of values <= x), one step line per (label, values).

    The x axis is logarithmic when the positive values span more than 50×
    (``log_x`` None) and every value is positive.
    """
    drawn = []
    for label, values in series:
        values = np.asarray(values, dtype=float)
        values = np.sort(values[np.isfinite(values)])
        if values.size == 0:
            continue
        index = np.arange(values.size)
        if values.size > MAX_POINTS:  # evenly spaced order statistics, the first and last kept
            index = np.unique(np.linspace(0, values.size - 1, MAX_POINTS).round().astype(np.int64))
        drawn.append({"label": label, "x": values[index], "y": (index + 1) / values.size})
    if not drawn:
        return empty(name, title, "no completed request has a value")
    if log_x is None:
        every = np.concatenate([d["x"] for d in drawn])
        log_x = bool((every > 0).all()) and every.max() / every.min() > 50
    return lines(name, title, drawn, xlabel + (" (log scale)" if log_x else ""), "fraction of requests",
                 log_x=log_x, step=True, y_range=(0.0, 1.0), legend_title=legend_title)


def stacked_bars(name: str, title: str, bars: Sequence[tuple[str, Sequence[float]]], parts_names: Sequence[str],
                 ylabel: str, *, percent: bool = False, totals: Sequence[str] | None = None, xlabel: str = "") -> str:
    """Vertical stacked bars: ``bars`` are (tick label, one value per part); ``percent`` stacks shares to 100.

    ``totals``: a text above each bar.
    """
    if not bars:
        return empty(name, title, "no data")
    values = np.asarray([[0.0 if v is None or not math.isfinite(v) else float(v) for v in b] for _, b in bars])
    if percent:
        sums = values.sum(axis=1, keepdims=True)
        values = np.divide(100.0 * values, sums, out=np.zeros_like(values), where=sums > 0)
    top = float(values.sum(axis=1).max()) if values.size else 1.0
    axes = Axes(np.asarray([0.0, len(bars)]), np.asarray([0.0, top or 1.0]),
                y_range=(0.0, 100.0) if percent else None)
    parts = axes.frame(xlabel, ylabel, x_ticks=False)
    slot = (axes.width - LEFT - RIGHT) / len(bars)
    width = max(2.0, min(48.0, 0.7 * slot))
    for i, (label, _) in enumerate(bars):
        centre = LEFT + (i + 0.5) * slot
        bottom = 0.0
        for k, value in enumerate(values[i]):
            if value <= 0:
                continue
            y_top, y_bottom = float(axes.py(bottom + value)), float(axes.py(bottom))
            parts.append(f'<rect x="{centre - width / 2:.1f}" y="{y_top:.1f}" width="{width:.1f}" '
                         f'height="{max(y_bottom - y_top, 0.5):.1f}" fill="{color(k)}">'
                         f'<title>{escape(label)}: {escape(parts_names[k])} {value:.4g}{"%" if percent else ""}'
                         f'</title></rect>')
            bottom += value
        if len(bars) <= 40:
            parts.append(f'<text x="{centre:.1f}" y="{HEIGHT - BOTTOM + 14}" class="tick" text-anchor="middle">'
                         f'{escape(label[:10])}</text>')
        if totals is not None and len(bars) <= 40:
            parts.append(f'<text x="{centre:.1f}" y="{float(axes.py(bottom)) - 3:.1f}" class="point" '
                         f'text-anchor="middle">{escape(totals[i])}</text>')
    parts += _legend([(n, color(k), "") for k, n in enumerate(parts_names)][::-1], title="(top first)")
    return _svg(name, title, parts)


def hbar(name: str, title: str, segments: Sequence[tuple[str, float]], unit: str) -> str:
    """One horizontal bar split into labelled segments (a mean split into its stages)."""
    kept = [(label, value) for label, value in segments if value is not None and value > 0]
    total = sum(v for _, v in kept)
    height = 120
    if total <= 0:
        return empty(name, title, "every stage is 0")
    axes = Axes(np.asarray([0.0, total]), np.asarray([0.0, 1.0]), height=height)
    parts = axes.frame(unit, "", y_ticks=False)
    y0, y1 = float(axes.py(0.8)), float(axes.py(0.2))
    start = 0.0
    for k, (label, value) in enumerate(segments):
        if value is None or value <= 0:
            continue
        a, b = float(axes.px(start)), float(axes.px(start + value))
        index = [s[0] for s in segments].index(label)
        parts.append(f'<rect x="{a:.1f}" y="{y0:.1f}" width="{max(b - a, 0.5):.1f}" height="{y1 - y0:.1f}" '
                     f'fill="{color(index)}"><title>{escape(label)}: {value:.4g} {escape(unit)} '
                     f'({100 * value / total:.1f}%)</title></rect>')
        start += value
    parts += _legend([(f"{label} {100 * (value or 0) / total:.1f}%", color(k), "")
                      for k, (label, value) in enumerate(segments) if value], title=None)
    return _svg(name, title, parts, height=height + 40)
