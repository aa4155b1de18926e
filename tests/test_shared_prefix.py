"""Recurring prompts (``workload.source=shared_prefix``, docs/semantics.md): the
cycle, lengths and block identities worked by hand, the prefix-cache hit law with
an unbounded cache, the reference implementation, bad keys and the CLI preset."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

import simcore
from simcore.config import ConfigError, load_config
from simcore.scheduler.prefix import prompt_block_identities
from simcore.workload.api import send_instants_ns
from simcore.workload.shared_prefix import shared_prefix_requests
from tests.scenarios import random_scenario
from tests.test_against_reference import compare_with_reference, reference
from tests.test_cli import replaysim

TINY = {"num_groups": 2, "num_prompts_per_group": 2, "system_prompt_len": 20, "question_len": 10, "output_len": 3}


def workload(num_requests: int, seed: int | None = None, **shared_prefix) -> dict:
    return {"source": "shared_prefix", "num_requests": num_requests, "shared_prefix": {**shared_prefix, "seed": seed}}


def tiny_table(num_requests: int = 6, seed: int | None = 5, run_seed: int = 0):
    cfg = load_config({"seed": run_seed, "workload": workload(num_requests, seed, **TINY)})
    return cfg, shared_prefix_requests(cfg.workload.shared_prefix, num_requests, np.random.default_rng(run_seed))


def test_tiny_workload_lengths_cycle_and_hash_ids():
    # G = 2, P = 2: prompt k = 2g + p is group g's 20-token system prompt and its own
    # 10-token question, 30 tokens in, 3 out.  hash_ids blocks are 20 tokens (the system
    # prompt): ceil(30 / 20) = 2 entries, [g, 2 + k] (ids 0, 1 are the system prompts).
    cfg, table = tiny_table()
    assert cfg.workload.block_size == 20
    order = np.random.default_rng(5).permutation(4)  # the cycle: workload.shared_prefix.seed = 5
    prompts = [int(order[i % 4]) for i in range(6)]  # sends 4, 5 repeat sends 0, 1
    assert table.input_tokens.tolist() == [30] * 6 and table.output_tokens.tolist() == [3] * 6
    assert table.request_id.to_pylist() == [f"r{i}" for i in range(6)]
    assert table.send_ms is None
    assert table.hash_ids.to_pylist() == [[k // 2, 2 + k] for k in prompts]


def test_tiny_workload_block_identities():
    # Engine blocks of 4 tokens: 30 // 4 = 7 complete.  Blocks ending at 4 .. 20 lie in
    # the system prompt: identity (g, end); those ending at 24, 28 are in hash block 1,
    # the prompt's own: (2 + k, end - 20).  Blocks of 8: ends 8, 16 shared, 24 not.
    _, table = tiny_table()
    order = np.random.default_rng(5).permutation(4)
    prompts = [int(order[i % 4]) for i in range(6)]
    for block, expected_keys in (
        (4, lambda k: [("system", k // 2, e) for e in (4, 8, 12, 16, 20)] + [("question", k, 4), ("question", k, 8)]),
        (8, lambda k: [("system", k // 2, 8), ("system", k // 2, 16), ("question", k, 4)]),
    ):
        offset, ident = prompt_block_identities(table, block, 20, 0)
        keys = {}
        for i, k in enumerate(prompts):
            got = ident[offset[i]:offset[i + 1]].tolist()
            expected = expected_keys(k)
            assert len(got) == len(expected) == 30 // block
            for identity, key in zip(got, expected):
                keys.setdefault(identity, key)
                assert keys[identity] == key  # one key per identity
        assert len(set(keys.values())) == len(keys)  # and one identity per key


def test_without_a_seed_the_cycle_is_drawn_from_the_run_generator_before_the_gaps():
    cfg = load_config({"seed": 9, "workload": workload(6, None, **TINY), "load": {"type": "poisson", "request_rate": 5.0}})
    rng = np.random.default_rng(9)
    table = shared_prefix_requests(cfg.workload.shared_prefix, 6, rng)
    sends = send_instants_ns(cfg.load, table, rng)
    expected = np.random.default_rng(9)
    order = expected.permutation(4)
    gaps = expected.exponential(1000 / 5.0, size=5)
    assert [ids[1] - 2 for ids in table.hash_ids.to_pylist()] == [int(order[i % 4]) for i in range(6)]
    assert sends.tolist() == [round(ms * 1e6) for ms in np.concatenate(([0.0], np.cumsum(gaps)))]
    result = simcore.run({"seed": 9, "workload": workload(6, None, **TINY), "load": {"type": "poisson", "request_rate": 5.0}})
    assert result.requests.column("send_ms").to_pylist() == (sends / 1e6).tolist()


def test_a_seed_of_its_own_keeps_the_prompts_while_the_run_seed_moves_the_sends():
    _, a = tiny_table(seed=5, run_seed=0)
    _, b = tiny_table(seed=5, run_seed=1)
    assert a.hash_ids.equals(b.hash_ids)


def expected_cached_tokens(sp: dict, num_requests: int, order: np.ndarray, block: int) -> list[int]:
    """Hits with every block still resident: a prompt sent before hits all its complete
    blocks, a first send whose group was sent before hits the system prompt's whole
    blocks; never the block holding the last prompt token (vLLM computes it)."""
    prompt_tokens = sp["system_prompt_len"] + sp["question_len"]
    at_most = (prompt_tokens - 1) // block
    sent, groups, out = set(), set(), []
    for i in range(num_requests):
        k = int(order[i % len(order)])
        g = k // sp["num_prompts_per_group"]
        if k in sent:
            blocks = prompt_tokens // block
        elif g in groups:
            blocks = sp["system_prompt_len"] // block
        else:
            blocks = 0
        out.append(min(blocks, at_most) * block)
        sent.add(k)
        groups.add(g)
    return out


LAW_CASES = [
    # (shared_prefix, engine block size, load)
    (dict(num_groups=3, num_prompts_per_group=4, system_prompt_len=37, question_len=11, output_len=4), 16,
     {"concurrency": 4}),
    (dict(num_groups=2, num_prompts_per_group=3, system_prompt_len=32, question_len=16, output_len=2), 16,
     {"concurrency": 64}),  # 48 tokens = 3 whole blocks: a repeat hits 2
    (dict(num_groups=4, num_prompts_per_group=2, system_prompt_len=0, question_len=40, output_len=3), 8,
     {"concurrency": 2}),  # no system prompt: only repeats hit
    (dict(num_groups=2, num_prompts_per_group=5, system_prompt_len=50, question_len=30, output_len=5), 5,
     {"type": "poisson", "request_rate": 400.0}),
]


@pytest.mark.parametrize("sp, block, load", LAW_CASES)
def test_hits_with_an_unbounded_cache_are_every_resident_whole_block(sp, block, load):
    n = 3 * sp["num_groups"] * sp["num_prompts_per_group"] + 1
    result = simcore.run(
        {
            "seed": 3,
            "workload": workload(n, 11, **sp),
            "load": load,
            "engine": {"aggregated": {"prefix_caching": True, "block_size": block, "num_blocks": 20_000}},
        }
    )
    assert result.summary["completed"] == n
    order = np.random.default_rng(11).permutation(sp["num_groups"] * sp["num_prompts_per_group"])
    expected = expected_cached_tokens(sp, n, order, block)
    assert result.requests.column("cached_tokens").to_pylist() == expected
    prompt_tokens = sp["system_prompt_len"] + sp["question_len"]
    assert result.summary["prefix_cache_hit_rate"] == sum(expected) / (n * prompt_tokens)


NUM_REFERENCE_SCENARIOS = 60


def reference_scenario(seed: int) -> dict:
    """A random small engine (tests/scenarios.py, tight KV: evictions, preemption) fed
    recurring prompts through the hash_ids path of a Mooncake trace."""
    rnd = random.Random(seed)
    scenario = random_scenario(seed, prefix_caching=True, disaggregated=seed % 3 == 2)
    n = len(scenario["ids"])
    sp = dict(num_groups=rnd.randint(1, 3), num_prompts_per_group=rnd.randint(1, 3),
              system_prompt_len=rnd.choice([0, 4, 6, 12]), question_len=rnd.randint(1, 8), output_len=rnd.randint(1, 6))
    cfg = load_config({"workload": workload(n, seed, **sp)})
    table = shared_prefix_requests(cfg.workload.shared_prefix, n, np.random.default_rng(0))
    scenario["config"]["workload"] = {"source": "mooncake", "path": "scenario.jsonl", "num_requests": n,
                                      "block_size": cfg.workload.block_size}
    scenario.update(inputs=table.input_tokens.tolist(), outputs=table.output_tokens.tolist(),
                    hash_ids=table.hash_ids.to_pylist())
    return scenario


@pytest.mark.parametrize("seed", range(NUM_REFERENCE_SCENARIOS))
def test_shared_prefix_tables_match_the_reference(seed):
    compare_with_reference(reference_scenario(seed))


def test_reference_scenarios_hit_the_cache():
    """Guards the generator: a good share of the scenarios reuse recurring blocks."""
    with_hits = 0
    for seed in range(NUM_REFERENCE_SCENARIOS):
        _, slow = reference(reference_scenario(seed))
        with_hits += any(r["cached_tokens"] for r in slow["requests"])
    assert with_hits >= NUM_REFERENCE_SCENARIOS // 3, with_hits


def test_the_same_config_gives_identical_tables():
    config = {"workload": workload(50, None, **TINY), "load": {"type": "gamma", "request_rate": 30.0, "burstiness": 0.5},
              "engine": {"aggregated": {"prefix_caching": True}}}
    assert simcore.run(config).requests.equals(simcore.run(config).requests)


@pytest.mark.parametrize(
    "config, message",
    [
        (workload(8, num_groups=0), "^workload.shared_prefix.num_groups must be an integer >= 1, got 0$"),
        (workload(8, num_prompts_per_group=2.5), "^workload.shared_prefix.num_prompts_per_group must be an integer"),
        (workload(8, system_prompt_len=-1), "^workload.shared_prefix.system_prompt_len must be an integer >= 0"),
        (workload(8, question_len=0), "^workload.shared_prefix.question_len must be an integer >= 1"),
        (workload(8, output_len="50"), "^workload.shared_prefix.output_len must be an integer >= 1"),
        (workload(8, seed=-3), "^workload.shared_prefix.seed must be an integer >= 0"),
        (workload(8, system_prompt_len=2**62, question_len=2**62),
         "^workload.shared_prefix.question_len: system_prompt_len \\+ question_len = 9223372036854775808 tokens"),
        (workload(None), "^workload.num_requests must be set for workload.source=shared_prefix$"),
        ({"shared_prefix": {"num_groups": 3}},
         "^workload.shared_prefix.num_groups is only used by workload.source=shared_prefix, got 3 with "
         "workload.source=synthetic$"),
        ({**workload(8), "input_tokens": 64}, "^workload.input_tokens has no effect here"),
        ({**workload(8), "block_size": 64}, "^workload.block_size is only used by workload.source=mooncake"),
        ({**workload(8), "prefix_tokens": 16}, "^workload.prefix_tokens is only used by workload.source=synthetic"),
        ({**workload(8), "shared_prefix": {"num_group": 3}}, "^workload.shared_prefix.num_group is not a known key"),
        (workload(8, num_groups=10**9, num_prompts_per_group=10**9),
         "^workload.shared_prefix.num_groups=1000000000 x num_prompts_per_group=1000000000 \\(the prompt cycle\\)"),
    ],
)
def test_bad_keys_are_one_line_errors_naming_the_field(config, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_config({"workload": config})
    assert "\n" not in str(err.value)


def test_a_trace_load_needs_send_times():
    with pytest.raises(ConfigError, match="^load.type=trace needs send times"):
        simcore.run({"workload": workload(8), "load": {"type": "trace"}})


def test_the_preset_runs_through_the_cli(tmp_path):
    # The preset: 10 groups x 10 prompts of 128 + 64 tokens; blocks of 16 divide both.
    done = replaysim(tmp_path, "workload=shared_prefix", "workload.num_requests=250", "workload.shared_prefix.seed=4",
                     "engine.aggregated.prefix_caching=true", "load.concurrency=8")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    sp = dict(num_groups=10, num_prompts_per_group=10, system_prompt_len=128, question_len=64)
    expected = expected_cached_tokens(sp, 250, np.random.default_rng(4).permutation(100), 16)
    assert summary["completed"] == 250
    assert summary["prefix_cache_hit_rate"] == sum(expected) / (250 * 192)
