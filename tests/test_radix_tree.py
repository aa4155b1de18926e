"""SGLang's radix cache as a tree of nodes of many blocks (simcore.scheduler.radix_tree_nb):
when it applies, and that it gives the block-per-node model's results.

The block model is the one compared with the reference implementation in
tests/test_against_reference.py (whose random sglang scenarios run on the tree
when their identities are tree-shaped, on the block model when not)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import simcore
import simcore.scheduler.api as scheduler_api  # where prepare asks whether a tree applies
from simcore.scheduler.radix import tree_shaped
from simcore.workload.api import RequestTable

MOONCAKE = Path(__file__).resolve().parents[1] / "runners" / "samples" / "mooncake_conversation_300.jsonl"


def table(hash_ids):
    n = 2 if hash_ids is None else len(hash_ids)
    return RequestTable(
        pa.array([str(k) for k in range(n)], type=pa.string()),
        np.full(n, 64, dtype=np.int64),
        np.full(n, 4, dtype=np.int64),
        hash_ids=None if hash_ids is None else pa.array(hash_ids, type=pa.list_(pa.int64())),
    )


@pytest.mark.parametrize(
    "hash_ids, expected",
    [
        ([[1, 2, 3], [1, 2, 4], [1, 5], [6]], True),  # a tree: 2 after 1 at position 1 each time
        ([[1, 2], [2, 3]], False),  # hash 2 at positions 1 and 0
        ([[1, 3], [2, 3]], False),  # hash 3 after 1 and after 2
        ([[1, 2, 1]], False),  # a hash repeated inside a prompt
        ([[], [7]], True),
        (None, True),  # positional identities (synthetic prefix, sessions)
    ],
)
def test_tree_shaped_identities(hash_ids, expected):
    assert tree_shaped(table(hash_ids), "round_robin") is expected


def test_the_prefix_aware_router_keeps_the_block_model():
    # It reads the block model's identity map.
    assert tree_shaped(table([[1, 2]]), "prefix_aware") is False


def mooncake_run(block_size: int, num_blocks: int, replicas: int):
    return simcore.run(
        {
            "workload": {"source": "mooncake", "path": str(MOONCAKE), "num_requests": None},
            "load": {"type": "trace", "speedup": 4.0},
            "engine": {
                "policy": "sglang",
                "aggregated": {
                    "prefix_caching": True, "block_size": block_size, "num_blocks": num_blocks, "replicas": replicas,
                },
            },
            "timing": {"type": "linear"},
        }
    )


@pytest.mark.parametrize("block_size, tokens, replicas", [(1, 80_000, 1), (1, 60_000, 2), (16, 80_000, 1)])
def test_tree_gives_the_block_models_results_on_the_mooncake_excerpt(monkeypatch, block_size, tokens, replicas):
    """A cache of a few prompts (the excerpt's prompts average ~14k tokens), sent
    at 4x the trace's pace: matches, splits, evictions of parts of nodes and
    retractions, request by request equal to the block model's."""
    decided = []

    def tree_shaped_noted(requests, router_policy):
        decided.append(tree_shaped(requests, router_policy))
        return decided[-1]

    monkeypatch.setattr(scheduler_api, "tree_shaped", tree_shaped_noted)
    tree = mooncake_run(block_size, tokens // block_size, replicas)
    assert decided == [True]  # Mooncake's hash_ids are prefix-chained
    monkeypatch.setattr(scheduler_api, "tree_shaped", lambda requests, router_policy: False)
    blocks = mooncake_run(block_size, tokens // block_size, replicas)
    requests = tree.requests
    assert tree.summary["prefix_cache_hit_rate"] > 0
    assert sum(requests.column("input_tokens").to_pylist()) > 10 * tokens * replicas  # it must evict
    assert sum(requests.column("num_preemptions").to_pylist()) > 0
    assert tree.requests.equals(blocks.requests)
    assert tree.summary == blocks.summary
