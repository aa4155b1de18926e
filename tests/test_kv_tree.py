"""vLLM's prefix cache as a tree of nodes of many blocks (simcore.scheduler.kv_tree_nb):
when it applies, and that it gives the block model's results.

The block model (simcore.scheduler.kv_nb) is the one compared with the
reference implementation in tests/test_against_reference.py."""

from __future__ import annotations

from pathlib import Path

import pytest

import simcore
import simcore.engine.api as engine_api
from simcore.config import load_config
from simcore.scheduler.kv_tree import kv_tree_applies
from simcore.scheduler.radix import tree_shaped

MOONCAKE = Path(__file__).resolve().parents[1] / "runners" / "samples" / "mooncake_conversation_300.jsonl"


def run(overrides: dict, tree: bool, monkeypatch):
    """One run, its prefix cache on the tree or (tree False) on the block model."""
    decided = []

    def tree_shaped_noted(requests, router_policy):
        decided.append(tree_shaped(requests, router_policy) and tree)
        return decided[-1]

    monkeypatch.setattr(engine_api, "tree_shaped", tree_shaped_noted)
    result = simcore.run(overrides)
    assert decided == [tree]  # Mooncake's hash_ids are prefix-chained: the tree applies
    return result


def mooncake(block_size: int, num_blocks: int, replicas: int, speedup: float, **pool) -> dict:
    return {
        "workload": {"source": "mooncake", "path": str(MOONCAKE), "num_requests": None},
        "load": {"type": "trace", "speedup": speedup},
        "engine": {
            "policy": "vllm",
            "aggregated": {
                "prefix_caching": True, "block_size": block_size, "num_blocks": num_blocks, "replicas": replicas,
                **pool,
            },
        },
        "timing": {"type": "linear"},
        "output": {"passes": True},
    }


@pytest.mark.parametrize(
    "block_size, tokens, replicas, speedup, pool",
    [
        (16, 80_000, 1, 4.0, {}),  # a cache of a few prompts (they average ~14k tokens): evictions, preemptions
        (16, 60_000, 2, 4.0, {}),
        (16, 200_000, 1, 50.0, {"max_batched_tokens": 2048}),  # a burst: duplicates computed side by side
        (32, 120_000, 1, 20.0, {"max_batched_tokens": 1024}),
    ],
)
def test_tree_gives_the_block_models_results_on_the_mooncake_excerpt(monkeypatch, block_size, tokens, replicas,
                                                                       speedup, pool):
    overrides = mooncake(block_size, tokens // block_size, replicas, speedup, **pool)
    tree = run(overrides, True, monkeypatch)
    blocks = run(overrides, False, monkeypatch)
    requests = tree.requests
    assert tree.summary["prefix_cache_hit_rate"] > 0
    assert tree.requests.equals(blocks.requests)
    assert tree.passes.equals(blocks.passes)
    assert tree.summary == blocks.summary
    if replicas == 1 and speedup == 4.0:
        assert sum(requests.column("input_tokens").to_pylist()) > 10 * tokens  # it must evict
        assert sum(requests.column("num_preemptions").to_pylist()) > 0


@pytest.mark.parametrize(
    "policy, pool, expected",
    [
        ("vllm", {}, True),
        ("trtllm", {}, False),
        ("sglang", {}, False),  # its own tree (simcore.scheduler.radix)
        ("vllm", {"kv_offload": {"num_blocks": 64, "bandwidth_gb_per_second": 10, "bytes_per_token": 1024}}, False),
    ],
)
def test_the_tree_is_for_vllm_without_a_cpu_tier(policy, pool, expected):
    cfg = load_config({"engine": {"policy": policy, "aggregated": {"prefix_caching": True, **pool}}})
    assert kv_tree_applies(cfg.engine.pools[0], cfg.engine.policy) is expected
