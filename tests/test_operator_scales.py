"""The operator scales (timing.prefill_token_scale, decode_attention_scale, decode_base_scale):
the split of a pass's model time worked by hand for ``linear``, laws for ``table``, the
settings' checks, and the engine against the reference implementation with them set."""

from __future__ import annotations

import numpy as np
import pytest

from simcore.config import ConfigError, load_config, merge_config
from simcore.timing import nb
from simcore.timing.api import timing_arrays
from simcore.timing.profile import load_profile, profile_arrays
from tests.scenarios import random_scenario
from tests.test_against_reference import compare_with_reference
from tests.test_timing_models import write_profile

LINEAR = {"type": "linear", "base_ms": 2.0, "per_prefill_token_us": 20.0, "per_decode_seq_us": 50.0,
          "per_kv_token_ns": 1000.0}
SCALES = ("prefill_token_scale", "decode_attention_scale", "decode_base_scale")


def linear_ms(timing: dict, *summary) -> float:
    model, params, table = timing_arrays(load_config({"timing": timing}).timing)
    return nb.rank_time_ms_nb(model, params, table, *summary)


def test_linear_split_worked_by_hand():
    # one prefill entry of 100 tokens (none cached) beside 4 decodes holding 400 KV tokens in all
    summary = (1, 100, 100, 4, 400, 130)
    # F = 2 + 20 x 100 / 1000 + 50 x 4 / 1000 + 1000 x (100 + 400) / 1e6 = 2 + 2 + 0.2 + 0.5
    f = 4.7
    # D (the decodes alone) = 2 + 0.2 + 1000 x 400 / 1e6 = 2.6; D1 (one token of context each) = 2 + 0.2 + 0.004
    d, d1 = 2.6, 2.204
    assert linear_ms(LINEAR, *summary) == pytest.approx(f, rel=1e-12)
    scaled = dict(LINEAR, prefill_token_scale=1.5, decode_attention_scale=2.0, decode_base_scale=0.5)
    assert linear_ms(scaled, *summary) == pytest.approx(0.5 * d1 + 2.0 * (d - d1) + 1.5 * (f - d), rel=1e-12)
    # a prefill-only pass is all prefill; a decode-only pass has no prefill part
    assert linear_ms(scaled, 1, 100, 100, 0, 0, 0) == pytest.approx(1.5 * (2 + 2 + 0.1), rel=1e-12)
    assert linear_ms(scaled, 0, 0, 0, 4, 400, 130) == pytest.approx(0.5 * d1 + 2.0 * (d - d1), rel=1e-12)
    # the pass scales and the overhead apply after the split
    both = dict(scaled, prefill_scale=2.0, pass_overhead_us=100.0)
    assert linear_ms(both, *summary) == pytest.approx(2.0 * (0.5 * d1 + 2.0 * (d - d1) + 1.5 * (f - d)) + 0.1,
                                                      rel=1e-12)


def test_defaults_leave_the_pass_time_bit_for_bit():
    model, params, table = timing_arrays(load_config({"timing": LINEAR}).timing)
    bare = params[:nb.LINEAR_NUM_PARAMS].copy()  # the model's own time, no pass terms at all
    for summary in [(1, 100, 100, 4, 400, 130), (0, 0, 0, 7, 911, 200), (2, 37, 80, 0, 0, 0)]:
        assert nb.rank_time_ms_nb(model, params, table, *summary) == nb.rank_time_ms_nb(model, bare, table, *summary)


