"""Pass terms (time scales, per-pass overhead, TP all-reduce, CUDA-graph padding): the
kernel's parameter block and the all-reduce curve reader.

Under tensor parallelism of ``n`` GPUs every decoder layer ends its attention
and its MLP with an all-reduce of the pass's activations, ``tokens x
hidden_size x dtype_bytes`` bytes (docs/timing.md).  The kernel
(``simcore.timing.nb.allreduce_ms_nb``) prices one all-reduce either by the
ring formula ``latency_us + 2 (n - 1) / n x bytes / bandwidth`` or by a measured
curve of message size to time, interpolated piecewise linearly.

Curves are read in two layouts:

- Vidur's ``all_reduce.csv`` (header with ``size``, ``num_workers`` and
  ``time_stats.all_reduce.median``): ``size`` counts fp16 elements (Vidur's
  collective profiler allocates ``size`` float16 values,
  ``vidur/profiling/collectives/collectives_impl.py``), so bytes = 2 x size;
  the median is in ms; rows of ``num_workers == timing.tp``.
- nccl-tests output (``all_reduce_perf``): ``#`` comment lines, then rows
  ``size count type redop root time algbw busbw #wrong ...`` with size in bytes
  and the out-of-place time in us.
"""

from __future__ import annotations

import csv
from typing import TYPE_CHECKING

import numpy as np

from simcore.errors import ConfigError
from simcore.timing import nb
from simcore.units import MAX_INSTANT_NS
from simcore.workload.table import utf8_text

if TYPE_CHECKING:  # annotations only
    from simcore.timing.settings import TimingConfig

VIDUR_TIME = "time_stats.all_reduce.median"
VIDUR_ELEMENT_BYTES = 2  # float16 elements


