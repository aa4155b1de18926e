"""Per-pool hardware and timing (``engine.<pool>.timing``; docs/timing.md, "Per-pool timing").

Expected figures are worked by hand below from the GPUs' datasheet figures
(``simcore/models/data/gpus.json``) and Llama-3.1-8B's published config
(32 layers, hidden 4096, 32 heads, 8 KV heads of 128, MLP 14336, vocabulary
128256, bf16), or are laws (a pool's own keys equal the same keys set for the
whole deployment).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import simcore
from simcore.config import ConfigError, load_config
from simcore.timing.api import timing_arrays, worker_timing

GIB = 2**30
# Llama-3.1-8B, by hand from its config.json
LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 32, 4096, 32, 8, 128, 14336, 128256
ATTN_PARAMS = LAYERS * (2 * HIDDEN * HEADS * HEAD_DIM + 2 * HIDDEN * KV_HEADS * HEAD_DIM)  # q, o; k, v
MLP_PARAMS = LAYERS * 3 * HIDDEN * MLP
HEAD_PARAMS = VOCAB * HIDDEN  # lm_head (untied)
KV_BYTES_PER_TOKEN_LAYER = 2 * KV_HEADS * HEAD_DIM * 2  # K and V, bf16
# Datasheet figures: H100 SXM 3.35 TB/s, H200 4.8 TB/s, both 989.5 dense bf16 TFLOPS; 80 and 141 GiB
H100 = dict(name="H100-SXM", bytes_per_ms=3350e6, flops_per_ms=989.5e9, memory=80 * GIB)
H200 = dict(name="H200", bytes_per_ms=4800e6, flops_per_ms=989.5e9, memory=141 * GIB)

POOLS = {
    "mode": "disaggregated",
    "prefill": {"num_blocks": "auto", "timing": {"type": "roofline", "model": "llama-3.1-8b", "gpu": "H100-SXM"}},
    "decode": {"num_blocks": "auto", "timing": {"type": "roofline", "model": "llama-3.1-8b", "gpu": "H200"}},
}


def _decode_ms(gpu: dict, kv_tokens: int) -> float:
    """One decode entry at ``kv_tokens`` (its computed + 1): every group is bound by its bytes."""
    gemm = (ATTN_PARAMS + MLP_PARAMS + HEAD_PARAMS) * 2  # weights read once, bf16
    rows = 2 * LAYERS * 2 * HIDDEN * 2 + (HIDDEN + VOCAB) * 2  # two layer groups' rows in and out; lm_head's
    # attention, per layer: the context's KV read, the new token's KV written, its query and output
    attention = LAYERS * (kv_tokens * KV_BYTES_PER_TOKEN_LAYER + KV_BYTES_PER_TOKEN_LAYER + 2 * HEADS * HEAD_DIM * 2)
    return (gemm + rows + attention) / gpu["bytes_per_ms"]


def _prefill_ms(gpu: dict, chunk: int) -> float:
    """One prompt of ``chunk`` tokens with nothing cached: each group at the slower of FLOPs and bytes."""
    def roof(flops, nbytes, flops_per_ms=gpu["flops_per_ms"]):
        return max(flops / flops_per_ms, nbytes / gpu["bytes_per_ms"])

    rows = chunk * 2 * HIDDEN * 2
    ms = roof(2 * ATTN_PARAMS * chunk, ATTN_PARAMS * 2 + LAYERS * rows)
    ms += roof(2 * MLP_PARAMS * chunk, MLP_PARAMS * 2 + LAYERS * rows)
    ms += roof(2 * HEAD_PARAMS, HEAD_PARAMS * 2 + (HIDDEN + VOCAB) * 2)  # one sequence's logits
    pairs = chunk * (chunk + 1) // 2  # causal: token x attends x keys
    per_layer = roof(pairs * 4 * HEADS * HEAD_DIM,
                     (chunk + chunk) * KV_BYTES_PER_TOKEN_LAYER + chunk * 2 * HEADS * HEAD_DIM * 2)
    return ms + LAYERS * per_layer


def test_each_pool_sizes_its_kv_cache_on_its_own_gpu():
    cfg = load_config({"engine": POOLS})
    # usable 0.9 x memory, less the weights (8,029,995,008 parameters without norms, bf16) and the
    # activations at the pool's largest pass (8192 tokens x (2 hidden + 2 MLP) x 2 bytes + 256 x vocab x 4)
    weights = (ATTN_PARAMS + MLP_PARAMS + 2 * HEAD_PARAMS) * 2
    activations = 8192 * (2 * HIDDEN + 2 * MLP) * 2 + 256 * VOCAB * 4
    block = 16 * LAYERS * KV_BYTES_PER_TOKEN_LAYER
    for name, gpu in (("prefill", H100), ("decode", H200)):
        expected = int((gpu["memory"] * 0.9 - weights - activations) // block)
        assert getattr(cfg.engine, name).num_blocks == expected
    assert cfg.engine.prefill.num_blocks == 28855 and cfg.engine.decode.num_blocks == 56964


def test_prefill_on_h100_and_decode_on_h200_pass_times():
    table = pa.table({"request_id": ["a"], "input_tokens": [2048], "output_tokens": [4]})
    result = simcore.run({"engine": POOLS, "output": {"passes": True}, "load": {"concurrency": 1}}, requests=table)
    passes = result.passes.to_pylist()
    prefill = [p for p in passes if p["pool"] == "prefill"]
    decode = [p for p in passes if p["pool"] == "decode"]
    assert len(prefill) == 1 and prefill[0]["prefill_tokens"] == 2048
    assert prefill[0]["rank_time_ms"] == pytest.approx(_prefill_ms(H100, 2048), rel=1e-12)
    # SPEC §6: the decode rank takes the request at computed = input - 1, and emits every output token
    assert len(decode) == 4 and [p["decode_kv_tokens"] for p in decode] == [2048, 2049, 2050, 2051]
    for p in decode:
        assert p["num_decode"] == 1 and p["num_prefill"] == 0
        assert p["rank_time_ms"] == pytest.approx(_decode_ms(H200, p["decode_kv_tokens"]), rel=1e-12)
    # the same decode on the prefill pool's H100 would take 4800 / 3350 as long: every group is bound by bytes
    k = decode[0]["decode_kv_tokens"]
    assert _decode_ms(H100, k) / _decode_ms(H200, k) == pytest.approx(4800 / 3350, rel=1e-12)
    assert 4.4 < _decode_ms(H100, 2049) < 4.6 and 3.1 < _decode_ms(H200, 2049) < 3.2  # ~15.1 GB read per step


def test_transfer_bytes_are_the_models_kv():
    """With the link stated and bytes_per_token null, the KV of the prompt crosses once (all layers)."""
    engine = dict(POOLS, kv_transfer={"bandwidth_gb_per_second": 50.0})
    cfg = load_config({"engine": engine})
    assert cfg.engine.kv_transfer.bytes_per_token == LAYERS * KV_BYTES_PER_TOKEN_LAYER == 131072
    table = pa.table({"request_id": ["a"], "input_tokens": [2048], "output_tokens": [2]})
    result = simcore.run({"engine": engine, "load": {"concurrency": 1}}, requests=table)
    # 2048 tokens x 131072 bytes over 50 GB/s
    assert result.requests.column("transfer_ms")[0].as_py() == pytest.approx(2048 * 131072 / 50e9 * 1e3, abs=1e-6)


def test_pools_must_serve_the_same_model():
    engine = {**POOLS, "decode": {"timing": {"type": "roofline", "model": "qwen3-8b", "gpu": "H200"}}}
    with pytest.raises(ConfigError) as err:
        load_config({"engine": engine})
    message = str(err.value)
    assert "\n" not in message
    assert "engine.prefill.timing.model=llama-3.1-8b" in message and "engine.decode.timing.model=qwen3-8b" in message
    # a pool's own model against the timing section's: both keys named
    with pytest.raises(ConfigError, match=r"timing.model=llama-3.1-8b and engine.decode.timing.model=qwen3-8b"):
        load_config({"timing": {"type": "roofline", "model": "llama-3.1-8b", "gpu": "H100-SXM"},
                     "engine": {"mode": "disaggregated", "decode": {"timing": {"model": "qwen3-8b"}}}})


@pytest.mark.parametrize("override, match", [
    ({"gpu": "H300"}, r"^engine.decode.timing.gpu=H300 "),
    ({"colour": 1}, r"^engine.decode.timing.colour is not a known key"),
    ({"roofline": {"bandwidth_efficiency": 2}}, r"^engine.decode.timing.roofline.bandwidth_efficiency must be in \(0, 1\]"),
    ({"profile": "/tmp"}, r"^engine.decode.timing.profile is only used by timing.type=table, got '/tmp' with "
                          r"engine.decode.timing.type=roofline"),
    ({"tp": 3}, r"^engine.decode.timing.tp=3 must divide the 32 attention heads"),
    ("H200", r"^engine.decode.timing must be a mapping"),
])
def test_bad_pool_timing_names_the_key(override, match):
    base = {"timing": {"type": "roofline", "model": "llama-3.1-8b", "gpu": "H100-SXM"}}
    with pytest.raises(ConfigError, match=match) as err:
        load_config({**base, "engine": {"mode": "disaggregated", "decode": {"timing": override}}})
    assert "\n" not in str(err.value)


def test_inactive_pool_timing_is_refused():
    with pytest.raises(ConfigError, match=r"^engine.prefill.timing is only used by engine.mode=disaggregated"):
        load_config({"engine": {"prefill": {"timing": {"base_ms": 1.0}}}})


def test_a_pool_that_does_not_fit_its_gpu_is_named():
    with pytest.raises(ConfigError, match=r"^engine.decode.timing.model=llama-3.1-70b does not fit "
                                          r"engine.decode.timing.gpu=RTX4090 at engine.decode.timing.tp=1"):
        load_config({"timing": {"type": "roofline", "model": "llama-3.1-70b", "gpu": "H200", "tp": 2},
                     "engine": {"mode": "disaggregated", "decode": {"timing": {"gpu": "RTX4090", "tp": 1}}}})


def test_default_layout_is_the_sections_own_arrays():
    """No pool timing: one copy of the section's arrays, every worker spanning all of it."""
    cfg = load_config({"timing": {"type": "roofline", "model": "llama-3.1-8b", "gpu": "H100-SXM"},
                       "engine": {"mode": "disaggregated", "prefill": {"replicas": 2}}})
    assert all(t is cfg.timing for t in cfg.pool_timing) and not cfg.per_pool_timing
    model, params, table = timing_arrays(cfg.timing)
    worker_model, all_params, all_table, span = worker_timing(list(cfg.pool_timing), [2, 1])
    assert np.array_equal(all_params, params) and np.array_equal(all_table, table)
    assert worker_model.tolist() == [model] * 3
    assert span.tolist() == [[0, params.size, 0, table.size]] * 3