def test_table_split_laws(tmp_path):
    """Equal scales multiply the model time; a scale moves only its own part."""
    profile = write_profile(tmp_path / "p")
    params, table = profile_arrays(load_profile(profile, num_layers=4))
    block = np.zeros(nb.PASS_TERMS_NUM_PARAMS)
    block[[nb.R_PREFILL_SCALE, nb.R_DECODE_SCALE]] = 1.0

    def ms(scales, *summary):
        b = block.copy()
        b[[nb.R_PREFILL_TOKEN_SCALE, nb.R_DECODE_ATTENTION_SCALE, nb.R_DECODE_BASE_SCALE]] = scales
        return nb.rank_time_ms_nb(nb.TIMING_TABLE, np.concatenate([params, b]), table, *summary)

    mixed = (1, 24, 56, 2, 66, 33)
    decode = (0, 0, 0, 2, 66, 33)
    plain = ms((1.0, 1.0, 1.0), *mixed)
    assert ms((1.25, 1.25, 1.25), *mixed) == pytest.approx(1.25 * plain, rel=1e-12)
    assert ms((1.7, 1.0, 1.0), *decode) == ms((1.0, 1.0, 1.0), *decode)  # no prefill entry: unchanged
    # the prefill part is the mixed pass less its decodes alone
    gap = ms((2.0, 1.0, 1.0), *mixed) - plain
    assert gap == pytest.approx(plain - ms((1.0, 1.0, 1.0), *decode), rel=1e-9)
    # the decodes' attention grows with their context: its scale moves a long-context pass more
    long = (0, 0, 0, 2, 2 * 48, 48)
    assert ms((1.0, 2.0, 1.0), *long) - ms((1.0, 1.0, 1.0), *long) > ms((1.0, 2.0, 1.0), *decode) - ms(
        (1.0, 1.0, 1.0), *decode) > 0


@pytest.mark.parametrize("timing, named", [
    ({"prefill_token_scale": 0.0}, "timing.prefill_token_scale"),
    ({"decode_attention_scale": -1.0}, "timing.decode_attention_scale"),
    ({"decode_base_scale": "x"}, "timing.decode_base_scale"),
    ({"type": "fixed", "decode_base_scale": 2.0}, "timing.decode_base_scale"),
])
def test_bad_operator_scales_are_refused(timing, named):
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        load_config({"timing": timing})


def _lockstep(timing: dict, summary: np.ndarray) -> tuple[float, np.ndarray]:
    cfg = load_config({"engine": {"aggregated": {"attention_dp": summary.shape[0], "expert_parallel": True}},
                       "timing": timing})
    model, params, table = timing_arrays(cfg.timing)
    rank_ms = np.zeros(summary.shape[0])
    return nb.lockstep_times_nb(model, params, table, summary, summary.shape[0], rank_ms), rank_ms


EP_LINEAR = {"type": "linear", "base_ms": 1.0, "per_prefill_token_us": 30.0, "per_decode_seq_us": 20.0,
             "per_kv_token_ns": 40.0, "cuda_graph_sizes": [4, 8], "num_layers": 2, "hidden_size": 64,
             "moe": {"num_experts": 8, "top_k": 2, "alltoall": {"latency_us": 10.0, "bandwidth_gb_per_second": 1.0}}}


