"""aic decode attention beyond the database's KV heads (docs/timing.md, "Decode attention beyond the database").

The rule's arithmetic is checked by hand without aiconfigurator-core; the tables
and the summary's warning need it (skipped without the replaysim[aic] extra).
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from simcore.timing import aic, nb

HAS_AIC = importlib.util.find_spec("aiconfigurator_core") is not None
needs_aic = pytest.mark.skipif(not HAS_AIC, reason="aiconfigurator-core (the replaysim[aic] extra) is not installed")

#: The KV-head counts of aiconfigurator-core 0.12's H100 vLLM decode-attention rows.
MEASURED = (1, 2, 4, 8)


def spec(tp=1):
    return aic.AicSpec("m", "h100_sxm", "vllm", None, tp, tokens=64, sequences=8, context=256)


def rule_for(monkeypatch, layers, heads, kv_heads, head_dim=128, tp=1, covered=MEASURED):
    monkeypatch.setattr(aic, "attention_shape", lambda model: (layers, heads, kv_heads, head_dim))
    monkeypatch.setattr(aic, "covered_kv_heads", lambda s, size: covered)
    return aic.fold_rule(spec(tp))


def test_multi_head_attention_folds_its_heads_into_the_batch(monkeypatch):
    # Llama-2-7B: 32 query and 32 KV heads, TP1.  Largest measured count dividing 32: 8,
    # so 32 / 8 = 4 times the batch at 8 KV heads, one query head per KV head (8 query heads).
    rule = rule_for(monkeypatch, 32, 32, 32)
    assert (rule.model_kv_heads, rule.kv_heads, rule.fold, rule.q_heads, rule.layers) == (32, 8, 4, 8, 32)
    op = json.loads(rule.op_json())[0]["GenerationAttention"]
    assert (op["n"], op["n_kv"], op["head_size"], op["scale_factor"]) == (8, 8, 128, 32.0)


def test_tensor_parallelism_splits_the_heads_first(monkeypatch):
    # 32 KV heads over TP2: 16 per GPU -> 2 x the batch at 8; TP4: 8 per GPU, measured: no rule.
    assert rule_for(monkeypatch, 32, 32, 32, tp=2).fold == 2
    assert rule_for(monkeypatch, 32, 32, 32, tp=4) is None


def test_grouped_query_models_within_the_database_keep_its_rows(monkeypatch):
    # CodeLlama-34B TP2: 8 KV heads / 2 = 4 per GPU; Llama-2-70B TP4: 2 per GPU; Llama-3.1-8B TP1: 8.
    assert rule_for(monkeypatch, 48, 64, 8, tp=2) is None
    assert rule_for(monkeypatch, 80, 64, 8, tp=4) is None
    assert rule_for(monkeypatch, 32, 32, 8) is None


def test_the_largest_measured_count_that_divides_is_used(monkeypatch):
    # 40 KV heads (Llama-2-13B): 40 = 5 x 8.  12 KV heads: 12 = 3 x 4 (8 does not divide 12).
    assert (rule_for(monkeypatch, 40, 40, 40).kv_heads, rule_for(monkeypatch, 40, 40, 40).fold) == (8, 5)
    twelve = rule_for(monkeypatch, 24, 24, 12)
    assert (twelve.kv_heads, twelve.fold, twelve.q_heads) == (4, 3, 8)  # 2 query heads per KV head
    # No measured count divides the model's: the database's own rows stay.
    assert rule_for(monkeypatch, 24, 18, 18, covered=(4, 8)) is None


def test_the_rule_enters_only_the_keys_it_applies_to(monkeypatch):
    rule = rule_for(monkeypatch, 32, 32, 32)
    assert aic.cache_key(spec(), "0.12.0", None) == aic.cache_key(spec(), "0.12.0")
    assert aic.cache_key(spec(), "0.12.0", rule) != aic.cache_key(spec(), "0.12.0")


def test_the_note_names_the_operator_and_the_rule(monkeypatch):
    note = rule_for(monkeypatch, 32, 32, 32).note()
    assert "generation_attention" in note and "32 KV heads per GPU" in note
    assert "4 x the batch at 8 KV heads" in note and "1, 2, 4, 8" in note


def test_attention_shape_reads_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096}))
    assert aic.attention_shape(str(tmp_path)) == (32, 32, 32, 128)  # KV heads default to the heads
    (tmp_path / "config.json").write_text(json.dumps(
        {"num_hidden_layers": 48, "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192}))
    assert aic.attention_shape(str(tmp_path)) == (48, 64, 8, 128)
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    assert aic.attention_shape(str(tmp_path)) is None


LLAMA2_7B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32,
             "num_key_value_heads": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
             "rms_norm_eps": 1e-05, "torch_dtype": "float16", "hidden_act": "silu"}


@pytest.fixture()
def mha_model(tmp_path, monkeypatch):
    monkeypatch.setenv("REPLAYSIM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(aic, "_MEMO", {})
    model = tmp_path / "llama-2-7b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA2_7B))
    return str(model)


@needs_aic
def test_the_database_measured_one_to_eight_kv_heads():
    assert aic.covered_kv_heads(aic.AicSpec("m", "h100_sxm", "vllm", None, 1, 64, 8, 256), 128) == MEASURED


@needs_aic
def test_tables_price_the_folded_shape(mha_model):
    s = aic.AicSpec(mha_model, "h100_sxm", "vllm", None, 1, tokens=64, sequences=8, context=256)
    rule = aic.fold_rule(s)
    assert rule is not None and rule.fold == 4
    params, table, info = aic.load_or_build(s)
    assert info["extrapolated"] == [rule.note()] and info["max_rel_error"] <= aic.MAX_REL_ERROR
    handle = aic._compile(s)
    ng_ops = aic._op_indices(handle)[3]
    # GA(B, K) at a knot equals the covered shape (8 KV heads) at 4 B sequences, K tokens.
    for b, k in ((1, 16), (3, 128), (8, 256)):
        want = sum(r[1] for r in handle.evaluate_ops_json(rule.op_json(), is_context=False, batch_size=4 * b, s=k))
        got = np.zeros(1)
        nb.pass_times_nb(nb.TIMING_AIC, params, table, np.array([[0, 0, 0, b, b * (k + 1)]], dtype=np.int64), got)
        ng = sum(r[1] for r in handle.evaluate_generation_ops(ng_ops, batch_size=b, s=1))
        assert got[0] == pytest.approx(ng + want, rel=1e-9)  # decode only: NG[B] + GA(B, K)


@needs_aic
def test_the_summary_warns_and_covered_runs_do_not(mha_model):
    import simcore

    base = {"engine": {"aggregated": {"max_batched_tokens": 48, "max_sequences": 8, "context_length": 200}},
            "workload": {"num_requests": 4, "input_tokens": 20, "output_tokens": 3}}
    run = simcore.run({**base, "timing": {"type": "aic", "model": mha_model, "gpu": "h100_sxm"}})
    assert len(run.summary["timing_warnings"]) == 1
    assert "generation_attention" in run.summary["timing_warnings"][0]
    assert "timing_warnings" not in simcore.run(base).summary


def test_the_report_prints_the_timing_warnings_first():
    from runners.report import warnings_for

    note = "timing.type=aic: decode attention (generation_attention) extrapolated: ..."
    assert warnings_for({"timing_warnings": [note], "config": {"load": {"type": "poisson"}}}) == [note]
    closed = {"timing_warnings": [note], "num_requests": 2,
              "config": {"load": {"type": "closed_loop", "concurrency": 1000}}}
    lines = warnings_for(closed)
    assert lines[0] == note and len(lines) == 2 and "load.concurrency=1000" in lines[1]
    assert warnings_for({"config": {"load": {"type": "poisson"}}}) == []
