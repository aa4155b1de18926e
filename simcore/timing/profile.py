"""Per-operator profiles (``timing.type=table``): load, check, fill and lay out.

A profile directory holds three CSV files of **µs per layer** (the layout of
LLMServingSim's vLLM layer profiler, see docs/timing.md):

- ``dense.csv``: ``layer, tokens, time_us`` (ops that scale with the tokens of
  the pass);
- ``per_sequence.csv``: ``layer, sequences, time_us`` (``lm_head``,
  ``sampler``: one row per scheduled sequence);
- ``attention.csv``: ``prefill_chunk, kv_prefill, n_decode, kv_decode,
  time_us`` (one layer's attention for one prefill chunk over ``kv_prefill``
  cached tokens plus ``n_decode`` decodes of ``kv_decode`` cached tokens).

and optionally ``meta.yaml`` (here or one directory up) whose top-level
``num_layers`` gives the layer count when ``timing.num_layers`` is not set.

:func:`load_profile` checks every row (errors name ``<file>:<line>``) and
returns the kernel's ``(params, table)`` (layout: ``simcore.timing.nb.P_*``).
The attention CSV need not be a full tensor grid: the missing cells of the
union grid are filled as documented in :func:`fill_grid`.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass

import numpy as np

from simcore.checks import shown
from simcore.errors import ConfigError
from simcore.timing import nb
from simcore.units import MAX_INSTANT_NS
from simcore.values import integral
from simcore.workload.table import utf8_text

DENSE_FILE = "dense.csv"
SEQUENCE_FILE = "per_sequence.csv"
ATTENTION_FILE = "attention.csv"
MOE_FILE = "moe.csv"
META_FILE = "meta.yaml"

#: Dense ops that run once per pass (the model's prologue and head), not once
#: per decoder layer (LLMServingSim ``profiler/models/*.yaml`` sequences).
PER_PASS_OPS = frozenset({"embedding", "final_layernorm"})
#: Dense ops that run more than once per decoder layer (the profile averages
#: instances): ``layernorm`` is the input and the post-attention RMSNorm.
LAYER_MULTIPLICITY = {"layernorm": 2}

_ATTN_COLUMNS = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us")


@dataclass(frozen=True)
class Profile:
    """A loaded profile, in µs per layer (per pass for ``dense_pass`` and ``seq``)."""

    path: str
    num_layers: int
    dense_x: np.ndarray  # tokens knots
    dense_layer: np.ndarray  # per-layer dense ops at each knot, us
    dense_pass: np.ndarray  # once-per-pass dense ops at each knot, us
    seq_x: np.ndarray  # sequences knots
    seq_y: np.ndarray  # lm_head + sampler, us
    axes: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # pc, kvp, nd, kvd
    attention: np.ndarray  # filled grid, us, shape of the axes
    measured: np.ndarray  # bool, the cells that come from attention.csv
    # moe.csv (MoE models): one MoE layer (gate + routed experts) by tokens and activated experts
    moe_tokens: np.ndarray | None = None  # tokens knots
    moe_experts: np.ndarray | None = None  # activated-experts knots
    moe: np.ndarray | None = None  # filled grid, us, shape (tokens, experts)


#: The largest knot (tokens, sequences, KV tokens: int64 in the kernels) and time a profile row may
#: give: one operator's time is below ``MAX_INSTANT_NS`` (about 146 years), as every simulated instant.
MAX_KNOT = 2**63 - 1
MAX_TIME_US = MAX_INSTANT_NS / 1e3


def _fail(path: str, line: int, message: str) -> ConfigError:
    return ConfigError(f"{path}:{line}: {message}")


def _read_rows(path: str, columns: tuple[str, ...]) -> list[tuple[int, list[str]]]:
    if not os.path.isfile(path):
        raise ConfigError(f"timing.profile: {path} does not exist")
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ConfigError(f"timing.profile: cannot read {path} ({exc.strerror or exc})") from None
    if b"\0" in data:
        raise _fail(path, data.count(b"\n", 0, data.index(b"\0")) + 1, "a NUL byte: not a CSV text file")
    text = utf8_text(data, path, f"a profile CSV with the header {','.join(columns)} (timing.profile)")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise _fail(path, 1, f"empty file; expected the header {','.join(columns)}") from None
    header = [h.strip() for h in header]
    if tuple(header) != columns:
        raise _fail(path, 1, f"header must be {','.join(columns)}, got {','.join(header)}")
    rows = []
    for row in reader:
        line = reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(columns):
            raise _fail(path, line, f"expected {len(columns)} fields ({','.join(columns)}), got {len(row)}")
        rows.append((line, [cell.strip() for cell in row]))
    if not rows:
        raise _fail(path, 2, "no data rows")
    return rows


def _int(path: str, line: int, name: str, text: str, minimum: int) -> int:
    try:
        value = float(text)
    except ValueError:
        raise _fail(path, line, f"{name} must be an integer >= {minimum}, got {text!r}") from None
    number = integral(value)
    if number is None or not minimum <= number <= MAX_KNOT:
        raise _fail(path, line, f"{name} must be an integer from {minimum} to {MAX_KNOT}, got {text!r}")
    return number


def _time(path: str, line: int, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _fail(path, line, f"time_us must be a finite number >= 0, got {text!r}") from None
    if not math.isfinite(value) or not 0 <= value <= MAX_TIME_US:
        raise _fail(path, line, f"time_us must be a number from 0 to {MAX_TIME_US:.4g}, got {text!r}")
    return value


def _read_ops(path: str, key: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``layer -> (knots, us)`` of a dense or per-sequence CSV, knots ascending."""
    ops: dict[str, dict[int, tuple[int, float]]] = {}
    for line, (layer, x_text, t_text) in _read_rows(path, ("layer", key, "time_us")):
        if not layer:
            raise _fail(path, line, "layer must be a non-empty name")
        x = _int(path, line, key, x_text, 1)
        t = _time(path, line, t_text)
        seen = ops.setdefault(layer, {})
        if x in seen:
            raise _fail(path, line, f"duplicate row for layer {layer!r} at {key}={x} (first at line {seen[x][0]})")
        seen[x] = (line, t)
    out = {}
    for layer, points in ops.items():
        xs = np.array(sorted(points), dtype=np.float64)
        out[layer] = (xs, np.array([points[int(x)][1] for x in xs], dtype=np.float64))
    return out