def test_lockstep_split_worked_by_hand():
    """Under expert parallelism each rank's model time is split within the lock-step pass, before
    the all-to-all and the slowest rank; the decodes alone take the lock-step's padding again."""
    summary = np.zeros((2, 7), dtype=np.int64)
    summary[0, :5], summary[0, 6] = (1, 3, 3, 2, 50), 30  # a 3-token prefill beside 2 decodes (50 KV tokens)
    summary[1, :5], summary[1, 6] = (0, 0, 0, 5, 100), 30  # 5 decodes (100 KV tokens)
    # tokens 5 and 5 -> size 8 each, both within the sizes: both run 8; gathered 16
    # all-to-all (not scaled): 2 layers x (2 x 10 + 1/2 x 16 x (2 x 64 x 2 + 8 x 2) / 1e3) us = 0.044352 ms
    a2a = 2 * (2 * 10 + 0.5 * 16 * 272 / 1e3) / 1000
    # rank 0: F = 1 + 30 x (3 + 3 padding) / 1000 + 20 x 2 / 1000 + 40 x (3 + 50) / 1e6 = 1.22212
    f0 = 1.0 + 0.18 + 0.04 + 0.00212
    # its decodes alone: tokens 2 -> size 4 beside rank 1's 8, all within the sizes: they run 8,
    # the 6 padding tokens priced as decode entries: D = 1 + 20 x 8 / 1000 + 40 x 50 / 1e6 = 1.162
    # (their own padding alone would be 4); D1 (one token of context each) = 1 + 0.16 + 40 x 2 / 1e6
    d0, d10 = 1.162, 1.16008
    # rank 1 (decodes only): F = D = 1 + 20 x 8 / 1000 + 40 x 100 / 1e6 = 1.164; D1 = 1 + 0.16 + 40 x 5 / 1e6
    d1, d11 = 1.164, 1.1602
    worst, rank_ms = _lockstep(EP_LINEAR, summary.copy())
    assert rank_ms[0] == pytest.approx(f0 + a2a, rel=1e-12) and rank_ms[1] == pytest.approx(d1 + a2a, rel=1e-12)
    scales = dict(prefill_token_scale=1.5, decode_attention_scale=2.0, decode_base_scale=0.5)
    worst, rank_ms = _lockstep(dict(EP_LINEAR, **scales), summary.copy())
    # 0.5 x 1.16008 + 2 x 0.00192 + 1.5 x 0.06012 = 0.67406; 0.5 x 1.1602 + 2 x 0.0038 = 0.5877
    r0 = 0.5 * d10 + 2.0 * (d0 - d10) + 1.5 * (f0 - d0)
    r1 = 0.5 * d11 + 2.0 * (d1 - d11)
    assert r0 == pytest.approx(0.67406, rel=1e-12) and r1 == pytest.approx(0.5877, rel=1e-12)
    assert rank_ms[0] == pytest.approx(r0 + a2a, rel=1e-12) and rank_ms[1] == pytest.approx(r1 + a2a, rel=1e-12)
    assert worst == rank_ms[0]  # scaled, the prefill rank is the slower one (unscaled: rank 1)
    # the pass scale and the overhead apply after the split, per rank (rank 0 has a prefill entry)
    worst, rank_ms = _lockstep(dict(EP_LINEAR, prefill_scale=2.0, pass_overhead_us=100.0, **scales), summary.copy())
    assert rank_ms[0] == pytest.approx(2.0 * r0 + 0.1 + a2a, rel=1e-12)
    assert rank_ms[1] == pytest.approx(r1 + 0.1 + a2a, rel=1e-12)


def test_lockstep_split_prefill_only_and_dummy_ranks():
    summary = np.zeros((3, 7), dtype=np.int64)
    summary[0, :5] = (1, 9, 9, 0, 0)  # beyond the largest size (8): eager, no DP padding
    # rank 0: prefill only, all of it prefill: 1.5 x (1 + 30 x 9 / 1000 + 40 x 9 / 1e6) = 1.5 x 1.27036
    # ranks 1, 2: the dummy batch (one decode of one token) at its own size 4: decode only, its
    # context 1 token: all of it the base: 0.5 x (1 + 20 x 4 / 1000 + 40 x 1 / 1e6) = 0.5 x 1.08004
    timing = {k: v for k, v in EP_LINEAR.items() if k not in ("moe", "num_layers", "hidden_size")}
    worst, rank_ms = _lockstep(dict(timing, prefill_token_scale=1.5, decode_attention_scale=2.0,
                                    decode_base_scale=0.5), summary)
    assert rank_ms.tolist() == pytest.approx([1.5 * 1.27036, 0.5 * 1.08004, 0.5 * 1.08004], rel=1e-12)
    assert worst == rank_ms[0]


