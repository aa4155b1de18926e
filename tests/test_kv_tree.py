"""vLLM's (and TensorRT-LLM's) prefix cache as a tree of nodes of many blocks
(simcore.scheduler.kv_tree_nb): when it applies, and that it gives the block model's results.

The block model (simcore.scheduler.kv_nb) is the one compared with the
reference implementation in tests/test_against_reference.py."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

import simcore
import simcore.scheduler.api as scheduler_api  # where prepare asks whether a tree applies
from simcore.config import load_config
from simcore.scheduler import kv_nb
from simcore.scheduler.kv_tree import kv_tree_applies, kv_tree_prefix_cache
from simcore.scheduler.kv_tree_nb import prefix_hits_nb, prefix_register_nb, prefix_release_nb, prefix_take_hits_nb
from simcore.scheduler.offload import OffloadShape, offload_state
from simcore.scheduler.radix import tree_shaped

MOONCAKE = Path(__file__).resolve().parents[1] / "runners" / "samples" / "mooncake_conversation_300.jsonl"


def run(overrides: dict, tree: bool, monkeypatch):
    """One run, its prefix cache on the tree or (tree False) on the block model."""
    decided = []

    def tree_shaped_noted(requests, router_policy):
        decided.append(tree_shaped(requests, router_policy) and tree)
        return decided[-1]

    monkeypatch.setattr(scheduler_api, "tree_shaped", tree_shaped_noted)
    result = simcore.run(overrides)
    assert decided == [tree]  # Mooncake's hash_ids are prefix-chained: the tree applies
    return result


def mooncake(block_size: int, num_blocks: int, replicas: int, speedup: float, path: Path = MOONCAKE,
             policy: str = "vllm", **pool) -> dict:
    return {
        "workload": {"source": "mooncake", "path": str(path), "num_requests": None},
        "load": {"type": "trace", "speedup": speedup},
        "engine": {
            "policy": policy,
            "aggregated": {
                "prefix_caching": True, "block_size": block_size, "num_blocks": num_blocks, "replicas": replicas,
                **pool,
            },
        },
        "timing": {"type": "linear"},
        "output": {"passes": True},
    }


@pytest.mark.parametrize(
    "policy, block_size, tokens, replicas, speedup, pool",
    [
        ("vllm", 16, 80_000, 1, 4.0, {}),  # a cache of a few prompts (they average ~14k tokens): evictions, preemptions
        ("vllm", 16, 60_000, 2, 4.0, {}),
        ("vllm", 16, 200_000, 1, 50.0, {"max_batched_tokens": 2048}),  # a burst
        ("vllm", 32, 120_000, 1, 20.0, {"max_batched_tokens": 1024}),
        ("trtllm", 16, 200_000, 1, 4.0, {}),  # reuse stored at the last chunk and at the end (no preemption)
        ("trtllm", 16, 100_000, 2, 20.0, {"max_batched_tokens": 2048}),
    ],
)
def test_tree_gives_the_block_models_results_on_the_mooncake_excerpt(monkeypatch, policy, block_size, tokens,
                                                                       replicas, speedup, pool):
    overrides = mooncake(block_size, tokens // block_size, replicas, speedup, policy=policy, **pool)
    tree = run(overrides, True, monkeypatch)
    blocks = run(overrides, False, monkeypatch)
    requests = tree.requests
    assert tree.summary["prefix_cache_hit_rate"] > 0
    assert tree.requests.equals(blocks.requests)
    assert tree.passes.equals(blocks.passes)
    assert tree.summary == blocks.summary
    if policy == "vllm" and replicas == 1 and speedup == 4.0:
        assert sum(requests.column("input_tokens").to_pylist()) > 10 * tokens  # it must evict
        assert sum(requests.column("num_preemptions").to_pylist()) > 0


def test_tree_gives_the_block_models_results_with_duplicate_prompts_sent_together(monkeypatch, tmp_path):
    """The excerpt's first 150 rows, each sent three times at once: requests
    compute blocks that a twin registered meanwhile (they stay anonymous)."""
    rows = MOONCAKE.read_text().splitlines()[:150]
    path = tmp_path / "triplets.jsonl"
    path.write_text("".join(f"{row}\n" * 3 for row in rows))
    overrides = mooncake(16, 80_000 // 16, 1, 4.0, path=path)
    tree = run(overrides, True, monkeypatch)
    blocks = run(overrides, False, monkeypatch)
    assert tree.summary["prefix_cache_hit_rate"] > 0.5  # two of three prompts are repeats
    assert tree.requests.equals(blocks.requests)
    assert tree.passes.equals(blocks.passes)
    assert tree.summary == blocks.summary


@pytest.mark.parametrize(
    "policy, pool, expected",
    [
        ("vllm", {}, True),
        ("trtllm", {}, True),
        ("sglang", {}, False),  # its own tree (simcore.scheduler.radix)
        ("vllm", {"kv_offload": {"num_blocks": 64, "bandwidth_gb_per_second": 10, "bytes_per_token": 1024}}, False),
    ],
)
def test_the_tree_is_for_vllm_and_trtllm_without_a_cpu_tier(policy, pool, expected):
    cfg = load_config({"engine": {"policy": policy, "aggregated": {"prefix_caching": True, **pool}}})
    assert kv_tree_applies(cfg.engine.pools[0], cfg.engine.policy) is expected


class Model:
    """One prefix-cache state (the block model or the tree) and its per-rank and per-request counts."""

    def __init__(self, pc, num_ranks: int, n: int):
        self.pc = pc
        self.blocks_used = np.zeros(num_ranks, dtype=np.int64)
        self.held = np.zeros(n, dtype=np.int64)


def random_prompts(rnd: random.Random, n: int) -> list[list[int]]:
    """Tree-shaped identities: a prompt is another's prefix (of any length) plus identities of its own."""
    prompts: list[list[int]] = []
    fresh = 0
    for k in range(n):
        ids = []
        if k and rnd.random() < 0.8:
            base = prompts[rnd.randrange(k)]
            ids = base[: rnd.randint(0, len(base))]
        for _ in range(rnd.randint(0 if ids else 1, 10)):
            ids.append(fresh)
            fresh += 1
        prompts.append(ids)
    return prompts


