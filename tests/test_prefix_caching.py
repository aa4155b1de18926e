"""Prefix caching (docs/prefix-caching.md): hand-worked hits and the hit rate on
an excerpt of the real Mooncake conversation trace against its offline bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import simcore
from simcore.config import ConfigError

MOONCAKE = Path(__file__).resolve().parents[1] / "runners" / "samples" / "mooncake_conversation_300.jsonl"
LINEAR = {"type": "linear", "base_ms": 1.0, "per_prefill_token_us": 10.0, "per_decode_seq_us": 0.0, "per_kv_token_ns": 0.0}


def offline_bound(rows: list[dict], block: int = 512) -> float:
    """Prompt tokens in blocks whose hash appeared in an earlier request, over all
    prompt tokens, at most input - 1 per request (one token is always computed).
    Mooncake hashes are prefix-chained, so repeated blocks are leading blocks."""
    seen: set[int] = set()
    reused = 0
    for row in rows:
        repeated = 0
        for h in row["hash_ids"]:
            if h not in seen:
                break
            repeated += 1
        full_blocks = row["input_length"] // block  # a partial last block is never complete
        reused += min(min(repeated, full_blocks) * block, row["input_length"] - 1)
        seen.update(row["hash_ids"])
    return reused / sum(row["input_length"] for row in rows)


def replay(num_blocks: int) -> dict:
    return simcore.run(
        {
            "workload": {"source": "mooncake", "path": str(MOONCAKE), "num_requests": None},
            "load": {"type": "closed_loop", "concurrency": 1},
            "engine": {"aggregated": {"prefix_caching": True, "num_blocks": num_blocks, "max_batched_tokens": 16384}},
            "timing": LINEAR,
        }
    ).summary


def test_hit_rate_on_the_conversation_trace_reaches_the_offline_bound_and_falls_with_the_cache():
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines() if line.strip()]
    bound = offline_bound(rows)
    assert bound > 0.05  # the excerpt does share prefixes (8% of its prompt tokens)
    # Concurrency 1: every earlier request finished and left its blocks cached.
    unlimited = replay(num_blocks=4_000_000 // 16)
    assert unlimited["completed"] == len(rows)
    assert abs(unlimited["prefix_cache_hit_rate"] - bound) <= 0.01
    # Shrinking the cache evicts older prefixes; with one request at a time the
    # previous turn's blocks survive longest, so the rate levels off, never rises.
    rates = [unlimited["prefix_cache_hit_rate"]] + [
        replay(num_blocks=nb)["prefix_cache_hit_rate"] for nb in (100_000, 60_000, 20_000)
    ]
    assert rates[0] > rates[1] > rates[2] >= rates[3] > 0


def test_shared_prefix_hits_shorten_the_prefill():
    # block 16, prefix_tokens 64: 4 shared blocks. Concurrency 1: "r0" computes its 100
    # tokens (prefill 1 + 10 x 100 / 1000 = 2 ms); "r1" reuses 64 tokens and computes
    # 36: 1 + 10 x 36 / 1000 = 1.36 ms.
    result = simcore.run(
        {
            "workload": {"num_requests": 2, "input_tokens": 100, "output_tokens": 1, "prefix_tokens": 64},
            "load": {"type": "closed_loop", "concurrency": 1},
            "engine": {"aggregated": {"prefix_caching": True}},
            "timing": LINEAR,
            "output": {"passes": True},
        }
    )
    r0, r1 = result.requests.to_pylist()
    assert (r0["cached_tokens"], r1["cached_tokens"]) == (0, 64)
    assert (r0["ttft_ms"], r1["ttft_ms"]) == (2.0, 1.36)
    assert result.passes.column("prefill_tokens").to_pylist() == [100, 36]
    assert result.summary["prefix_cache_hit_rate"] == 64 / 200


def test_an_identical_prompt_still_computes_its_last_token():
    # Prompt of 64 tokens = 4 complete blocks, all cached after "r0": the hit stops at
    # floor((64 - 1) / 16) = 3 blocks, so "r1" computes 16 tokens.
    result = simcore.run(
        {
            "workload": {"num_requests": 2, "input_tokens": 64, "output_tokens": 1, "prefix_tokens": 64},
            "load": {"type": "closed_loop", "concurrency": 1},
            "engine": {"aggregated": {"prefix_caching": True}},
            "timing": LINEAR,
        }
    )
    assert result.requests.column("cached_tokens").to_pylist() == [0, 48]


def test_prefix_caching_is_rejected_where_it_is_not_modelled():
    for policy in ("sglang", "trtllm"):  # every policy caches
        assert simcore.load_config({"engine": {"policy": policy, "aggregated": {"prefix_caching": True}}}).engine.aggregated.prefix_caching
    with pytest.raises(ConfigError, match="engine.decode.prefix_caching"):
        simcore.load_config({"engine": {"mode": "disaggregated", "decode": {"prefix_caching": True}}})
    with pytest.raises(ConfigError, match="workload.prefix_tokens is only used by workload.source=synthetic"):
        simcore.load_config({"workload": {"source": "table", "path": "x.csv", "prefix_tokens": 16}})
