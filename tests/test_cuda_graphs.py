"""CUDA-graph batch padding (timing.cuda_graph_sizes), hand-worked, vLLM's default sizes
against a measured run's resolved configuration, and the configuration errors.  The
engine with padding is compared with the reference implementation in
tests/test_against_reference.py."""

from __future__ import annotations

import json
import os

import pytest

from simcore.config import ConfigError, load_config
from tests.test_allreduce import LINEAR_1MS, pass_time
from tests.test_timing_models import write_profile

SIZES = [1, 2, 4, 8]
DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "llmservingsim-vllm-bench")


def test_decode_pass_runs_at_the_next_size_or_eager_beyond_the_largest():
    timing = dict(LINEAR_1MS, per_decode_seq_us=1000.0, cuda_graph_sizes=SIZES)
    # 3 decodes run as the size-4 graph: 1 ms + 4 x 1 ms
    assert pass_time(timing, 0, 0, 0, 3, 30) == 5.0
    # 8 decodes: a size itself, no padding
    assert pass_time(timing, 0, 0, 0, 8, 80) == 9.0
    # 9 decodes: beyond the largest size, eager and unpadded
    assert pass_time(timing, 0, 0, 0, 9, 90) == 10.0
    # the empty batch still takes 0
    assert pass_time(timing, 0, 0, 0, 0, 0) == 0.0


def test_mixed_pass_pads_its_prefill_tokens_and_keeps_the_kv_term():
    timing = dict(LINEAR_1MS, per_prefill_token_us=100.0, per_decode_seq_us=1000.0, per_kv_token_ns=1e6,
                  cuda_graph_sizes=SIZES)
    # 5 prefill tokens + 1 decode = 6 tokens -> 8: the 2 padding tokens are priced as prefill
    # tokens (7 x 0.1 ms), the decode as one (1 ms), the kv term over the 15 + 5 scheduled
    # kv tokens unchanged (20 x 1 ms), plus the 1 ms base
    assert pass_time(timing, 1, 5, 15, 1, 5) == pytest.approx(1.0 + 0.7 + 1.0 + 20.0, rel=1e-15)


def test_allreduce_moves_the_padded_activations():
    timing = dict(LINEAR_1MS, base_ms=0.0, tp=2, num_layers=1, hidden_size=1000, cuda_graph_sizes=SIZES,
                  allreduce={"latency_us": 0.0, "bandwidth_gb_per_second": 1.0})
    # 3 decodes -> 4 tokens x 1000 x 2 bytes = 8000 bytes at 1 GB/s (ring n = 2: 1 x bytes) = 8 us,
    # two all-reduces: 0.016 ms
    assert pass_time(timing, 0, 0, 0, 3, 3) == pytest.approx(0.016, rel=1e-15)


def test_table_model_pads_the_dense_ops_only(tmp_path):
    profile = write_profile(tmp_path / "p")
    timing = {"type": "table", "profile": profile, "num_layers": 4, "cuda_graph_sizes": [8, 16, 32]}
    # The pass of tests/test_timing_models.py (T = 26, S = 3) runs at 32 tokens: layernorm
    # 0.5 + 31/100 = 0.81 (twice per layer), qkv 10 + 0.31 x 20 = 16.2; embedding 1.31 and
    # final_layernorm 0.262 once; attention (10.92) and lm_head + sampler at S = 3 (111) unchanged.
    expected = (4 * (2 * 0.81 + 16.2 + 10.92) + (1.31 + 0.262) + 111.0) / 1000
    assert pass_time(timing, 1, 24, 56, 2, 66) == pytest.approx(expected, rel=1e-12)


def test_no_sizes_leave_pass_times_unchanged(tmp_path):
    profile = write_profile(tmp_path / "p")
    for timing in ({"type": "table", "profile": profile, "num_layers": 4}, dict(LINEAR_1MS, per_prefill_token_us=33.3, per_decode_seq_us=7.7)):
        for summary in ((1, 24, 56, 2, 66), (0, 0, 0, 3, 30), (2, 40, 40, 0, 0)):
            assert pass_time(dict(timing, cuda_graph_sizes=[1000]), *summary) != pass_time(timing, *summary)
            assert pass_time(dict(timing, cuda_graph_sizes=None), *summary) == pass_time(timing, *summary)


def test_vllm_default_is_the_measured_runs_resolved_capture_sizes():
    path = os.path.join(DATA, "bench", "RTX4090", "Llama-3.1-8B", "vllm", "meta.json")
    with open(path, encoding="utf-8") as handle:
        meta = json.load(handle)
    resolved = meta["resolved_config"]["compilation_config"]["cudagraph_capture_sizes"]
    kwargs = meta["engine_kwargs"]
    cfg = load_config(
        {
            "engine": {"aggregated": {"max_sequences": kwargs["max_num_seqs"], "max_batched_tokens": kwargs["max_num_batched_tokens"]}},
            "timing": {"cuda_graph_sizes": "vllm_default"},
        }
    )
    assert list(cfg.timing.cuda_graph_sizes) == resolved


def test_vllm_default_hand_worked():
    def sizes(max_sequences, max_batched_tokens):
        engine = {"aggregated": {"max_sequences": max_sequences, "max_batched_tokens": max_batched_tokens}}
        return load_config({"engine": engine, "timing": {"cuda_graph_sizes": "vllm_default"}}).timing.cuda_graph_sizes

    # largest = min(2 x 128, 512, 2048) = 256: 1, 2, 4, 8..248 by 8, 256
    assert sizes(128, 2048) == (1, 2, 4, *range(8, 256, 8), 256)
    # largest = min(2 x 3, 512, 64) = 6
    assert sizes(3, 64) == (1, 2, 4)
    # the token budget caps it: min(2 x 256, 512, 100) = 100
    assert sizes(256, 100) == (1, 2, 4, *range(8, 101, 8))


def test_a_list_is_sorted_and_deduplicated():
    assert load_config({"timing": {"cuda_graph_sizes": [8, 1, 4, 4]}}).timing.cuda_graph_sizes == (1, 4, 8)


@pytest.mark.parametrize(
    "overrides",
    [
        {"timing": {"cuda_graph_sizes": [0]}},
        {"timing": {"cuda_graph_sizes": []}},
        {"timing": {"cuda_graph_sizes": "all"}},
        {"timing": {"cuda_graph_sizes": [1.5]}},
        {"timing": {"type": "fixed", "cuda_graph_sizes": [1]}},
        {"engine": {"policy": "sglang"}, "timing": {"cuda_graph_sizes": "vllm_default"}},
        {
            "engine": {"mode": "disaggregated", "prefill": {"max_sequences": 4}, "decode": {"max_sequences": 8}},
            "timing": {"cuda_graph_sizes": "vllm_default"},
        },
    ],
)
def test_bad_sizes_name_the_field(overrides):
    with pytest.raises(ConfigError, match="timing.cuda_graph_sizes"):
        load_config(overrides)
