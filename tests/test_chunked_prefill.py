"""vLLM with chunked prefill off (engine.<pool>.chunked_prefill=false, docs/semantics.md):
a hand-worked timeline, configuration errors, and a policy variant that turns it off
by default being one registry entry.  The engine is compared with the reference
implementation in tests/test_against_reference.py (``chunked_prefill_off``)."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest

import simcore
from simcore.config import ConfigError, load_config
from simcore.scheduler import policies
from tests.scenarios import mooncake_runs

VARIANT = "vllm_no_chunk"


def run_three_prompts(chunked_prefill: bool) -> dict:
    """a (6 prompt tokens, 3 outputs), b (8, 1) and c (3, 1), all sent at 0, in that
    order; one rank, blocks of 1 token (plenty), a budget of 10 tokens, L = 10;
    fixed timing (SPEC §8): 10 ms if the pass has a prefill entry, plus 2 ms if it
    has a decode entry."""
    requests = pa.table({
        "request_id": ["a", "b", "c"], "input_tokens": [6, 8, 3], "output_tokens": [3, 1, 1],
        "send_ms": [0.0, 0.0, 0.0],
    })
    pool = {"num_blocks": 100, "block_size": 1, "max_batched_tokens": 10, "context_length": 10,
            "chunked_prefill": chunked_prefill}
    cfg = {
        "load": {"type": "trace"},
        "workload": {"num_requests": 3},
        "engine": {"aggregated": pool},
        "timing": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0},
    }
    return simcore.run(cfg, requests=requests).requests.to_pydict()


def test_a_long_prompt_waits_instead_of_being_chunked():
    # Chunked (vLLM's default): pass [0, 10] (prefill only) takes a's 6 tokens and a
    # chunk of b's, the budget's last 4; c waits (no budget left).  Pass [10, 22]
    # (prefill + decode): a decodes (1), b's last 4 tokens, c's 3 (budget 10 - 5 = 5):
    # b and c emit their only token at 22.  Pass [22, 24] decodes a's last token.
    on = run_three_prompts(True)
    assert on["first_admit_ms"] == [0.0, 0.0, 10.0]
    assert on["ttft_ms"] == [10.0, 22.0, 22.0]
    assert on["e2el_ms"] == [24.0, 22.0, 22.0]
    # Chunked prefill off: at 0 a takes 6 tokens (4 left); b needs 8 > 4, so the waiting
    # loop stops there (vLLM's `break`): b keeps its place and c, behind it, is not
    # tried.  Pass [0, 10]: a emits at 10.  Pass [10, 22]: a decodes (9 left), b is
    # admitted whole, 8 tokens (1 left), c's 3 > 1 stops the loop: a and b emit at 22,
    # b finishes.  Pass [22, 34]: a decodes its last token (9 left) and c's 3 tokens
    # are admitted: both emit at 34.
    off = run_three_prompts(False)
    assert off["first_admit_ms"] == [0.0, 10.0, 22.0]
    assert off["ttft_ms"] == [10.0, 22.0, 34.0]
    assert off["e2el_ms"] == [34.0, 22.0, 34.0]


@pytest.mark.parametrize("engine, message", [
    ({"aggregated": {"chunked_prefill": False}},
     r"^engine\.aggregated\.max_batched_tokens=8192 is below the sequence limit L = 416000 with "
     r"engine\.aggregated\.chunked_prefill=false"),
    ({"aggregated": {"chunked_prefill": False, "context_length": 9000}},
     r"^engine\.aggregated\.max_batched_tokens=8192 is below the sequence limit L = 9000"),
    ({"mode": "disaggregated", "decode": {"chunked_prefill": False, "num_blocks": 1000}},
     r"^engine\.decode\.max_batched_tokens=8192 is below the sequence limit L = 16000"),
    ({"policy": "trtllm", "aggregated": {"chunked_prefill": False}},
     r"^engine\.aggregated\.chunked_prefill=false is modelled for engine\.policy=vllm only, got trtllm$"),
    ({"policy": "sglang", "aggregated": {"chunked_prefill": False}},
     r"^engine\.aggregated\.chunked_prefill is not used by engine\.policy=sglang, got False$"),
    ({"aggregated": {"chunked_prefill": "no"}}, r"^engine\.aggregated\.chunked_prefill"),
    ({"aggregated": {"chunked_prefill": False, "context_length": 8192, "prefix_caching": True,
                     "kv_offload": {"num_blocks": 64, "bandwidth_gb_per_second": 10.0, "bytes_per_token": 1000.0}}},
     r"^engine\.aggregated\.chunked_prefill=false is not modelled with engine\.aggregated\.kv_offload$"),
])
def test_bad_chunked_prefill_names_the_key(engine, message):
    with pytest.raises(ConfigError, match=message) as error:
        load_config({"engine": engine})
    assert "\n" not in str(error.value)


def test_budget_at_the_limit_is_accepted():
    for pool in ({"context_length": 8192}, {"num_blocks": 512}, {"max_batched_tokens": 416_000}):
        cfg = load_config({"engine": {"aggregated": {"chunked_prefill": False, **pool}}})
        assert cfg.engine.aggregated.chunked_prefill is False
    # a policy without the key leaves it None; vLLM's default is True
    assert load_config({"engine": {"policy": "sglang"}}).engine.aggregated.chunked_prefill is None
    assert load_config({}).engine.aggregated.chunked_prefill is True


@pytest.fixture
def no_chunk_variant(monkeypatch):
    """``vllm_no_chunk``: vLLM's entry with the pool default chunked_prefill false, registered for the test."""
    vllm = policies.SCHEDULING_POLICIES["vllm"]
    spec = dataclasses.replace(vllm, name=VARIANT, defaults={**vllm.defaults, "chunked_prefill": False})
    monkeypatch.setitem(policies.SCHEDULING_POLICIES, VARIANT, spec)
    return spec