def test_lockstep_scales_of_one_leave_the_pass_bit_for_bit():
    """All three scales 1: the lock-step gives the model's time as without the operator split
    (the equal-scales law: each rank's split sums back to F)."""
    summary = np.zeros((2, 7), dtype=np.int64)
    summary[0, :5], summary[0, 6] = (1, 3, 3, 2, 50), 30
    summary[1, :5], summary[1, 6] = (0, 0, 0, 5, 100), 30
    _, plain = _lockstep(EP_LINEAR, summary.copy())
    _, same = _lockstep(dict(EP_LINEAR, prefill_token_scale=1.0, decode_base_scale=1.0), summary.copy())
    assert plain.tolist() == same.tolist()
    _, equal = _lockstep(dict(EP_LINEAR, prefill_token_scale=1.25, decode_attention_scale=1.25,
                              decode_base_scale=1.25), summary.copy())
    a2a = 2 * (2 * 10 + 0.5 * 16 * 272 / 1e3) / 1000
    assert (equal - a2a).tolist() == pytest.approx((1.25 * (plain - a2a)).tolist(), rel=1e-12)


def test_the_scales_are_declared_calibration_parameters():
    from runners.calibrate import declared_ranges, parse_fit

    ranges = declared_ranges()
    for name in SCALES:
        assert ranges[f"timing.{name}"] == (0.5, 2.0)
    assert parse_fit(["timing.decode_attention_scale"]) == [("timing.decode_attention_scale", 0.5, 2.0)]


def scaled_scenario(seed: int) -> dict:
    """A random linear-timing scenario (all-reduce, CUDA graphs, skew, P/D mixed in) with the
    operator scales drawn from values that split every pass differently."""
    rnd = np.random.default_rng(seed)
    scenario = random_scenario(seed, allreduce=seed % 2 == 0, disaggregated=seed % 3 == 2,
                               cuda_graphs=seed % 4 == 1, attention_skew=seed % 5 == 3, speculative=seed % 7 == 6,
                               expert_parallel=seed % 7 == 2)
    config = merge_config(scenario["config"])
    if config["timing"]["type"] == "fixed":
        config["timing"].update(type="linear", base_ms=0.5, per_prefill_token_us=10.0, per_decode_seq_us=20.0,
                                per_kv_token_ns=123.4)
    for name in SCALES:
        config["timing"][name] = float(rnd.choice([1.0, 0.5, 1.37, 2.5]))
    return dict(scenario, config=config)


@pytest.mark.parametrize("seed", range(40))
def test_operator_scales_match_reference(seed):
    compare_with_reference(scaled_scenario(seed))


def test_lockstep_table_split_laws(tmp_path):
    """``table`` under expert parallelism: equal scales multiply each rank's model time; a decode-only
    rank has no prefill part; a rank's prefill part is its time less its time in the lock-step pass
    where its prefill entries are gone (the DP padding taken again, the other rank as it is)."""
    profile = write_profile(tmp_path / "p")
    timing = {"type": "table", "profile": profile, "num_layers": 4, "cuda_graph_sizes": [4, 8, 32]}
    summary = np.zeros((2, 7), dtype=np.int64)
    summary[0, :5], summary[0, 6] = (1, 24, 56, 2, 66), 33  # tokens 26 -> 32
    summary[1, :5], summary[1, 6] = (0, 0, 0, 3, 60), 20  # tokens 3 -> 4; both run 32
    _, plain = _lockstep(timing, summary.copy())
    _, equal = _lockstep(dict(timing, prefill_token_scale=1.25, decode_attention_scale=1.25,
                              decode_base_scale=1.25), summary.copy())
    assert equal.tolist() == pytest.approx((1.25 * plain).tolist(), rel=1e-12)
    _, prefill = _lockstep(dict(timing, prefill_token_scale=2.0), summary.copy())
    assert prefill[1] == plain[1]  # no prefill entry on rank 1
    alone = summary.copy()
    alone[0, :3] = 0  # rank 0's decodes alone: tokens 2 -> 4 beside rank 1's 4: both run 4
    _, without = _lockstep(timing, alone)
    assert prefill[0] - plain[0] == pytest.approx(plain[0] - without[0], rel=1e-12)
    assert plain[0] - without[0] > 0
