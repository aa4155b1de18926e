"""MoE timing (moe.csv), expert parallelism's lock-step and all-to-all, and the aic MoE layout.

Expected values are worked by hand in each test (docs/timing.md, docs/semantics.md
"Expert parallelism"); the random scenarios against the reference implementation are in
tests/test_against_reference.py (``test_expert_parallel_matches_reference``).
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import replace

import numpy as np
import pytest

from simcore.config import ConfigError, load_config
from simcore.timing import aic, nb
from simcore.timing.api import timing_arrays
from simcore.timing.profile import read_moe

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "llmservingsim-vllm-bench")
MOE_PROFILE = os.path.join(DATA, "profiler", "RTXPRO6000", "Qwen", "Qwen3-30B-A3B-Instruct-2507", "bf16", "tp1")


# ---------------------------------------------------------------- aic: the MoE layout


def test_moe_layout_fills_the_width_rule():
    # aiconfigurator-core: moe_tp x moe_ep = tp x attention_dp (1 in the tables)
    assert aic.moe_layout(1, False) == (1, 1)
    assert aic.moe_layout(2, False) == (2, 1)  # vLLM without EP: every expert split over the TP GPUs
    assert aic.moe_layout(2, True) == (1, 2)  # --enable-expert-parallel: whole experts per GPU
    assert aic.moe_layout(8, True) == (1, 8)


def test_aic_spec_passes_the_moe_layout():
    spec = aic.AicSpec("m", "h200_sxm", "vllm", None, 2, 64, 8, 1024, *aic.moe_layout(2, False))
    native = aic._native_config(spec)
    assert (native["tp_size"], native["moe_tp_size"], native["moe_ep_size"]) == (2, 2, 1)
    spec_ep = replace(spec, moe_tp=1, moe_ep=2)
    native = aic._native_config(spec_ep)
    assert (native["moe_tp_size"], native["moe_ep_size"]) == (1, 2)
    assert aic.cache_key(spec, "0.12.0") != aic.cache_key(spec_ep, "0.12.0")


def test_aic_spec_from_config_reads_expert_parallel():
    timing = replace(load_config({"timing": {"type": "linear"}}).timing, model="m", gpu="g", backend="vllm", tp=4,
                     pass_tokens_limit=64, pass_sequences_limit=8, context_limit=1024)
    assert (aic.AicSpec.from_config(timing).moe_tp, aic.AicSpec.from_config(timing).moe_ep) == (4, 1)
    spec = aic.AicSpec.from_config(replace(timing, expert_parallel=True))
    assert (spec.moe_tp, spec.moe_ep) == (1, 4)


def test_aic_mixtral_tp2_compiles(tmp_path):
    """Mixtral-8x7B at TP2 failed in aiconfigurator-core with the MoE sizes unset (1 x 1 != 2)."""
    pytest.importorskip("aiconfigurator_core")
    from aiconfigurator_core.sdk import EngineHandle

    bundled = os.path.join(os.path.dirname(__import__("aiconfigurator_core").__file__), "model_configs",
                           "mistralai--Mixtral-8x7B-v0.1_config.json")
    if not os.path.isfile(bundled):
        pytest.skip("aiconfigurator-core without the Mixtral config")
    shutil.copy(bundled, tmp_path / "config.json")
    for expert_parallel in (False, True):
        moe_tp, moe_ep = aic.moe_layout(2, expert_parallel)
        with aic._quiet_stderr():
            handle = EngineHandle.compile(str(tmp_path), "h200_sxm", "vllm", tp_size=2,
                                          moe_tp_size=moe_tp, moe_ep_size=moe_ep)
            assert handle.decode_step_latency(8, 1000, 2) > 0


# ---------------------------------------------------------------- moe.csv


def _write(path, text):
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def test_read_moe_fills_the_triangle_along_tokens(tmp_path):
    # top_k 2: 1 token reaches at most 2 experts, so (1, 4) and (1, 8) are not measured
    path = tmp_path / "moe.csv"
    _write(path, "tokens,activated_experts,time_us\n1,2,10\n2,2,12\n2,4,30\n4,2,16\n4,4,34\n4,8,70\n8,8,78\n")
    tokens, experts, grid = read_moe(str(path))
    assert tokens.tolist() == [1, 2, 4, 8] and experts.tolist() == [2, 4, 8]
    # measured cells kept
    assert grid[0, 0] == 10 and grid[1, 1] == 30 and grid[2, 2] == 70 and grid[3, 2] == 78
    # column 4 experts: measured at 2 (30) and 4 (34): 1 token extended below: 30 - (34 - 30) / 2 = 28; 8 tokens: 42
    assert grid[0, 1] == pytest.approx(28.0) and grid[3, 1] == pytest.approx(42.0)
    # column 8: measured at 4 (70) and 8 (78): slope 2 per token: 1 token 64, 2 tokens 66
    assert grid[0, 2] == pytest.approx(64.0) and grid[1, 2] == pytest.approx(66.0)
    # column 2 extended beyond 4 tokens: 16 + 2 x 4 = 24
    assert grid[3, 0] == pytest.approx(24.0)


def test_read_moe_refuses_a_bad_row(tmp_path):
    path = tmp_path / "moe.csv"
    _write(path, "tokens,activated_experts,time_us\n1,2,10\n1,2,11\n")
    with pytest.raises(ConfigError, match=r"moe.csv:3: duplicate row"):
        read_moe(str(path))
    _write(path, "tokens,activated_experts,time_us\n0,2,10\n")
    with pytest.raises(ConfigError, match=r"moe.csv:2: tokens must be an integer from 1 to "):
        read_moe(str(path))


def _moe_params(tokens, experts, grid, layers, num_experts, top_k, imbalance=1.0, tp=1):
    params = np.zeros(nb.TABLE_NUM_PARAMS)
    table = np.concatenate([np.asarray(tokens, float), np.asarray(experts, float), np.asarray(grid, float).ravel()])
    params[nb.P_MOE_T_N], params[nb.P_MOE_T_X] = len(tokens), 0
    params[nb.P_MOE_A_N], params[nb.P_MOE_A_X] = len(experts), len(tokens)
    params[nb.P_MOE] = len(tokens) + len(experts)
    params[nb.P_MOE_LAYERS], params[nb.P_MOE_EXPERTS], params[nb.P_MOE_TOP_K] = layers, num_experts, top_k
    params[nb.P_MOE_IMBALANCE], params[nb.P_MOE_TP] = imbalance, tp
    return params, table


def test_table_moe_term_hand_worked():
    # grid: tokens {1, 4} x experts {2, 4}: (1,2) 10, (1,4) 20, (4,2) 40, (4,4) 60 us
    params, table = _moe_params([1, 4], [2, 4], [[10, 20], [40, 60]], layers=3, num_experts=4, top_k=2)
    # 2 gathered tokens on one GPU: tokens 2, activated 4 x (1 - (1 - 2/4)^2) = 3
    # experts: row 1 -> 15, row 4 -> 50; tokens at 1/3: 15 + 35/3 = 26.667 us; x 3 layers = 80 us
    assert nb.table_moe_ms_nb(params, table, 2, 1) == pytest.approx(0.08)
    # two GPUs (expert parallel), 4 gathered: tokens 4 x 1.0 / 2 = 2, activated 2 x (1 - 0.5^4) = 1.875,
    # below the first experts knot: at 2 -> row 1: 10, row 4: 40 -> 20 us at 2 tokens; x 3 = 60 us
    assert nb.table_moe_ms_nb(params, table, 4, 2) == pytest.approx(0.06)
    # imbalance 1.5: tokens 3 -> 10 + 30 x 2/3 = 30 us; x 3 = 90 us
    params[nb.P_MOE_IMBALANCE] = 1.5
    assert nb.table_moe_ms_nb(params, table, 4, 2) == pytest.approx(0.09)
    # beyond the last tokens knot, rising: 8 gathered on one GPU, x 1.5 = 12 tokens; activated
    # a = 4 (1 - 0.5^8) = 3.984375: row 1 -> 10 + 10 (a - 2) / 2, row 4 -> 40 + 20 (a - 2) / 2;
    # the rising segment extended to 12 tokens: t = (12 - 1) / 3
    a = 4 * (1 - 0.5**8)
    lo, hi = 10 + 10 * (a - 2) / 2, 40 + 20 * (a - 2) / 2
    assert nb.table_moe_ms_nb(params, table, 8, 1) == pytest.approx(3 * (lo + (hi - lo) * 11 / 3) / 1000)
    # no moe.csv: nothing
    params[nb.P_MOE_T_N] = 0
    assert nb.table_moe_ms_nb(params, table, 8, 1) == 0.0


@pytest.mark.skipif(not os.path.isdir(MOE_PROFILE), reason="shared data set not present")
def test_shared_moe_profile_reproduces_its_rows():
    tokens, experts, grid = read_moe(os.path.join(MOE_PROFILE, "moe.csv"))
    params, table = _moe_params(tokens, experts, grid, layers=48, num_experts=128, top_k=8)
    with open(os.path.join(MOE_PROFILE, "moe.csv"), encoding="utf-8") as handle:
        rows = [line.split(",") for line in handle.read().split()[1:]]
    for t, a, us in rows:  # on a knot the measured value exactly
        assert nb.interp2_rising_nb(table, params, float(t), float(a)) == float(us)


# ---------------------------------------------------------------- the lock-step


def _lockstep_config(**timing):
    return {
        "engine": {"policy": "vllm", "aggregated": {"attention_dp": 2, "expert_parallel": True}},
        "timing": dict({"type": "linear", "base_ms": 1.0, "per_prefill_token_us": 10.0, "per_decode_seq_us": 20.0,
                        "per_kv_token_ns": 40.0, "cuda_graph_sizes": [4, 8]}, **timing),
    }


def test_lockstep_hand_worked_linear():
    cfg = load_config(_lockstep_config(
        num_layers=2, hidden_size=64,
        moe={"num_experts": 8, "top_k": 2, "alltoall": {"latency_us": 10.0, "bandwidth_gb_per_second": 1.0}},
    ))
    model, params, table = timing_arrays(cfg.timing)
    summary = np.zeros((2, 7), dtype=np.int64)
    summary[0, :5] = (1, 5, 5, 0, 0)  # rank 0: one 5-token prefill; rank 1: nothing (dummy batch)
    rank_ms = np.zeros(2)
    worst = nb.lockstep_times_nb(model, params, table, summary, 2, rank_ms)
    # tokens 5 -> size 8, dummy 1 -> 4; both within the sizes: both run 8; gathered 16
    # all-to-all: 2 layers x (2 x 10 + 1/2 x 16 x (2 x 64 x 2 + 2 x 8) / 1e3) us = 0.044352 ms
    a2a = 2 * (2 * 10 + 0.5 * 16 * 272 / 1e3) / 1000
    rank0 = 1.0 + 10.0 * 8 / 1000 + 40.0 * 5 / 1e6 + a2a  # 3 padding tokens priced as prefill tokens
    rank1 = 1.0 + 20.0 * 8 / 1000 + 40.0 * 1 / 1e6 + a2a  # the dummy decode + 7 padding decodes
    assert rank_ms[0] == pytest.approx(rank0, abs=1e-12) and rank_ms[1] == pytest.approx(rank1, abs=1e-12)
    assert worst == rank_ms[1]  # the idle rank's dummy batch is the slower one here


def test_lockstep_without_padding_when_a_rank_runs_eagerly():
    cfg = load_config(_lockstep_config())
    model, params, table = timing_arrays(cfg.timing)
    summary = np.zeros((2, 7), dtype=np.int64)
    summary[0, :5] = (1, 9, 9, 0, 0)  # beyond the largest size (8): eager, and no DP padding
    summary[1, :5] = (0, 0, 0, 2, 20)  # two decodes -> size 4
    rank_ms = np.zeros(2)
    nb.lockstep_times_nb(model, params, table, summary, 2, rank_ms)
    assert rank_ms[0] == pytest.approx(1.0 + 10.0 * 9 / 1000 + 40.0 * 9 / 1e6, abs=1e-12)
    assert rank_ms[1] == pytest.approx(1.0 + 20.0 * 4 / 1000 + 40.0 * 20 / 1e6, abs=1e-12)


def test_lockstep_fixed_prices_the_dummy_as_a_decode():
    cfg = load_config({"engine": {"policy": "vllm", "aggregated": {"attention_dp": 3, "expert_parallel": True}},
                       "timing": {"type": "fixed", "prefill_ms": 3.0, "decode_ms": 0.5}})
    model, params, table = timing_arrays(cfg.timing)
    summary = np.zeros((3, 7), dtype=np.int64)
    summary[0, :5] = (1, 4, 4, 0, 0)
    rank_ms = np.zeros(3)
    assert nb.lockstep_times_nb(model, params, table, summary, 3, rank_ms) == 3.0
    assert rank_ms.tolist() == [3.0, 0.5, 0.5]


def test_expert_parallel_off_is_the_default():
    cfg = load_config({})
    assert not cfg.engine.aggregated.expert_parallel and not cfg.timing.moe and not cfg.timing.alltoall


@pytest.mark.parametrize("overrides, message", [
    ({"timing": {"moe": {"num_experts": 8}}}, r"^timing.moe.num_experts and timing.moe.top_k are set together"),
    ({"timing": {"moe": {"num_experts": 4, "top_k": 8, "alltoall": {"bandwidth_gb_per_second": 1.0}}}},
     r"^timing.moe.top_k must be <= timing.moe.num_experts = 4, got 8$"),
    ({"timing": {"moe": {"imbalance": 1.2}}}, r"^timing.moe.imbalance needs timing.moe.num_experts"),
    ({"timing": {"moe": {"num_experts": 8, "top_k": 2}}}, r"^timing.moe with timing.type=linear prices only"),
    ({"timing": {"moe": {"num_experts": 8, "top_k": 2, "imbalance": 0.5,
                         "alltoall": {"bandwidth_gb_per_second": 1.0}}}}, r"^timing.moe.imbalance must be in \[1, "),
    ({"timing": {"type": "fixed", "moe": {"num_experts": 8, "top_k": 2}}}, r"^timing.moe is only used by"),
    ({"timing": {"num_layers": 4, "hidden_size": 64,
                 "moe": {"num_experts": 8, "top_k": 2, "alltoall": {"bandwidth_gb_per_second": 1.0}}}},
     r"^timing.moe.alltoall has no effect here: it is only used with engine.<pool>.expert_parallel=true$"),
    ({"engine": {"aggregated": {"attention_dp": 2, "expert_parallel": True}},
      "timing": {"moe": {"num_experts": 8, "top_k": 2, "alltoall": {"bandwidth_gb_per_second": 1.0}}}},
     r"^timing.num_layers must be set for timing.moe.alltoall with timing.type=linear$"),
    ({"engine": {"policy": "sglang", "aggregated": {"expert_parallel": True}}},
     r"^engine.aggregated.expert_parallel"),
    ({"engine": {"aggregated": {"expert_parallel": "yes"}}}, r"^engine.aggregated.expert_parallel"),
])
def test_bad_keys_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config(overrides)
    assert "\n" not in str(info.value)


@pytest.mark.skipif(not os.path.isdir(MOE_PROFILE), reason="shared data set not present")
def test_moe_profile_needs_its_keys_and_expert_parallel():
    table = {"type": "table", "profile": MOE_PROFILE, "num_layers": 48}
    with pytest.raises(ConfigError, match=r"^timing.moe.num_experts must be set: .* holds moe.csv"):
        load_config({"timing": table})
    moe = dict(table, moe={"num_experts": 128, "top_k": 8})
    with pytest.raises(ConfigError, match=r"^engine.aggregated.expert_parallel must be true for an MoE model"):
        load_config({"engine": {"aggregated": {"attention_dp": 2}}, "timing": moe})
    cfg = load_config({"engine": {"aggregated": {"attention_dp": 2, "expert_parallel": True}}, "timing": moe})
    assert cfg.timing.moe_num_layers == 48  # every layer an MoE layer by default
    model, params, table_arr = timing_arrays(cfg.timing)
    assert params[nb.P_MOE_EXPERTS] == 128 and params[nb.P_MOE_TOP_K] == 8 and params[nb.P_MOE_T_N] > 0
    # one decode on one GPU holding every expert: 48 layers x moe(1 token, 8 experts) = 48 x 50.2297 us
    assert nb.table_moe_ms_nb(params, table_arr, 1, 1) == pytest.approx(48 * 50.2297 / 1000)
    assert math.isfinite(nb.rank_time_ms_nb(model, params, table_arr, 0, 0, 0, 1, 100))


def test_an_absurd_link_is_refused_by_the_run_bound():
    with pytest.raises(ConfigError, match=r"^timing.moe.alltoall.bandwidth_gb_per_second=1e-300 .* must stay below"):
        load_config(_lockstep_config(num_layers=4, hidden_size=64, moe={
            "num_experts": 8, "top_k": 2, "alltoall": {"bandwidth_gb_per_second": 1e-300}}))


@pytest.mark.skipif(not os.path.isdir(MOE_PROFILE), reason="shared data set not present")
def test_a_tp2_profile_takes_the_tp1_moe_csv():
    """LLMServingSim profiles the MoE block at TP 1 only: a tp2 directory has no moe.csv of its own."""
    tp2 = os.path.join(os.path.dirname(MOE_PROFILE), "tp2")
    assert not os.path.isfile(os.path.join(tp2, "moe.csv"))
    cfg = load_config({"engine": {"aggregated": {"expert_parallel": True}},
                       "timing": {"type": "table", "profile": tp2, "num_layers": 48, "tp": 2,
                                  "moe": {"num_experts": 128, "top_k": 8}}})
    _, params, table = timing_arrays(cfg.timing)
    _, params1, table1 = timing_arrays(replace(cfg.timing, profile=MOE_PROFILE))
    assert params[nb.P_MOE_TP] == 2
    # the same moe.csv: one MoE layer at a knot of both
    assert nb.interp2_rising_nb(table, params, 128.0, 64.0) == nb.interp2_rising_nb(table1, params1, 128.0, 64.0) == 456.737
