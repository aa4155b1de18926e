"""vLLM's caching of generated blocks (engine.<pool>.cache_generated_blocks,
docs/prefix-caching.md): the kernel against the reference (which registers each
generated block as it fills) on random scenarios under KV pressure, with
asynchronous scheduling and with sessions; a hand-worked preemption; the
refused combinations."""

from __future__ import annotations

import pyarrow as pa
import pytest

import simcore
from simcore.config import ConfigError, load_config
from tests.test_against_reference import compare_with_reference, reference
from tests.scenarios import random_scenario
from tests.test_sessions import compare_sessions_with_reference, random_session_scenario

NUM_PRESSURE_SCENARIOS = 150  # one rank, heavy eviction and preemption
NUM_MIXED_SCENARIOS = 150  # long outputs on tight caches, async scheduling, P/D
NUM_SESSION_SCENARIOS = 100  # a turn hits the previous turn's answer


def caching_generated_blocks(scenario: dict) -> dict:
    """The scenario with generated-block caching on the pool that caches prefixes."""
    engine = scenario["config"]["engine"]
    for name in ("aggregated", "prefill"):
        if engine.get(name, {}).get("prefix_caching"):
            engine[name]["cache_generated_blocks"] = True
    return scenario


@pytest.mark.parametrize("seed", range(NUM_PRESSURE_SCENARIOS))
def test_under_eviction_pressure_matches_reference(seed):
    compare_with_reference(caching_generated_blocks(random_scenario(seed, prefix_pressure=True)))


@pytest.mark.parametrize("seed", range(NUM_MIXED_SCENARIOS))
def test_long_outputs_async_and_pd_match_reference(seed):
    compare_with_reference(caching_generated_blocks(random_scenario(
        seed, prefix_caching=True, long_outputs=seed % 2 == 0, async_scheduling=seed % 3 == 0,
        disaggregated=seed % 5 == 4,
    )))


@pytest.mark.parametrize("seed", range(NUM_SESSION_SCENARIOS))
def test_sessions_match_reference(seed):
    compare_sessions_with_reference(caching_generated_blocks(
        random_session_scenario(seed, prefix_caching=True, disaggregated=seed % 5 == 4)
    ))


def test_random_scenarios_hit_generated_blocks():
    """Guards the generators: the key changes the passes of many pressure scenarios and of
    asynchronous ones, and many turns of the session scenarios hit past their
    predecessor's complete prompt blocks (into the predecessor's answer)."""
    def changes_passes(scenario: dict) -> bool:
        _, on = reference(scenario)
        scenario["config"]["engine"]["aggregated"]["cache_generated_blocks"] = False
        _, off = reference(scenario)
        return on["passes"] != off["passes"]

    changed = sum(changes_passes(caching_generated_blocks(random_scenario(seed, prefix_pressure=True)))
                  for seed in range(40))
    changed_async = sum(
        changes_passes(caching_generated_blocks(random_scenario(
            seed, prefix_caching=True, long_outputs=seed % 2 == 0, async_scheduling=True)))
        for seed in range(0, NUM_MIXED_SCENARIOS, 3) if seed % 5 != 4  # the aggregated async ones
    )
    into_answers = 0
    for seed in range(NUM_SESSION_SCENARIOS):
        scenario = caching_generated_blocks(random_session_scenario(seed, prefix_caching=True))
        pool = scenario["config"]["engine"].get("aggregated", {})
        if not pool.get("cache_generated_blocks"):
            continue
        slow = compare_sessions_with_reference(scenario)[2]
        previous = {}
        for k, session in enumerate(scenario["session"]):
            last = previous.get(session)
            cached = slow["requests"][k]["cached_tokens"] or 0
            into_answers += last is not None and cached > scenario["inputs"][last] // pool["block_size"] * pool["block_size"]
            previous[session] = k
    assert changed >= 10 and changed_async >= 5 and into_answers >= 10, (changed, changed_async, into_answers)


def run_preempted_pair(cache_generated_blocks: bool) -> dict:
    """b (prompt 4, 13 outputs) and a (prompt 4, 12 outputs), both sent at 0, b first; one
    rank of 7 blocks of 4 tokens, prefix caching; fixed timing: 2 ms a pass with prompt
    tokens, 1 ms a decode-only pass."""
    requests = pa.table(
        {"request_id": ["b", "a"], "input_tokens": [4, 4], "output_tokens": [13, 12], "send_ms": [0.0, 0.0]}
    )
    pool = {"num_blocks": 7, "block_size": 4, "max_batched_tokens": 64, "max_sequences": 2,
            "prefix_caching": True, "cache_generated_blocks": cache_generated_blocks}
    cfg = {
        "load": {"type": "trace"},
        "workload": {"num_requests": 2},
        "engine": {"aggregated": pool},
        "timing": {"type": "fixed", "prefill_ms": 2.0, "decode_ms": 1.0},
    }
    return simcore.run(cfg, requests=requests).requests.to_pydict()


def test_readmitted_request_hits_its_generated_blocks():
    # [0, 2]: both prompts (a block each), first tokens at 2.  Decode i runs [1 + i, 2 + i]
    # and computes position 3 + i of each; decodes 1 and 5 take a block each (4, then 6
    # in use).  Decode 9 at 10 ms: b takes the 7th block for position 12; a needs one
    # too, none is free and a is the last running request: a is preempted with 12
    # tokens computed (block 0 its prompt, blocks 1 and 2 its first 8 outputs) and 9
    # outputs emitted (known 13).  b decodes alone to its 13th token at 14 ms; a cannot
    # return meanwhile (its blocks cached or not, 4 needed, 3 free).  At 14 ms b's
    # blocks are freed and a is admitted:
    # - without the key only block 0 is cached: hits 1, a recomputes positions 4-12
    #   (9 prompt tokens: 2 ms), its 10th token at 16, the last two at 17 and 18;
    # - with it blocks 0-2 are: hits min(3, (13 - 1) // 4) = 3 (the cap leaves the last
    #   known token), a computes position 12 alone (a decode: 1 ms), tokens at 15, 16, 17.
    off = run_preempted_pair(False)
    on = run_preempted_pair(True)
    for run in (off, on):
        assert run["num_preemptions"] == [0, 1]
        assert run["cached_tokens"] == [0, 0]  # first admission only
        assert run["e2el_ms"][0] == 14.0
    assert off["e2el_ms"][1] == 18.0
    assert on["e2el_ms"][1] == 17.0


@pytest.mark.parametrize(
    "engine, key",
    [
        ({"policy": "sglang", "aggregated": {"prefix_caching": True, "cache_generated_blocks": True}},
         "engine.aggregated.cache_generated_blocks"),
        ({"policy": "trtllm", "aggregated": {"prefix_caching": True, "cache_generated_blocks": True}},
         "engine.aggregated.cache_generated_blocks"),
        ({"aggregated": {"cache_generated_blocks": True}}, "engine.aggregated.cache_generated_blocks"),
        ({"aggregated": {"prefix_caching": True, "cache_generated_blocks": "yes"}},
         "engine.aggregated.cache_generated_blocks"),
        ({"aggregated": {"prefix_caching": True, "cache_generated_blocks": True,
                         "kv_offload": {"num_blocks": 64, "bandwidth_gb_per_second": 10.0, "bytes_per_token": 1024.0}}},
         "engine.aggregated.cache_generated_blocks"),
        ({"mode": "disaggregated", "decode": {"cache_generated_blocks": True}}, "engine.decode.cache_generated_blocks"),
    ],
)
def test_bad_cache_generated_blocks_names_the_key(engine, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config({"engine": engine})