@pytest.mark.parametrize("seed", range(40))
def test_the_tree_follows_the_block_model_call_by_call(seed):
    """The scheduler's calls (admission lookups, possibly blocked; hits taken;
    chunks registered; preemptions and finishes) in a random order over two
    ranks, on both models: every lookup, and the blocks in use after every
    call, are equal.  Prompts share prefixes and their chunks interleave, so
    that a request computes blocks another registered meanwhile (anonymous),
    then registers blocks after them (detached nodes)."""
    rnd = random.Random(seed)
    block_size, num_blocks, num_ranks, n = 4, rnd.choice([12, 24, 60]), 2, 40
    prompts = random_prompts(rnd, n)
    input_tokens = [len(ids) * block_size + rnd.randrange(block_size) for ids in prompts]
    output_tokens = [rnd.randint(1, 12) for _ in range(n)]
    ident_offset = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(ids) for ids in prompts], out=ident_offset[1:])
    ident = np.array([i for ids in prompts for i in ids], dtype=np.int64)
    num_slots = num_blocks * num_ranks
    offload = offload_state(OffloadShape(np.zeros(num_ranks, dtype=np.int64), n, 0, 0.0))
    blocks = Model(kv_nb.allocate_prefix_cache(num_slots, num_ranks, ident_offset, ident, tail=offload), num_ranks, n)
    tree = Model(kv_tree_prefix_cache(num_slots, num_ranks, ident_offset, ident, offload,
                                      np.full(num_ranks, num_blocks, dtype=np.int64)), num_ranks, n)
    models = (blocks, tree)
    rank = [rnd.randrange(num_ranks) for _ in range(n)]
    state = ["waiting"] * n
    computed = [0] * n
    generated = [0] * n
    held = [0] * n

    def each(call):
        results = [call(m) for m in models]
        assert results[0] == results[1]
        assert np.array_equal(blocks.blocks_used, tree.blocks_used)
        return results[0]

    def release(k):
        each(lambda m: prefix_release_nb(m.pc, rank[k], k, m.held, m.blocks_used))
        computed[k] = held[k] = 0

    def schedule(k, start, n_tok):
        """Allocate and register request k's chunk (its blocks fit)."""
        g = rank[k]
        grow = -(-(start + n_tok) // block_size) - held[k]
        if grow > 0:
            each(lambda m: kv_nb.kv_allocate_nb(m.pc, g, grow, m.blocks_used, num_blocks))
            for m in models:
                m.held[k] += grow
            held[k] += grow
        if start < input_tokens[k]:
            each(lambda m: prefix_register_nb(m.pc, g, num_ranks, k, start + n_tok, block_size, m.blocks_used))
        computed[k] = start + n_tok

    for _ in range(1500):
        k = rnd.randrange(n)
        g = rank[k]
        known = input_tokens[k] + generated[k]
        budget = rnd.randint(1, 24)
        if state[k] == "waiting":
            hits, cached = each(lambda m: prefix_hits_nb(m.pc, g, num_ranks, k, known, block_size, m.blocks_used))
            start = hits * block_size
            n_tok = min(known - start, budget)
            grow = -(-(start + n_tok) // block_size) - hits
            if grow + cached > num_blocks - blocks.blocks_used[g]:
                continue  # a blocked head, looked up again later
            each(lambda m: prefix_take_hits_nb(m.pc, g, k, hits, m.blocks_used))
            for m in models:
                m.held[k] = hits
            held[k] = hits
            state[k] = "running"
            schedule(k, start, n_tok)
        elif state[k] == "running":
            if computed[k] == known:  # a decode step
                if generated[k] == output_tokens[k]:
                    release(k)
                    state[k] = "done"
                    continue
                generated[k] += 1
                known += 1
            n_tok = min(known - computed[k], budget)
            if -(-(computed[k] + n_tok) // block_size) - held[k] > num_blocks - blocks.blocks_used[g]:
                release(k)  # preempted: recomputed from scratch later
                state[k] = "waiting"
                continue
            schedule(k, computed[k], n_tok)
    for k in range(n):
        if state[k] == "running":
            release(k)
    assert blocks.blocks_used.sum() == 0