def read_curve(path: str, tp: int) -> tuple[np.ndarray, np.ndarray]:
    """Message sizes (bytes, ascending, unique) and all-reduce times (us) of a curve file.

    Parameters
    ----------
    path : str
        A Vidur ``all_reduce.csv`` or an nccl-tests output file.
    tp : int
        TP degree: the rows of Vidur's ``num_workers`` to keep.

    Returns
    -------
    sizes, times : ndarray(float64, ndim=1)
        Knots (bytes) and their times (us; the mean where a size repeats).

    Raises
    ------
    ConfigError
        A malformed row (``<file>:<line>``) or no row for ``tp``.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ConfigError(f"timing.allreduce.curve: cannot read {path} ({exc.strerror or exc})") from None
    expected = "an all-reduce curve (timing.allreduce.curve): Vidur's all_reduce.csv or nccl-tests output"
    if b"\0" in data:
        line = data.count(b"\n", 0, data.index(b"\0")) + 1
        raise ConfigError(f"{path}:{line}: a NUL byte: not a text file; expected {expected}")
    lines = utf8_text(data, path, expected).splitlines()
    first = next((i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")), None)
    if first is None:
        raise ConfigError(f"{path}: no data rows (timing.allreduce.curve)")
    if "size" in lines[first].split(","):
        pairs = _vidur_rows(path, lines, first, tp)
    else:
        pairs = _nccl_rows(path, lines, first)
    if not pairs:
        raise ConfigError(f"{path}: no all-reduce rows for {tp} GPUs (timing.tp={tp})")
    by_size: dict[float, list[float]] = {}
    for size, time_us in pairs:
        by_size.setdefault(size, []).append(time_us)
    sizes = np.array(sorted(by_size), dtype=np.float64)
    # A size measured more than once (Vidur's file has one) takes the mean.
    times = np.array([sum(by_size[s]) / len(by_size[s]) for s in sizes], dtype=np.float64)
    return sizes, times


#: The largest message (bytes) and time (us) a curve point may give: a pass's instants are int64 ns
#: below ``MAX_INSTANT_NS`` (about 146 years), and so is one all-reduce.
MAX_CURVE_BYTES = float(2**63)
MAX_CURVE_US = MAX_INSTANT_NS / 1e3


def _checked(path: str, line: int, size: float, time_us: float) -> tuple[float, float]:
    if not (np.isfinite(size) and 0 < size <= MAX_CURVE_BYTES and np.isfinite(time_us)
            and 0 <= time_us <= MAX_CURVE_US):
        raise ConfigError(f"{path}:{line}: need a size from 1 to {MAX_CURVE_BYTES:.4g} bytes and a time from 0 to "
                          f"{MAX_CURVE_US:.4g} us (timing.allreduce.curve), got {size!r}, {time_us!r}")
    return size, time_us


def _vidur_rows(path: str, lines: list[str], first: int, tp: int) -> list[tuple[float, float]]:
    rows = list(csv.reader(lines[first:]))
    header = rows[0]
    for column in ("size", "num_workers", VIDUR_TIME):
        if column not in header:
            raise ConfigError(f"{path}:{first + 1}: the header has no {column!r} column")
    size_at, workers_at, time_at = header.index("size"), header.index("num_workers"), header.index(VIDUR_TIME)
    out = []
    for offset, row in enumerate(rows[1:], start=first + 2):
        if not row:
            continue
        try:
            workers = int(row[workers_at])
            size = float(row[size_at]) * VIDUR_ELEMENT_BYTES
            time_us = float(row[time_at]) * 1000.0
        except (ValueError, IndexError):
            raise ConfigError(f"{path}:{offset}: expected numbers in size, num_workers, {VIDUR_TIME}") from None
        if workers == tp:
            out.append(_checked(path, offset, size, time_us))
    return out


def _nccl_rows(path: str, lines: list[str], first: int) -> list[tuple[float, float]]:
    out = []
    for offset, line in enumerate(lines[first:], start=first + 1):
        fields = line.split()
        if not fields or fields[0].startswith("#"):
            continue
        try:
            size, time_us = float(fields[0]), float(fields[5])
        except (ValueError, IndexError):
            raise ConfigError(
                f"{path}:{offset}: expected nccl-tests columns 'size count type redop root time ...'"
            ) from None
        out.append(_checked(path, offset, size, time_us))
    return out


def pass_terms_block(cfg: TimingConfig, table_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's pass-terms parameters (``nb.R_*``) and the arrays to append to the table.

    Parameters
    ----------
    cfg : TimingConfig
        The timing section (scales, overhead; ``cfg.allreduce`` false: no
        all-reduce; ``cfg.cuda_graph_sizes`` None: no padding).
    table_size : int
        Length of the model's own flat table (the appended arrays follow it).

    Returns
    -------
    block : ndarray(float64, shape (nb.PASS_TERMS_NUM_PARAMS,))
    appended : ndarray(float64, ndim=1)
        The all-reduce curve's knots (bytes) then times (us), if a curve is
        set, then the CUDA-graph capture sizes, if set; may be empty.
    """
    block = np.zeros(nb.PASS_TERMS_NUM_PARAMS, dtype=np.float64)
    block[nb.R_PREFILL_SCALE] = cfg.prefill_scale
    block[nb.R_DECODE_SCALE] = cfg.decode_scale
    block[nb.R_OVERHEAD_US] = cfg.pass_overhead_us
    block[nb.R_SKEW_ALPHA] = cfg.attention_skew_alpha
    block[nb.R_PREFILL_TOKEN_SCALE] = cfg.prefill_token_scale
    block[nb.R_DECODE_ATTENTION_SCALE] = cfg.decode_attention_scale
    block[nb.R_DECODE_BASE_SCALE] = cfg.decode_base_scale
    appended: list[np.ndarray] = []
    end = table_size
    if cfg.allreduce:
        block[nb.R_COUNT] = 2 * cfg.num_layers
        block[nb.R_BYTES_PER_TOKEN] = cfg.hidden_size * cfg.dtype_bytes
        block[nb.R_GPUS] = cfg.tp
        if cfg.allreduce_curve is None:
            block[nb.R_LATENCY_US] = cfg.allreduce_latency_us
            block[nb.R_BANDWIDTH] = cfg.allreduce_bandwidth_gb_per_second
        else:
            sizes, times = read_curve(cfg.allreduce_curve, cfg.tp)
            block[nb.R_CURVE_N] = sizes.size
            block[nb.R_CURVE_X] = end
            block[nb.R_CURVE_Y] = end + sizes.size
            appended += [sizes, times]
            end += 2 * sizes.size
    if cfg.cuda_graph_sizes:
        block[nb.R_GRAPH_N] = len(cfg.cuda_graph_sizes)
        block[nb.R_GRAPH_X] = end
        appended.append(np.asarray(cfg.cuda_graph_sizes, dtype=np.float64))
    if not appended:
        return block, np.zeros(0, dtype=np.float64)
    return block, np.concatenate(appended)
