"""timing.type=roofline and the model catalogue: hand-worked passes of tiny models, every catalogue
entry parsed, every catalogue model on every catalogue GPU, and the one-line errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import simcore
from simcore.config import ConfigError, load_config
from simcore.models import catalogue
from simcore.models.catalogue import Gpu
from simcore.models.describe import describe
from simcore.timing import nb
from simcore.timing.api import timing_arrays
from simcore.timing.roofline import roofline_params

# A tiny dense model: 2 layers, width 64, 4 heads of 16, 2 KV heads, MLP 128, vocab 256, bf16.
TINY = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256, "torch_dtype": "bfloat16"}
# Its MoE sibling: every layer 4 experts of width 32, 2 per token, no shared expert.
TINY_MOE = {**TINY, "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "decoder_sparse_step": 1, "mlp_only_layers": []}
# Round peaks: 0.001 TFLOPS = 1e6 FLOP/ms, 1 GB/s = 1e6 bytes/ms.
SLOW = Gpu("slow", 1.0, 1.0, {"bf16": 0.001, "fp8": None, "fp4": None}, "none", 2.0)
ONE = (1.0, 1.0, 1.0, 1.0)


def _pass_ms(params, table, *summary):
    num_prefill, prefill_tokens, _, num_decode, _ = summary
    return nb.roofline_pass_ms_nb(params, table, *summary, prefill_tokens + num_decode)


def test_tiny_dense_by_hand():
    spec = describe(TINY, "tiny")
    # per layer: q 64x64 + k, v 2 x 64x32 + o 64x64 = 12288; MLP 3 x 64 x 128 = 24576; lm_head 256 x 64
    assert spec.attention_params() == 12288
    assert spec.layer_mlp_params() == (2 * 24576, 0, 0)
    assert spec.embedding_params() == (16384, 16384)
    assert spec.kv_bytes_per_token() == 2 * (2 * 2 * 16) * 2  # layers x (k, v) x heads x head_dim x bf16
    params, table = roofline_params(spec, SLOW, 1, ONE)
    # Decode of one sequence at context 10 (T = S = 1), each group max(FLOPs / 1e6, bytes / 1e6):
    #   projections: max(2 x 24576, 2 x 24576 + 2 layers x 2 x 64 x 2) = 49664 bytes -> 0.049664
    #   MLP:         max(2 x 49152, 2 x 49152 + 512) = 98816 bytes                  -> 0.098816
    #   lm_head:     max(2 x 16384, 2 x 16384 + (64 + 256) x 2) = 33408 bytes       -> 0.033408
    #   attention, per layer: 10 keys x 4 heads x 4 x 16 = 2560 FLOPs against
    #     10 x 128 KV bytes + (128 written + 4 x 16 x 2 x 2 q/o) = 1664 bytes      -> 2 x 0.00256
    decode = 0.049664 + 0.098816 + 0.033408 + 2 * 0.00256
    assert _pass_ms(params, table, 0, 0, 0, 1, 10) == pytest.approx(decode, rel=1e-12)
    # Prefill of 8 new tokens over 4 cached (T = 8, S = 1):
    #   projections: 8 x 49152 FLOPs = 0.393216 (bytes 49152 + 8 x 512: 0.053248)
    #   MLP:         8 x 98304 FLOPs = 0.786432
    #   lm_head:     one row, as above: 0.033408
    #   attention:   pairs 5 + 6 + ... + 12 = 68, x 256 FLOPs = 17408 -> 0.017408 per layer
    #                (bytes: (12 read + 8 written) x 128 + 8 x 256 = 4608)
    prefill = 0.393216 + 0.786432 + 0.033408 + 2 * 0.017408
    assert _pass_ms(params, table, 1, 8, 12, 0, 0) == pytest.approx(prefill, rel=1e-12)


def test_tiny_moe_by_hand():
    spec = describe(TINY_MOE, "tiny-moe")
    assert spec.moe_layers == (True, True) and spec.expert_params() == 3 * 64 * 32
    params, table = roofline_params(spec, SLOW, 1, ONE)
    # Two decodes at context 5 each (T = S = 2):
    #   projections: max(2 x 2 x 24576, 49152 + 2 x 512) -> 0.098304
    #   routers (2 x 64 x 4 weights): max(2 x 2 x 512, 2 x 512 + 2 x 512) -> 0.002048
    #   lm_head, 2 rows: max(2 x 2 x 16384, 32768 + 2 x 640) -> 0.065536
    #   experts, per layer: A(2) = 4 (1 - (1 - 2/4)^2) = 3 experts of 6144 weights;
    #     4 routed tokens x 2 x 6144 = 49152 FLOPs vs 3 x 12288 + 4 x 256 = 37888 bytes -> 0.049152
    #   attention, per layer: 10 keys x 256 = 2560 FLOPs vs 1280 + 2 x 384 = 2048 bytes -> 0.00256
    expected = 0.098304 + 0.002048 + 0.065536 + 2 * 0.049152 + 2 * 0.00256
    assert _pass_ms(params, table, 0, 0, 0, 2, 10) == pytest.approx(expected, rel=1e-12)


def test_activated_experts_law():
    """One token activates exactly k experts; many tokens activate all E."""
    spec = describe({**TINY_MOE, "num_experts": 8, "num_experts_per_tok": 2}, "moe")
    big = Gpu("fast-compute", 1.0, 1.0, {"bf16": 1e6, "fp8": None, "fp4": None}, "none", 2.0)
    params, table = roofline_params(spec, big, 1, ONE)
    params[nb.RF_NUM_GEMM] = 0
    params[nb.RF_NUM_ATTN] = 0  # the experts alone, memory-bound: (A(T) x 12288 + 2T x 256) / 1e6 per layer
    for tokens, active in ((1, 2.0), (2, 8 * (1 - 0.75**2)), (10_000, 8.0)):
        want = 2 * (active * 12288 + 2 * tokens * 256) / 1e6
        assert nb.roofline_pass_ms_nb(params, table, 0, 0, 0, tokens, tokens, tokens) == pytest.approx(want, rel=1e-9)


def test_span_sum_by_hand():
    assert nb.span_sum_nb(3.0, 7.0, 5.0) == 3 + 4 + 5 + 5 + 5
    assert nb.span_sum_nb(1.0, 4.0, 0.0) == 10
    assert nb.span_sum_nb(6.0, 8.0, 5.0) == 15
    assert nb.span_sum_nb(2.0, 1.0, 0.0) == 0


def test_sliding_window_caps_decode_reads():
    spec = describe({**TINY, "model_type": "mistral", "sliding_window": 4}, "windowed")
    assert spec.windows == (4, 4)
    params, table = roofline_params(spec, SLOW, 1, ONE)
    full, full_table = roofline_params(describe(TINY, "tiny"), SLOW, 1, ONE)
    # one decode at context 10: a window of 4 reads 4 keys, 6 fewer x 256 FLOPs per layer (compute-bound)
    gap = _pass_ms(full, full_table, 0, 0, 0, 1, 10) - _pass_ms(params, table, 0, 0, 0, 1, 10)
    assert gap == pytest.approx(2 * 6 * 256 / 1e6, rel=1e-9)


def test_mla_kv_bytes():
    """DeepSeek-V3: (kv_lora_rank 512 + rope 64) elements per layer and token, on every TP rank."""
    spec = catalogue.model_spec("deepseek-v3")
    assert spec.mla and spec.kv_bytes_per_token() == 61 * 576 * 2
    assert spec.kv_bytes_per_token(8) == spec.kv_bytes_per_token(1)
    assert catalogue.model_spec("deepseek-v3", kv_dtype="fp8").kv_bytes_per_token() == 61 * 576


# Published total parameter counts (billions; the models' cards and papers), to 2%:
PUBLISHED_B = {
    "llama-3.1-8b": 8.03, "llama-3.1-70b": 70.6, "llama-3.1-405b": 405.8, "mixtral-8x7b": 46.7,
    "mixtral-8x22b": 141, "qwen3-30b-a3b": 30.5, "qwen3-235b-a22b": 235, "deepseek-v3": 671, "kimi-k2": 1026,
    "gpt-oss-20b": 20.9, "gpt-oss-120b": 116.8, "qwen2.5-7b": 7.61, "gemma-2-9b": 9.24, "llama-2-7b": 6.74,
}


@pytest.mark.parametrize("name", catalogue.model_names())
def test_every_catalogue_model_parses(name):
    entry = catalogue.model_entry(name)
    assert entry["config_url"].startswith("https://huggingface.co/") and entry["licence"] and entry["copied_from"]
    spec = catalogue.model_spec(name)
    assert spec.num_params() > 0 and spec.kv_bytes_per_token() > 0
    assert spec.active_params_per_token() <= spec.num_params()
    if name in PUBLISHED_B:
        assert spec.num_params() / 1e9 == pytest.approx(PUBLISHED_B[name], rel=0.02)


def test_names_any_case_and_unknown_names_list_the_valid_ones():
    assert catalogue.model_spec("Llama-3.1-8B") == catalogue.model_spec("llama-3.1-8b")
    with pytest.raises(ConfigError, match=r"^timing\.model=llama-70b is neither .*catalogue models: llama-2-7b, "):
        catalogue.model_spec("llama-70b")
    with pytest.raises(ConfigError, match=r"^timing\.gpu=h100 is not a catalogue GPU; valid names: A100-80GB, "):
        catalogue.gpu("h100")


def test_own_config_path(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY))
    assert catalogue.model_spec(str(tmp_path)) == describe(TINY, str(path))
    cfg = load_config({"timing": {"type": "roofline", "model": str(path), "gpu": "L40S"}})
    assert cfg.timing.type == "roofline"


@pytest.mark.parametrize("change, field", [
    ({"model_type": "bert"}, "model_type"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"hidden_size": "64"}, "hidden_size"),
    ({"num_hidden_layers": None}, "num_hidden_layers"),
    ({"torch_dtype": "int8"}, "torch_dtype"),
    ({"layer_types": ["full_attention"]}, "layer_types"),
    ({"layer_types": ["full_attention", "linear_attention"]}, "layer_types"),
    ({"quantization_config": {"quant_method": "awq"}}, "quantization_config.quant_method"),
    ({"model_type": "mixtral", "num_local_experts": 2, "num_experts_per_tok": 3}, "num_experts_per_tok"),
    ({"model_type": "deepseek_v3", "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
      "first_k_dense_replace": 5}, "first_k_dense_replace"),
])
def test_bad_config_fields_name_file_and_field(tmp_path, change, field):
    config = {**TINY, **change}
    config = {k: v for k, v in config.items() if v is not None}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError) as err:
        catalogue.model_spec(str(path))
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}: {field} ")


def test_bad_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match=r"config\.json:1: not JSON"):
        catalogue.model_spec(str(path))


@pytest.mark.parametrize("timing, match", [
    ({"type": "roofline", "gpu": "H200"}, r"^timing\.model must be set for timing\.type=roofline"),
    ({"type": "roofline", "model": "qwen3-8b"}, r"^timing\.gpu must be set for timing\.type=roofline"),
    ({"type": "roofline", "model": "qwen3-8b", "gpu": "H200", "roofline": {"flops_efficiency": 1.5}},
     r"^timing\.roofline\.flops_efficiency must be in \(0, 1\]"),
    ({"type": "roofline", "model": "qwen3-8b", "gpu": "H200", "roofline": {"kv_dtype": "fp4"}},
     r"^timing\.roofline\.kv_dtype"),
    ({"type": "roofline", "model": "qwen3-8b", "gpu": "H200", "num_layers": 3}, r"^timing\.num_layers is the model's"),
    ({"type": "linear", "roofline": {"bandwidth_efficiency": 0.5}},
     r"^timing\.roofline\.bandwidth_efficiency is only used by timing\.type=roofline"),
    ({"type": "roofline", "model": "qwen3-8b", "gpu": "H200", "tp": 3}, r"^timing\.tp=3 must divide the 32"),
    ({"type": "roofline", "model": "qwen3-8b", "gpu": "H100"}, r"^timing\.gpu=H100 is not a catalogue GPU"),
])
def test_bad_keys_one_line(timing, match):
    with pytest.raises(ConfigError, match=match) as err:
        load_config({"timing": timing})
    assert "\n" not in str(err.value)


def test_auto_blocks_from_the_memory_plan():
    """Llama-3.1-8B on an H100 at 0.9: (72 GiB - weights - activations) / (16 x 128 KiB) blocks."""
    cfg = load_config({"timing": {"type": "roofline", "model": "llama-3.1-8b", "gpu": "H100-SXM"},
                       "engine": {"aggregated": {"num_blocks": "auto"}}})
    pool = cfg.engine.aggregated
    spec = catalogue.model_spec("llama-3.1-8b")
    activations = pool.max_batched_tokens * (2 * 4096 + 2 * 14336) * 2 + pool.max_sequences * 128256 * 4
    kv = 80 * 2**30 * 0.9 - spec.weight_bytes() - activations
    assert pool.num_blocks == int(kv // (32 * 8 * 128 * 2 * 2 * 16))


def test_tp_adds_the_ring_allreduce_at_the_link():
    """tp 2 on an H100 without timing.allreduce: 2 x 32 all-reduces of T x 4096 x 2 bytes at 450 GB/s."""
    base = {"type": "roofline", "model": "llama-3.1-8b", "gpu": "H100-SXM", "tp": 2}
    cfg = load_config({"timing": base})
    assert (cfg.timing.allreduce_bandwidth_gb_per_second, cfg.timing.num_layers, cfg.timing.hidden_size) == (450, 32, 4096)
    model, params, table = timing_arrays(cfg.timing)
    bare = params[: nb.ROOFLINE_NUM_PARAMS]
    with_ar = nb.rank_time_ms_nb(model, params, table, 0, 0, 0, 4, 4000)
    alone = nb.roofline_pass_ms_nb(bare, table, 0, 0, 0, 4, 4000, 4)
    assert with_ar - alone == pytest.approx(64 * (2 * 0.5 * 4 * 4096 * 2 / 450e3) / 1000, rel=1e-9)


def _smallest_fitting_tp(name, gpu):
    spec = catalogue.model_spec(name)
    for tp in (1, 2, 4, 8):
        try:
            catalogue.check_tp(spec, tp)
        except ConfigError:
            continue
        if catalogue.memory_plan(spec, catalogue.gpu(gpu), tp, 0.9, 8192, 256).fits:
            return tp
    return None


def test_every_model_on_every_gpu():
    """Each pair runs a tiny workload at the smallest TP (<= 8) it fits at; at TP 1 a pair that does
    not fit is refused in one line with its memory figures."""
    tiny = {"workload": {"num_requests": 3, "input_tokens": 64, "output_tokens": 3}, "output": {"mode": "bounded"}}
    ran = refused = 0
    for name in catalogue.model_names():
        spec = catalogue.model_spec(name)
        for gpu in catalogue.gpu_names():
            plan = catalogue.memory_plan(spec, catalogue.gpu(gpu), 1, 0.9, 8192, 256)
            if not plan.fits:
                with pytest.raises(ConfigError) as err:
                    load_config({"timing": {"type": "roofline", "model": name, "gpu": gpu}})
                message = str(err.value)
                assert "\n" not in message and message.startswith(f"timing.model={name} does not fit timing.gpu={gpu}")
                assert f"weights {plan.weights / 2**30:.2f} GiB" in message
                refused += 1
            tp = _smallest_fitting_tp(name, gpu)
            if tp is None:
                continue
            cfg = {**tiny, "timing": {"type": "roofline", "model": name, "gpu": gpu, "tp": tp},
                   "engine": {"aggregated": {"num_blocks": "auto"}}}
            summary = simcore.run(cfg).summary
            assert summary["completed"] == 3 and math.isfinite(summary["mean_e2el_ms"]) and summary["mean_e2el_ms"] > 0
            ran += 1
    assert ran >= 150 and refused >= 50


def test_faster_gpu_is_faster():
    """The same passes on an H200 take no longer than on an H100 (same peaks, more bandwidth)."""
    out = {}
    for gpu in ("H100-SXM", "H200"):
        cfg = load_config({"timing": {"type": "roofline", "model": "qwen3-30b-a3b", "gpu": gpu}})
        model, params, table = timing_arrays(cfg.timing)
        summaries = np.array([[0, 0, 0, 64, 64 * 2000], [1, 2048, 4096, 0, 0], [1, 512, 512, 32, 32 * 900]],
                             dtype=np.int64)
        times = np.zeros(3)
        nb.pass_times_nb(model, params, table, summaries, times)
        out[gpu] = times
    assert np.all(out["H200"] <= out["H100-SXM"]) and np.all(out["H200"] > 0)


def test_models_command(capsys):
    from runners import models

    models.main([])
    out = capsys.readouterr().out
    assert all(name in out for name in catalogue.model_names() + catalogue.gpu_names())
    models.main(["--model", "llama-3.1-8b", "--gpu", "H100-SXM"])
    line = capsys.readouterr().out.strip()
    spec = catalogue.model_spec("llama-3.1-8b")
    assert line.startswith("llama-3.1-8b on H100-SXM x tp 1: fits: ") and f"weights {spec.weight_bytes() / 2**30:.2f} GiB" in line
    models.main(["--gpu", "RTX4090"])
    assert "llama-3.1-405b on RTX4090 x tp 1: does not fit: " in capsys.readouterr().out
    for argv in (["--gpu", "h100"], ["--model", "nope"], ["--tp", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            models.main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("replaysim-models: error: ") and err.count("\n") == 1


def _reference_ms(spec, device, tp, summary):
    """docs/timing.md's roofline formula written out per layer, without the kernel's grouping."""
    num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens = summary
    from simcore.models.describe import DTYPE_BYTES as B

    T, S = prefill_tokens + num_decode, num_prefill + num_decode
    bw = device.bandwidth_gb_per_s * 1e6
    act, lin = B[spec.dtype], B[spec.linear_dtype]
    h = spec.hidden_size

    def roof(flops, nbytes, peak):
        return max(flops / peak, nbytes / bw)

    def peak(dtype):
        return device.peak_tflops(dtype) * 1e9

    total = 0.0
    attn = spec.attention_params()
    dense = 3 * h * spec.intermediate_size
    shared = 3 * h * spec.shared_intermediate_size + h * spec.num_experts
    groups = {"attn": [0, 0.0, 0.0], "dense": [0, 0.0, 0.0], "shared": [0, 0.0, 0.0]}
    for moe in spec.moe_layers:
        groups["attn"][0] += 1
        groups["attn"][1] += attn * lin
        if moe:
            groups["shared"][0] += 1
            groups["shared"][1] += (3 * h * spec.shared_intermediate_size) * lin + h * spec.num_experts * act
        else:
            groups["dense"][0] += 1
            groups["dense"][1] += dense * lin
    per_layer = {"attn": attn, "dense": dense, "shared": shared}
    for name, (layers, weight_bytes, _) in groups.items():
        if layers:
            total += roof(T * 2 * layers * per_layer[name] / tp, weight_bytes / tp + T * layers * 2 * h * act,
                          peak(spec.linear_dtype))
    vocab_weights = spec.vocab_size * h
    total += roof(S * 2 * vocab_weights / tp, vocab_weights * act / tp + S * (h + spec.vocab_size / tp) * act,
                  peak(spec.dtype))
    if spec.num_experts:
        E, k = spec.num_experts, spec.experts_per_token
        active = E * (1 - (1 - k / E) ** T)
        expert = spec.expert_params()
        total += spec.num_moe_layers * roof(T * k * 2 * expert / tp,
                                            active * expert * B[spec.expert_dtype] / tp + T * k * 2 * h * act,
                                            peak(spec.expert_dtype))
    heads = spec.num_heads // tp
    kvb = spec.kv_elements_per_token_layer(tp) * B[spec.kv_dtype]
    for w in spec.windows:
        flops = nbytes = 0.0
        if num_prefill:
            c = prefill_tokens / num_prefill
            cached = (prefill_kv_tokens - prefill_tokens) / num_prefill
            if w:
                pairs = sum(min(x, w) for x in np.arange(cached + 1, cached + c + 0.5))
            else:
                pairs = sum(np.arange(cached + 1, cached + c + 0.5))
            read = min(cached + c, w) if w else cached + c
            if spec.mla:
                qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
                flops += num_prefill * (pairs * 2 * heads * (qk + spec.v_head_dim)
                                        + cached * 2 * spec.kv_lora_rank * heads * (spec.qk_nope_head_dim + spec.v_head_dim))
                nbytes += num_prefill * ((read + c) * kvb + c * heads * (qk + spec.v_head_dim) * act)
            else:
                flops += num_prefill * pairs * 4 * heads * spec.head_dim
                nbytes += num_prefill * ((read + c) * kvb + c * 2 * heads * spec.head_dim * act)
        if num_decode:
            mean = decode_kv_tokens / num_decode
            reads = num_decode * w if w and mean > w else decode_kv_tokens
            if spec.mla:
                width = 2 * spec.kv_lora_rank + spec.qk_rope_head_dim
                flops += reads * 2 * heads * width
                nbytes += reads * kvb + num_decode * (kvb + heads * width * act)
            else:
                flops += reads * 4 * heads * spec.head_dim
                nbytes += reads * kvb + num_decode * (kvb + 2 * heads * spec.head_dim * act)
        total += roof(flops, nbytes, device.tflops["bf16"] * 1e9)
    return total


@pytest.mark.parametrize("name, gpu, tp", [
    ("llama-3.1-8b", "H100-SXM", 1), ("gemma-2-9b", "L40S", 1), ("gpt-oss-120b", "B200", 2),
    ("deepseek-v3", "H200", 8), ("llama-4-maverick", "MI325X", 4), ("mixtral-8x7b", "A100-80GB", 2),
    ("qwen3-30b-a3b", "RTXPRO6000", 1), ("mistral-7b", "RTX4090", 1),
])
def test_kernel_matches_the_formula_per_layer(name, gpu, tp):
    """The kernel's grouped parameters against the formula written out layer by layer, on random
    passes with integer mean entries (the reference sums the prefill pairs one query at a time)."""
    spec, device = catalogue.model_spec(name), catalogue.gpu(gpu)
    params, table = roofline_params(spec, device, tp, ONE)
    rng = np.random.default_rng(7)
    for _ in range(20):
        n = int(rng.integers(0, 3))
        chunk = int(rng.integers(1, 300))
        cached = int(rng.integers(0, 9000))
        d = int(rng.integers(0 if n else 1, 40))
        summary = (n, n * chunk, n * (chunk + cached), d, int(d * rng.integers(1, 20000)))
        got = nb.roofline_pass_ms_nb(params, table, *summary, summary[1] + summary[3])
        assert got == pytest.approx(_reference_ms(spec, device, tp, summary), rel=1e-9)


@pytest.mark.parametrize("name", ["llama-3.1-70b", "gpt-oss-20b", "deepseek-r1", "gemma-2-9b", "llama-4-scout"])
def test_more_work_never_takes_less_time(name):
    """Law: adding tokens, decodes or context to a pass never shortens it (every term is non-decreasing)."""
    spec = catalogue.model_spec(name)
    params, table = roofline_params(spec, catalogue.gpu("H200"), 8 if spec.num_heads % 8 == 0 else 1, ONE)
    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(0, 3))
        chunk, cached = int(rng.integers(1, 2048)), int(rng.integers(0, 20000))
        d, ctx = int(rng.integers(0 if n else 1, 64)), int(rng.integers(1, 30000))
        base = (n, n * chunk, n * (chunk + cached), d, d * ctx)
        t0 = _pass_ms(params, table, *base)
        more = [
            (n, n * (chunk + 1), n * (chunk + 1 + cached), d, d * ctx),  # a longer chunk
            (n, n * chunk, n * (chunk + cached + 7), d, d * ctx),  # more cached
            (n, n * chunk, n * (chunk + cached), d + 1, (d + 1) * ctx),  # one more decode
            (n, n * chunk, n * (chunk + cached), d, d * ctx + d),  # longer contexts
        ]
        for bigger in more:
            if n == 0 and bigger[1] == 0 and bigger[3] == d and bigger[4] == d * ctx:
                continue
            assert _pass_ms(params, table, *bigger) >= t0 * (1 - 1e-12)


def test_gpu_table_sparse_rates_are_the_datasheets():
    """The datasheets' with-sparsity figures are twice the dense ones (H100 SXM: FP8 3,958 TFLOPS)."""
    h100 = catalogue.gpu("H100-SXM")
    assert h100.sparse_tflops("fp8") == 3958 and h100.sparse_tflops("fp4") is None
    assert catalogue.gpu("B200").peak_tflops("mxfp4") == 9000 and h100.peak_tflops("mxfp4") == 1979
    assert catalogue.gpu("A100-80GB").peak_tflops("fp8") == 312


def test_batch_of_models_equals_single_runs():
    """Configurations of different models (parameter vectors and tables of other lengths) in one batch."""
    base = {"workload": {"num_requests": 12, "input_tokens": 128, "output_tokens": 6}}
    cfgs = [dict(base, timing={"type": "roofline", "model": model, "gpu": "H200"})
            for model in ("llama-3.1-8b", "gpt-oss-20b", "deepseek-v3")]
    cfgs[2]["timing"]["tp"] = 8
    cfgs.append(dict(base, timing={"type": "roofline", "model": "llama-3.1-8b", "gpu": "H200",
                                   "roofline": {"bandwidth_efficiency": 0.5}}))
    batch = [r.summary for r in simcore.run_batch(cfgs)]
    assert batch == [simcore.run(cfg).summary for cfg in cfgs]
    assert batch[3]["mean_e2el_ms"] > batch[0]["mean_e2el_ms"]  # half the bandwidth: slower