def _sum_on_union(ops: dict[str, tuple[np.ndarray, np.ndarray]], weights: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """Knots = union of every op's knots; value = Σ weight × (op's linear interpolant)."""
    knots = np.unique(np.concatenate([x for x, _ in ops.values()]))
    total = np.zeros(knots.shape[0], dtype=np.float64)
    for layer, (x, y) in ops.items():
        w = weights.get(layer, 0.0)
        if w == 0.0:
            continue
        total += w * _linear(x, y, knots)
    return knots, total


def _linear(x: np.ndarray, y: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Piecewise-linear interpolation with linear extension beyond both ends (as the kernel)."""
    if x.shape[0] == 1:
        return np.full(q.shape[0], y[0])
    i = np.clip(np.searchsorted(x, q, side="right") - 1, 0, x.shape[0] - 2)
    t = (q - x[i]) / (x[i + 1] - x[i])
    return (1.0 - t) * y[i] + t * y[i + 1]


def _read_attention(path: str):
    points: dict[tuple[int, int, int, int], tuple[int, float]] = {}
    for line, cells in _read_rows(path, _ATTN_COLUMNS):
        pc = _int(path, line, "prefill_chunk", cells[0], 0)
        kvp = _int(path, line, "kv_prefill", cells[1], 0)
        nd = _int(path, line, "n_decode", cells[2], 0)
        kvd = _int(path, line, "kv_decode", cells[3], 0)
        t = _time(path, line, cells[4])
        if pc == 0 and nd == 0:
            raise _fail(path, line, "an attention row needs a prefill chunk or decodes (both are 0)")
        if pc == 0 and kvp != 0:
            raise _fail(path, line, f"kv_prefill must be 0 without a prefill chunk, got {kvp}")
        if nd == 0 and kvd != 0:
            raise _fail(path, line, f"kv_decode must be 0 without decodes, got {kvd}")
        key = (pc, kvp, nd, kvd)
        if key in points:
            raise _fail(path, line, f"duplicate attention row {key} (first at line {points[key][0]})")
        points[key] = (line, t)
    keys = np.array(list(points), dtype=np.int64)
    axes = tuple(np.unique(keys[:, a]).astype(np.float64) for a in range(4))
    grid = np.full(tuple(a.shape[0] for a in axes), np.nan)
    idx = [np.searchsorted(axes[a], keys[:, a]) for a in range(4)]
    grid[idx[0], idx[1], idx[2], idx[3]] = [t for _, t in points.values()]
    return axes, grid


def moe_path(profile: str) -> str | None:
    """The profile's ``moe.csv``: its own, else the one of the sibling ``tp1`` directory, else None.

    LLMServingSim's profiler measures the MoE block at TP 1 only (its
    ``profiler/core/categories.py``, ``categories_for``: no ``ExpertCategory`` for
    ``tp != 1``), so a ``tp2`` profile of an MoE model has none of its own.

    Parameters
    ----------
    profile : str
        The profile directory (``.../bf16/tp<N>``).

    Returns
    -------
    str or None
    """
    own = os.path.join(profile, MOE_FILE)
    if os.path.isfile(own):
        return own
    sibling = os.path.join(os.path.dirname(os.path.normpath(profile)), "tp1", MOE_FILE)
    return sibling if os.path.isfile(sibling) else None


def read_moe(path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``moe.csv``: the tokens and activated-experts knots and the filled grid of one MoE layer, us.

    LLMServingSim's profiler times the MoE block (gate and routed experts, vLLM's
    ``FusedMoE``) of one decoder layer at ``tokens`` tokens whose top-k choices are
    forced onto exactly ``activated_experts`` distinct experts (its
    ``profiler/core/hooks/moe_hook.py``), for ``top_k <= activated <= min(num_experts,
    tokens x top_k)``: the grid is a triangle.  A cell it could not measure (more
    experts than ``tokens x top_k`` pairs reach) is filled along the tokens axis at
    its activated count: linearly between measured cells, and beyond them
    extended from the two nearest (one: copied), never below 0.  Measured cells are
    kept exactly.

    Parameters
    ----------
    path : str
        The CSV file.

    Returns
    -------
    tokens, experts : ndarray(float64, ndim=1)
        Ascending knots.
    grid : ndarray(float64, shape (tokens, experts))
        us.

    Raises
    ------
    ConfigError
        A malformed row (``<file>:<line>``).
    """
    points: dict[tuple[int, int], tuple[int, float]] = {}
    for line, cells in _read_rows(path, ("tokens", "activated_experts", "time_us")):
        tokens = _int(path, line, "tokens", cells[0], 1)
        experts = _int(path, line, "activated_experts", cells[1], 1)
        time_us = _time(path, line, cells[2])
        if (tokens, experts) in points:
            raise _fail(path, line, f"duplicate row for tokens={tokens}, activated_experts={experts} "
                                    f"(first at line {points[(tokens, experts)][0]})")
        points[(tokens, experts)] = (line, time_us)
    t_knots = np.array(sorted({t for t, _ in points}), dtype=np.float64)
    e_knots = np.array(sorted({e for _, e in points}), dtype=np.float64)
    grid = np.full((t_knots.size, e_knots.size), np.nan)
    for (t, e), (_, time_us) in points.items():
        grid[np.searchsorted(t_knots, t), np.searchsorted(e_knots, e)] = time_us
    for j in range(e_knots.size):
        known = ~np.isnan(grid[:, j])
        xs, ys = t_knots[known], grid[known, j]
        missing = ~known
        if missing.any():
            grid[missing, j] = np.maximum(_linear(xs, ys, t_knots[missing]), 0.0)
    return t_knots, e_knots, grid


def fill_grid(axes, grid: np.ndarray) -> np.ndarray:
    """Fill the NaN cells of the attention grid (axes: pc, kvp, nd, kvd); returns a copy.

    1. Cells a batch cannot have take the value that does not depend on the
       axis: without a prefill (pc = 0) kv_prefill is irrelevant (copy from
       kv_prefill = 0); without decodes (nd = 0) kv_decode is irrelevant (copy
       from kv_decode = 0); pc = nd = 0 is the empty batch (0); with decodes,
       kv_decode = 0 (queries are clamped to the smallest positive knot) takes
       the value at the smallest measured kv_decode.
    2. Then, repeatedly, every gap between two known cells of a line along an
       axis is filled by linear interpolation (axes in the order kv_decode,
       kv_prefill, prefill_chunk, n_decode) until nothing changes; then each
       remaining cell beyond the known cells of a line is extended linearly
       from the two nearest known cells (axes n_decode, prefill_chunk,
       kv_prefill, kv_decode; one known cell: copied), and step 2 repeats.
    Measured cells are never changed.

    Parameters
    ----------
    axes : tuple of 4 ndarray(float64, ndim=1)
        Ascending knots: prefill chunk (tokens), kv prefill (tokens), decodes
        (sequences), kv decode (tokens).
    grid : ndarray(float64, ndim=4)
        Attention time per layer, us, NaN where not measured.

    Returns
    -------
    ndarray(float64, ndim=4)
        The filled grid, us, same shape.

    Raises
    ------
    ConfigError
        A cell has no measured neighbour on any axis.
    """
    g = grid.copy()
    pc, kvp, nd, kvd = axes
    if pc[0] == 0:
        if kvp[0] == 0:
            g[0] = np.where(np.isnan(g[0]), g[0, :1], g[0])
    if nd[0] == 0:
        if kvd[0] == 0:
            g[:, :, 0, :] = np.where(np.isnan(g[:, :, 0, :]), g[:, :, 0, :1], g[:, :, 0, :])
        if pc[0] == 0:
            g[0, :, 0, :] = 0.0
    if kvd[0] == 0 and kvd.shape[0] > 1:
        start = 1 if nd[0] == 0 else 0
        sub = g[:, :, start:, :]
        for i in np.argwhere(np.isnan(sub[..., 0])):
            line = sub[i[0], i[1], i[2], 1:]
            known = np.flatnonzero(~np.isnan(line))
            if known.size:
                sub[i[0], i[1], i[2], 0] = line[known[0]]
    interior_order = (3, 1, 0, 2)
    outer_order = (2, 0, 1, 3)
    while np.isnan(g).any():
        before = int(np.isnan(g).sum())
        changed = True
        while changed:
            changed = False
            for axis in interior_order:
                changed |= _fill_lines(g, axes[axis], axis, extend=False)
        if not np.isnan(g).any():
            break
        for axis in outer_order:
            if _fill_lines(g, axes[axis], axis, extend=True):
                break
        if int(np.isnan(g).sum()) == before:
            raise ConfigError("attention.csv: the grid is too sparse to fill (a cell has no measured neighbour on any axis)")
    return g


def _fill_lines(g: np.ndarray, knots: np.ndarray, axis: int, *, extend: bool) -> bool:
    moved = np.moveaxis(g, axis, -1)  # a view: writes go into g
    lines = moved.reshape(-1, knots.shape[0])
    nan = np.isnan(lines)
    todo = np.flatnonzero(nan.any(axis=1) & (~nan).any(axis=1))
    changed = False
    for r in todo:
        line = lines[r]
        known = np.flatnonzero(~np.isnan(line))
        missing = np.flatnonzero(np.isnan(line))
        if extend:
            if known.size == 1:
                fill = np.full(missing.shape[0], line[known[0]])
            else:
                fill = _linear(knots[known], line[known], knots[missing])
            line[missing] = fill
            changed = True
        else:
            inside = missing[(missing > known[0]) & (missing < known[-1])]
            if inside.size:
                line[inside] = np.interp(knots[inside], knots[known], line[known])
                changed = True
        lines[r] = line
    if changed:
        moved[...] = lines.reshape(moved.shape)
    return changed


def read_num_layers(path: str) -> int | None:
    """Top-level ``num_layers`` of ``meta.yaml`` in the profile directory or its parent, or None.

    Parameters
    ----------
    path : str
        The profile directory.

    Returns
    -------
    int or None
        Decoder layers, >= 1; None when no ``meta.yaml`` sets it.
    """
    return read_meta_count(path, "num_layers")


def read_meta_count(path: str, key: str) -> int | None:
    """A top-level integer ``key`` (>= 1) of ``meta.yaml`` in the profile directory or its parent.

    Parameters
    ----------
    path : str
        The profile directory.
    key : str
        ``num_layers`` or ``hidden_size``.

    Returns
    -------
    int or None
        The value; None when no ``meta.yaml`` sets it.
    """
    import yaml

    for candidate in (os.path.join(path, META_FILE), os.path.join(os.path.dirname(os.path.normpath(path)), META_FILE)):
        if os.path.isfile(candidate):
            with open(candidate, "rb") as handle:
                text = utf8_text(handle.read(), candidate, "the profile's meta.yaml (YAML text)")
            try:
                meta = yaml.safe_load(text) or {}
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                where = f"{candidate}:{mark.line + 1}" if mark is not None else candidate
                problem = getattr(exc, "problem", None) or "not valid YAML"
                raise ConfigError(f"{where}: not valid YAML ({problem})") from None
            value = meta.get(key) if isinstance(meta, dict) else None
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_KNOT:
                    raise ConfigError(f"{candidate}: {key} must be an integer from 1 to {MAX_KNOT}, "
                                      f"got {shown(value)}")
                return value
    return None


def load_profile(path: str, num_layers: int | None = None) -> Profile:
    """Read and check a profile directory; fill the attention grid.

    Parameters
    ----------
    path : str
        The directory holding ``dense.csv``, ``per_sequence.csv`` and ``attention.csv``.
    num_layers : int or None
        Decoder layers of the served model (each rank's share under TP is in
        the profile itself); None: ``num_layers`` of ``meta.yaml``.

    Returns
    -------
    Profile
    """
    if not os.path.isdir(path):
        raise ConfigError(f"timing.profile must be a directory holding {DENSE_FILE}, {SEQUENCE_FILE} and {ATTENTION_FILE}, got {path!r}")
    if num_layers is None:
        num_layers = read_num_layers(path)
        if num_layers is None:
            raise ConfigError(
                f"timing.num_layers must be set: {path} has no meta.yaml with a top-level num_layers "
                "(the profiles are per layer; hf_overrides.num_hidden_layers is the profiled count, not the model's)"
            )
    dense = _read_ops(os.path.join(path, DENSE_FILE), "tokens")
    weights = {layer: 0.0 if layer in PER_PASS_OPS else float(LAYER_MULTIPLICITY.get(layer, 1)) for layer in dense}
    dense_x, dense_layer = _sum_on_union(dense, weights)
    _, dense_pass = _sum_on_union(dense, {layer: 1.0 for layer in dense if layer in PER_PASS_OPS})
    seq = _read_ops(os.path.join(path, SEQUENCE_FILE), "sequences")
    seq_x, seq_y = _sum_on_union(seq, {layer: 1.0 for layer in seq})
    axes, grid = _read_attention(os.path.join(path, ATTENTION_FILE))
    measured = ~np.isnan(grid)
    filled = fill_grid(axes, grid)
    moe_tokens = moe_experts = moe = None
    moe_file = moe_path(path)
    if moe_file is not None:
        moe_tokens, moe_experts, moe = read_moe(moe_file)
    return Profile(
        path, int(num_layers), dense_x, dense_layer, dense_pass, seq_x, seq_y, axes, filled, measured,
        moe_tokens, moe_experts, moe,
    )


def profile_arrays(profile: Profile) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's ``(params, table)`` for a loaded profile (layout ``nb.P_*``).

    Parameters
    ----------
    profile : Profile
        From :func:`load_profile`.

    Returns
    -------
    params : ndarray(float64, shape (TABLE_NUM_PARAMS,))
        Layer count, offsets and sizes of the pieces of ``table``, smallest
        positive prefill-chunk and kv-decode knots (tokens).
    table : ndarray(float64, ndim=1)
        Dense and per-sequence knots and times (us), attention axes and grid (us).
    """
    pieces: list[np.ndarray] = []
    offsets: dict[str, int] = {}
    cursor = 0

    def put(name: str, array: np.ndarray) -> None:
        nonlocal cursor
        offsets[name] = cursor
        flat = np.ascontiguousarray(array, dtype=np.float64).ravel()
        pieces.append(flat)
        cursor += flat.shape[0]

    put("dense_x", profile.dense_x)
    put("dense_layer", profile.dense_layer)
    put("dense_pass", profile.dense_pass)
    put("seq_x", profile.seq_x)
    put("seq_y", profile.seq_y)
    for name, axis in zip(("pc", "kvp", "nd", "kvd"), profile.axes):
        put(name, axis)
    put("attn", profile.attention)
    if profile.moe is not None:
        put("moe_t", profile.moe_tokens)
        put("moe_a", profile.moe_experts)
        put("moe", profile.moe)
    params = np.zeros(nb.TABLE_NUM_PARAMS, dtype=np.float64)
    params[nb.P_NUM_LAYERS] = profile.num_layers
    params[nb.P_DENSE_X] = offsets["dense_x"]
    params[nb.P_DENSE_N] = profile.dense_x.shape[0]
    params[nb.P_DENSE_LAYER] = offsets["dense_layer"]
    params[nb.P_DENSE_PASS] = offsets["dense_pass"]
    params[nb.P_SEQ_X] = offsets["seq_x"]
    params[nb.P_SEQ_N] = profile.seq_x.shape[0]
    params[nb.P_SEQ_Y] = offsets["seq_y"]
    for name, index, count in (
        ("pc", nb.P_PC_X, nb.P_PC_N),
        ("kvp", nb.P_KVP_X, nb.P_KVP_N),
        ("nd", nb.P_ND_X, nb.P_ND_N),
        ("kvd", nb.P_KVD_X, nb.P_KVD_N),
    ):
        params[index] = offsets[name]
        params[count] = profile.axes[("pc", "kvp", "nd", "kvd").index(name)].shape[0]
    params[nb.P_ATTN] = offsets["attn"]
    pc, _, _, kvd = profile.axes
    params[nb.P_PC_MIN] = pc[pc > 0][0] if (pc > 0).any() else 1.0
    params[nb.P_KVD_MIN] = kvd[kvd > 0][0] if (kvd > 0).any() else 1.0
    if profile.moe is not None:  # the model's expert counts and MoE layers are set by simcore.timing.api
        params[nb.P_MOE_T_X] = offsets["moe_t"]
        params[nb.P_MOE_T_N] = profile.moe_tokens.shape[0]
        params[nb.P_MOE_A_X] = offsets["moe_a"]
        params[nb.P_MOE_A_N] = profile.moe_experts.shape[0]
        params[nb.P_MOE] = offsets["moe"]
    return params, np.concatenate(pieces)


_CACHE: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def table_arrays(path: str, num_layers: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``profile_arrays(load_profile(path, num_layers))``, memoised per process on the files' mtimes.

    Parameters
    ----------
    path : str
        The profile directory.
    num_layers : int or None
        Decoder layers; None: from ``meta.yaml``.

    Returns
    -------
    params, table : ndarray(float64, ndim=1)
        As :func:`profile_arrays`.
    """
    stamp = []
    for name in (DENSE_FILE, SEQUENCE_FILE, ATTENTION_FILE, META_FILE):
        file = os.path.join(path, name)
        stamp.append(os.stat(file).st_mtime_ns if os.path.isfile(file) else None)
    moe_file = moe_path(path)
    stamp.append(None if moe_file is None else (moe_file, os.stat(moe_file).st_mtime_ns))
    key = (os.path.abspath(path), num_layers, tuple(stamp))
    if key not in _CACHE:
        _CACHE[key] = profile_arrays(load_profile(path, num_layers))
    return _CACHE[key]
