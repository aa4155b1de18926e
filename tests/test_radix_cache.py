"""Prefix caching of the sglang and trtllm policies (docs/prefix-caching.md):
when each policy makes blocks reusable, worked by hand, and the hit law of a
cache that never evicts on the Mooncake conversation excerpt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import simcore

MOONCAKE = Path(__file__).resolve().parents[1] / "runners" / "samples" / "mooncake_conversation_300.jsonl"
LINEAR = {"type": "linear", "base_ms": 1.0, "per_prefill_token_us": 10.0, "per_decode_seq_us": 0.0, "per_kv_token_ns": 0.0}


def two_prompts(tmp_path, policy: str, load: dict) -> list[int]:
    """r0: 64 tokens (trace block [1]); r1: 80 tokens ([1, 2]), 3 outputs each, at
    16 tokens per engine block: r1's first 4 blocks are r0's 4 complete blocks."""
    trace = tmp_path / "two.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 64, "output_length": 3, "hash_ids": [1]},
        {"timestamp": 0, "input_length": 80, "output_length": 3, "hash_ids": [1, 2]},
    ]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = simcore.run(
        {
            "workload": {"source": "mooncake", "path": str(trace), "num_requests": None, "block_size": 64},
            "load": load,
            "engine": {"policy": policy, "aggregated": {"prefix_caching": True, "block_size": 16}},
            "timing": LINEAR,
        }
    )
    return result.requests.column("cached_tokens").to_pylist()


@pytest.mark.parametrize(
    "policy, expected",
    [
        # vLLM registers r0's 4 complete blocks as it schedules them: r1, admitted
        # next in the same pass, reuses them all (its cap is (80 - 1) // 16 = 4 blocks).
        ("vllm", [0, 64]),
        # TensorRT-LLM stores the full blocks of the first 64 - 1 tokens at the
        # context end: 3 blocks; the 4th only when r0 is released.
        ("trtllm", [0, 48]),
        # SGLang inserts r0's prompt into the radix tree once it is computed (the
        # pass end): r1, matched at its admission in the same pass, finds nothing.
        ("sglang", [0, 0]),
    ],
)
def test_blocks_become_reusable_when_each_engine_publishes_them(tmp_path, policy, expected):
    assert two_prompts(tmp_path, policy, {"type": "trace"}) == expected


@pytest.mark.parametrize("policy", ["vllm", "trtllm", "sglang"])
def test_after_a_finish_every_policy_reuses_the_whole_shared_prefix(tmp_path, policy):
    # One request at a time: r0 finished (64 + 3 - 1 = 66 tokens, 4 whole blocks
    # inserted or stored) before r1 is admitted, so r1 reuses 4 blocks.
    assert two_prompts(tmp_path, policy, {"type": "closed_loop", "concurrency": 1}) == [0, 64]


def hit_law(rows: list[dict], block: int, trace_block: int = 512) -> list[int]:
    """Cached tokens per request with a cache that never evicts and one request at
    a time: every complete prompt block of every earlier request is resident, so
    a request reuses its longest run of leading blocks seen before (at most
    (input - 1) // block blocks).  Block j ends at token e = (j + 1) x block, in
    trace block m = (e - 1) // trace_block; its identity is (hash_ids[m], e - m x trace_block)."""
    seen: set[tuple[int, int]] = set()
    cached = []
    for row in rows:
        ids = []
        for j in range(row["input_length"] // block):
            end = (j + 1) * block
            m = (end - 1) // trace_block
            ids.append((row["hash_ids"][m], end - m * trace_block) if m < len(row["hash_ids"]) else None)
        hits = 0
        while hits < min(len(ids), (row["input_length"] - 1) // block) and ids[hits] in seen:
            hits += 1
        cached.append(hits * block)
        seen.update(i for i in ids if i is not None)
    return cached


@pytest.mark.parametrize("policy", ["sglang", "trtllm"])
def test_hit_law_with_a_cache_that_never_evicts(policy):
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines() if line.strip()]
    block = 64
    result = simcore.run(
        {
            "workload": {"source": "mooncake", "path": str(MOONCAKE), "num_requests": None},
            "load": {"type": "closed_loop", "concurrency": 1},
            "engine": {
                "policy": policy,
                "aggregated": {"prefix_caching": True, "block_size": block, "num_blocks": 8_000_000 // block},
            },
            "timing": LINEAR,
        }
    )
    expected = hit_law(rows, block)
    assert sum(expected) > 0.05 * sum(row["input_length"] for row in rows)  # the excerpt shares prefixes
    assert result.requests.column("cached_tokens").to_pylist() == expected
