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


def test_operator_scales_are_refused_under_expert_parallelism():
    cfg = {"engine": {"aggregated": {"attention_dp": 2, "expert_parallel": True}},
           "timing": {"prefill_token_scale": 1.1}}
    with pytest.raises(ConfigError, match="prefill_token_scale is not modelled with engine.aggregated.expert_parallel"):
        load_config(cfg)


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
                               cuda_graphs=seed % 4 == 1, attention_skew=seed % 5 == 3, speculative=seed % 7 == 6)
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