def test_a_chunk_off_default_needs_the_feature():
    sglang = policies.SCHEDULING_POLICIES["trtllm"]
    with pytest.raises(ValueError, match="needs the chunked_prefill feature"):
        dataclasses.replace(sglang, defaults={**sglang.defaults, "chunked_prefill": False})
    with pytest.raises(ValueError, match="vLLM's batch builder only"):
        dataclasses.replace(policies.SCHEDULING_POLICIES["sglang"], chunked_prefill=True)


def test_the_no_chunk_variant_is_one_registry_entry(no_chunk_variant):
    # its default is vLLM's budget rule too: the same one-line error, naming the key
    with pytest.raises(ConfigError, match=r"^engine\.aggregated\.max_batched_tokens=8192 is below"):
        load_config({"engine": {"policy": VARIANT}})
    cfg = load_config({"engine": {"policy": VARIANT, "aggregated": {"context_length": 8192}}})
    assert cfg.engine.aggregated.chunked_prefill is False
    # and it may turn chunking back on, as vllm may turn it off
    assert load_config({"engine": {"policy": VARIANT, "aggregated": {"chunked_prefill": True}}}
                       ).engine.aggregated.chunked_prefill is True
    with pytest.raises(ConfigError, match=r"modelled for engine\.policy=vllm or vllm_no_chunk only, got trtllm"):
        load_config({"engine": {"policy": "trtllm", "aggregated": {"chunked_prefill": False}}})


@pytest.mark.parametrize("pool", [
    {"num_blocks": 1500, "context_length": 16384, "max_batched_tokens": 16384},
    {"num_blocks": 1500, "context_length": 16384, "max_batched_tokens": 16400, "prefix_caching": True,
     "async_scheduling": True},
])
def test_the_no_chunk_variant_runs_as_vllm_with_chunking_off(no_chunk_variant, pool):
    (base, base_prep), (run, prep), (chunked, chunked_prep) = mooncake_runs(
        [("vllm", {**pool, "chunked_prefill": False}), (VARIANT, pool), ("vllm", pool)])
    assert run.requests.equals(base.requests)
    assert run.tokens.equals(base.tokens) and run.passes.equals(base.passes)
    for field in prep.ranks._fields:
        assert (getattr(prep.ranks, field) == getattr(base_prep.ranks, field)).all(), field
    assert not prep.ranks.chunked_prefill.any() and chunked_prep.ranks.chunked_prefill.all()
    # the rule decides on this trace: chunking on gives other passes
    assert not chunked.passes.equals(base.passes)
