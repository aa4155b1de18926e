"""Timing-model selection: turn ``timing.*`` into the kernel's code, parameters and table."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simcore.timing.allreduce import pass_terms_block
from simcore.timing import nb
from simcore.timing.nb import TIMING_AIC, TIMING_FIXED, TIMING_LINEAR, TIMING_ROOFLINE, TIMING_TABLE

if TYPE_CHECKING:  # annotations only
    from simcore.timing.settings import TimingConfig


NO_TABLE = np.zeros(0, dtype=np.float64)


def timing_arrays(cfg: TimingConfig) -> tuple[int, np.ndarray, np.ndarray]:
    """The model code, float64 parameters and flat table that ``rank_time_ms_nb`` reads.

    ``table`` loads and checks the profile (``simcore.timing.profile``); ``aic``
    loads its component tables from the disk cache or builds and self-checks
    them (``simcore.timing.aic``, needs the ``replaysim[aic]`` extra).  Both are
    memoised per process.

    Parameters
    ----------
    cfg : TimingConfig
        The ``timing.*`` section.

    Returns
    -------
    model : int
        ``TIMING_FIXED``, ``TIMING_LINEAR``, ``TIMING_TABLE``, ``TIMING_AIC`` or ``TIMING_ROOFLINE``.
    params : ndarray(float64, ndim=1)
        fixed: ``[prefill_ms, decode_ms]``; linear: ``[base_ms, per_prefill_token_us,
        per_decode_seq_us, per_kv_token_ns]``; table/aic: offsets and sizes into ``table``;
        roofline: the ``nb.RF_*`` layout; linear, table, aic and roofline are followed
        by the pass-terms block (``nb.R_*``: scales,
        overhead, TP all-reduce, CUDA-graph padding).
    table : ndarray(float64, ndim=1)
        Flat lookup tables (empty for fixed and linear; roofline: its operator groups).
    """
    if cfg.type == "fixed":
        return TIMING_FIXED, np.array([cfg.prefill_ms, cfg.decode_ms], dtype=np.float64), NO_TABLE
    if cfg.type == "linear":
        model = TIMING_LINEAR
        params = np.array([cfg.base_ms, cfg.per_prefill_token_us, cfg.per_decode_seq_us, cfg.per_kv_token_ns])
        table = NO_TABLE
    elif cfg.type == "table":
        from simcore.timing.profile import table_arrays

        model = TIMING_TABLE
        params, table = table_arrays(cfg.profile, cfg.num_layers)
        if cfg.moe:  # the model's experts (simcore.derive checked the profile holds moe.csv)
            params = params.copy()
            params[nb.P_MOE_LAYERS] = cfg.moe_num_layers
            params[nb.P_MOE_EXPERTS] = cfg.moe_num_experts
            params[nb.P_MOE_TOP_K] = cfg.moe_top_k
            params[nb.P_MOE_IMBALANCE] = cfg.moe_imbalance
            params[nb.P_MOE_TP] = cfg.tp
        else:
            params = params.copy()
            params[nb.P_MOE_T_N] = 0.0  # a profile's moe.csv is priced only with timing.moe set
    elif cfg.type == "aic":
        from simcore.timing.aic import aic_arrays

        model = TIMING_AIC
        params, table = aic_arrays(cfg)
    elif cfg.type == "roofline":
        from simcore.timing.roofline import roofline_arrays

        model = TIMING_ROOFLINE
        params, table = roofline_arrays(cfg)
    else:
        raise ValueError(f"timing.type {cfg.type!r} has no kernel")  # config validation prevents this
    block, appended = pass_terms_block(cfg, table.shape[0])
    return (
        model,
        np.concatenate([np.asarray(params, dtype=np.float64), block, alltoall_block(cfg)]),
        np.concatenate([table, appended]) if appended.size else table,
    )


def worker_timing(timings: list[TimingConfig], workers: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each worker's model code and its span of the pools' parameters and tables, laid end to end.

    A pool's own timing (``engine.<pool>.timing``) has its own parameters and table; pools that
    share a timing section (the same object) share one copy.  The offsets a model's parameters
    hold into its table are relative to its own span, which the kernel slices out
    (``table[start:end]``), so each section's arrays are those of :func:`timing_arrays` unchanged.

    Parameters
    ----------
    timings : list of TimingConfig
        Each active pool's timing, in worker order (aggregated; or prefill, then decode).
    workers : list of int
        Each pool's workers (its replicas).

    Returns
    -------
    worker_model : ndarray(int64, shape (workers,))
    params : ndarray(float64)
        Every distinct section's parameters, end to end.
    table : ndarray(float64)
        Every distinct section's table, end to end.
    worker_span : ndarray(int64, shape (workers, 4))
        Each worker's ``params[s0:s1]`` and ``table[s2:s3]``.
    """
    seen: list[TimingConfig] = []
    spans: list[tuple[int, int, int, int, int]] = []
    params_parts, table_parts = [], []
    p_end = t_end = 0
    for timing in timings:
        if any(timing is other for other in seen):
            continue
        model, params, table = timing_arrays(timing)
        seen.append(timing)
        spans.append((model, p_end, p_end + params.shape[0], t_end, t_end + table.shape[0]))
        params_parts.append(params)
        table_parts.append(table)
        p_end += params.shape[0]
        t_end += table.shape[0]
    per_worker = [spans[next(i for i, other in enumerate(seen) if other is timing)]
                  for timing, count in zip(timings, workers) for _ in range(count)]
    worker_model = np.array([span[0] for span in per_worker], dtype=np.int64)
    worker_span = np.array([span[1:] for span in per_worker], dtype=np.int64).reshape(len(per_worker), 4)
    params = params_parts[0] if len(params_parts) == 1 else np.concatenate(params_parts)
    table = table_parts[0] if len(table_parts) == 1 else np.concatenate(table_parts)
    return worker_model, np.ascontiguousarray(params, dtype=np.float64), np.ascontiguousarray(table, dtype=np.float64), worker_span


#: Bytes per token of the top-k weights (float32) and ids (int32) that vLLM's dispatch gathers beside
#: the hidden states (vllm/distributed/device_communicators/all2all.py, ``AgRsAll2AllManager.dispatch``,
#: v0.19.0).
TOPK_BYTES_PER_EXPERT = 8


def alltoall_block(cfg: TimingConfig) -> np.ndarray:
    """The expert-parallel all-to-all parameters (``nb.X_*``; bandwidth 0: none).

    Per gathered token, the dispatch moves ``hidden_size x dtype_bytes`` of hidden
    state plus ``top_k x 8`` bytes of top-k weights and ids, and the combine
    ``hidden_size x dtype_bytes`` of expert output (docs/timing.md).

    Parameters
    ----------
    cfg : TimingConfig
        The timing section (``cfg.alltoall`` false: zeros).

    Returns
    -------
    ndarray(float64, shape (nb.ALLTOALL_NUM_PARAMS,))
    """
    block = np.zeros(nb.ALLTOALL_NUM_PARAMS, dtype=np.float64)
    if cfg.alltoall:
        block[nb.X_LAYERS] = cfg.moe_num_layers
        block[nb.X_BYTES_PER_TOKEN] = 2 * cfg.hidden_size * cfg.dtype_bytes + cfg.moe_top_k * TOPK_BYTES_PER_EXPERT
        block[nb.X_LATENCY_US] = cfg.moe_alltoall_latency_us
        block[nb.X_BANDWIDTH] = cfg.moe_alltoall_bandwidth_gb_per_second
    return block
