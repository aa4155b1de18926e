"""Timing-model selection: turn ``timing.*`` into the kernel's code and parameters."""

from __future__ import annotations

import numpy as np

from simcore.config import TimingConfig
from simcore.timing.nb import TIMING_FIXED, TIMING_LINEAR


NO_TABLE = np.zeros(0, dtype=np.float64)


def timing_arrays(cfg: TimingConfig) -> tuple[int, np.ndarray, np.ndarray]:
    """The model code, float64 parameters and flat table that ``rank_time_ms_nb`` reads."""
    if cfg.type == "fixed":
        return TIMING_FIXED, np.array([cfg.prefill_ms, cfg.decode_ms], dtype=np.float64), NO_TABLE
    if cfg.type == "linear":
        params = [cfg.base_ms, cfg.per_prefill_token_us, cfg.per_decode_seq_us, cfg.per_kv_token_ns]
        return TIMING_LINEAR, np.array(params, dtype=np.float64), NO_TABLE
    raise ValueError(f"timing.type {cfg.type!r} has no kernel")  # config validation prevents this
