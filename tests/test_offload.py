"""The CPU offload tier (docs/prefix-caching.md, "CPU offload tier"): the engine
against the reference on random scenarios, laws of the hit rates on the
Mooncake excerpt, hand-worked loads and the validation of its keys."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

import simcore
from simcore.config import ConfigError
from tests.reference.metrics import summarize as reference_summarize
from tests.scenarios import fast_as_reference, random_scenario, run_fast
from tests.test_against_reference import REQUEST_KEYS, assert_summaries_equal, reference
from tests.test_prefix_caching import LINEAR, MOONCAKE, offline_bound

NUM_OFFLOAD_SCENARIOS = 300  # two thirds under eviction pressure; of the rest half disaggregated


def offload_scenario(seed: int) -> dict:
    """A prefix-caching scenario with a CPU tier on its receiving pool: a few to
    many CPU blocks, copies from well under a pass to many passes long."""
    if seed % 3 != 2:
        scenario = random_scenario(seed, prefix_pressure=True)
    else:
        scenario = random_scenario(seed, prefix_caching=True, disaggregated=seed % 6 == 5)
    rnd = random.Random(10_000 + seed)
    engine = scenario["config"]["engine"]
    pool = engine["prefill" if engine.get("mode") == "disaggregated" else "aggregated"]
    pool["kv_offload"] = {
        "num_blocks": rnd.choice([1, 3, rnd.randint(4, 40), 10_000]),
        "bandwidth_gb_per_second": rnd.choice([0.001, 0.05, 1.0, 25.0]),
        "bytes_per_token": rnd.choice([1000.0, 131072.0]),
    }
    return scenario


def compare_offload(scenario):
    config, slow = reference(scenario)
    run, cols, summary = run_fast(scenario)
    fast = fast_as_reference(run, cols)
    for k, (f, s) in enumerate(zip(fast["requests"], slow["requests"])):
        f = {key: f[key] for key in REQUEST_KEYS} | {
            "cpu_cached_tokens": int(run.offload.cpu_cached_tokens[k]) if f["first_admit_ns"] is not None else None,
            "kv_load_ns": int(run.offload.kv_load_ns[k]),
        }
        assert f == {key: s[key] for key in f}, f"request {k}"
    assert fast["tokens"] == slow["tokens"]
    assert fast["passes"] == slow["passes"]
    cap_ns = None if config["max_time_ms"] is None else round(config["max_time_ms"] * 1e6)
    slow_summary = reference_summarize(
        slow, scenario["inputs"], scenario["outputs"], config["metrics"]["percentiles"], config["metrics"]["goodput"], cap_ns
    )
    assert_summaries_equal(summary, slow_summary)
    return slow


@pytest.mark.parametrize("seed", range(NUM_OFFLOAD_SCENARIOS))
def test_offload_matches_reference(seed):
    compare_offload(offload_scenario(seed))


def test_offload_scenarios_cover_the_features():
    """Guards the generator: CPU hits, loads of many passes, requests admitted while
    an earlier one on their rank loads, P/D prefill tiers, a CPU tier of 1-3 blocks."""
    seen = dict(cpu_hits=0, long_loads=0, disaggregated=0, tight_cpu=0, passed_over=0)
    for seed in range(NUM_OFFLOAD_SCENARIOS):
        s = offload_scenario(seed)
        _, slow = reference(s)
        reqs = slow["requests"]
        hit = any((r["cpu_cached_tokens"] or 0) > 0 for r in reqs)
        seen["cpu_hits"] += hit
        seen["long_loads"] += any(r["kv_load_ns"] > 1_000_000 for r in reqs)
        loaded = [r for r in reqs if (r["cpu_cached_tokens"] or 0) > 0]
        seen["passed_over"] += any(
            r["rank"] == o["rank"] and r["worker"] == o["worker"] and o["arrival_ns"] < r["arrival_ns"]
            and r["first_admit_ns"] < o["first_admit_ns"] for o in loaded for r in reqs if r["first_admit_ns"] is not None
        )
        seen["disaggregated"] += hit and s["config"]["engine"].get("mode") == "disaggregated"
        pool = s["config"]["engine"].get("aggregated") or {}
        seen["tight_cpu"] += hit and (pool.get("kv_offload") or {}).get("num_blocks", 0) <= 3
    assert seen["cpu_hits"] >= NUM_OFFLOAD_SCENARIOS // 3, seen
    assert all(count >= 5 for count in seen.values()), seen


# ------------------------------------------------------------------ laws on the Mooncake excerpt


def mooncake(num_blocks: int, cpu_blocks: int | None, concurrency: int = 1) -> simcore.Result:
    offload = {"num_blocks": cpu_blocks, "bandwidth_gb_per_second": 25.0, "bytes_per_token": 131072.0}
    return simcore.run(
        {
            "workload": {"source": "mooncake", "path": str(MOONCAKE), "num_requests": None},
            "load": {"type": "closed_loop", "concurrency": concurrency},
            "engine": {"aggregated": {
                "prefix_caching": True, "num_blocks": num_blocks, "max_batched_tokens": 16384,
                "kv_offload": offload if cpu_blocks is not None else dict.fromkeys(offload),
            }},
            "timing": LINEAR,
        }
    )


def test_an_unlimited_gpu_tier_never_loads_from_the_cpu():
    """Nothing is ever evicted from GPU memory: no CPU hit, no load, the same run as without the tier
    (stores still copy every computed prompt block: write-through)."""
    without = mooncake(4_000_000 // 16, None)
    tiered = mooncake(4_000_000 // 16, 10_000)
    assert tiered.summary["cpu_prefix_cache_hit_rate"] == 0.0
    assert tiered.summary["kv_offload_loaded_gb"] == 0.0
    assert tiered.summary["kv_offload_stored_gb"] > 0
    assert tiered.requests.column("kv_load_ms").null_count == tiered.requests.num_rows
    for column in ("cached_tokens", "first_admit_ms", "first_token_ms", "last_token_ms"):
        assert tiered.requests.column(column).equals(without.requests.column(column)), column
    assert tiered.summary["gpu_prefix_cache_hit_rate"] == without.summary["prefix_cache_hit_rate"]


def test_the_cpu_tier_adds_hits_and_approaches_the_offline_bound():
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines() if line.strip()]
    bound = offline_bound(rows)
    gpu_blocks = 20_000  # evicts: GPU-only is well under the bound
    gpu_only = mooncake(gpu_blocks, None).summary["prefix_cache_hit_rate"]
    assert gpu_only < bound - 0.02
    rates = [mooncake(gpu_blocks, cpu).summary for cpu in (20_000, 80_000, 400_000)]
    totals = [r["prefix_cache_hit_rate"] for r in rates]
    for r in rates:  # the tiers add up to the total
        assert r["gpu_prefix_cache_hit_rate"] + r["cpu_prefix_cache_hit_rate"] == pytest.approx(r["prefix_cache_hit_rate"], abs=1e-12)
    assert all(total >= gpu_only for total in totals)
    assert totals[0] <= totals[1] <= totals[2]
    # One request at a time and a CPU tier holding every block: every earlier prefix is found.
    assert abs(totals[2] - bound) <= 0.01


# ------------------------------------------------------------------ hand-worked


def test_a_prefix_evicted_from_the_gpu_is_loaded_back_from_the_cpu(tmp_path):
    """block 4 (the trace's too), 6 GPU blocks, 100 CPU blocks, fixed 1 ms passes,
    concurrency 1, one output token each, no tokenizer or detokenizer time.

    r0 = hashes [1, 2] (8 tokens: blocks A, B) runs 0-1 ms; its store after the
    batch copies A, B to the CPU.  It finishes: B then A join the GPU LRU (head B).
    r1 = [7 .. 11] (20 tokens, 5 blocks C..G) at 1 ms: 4 truly free blocks, so
    the LRU head B is evicted; it runs 1-2 ms and stores its 5 blocks.
    r2 = [1, 2, 3] (12 tokens: A, B, H) at 2 ms: GPU hit A (h = 1, at most
    (12 - 1) // 4 = 2); the CPU tier continues with B (H is nowhere): one
    block loads, 4 tokens x 1000 B / 1 GB/s = 4 us, so it is ready at 2.004 ms
    with 8 tokens computed (4 from the GPU, 4 from the CPU) and admitted then,
    the worker idle meanwhile; its store copies H.  Stores: 2 + 5 + 1 = 8
    blocks, loads 1 block, 4 x 1000 B each.
    """
    trace = tmp_path / "trace.jsonl"
    rows = [([1, 2], 8), ([7, 8, 9, 10, 11], 20), ([1, 2, 3], 12)]
    trace.write_text("".join(
        json.dumps({"timestamp": 0, "input_length": n, "output_length": 1, "hash_ids": h}) + "\n" for h, n in rows
    ))
    result = simcore.run(
        {
            "workload": {"source": "mooncake", "path": str(trace), "num_requests": None, "block_size": 4},
            "load": {"type": "closed_loop", "concurrency": 1},
            "engine": {"aggregated": {
                "prefix_caching": True, "num_blocks": 6, "block_size": 4,
                "kv_offload": {"num_blocks": 100, "bandwidth_gb_per_second": 1.0, "bytes_per_token": 1000.0},
            }},
            "timing": {"type": "fixed", "prefill_ms": 1.0, "decode_ms": 1.0},
            "tokenization": {"workers": 1, "base_ms": 0.0, "per_input_us": 0.0},
            "detokenization": {"workers": 1, "base_ms": 0.0, "per_output_us": 0.0, "first_output_us": 0.0,
                               "final_output_us": 0.0},
        }
    )
    req = result.requests.to_pydict()
    assert req["gpu_cached_tokens"] == [0, 0, 4]
    assert req["cpu_cached_tokens"] == [0, 0, 4]
    assert req["cached_tokens"] == [0, 0, 8]
    assert req["kv_load_ms"] == [None, None, 0.004]
    assert req["first_admit_ms"] == [0.0, 1.0, 2.004]
    assert result.summary["kv_offload_stored_gb"] == 8 * 4 * 1000 / 1e9
    assert result.summary["kv_offload_loaded_gb"] == 1 * 4 * 1000 / 1e9
    assert result.summary["cpu_prefix_cache_hit_rate"] == 4 / 40


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("pool", "expected"),
    [
        ({"prefix_caching": True, "kv_offload": {"num_blocks": 10}}, "engine.aggregated.kv_offload.bandwidth_gb_per_second"),
        ({"kv_offload": {"num_blocks": 10, "bandwidth_gb_per_second": 1.0, "bytes_per_token": 1.0}},
         "engine.aggregated.kv_offload needs engine.aggregated.prefix_caching=true"),
        ({"prefix_caching": True, "kv_offload": {"num_blocks": 0, "bandwidth_gb_per_second": 1.0, "bytes_per_token": 1.0}},
         "engine.aggregated.kv_offload.num_blocks"),
        ({"prefix_caching": True, "kv_offload": {"num_blocks": 4, "bandwidth_gb_per_second": 0.0, "bytes_per_token": 1.0}},
         "engine.aggregated.kv_offload.bandwidth_gb_per_second"),
        ({"prefix_caching": True, "async_scheduling": True,
          "kv_offload": {"num_blocks": 4, "bandwidth_gb_per_second": 1.0, "bytes_per_token": 1.0}},
         "engine.aggregated.kv_offload is not modelled with engine.aggregated.async_scheduling"),
        ({"prefix_caching": True, "reserve_full_isl": True,
          "kv_offload": {"num_blocks": 4, "bandwidth_gb_per_second": 1.0, "bytes_per_token": 1.0}},
         "engine.aggregated.kv_offload is not modelled with engine.aggregated.reserve_full_isl"),
    ],
)
def test_bad_offload_keys_name_the_key(pool, expected):
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.")):
        simcore.load_config({"engine": {"aggregated": pool}})


def test_null_offload_leaves_the_run_unchanged():
    """All three keys null (the default) is today's run, bit for bit."""
    config = {"workload": {"num_requests": 40, "input_tokens": 300, "output_tokens": 4, "prefix_tokens": 128},
              "engine": {"aggregated": {"prefix_caching": True, "num_blocks": 60}}}
    plain = simcore.run(config)
    nulls = simcore.run(config | {"engine": {"aggregated": {**config["engine"]["aggregated"], "kv_offload": {
        "num_blocks": None, "bandwidth_gb_per_second": None, "bytes_per_token": None}}}})
    assert plain.requests.equals(nulls.requests)
    assert plain.summary["cpu_prefix_cache_hit_rate"] is None
    assert np.array_equal(plain.requests.column("gpu_cached_tokens").to_numpy(),
                          plain.requests.column("cached_tokens").to_numpy())


def test_the_cli_exits_2_naming_the_offload_key(tmp_path):
    from tests.test_cli import SMALL, replaysim, result_files

    done = replaysim(tmp_path, *SMALL, "engine.aggregated.prefix_caching=true",
                     "engine.aggregated.kv_offload.num_blocks=64")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "engine.aggregated.kv_offload.bandwidth_gb_per_second" in lines[0], done.stderr
    assert result_files(tmp_path) == []


def test_the_cli_runs_a_cpu_tier(tmp_path):
    from tests.test_cli import SMALL, replaysim

    done = replaysim(tmp_path, *SMALL, "engine.aggregated.prefix_caching=true", "workload.prefix_tokens=32",
                     "engine.aggregated.kv_offload.num_blocks=64", "engine.aggregated.kv_offload.bandwidth_gb_per_second=25",
                     "engine.aggregated.kv_offload.bytes_per_token=131072")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["cpu_prefix_cache_hit_rate"] == 0.0 and summary["kv_offload_stored_gb"] > 0


@pytest.mark.parametrize("policy", ["sglang", "trtllm"])
def test_offload_on_another_policy_is_refused(policy):
    # Their prefix caches exist, but the CPU tier is vLLM's connector only.
    pool = {"prefix_caching": True, "kv_offload": {"num_blocks": 4, "bandwidth_gb_per_second": 1.0, "bytes_per_token": 1.0}}
    with pytest.raises(ConfigError, match=rf"engine\.aggregated\.kv_offload is modelled for engine\.policy=vllm only.*{policy}"):
        simcore.load_config({"engine": {"policy": policy, "aggregated": pool}})


def test_a_batch_of_cpu_tiers_equals_its_single_runs():
    """One shape, three copy bandwidths: simcore.run_batch runs them in one kernel call."""
    configs = [
        {"workload": {"source": "mooncake", "path": str(MOONCAKE), "num_requests": None},
         "load": {"type": "closed_loop", "concurrency": 4}, "timing": LINEAR,
         "engine": {"aggregated": {"prefix_caching": True, "num_blocks": 20_000, "max_batched_tokens": 16384,
                                   "kv_offload": {"num_blocks": 400_000, "bandwidth_gb_per_second": bandwidth,
                                                  "bytes_per_token": 131072.0}}}}
        for bandwidth in (1.0, 25.0, 400.0)
    ]
    batched = simcore.run_batch(configs)
    for config, result in zip(configs, batched):
        single = simcore.run(config)
        assert result.requests.equals(single.requests)
        assert result.summary == single.summary
    assert batched[0].summary["cpu_prefix_cache_hit_rate"] > 0


@pytest.mark.parametrize("bandwidth, bytes_per_token", [(1e-300, 1.0), (1.0, 1e300)])
def test_a_copy_too_long_names_both_keys(bandwidth, bytes_per_token):
    pool = {"prefix_caching": True,
            "kv_offload": {"num_blocks": 4, "bandwidth_gb_per_second": bandwidth, "bytes_per_token": bytes_per_token}}
    with pytest.raises(ConfigError, match=r"engine\.aggregated\.kv_offload\.bytes_per_token=.* at bandwidth_gb_per_second="
                                          r".*one block's copy exceeds"):
        simcore.load_config({"engine": {"aggregated": pool}})