def test_own_spans_reproduce_each_sections_arrays():
    cfg = load_config({"engine": {**POOLS, "decode": {"replicas": 2, **POOLS["decode"]}}})
    worker_model, params, table, span = worker_timing(list(cfg.pool_timing), [1, 2])
    for worker, timing in ((0, cfg.pool_timing[0]), (1, cfg.pool_timing[1]), (2, cfg.pool_timing[1])):
        model, own_params, own_table = timing_arrays(timing)
        s0, s1, s2, s3 = span[worker]
        assert worker_model[worker] == model
        assert np.array_equal(params[s0:s1], own_params) and np.array_equal(table[s2:s3], own_table)


@pytest.mark.parametrize("pool_keys, section_keys", [
    ({"gpu": "H200"}, {"gpu": "H200"}),
    ({"roofline": {"bandwidth_efficiency": 0.6}, "pass_overhead_us": 250.0},
     {"roofline": {"bandwidth_efficiency": 0.6}, "pass_overhead_us": 250.0}),
])
def test_a_pools_own_keys_equal_the_same_keys_for_the_deployment(pool_keys, section_keys):
    timing = {"type": "roofline", "model": "llama-3.1-8b", "gpu": "H100-SXM"}
    workload = {"num_requests": 40, "input_tokens": 300, "output_tokens": 20}
    own = simcore.run({"timing": timing, "workload": workload, "engine": {"aggregated": {"timing": pool_keys}}})
    merged = {**timing, **section_keys}
    whole = simcore.run({"timing": merged, "workload": workload})
    for column in ("first_token_ms", "last_token_ms"):
        assert own.requests.column(column).to_pylist() == whole.requests.column(column).to_pylist()


def test_batched_configurations_with_their_own_pool_timing_equal_single_runs():
    """The batch path stacks each configuration's arrays (padded) and spans: row by row as run alone."""
    workload = {"num_requests": 30, "input_tokens": 200, "output_tokens": 12}
    base = {"workload": workload, "engine": {"mode": "disaggregated", "decode": {"replicas": 2}}}
    configs = [
        base,
        {**base, "engine": {**base["engine"], "decode": {"replicas": 2, "timing": {"base_ms": 9.0}}}},
        {**base, "engine": {**base["engine"], "prefill": {"timing": {"type": "fixed", "prefill_ms": 3.0}},
                            "decode": {"replicas": 2, "timing": {"type": "roofline", "model": "llama-3.1-8b",
                                                                  "gpu": "H200"}}}},
    ]
    batched = simcore.run_batch(configs)
    for config, result in zip(configs, batched):
        alone = simcore.run(config)
        for column in ("first_token_ms", "last_token_ms", "transfer_end_ms"):
            assert result.requests.column(column).to_pylist() == alone.requests.column(column).to_pylist()
    assert batched[0].requests.column("last_token_ms") != batched[1].requests.column("last_token_ms")
