"""The numba engine against the slow pure-Python reference (tests/reference),
request by request and token by token, to the nanosecond, on random small
scenarios; and the two detokenization paths against each other."""

from __future__ import annotations

import copy
import json
import math

import pytest

from simcore.config import load_config, merge_config
from tests.reference.metrics import summarize as reference_summarize
from tests.reference.sim import ReferenceSim
from tests.reference.sim import simulate as reference_simulate
from tests.scenarios import fast_as_reference, longest_steady_stretch, random_scenario, run_fast

NUM_SCENARIOS = 400
NUM_PD_SCENARIOS = 300
NUM_POLICY_SCENARIOS = 300  # per policy; a third of them disaggregated
NUM_LONG_SCENARIOS = 100
NUM_PREFIX_SCENARIOS = 300  # a third of them disaggregated
NUM_ALLREDUCE_SCENARIOS = 200  # a third of them disaggregated
NUM_ASYNC_SCENARIOS = 400  # a third of them disaggregated; a quarter with prefix caching
NUM_STEADY_SCENARIOS = 60  # per policy (vllm, trtllm)
NUM_CURVE_SCENARIOS = 100  # a third of them disaggregated
NUM_GRAPH_SCENARIOS = 300  # mixed with the other features
NUM_PREFIX_PRESSURE_SCENARIOS = 150
CACHING_POLICIES = ["sglang", "trtllm"]  # prefix caching beside vllm's (docs/prefix-caching.md)
NUM_FULL_ISL_SCENARIOS = 300  # mixed with prefix caching, async scheduling and P/D
NUM_CHUNK_OFF_SCENARIOS = 300  # mixed with prefix caching, async scheduling, whole-sequence admission and P/D
NUM_SKEW_SCENARIOS = 300  # mixed with the policies, P/D, async scheduling, CUDA graphs, pass terms
NUM_EP_SCENARIOS = 300  # mixed with P/D, async scheduling, prefix caching, CUDA graphs, the all-to-all
NUM_SPEC_SCENARIOS = 120  # per policy; a third disaggregated, a third with prefix caching
NUM_QUEUE_ORDER_SCENARIOS = 200  # per policy; a third disaggregated, a quarter with prefix caching
NUM_LPM_SCENARIOS = 200
NUM_DFS_WEIGHT_SCENARIOS = 200
REQUEST_KEYS = [
    "status", "worker", "rank", "generated_tokens", "num_preemptions", "send_ns", "arrival_ns",
    "first_admit_ns", "first_emit_ns", "first_recv_ns", "last_recv_ns", "prefill_worker",
    "prefill_rank", "decode_worker", "decode_rank", "prompt_done_ns", "transfer_start_ns",
    "transfer_end_ns", "cached_tokens",
]


def reference(scenario):
    config = merge_config(scenario["config"])
    return config, reference_simulate(
        config, scenario["ids"], scenario["inputs"], scenario["outputs"], scenario["send_ns"], scenario.get("hash_ids"),
        acceptance_length=scenario.get("acceptance_length"), priority=scenario.get("priority"),
        predicted_output_tokens=scenario.get("predicted_output_tokens"), prompt_id=scenario.get("prompt_id"),
    )


def assert_summaries_equal(fast: dict, slow: dict):
    assert fast.keys() == slow.keys()
    for key, value in slow.items():
        if value is None or fast[key] is None:
            assert fast[key] is value, key
        elif key.startswith(("mean_", "std_", "median_")) or key.endswith("throughput") or key == "request_goodput":
            # sums: numpy's pairwise summation vs math.fsum differ in the last bits;
            # numpy.median averages the middle pair, the reference interpolates at 50%
            assert math.isclose(fast[key], value, rel_tol=1e-12, abs_tol=1e-12), key
        else:
            assert fast[key] == value, key


@pytest.mark.parametrize("seed", range(NUM_SCENARIOS))
def test_engine_matches_reference(seed):
    compare_with_reference(random_scenario(seed))


@pytest.mark.parametrize("seed", range(NUM_PD_SCENARIOS))
def test_disaggregated_engine_matches_reference(seed):
    compare_with_reference(random_scenario(seed, disaggregated=True))


@pytest.mark.parametrize("policy", ["sglang", "trtllm"])
@pytest.mark.parametrize("seed", range(NUM_POLICY_SCENARIOS))
def test_policy_engine_matches_reference(policy, seed):
    compare_with_reference(random_scenario(seed, policy=policy, disaggregated=seed % 3 == 2))


@pytest.mark.parametrize("seed", range(NUM_LONG_SCENARIOS))
def test_long_output_sglang_matches_reference(seed):
    """Many decode steps on a tight cache: the ratio decays and decodes retract."""
    compare_with_reference(random_scenario(seed, policy="sglang", long_outputs=True, disaggregated=seed % 4 == 3))


@pytest.mark.parametrize("seed", range(NUM_PREFIX_SCENARIOS))
def test_prefix_caching_matches_reference(seed):
    compare_with_reference(random_scenario(seed, prefix_caching=True, disaggregated=seed % 3 == 2))


@pytest.mark.parametrize("seed", range(NUM_PREFIX_PRESSURE_SCENARIOS))
def test_prefix_caching_under_eviction_pressure_matches_reference(seed):
    """Long shared prefixes on a small cache: evictions, a blocked queue head re-asked every pass."""
    compare_with_reference(random_scenario(seed, prefix_pressure=True))


@pytest.mark.parametrize("policy", CACHING_POLICIES)
@pytest.mark.parametrize("seed", range(NUM_PREFIX_SCENARIOS))
def test_policy_prefix_caching_matches_reference(policy, seed):
    compare_with_reference(random_scenario(seed, policy=policy, prefix_caching=True, disaggregated=seed % 3 == 2))


@pytest.mark.parametrize("policy", CACHING_POLICIES)
@pytest.mark.parametrize("seed", range(NUM_PREFIX_PRESSURE_SCENARIOS))
def test_policy_prefix_caching_under_eviction_pressure_matches_reference(policy, seed):
    compare_with_reference(random_scenario(seed, policy=policy, prefix_pressure=True))


@pytest.mark.parametrize("seed", range(NUM_LONG_SCENARIOS))
def test_long_output_sglang_radix_cache_matches_reference(seed):
    """Retractions on a tight cache: unlocked tree blocks keep their older access stamps."""
    compare_with_reference(
        random_scenario(seed, policy="sglang", long_outputs=True, prefix_caching=True, disaggregated=seed % 4 == 3)
    )


@pytest.mark.parametrize("seed", range(NUM_ALLREDUCE_SCENARIOS))
def test_allreduce_timing_matches_reference(seed):
    compare_with_reference(random_scenario(seed, allreduce=True, disaggregated=seed % 3 == 2))


@pytest.mark.parametrize("seed", range(NUM_CURVE_SCENARIOS))
def test_allreduce_curve_timing_matches_reference(seed, tmp_path):
    compare_with_reference(random_scenario(seed, allreduce=True, disaggregated=seed % 3 == 2, curve_dir=str(tmp_path)))


@pytest.mark.parametrize("seed", range(NUM_GRAPH_SCENARIOS))
def test_cuda_graph_padding_matches_reference(seed, tmp_path):
    policy = ("vllm", "vllm", "sglang", "trtllm")[seed % 4]
    steady = seed % 5 == 4 and policy != "sglang"
    compare_with_reference(
        random_scenario(
            seed, policy=policy, cuda_graphs=True, steady=steady, disaggregated=seed % 3 == 2 and not steady,
            async_scheduling=policy == "vllm" and seed % 2 == 1, allreduce=seed % 6 == 0,
            curve_dir=str(tmp_path) if seed % 12 == 0 else None,
        )
    )


@pytest.mark.parametrize("seed", range(NUM_ASYNC_SCENARIOS))
def test_async_scheduling_matches_reference(seed):
    compare_with_reference(
        random_scenario(
            seed, async_scheduling=True, disaggregated=seed % 3 == 2, prefix_caching=seed % 4 == 1,
            allreduce=seed % 5 == 0, long_outputs=seed % 7 == 3,
        )
    )


@pytest.mark.parametrize("policy", ["vllm", "trtllm"])
@pytest.mark.parametrize("seed", range(NUM_STEADY_SCENARIOS))
def test_steady_decode_matches_reference(policy, seed):
    """Light load, long outputs, one rank: long runs of the kernel's steady-decode path."""
    compare_with_reference(random_scenario(seed, policy=policy, steady=True))


def test_steady_scenarios_run_long_steady_stretches():
    """Guards the generator: many scenarios have 20+ consecutive decode-only passes of one batch."""
    long_runs = 0
    for seed in range(NUM_STEADY_SCENARIOS):
        _, slow = reference(random_scenario(seed, steady=True))
        long_runs += longest_steady_stretch(slow["passes"]) >= 20
    assert long_runs >= NUM_STEADY_SCENARIOS // 2, long_runs


def compare_with_reference(scenario):
    config, slow = reference(scenario)
    run, cols, summary = run_fast(scenario)
    fast = fast_as_reference(run, cols)
    for k, (f, s) in enumerate(zip(fast["requests"], slow["requests"])):
        assert {key: f[key] for key in REQUEST_KEYS} == {key: s[key] for key in REQUEST_KEYS}, f"request {k}"
    assert fast["tokens"] == slow["tokens"]
    assert fast["passes"] == slow["passes"]
    capacity = {name: getattr(load_config(scenario["config"]).engine, name).num_blocks for name in ("aggregated", "prefill", "decode")}
    assert all(p["blocks_in_use"] <= capacity[p["pool"]] for p in fast["passes"])
    cap_ns = None if config["max_time_ms"] is None else round(config["max_time_ms"] * 1e6)
    slow_summary = reference_summarize(slow, scenario["inputs"], scenario["outputs"], config["metrics"]["percentiles"], config["metrics"]["goodput"], cap_ns)
    assert_summaries_equal(summary, slow_summary)


def test_scenarios_cover_the_features():
    """The random scenarios exercise what they are meant to (guards the generator)."""
    seen = dict(preempted=0, rejected=0, truncated=0, incomplete=0, closed=0, open=0, detok_servers=0, chunked=0, multi_rank=0)
    for seed in range(NUM_SCENARIOS):
        s = random_scenario(seed)
        _, slow = reference(s)
        reqs = slow["requests"]
        c = s["config"]
        seen["preempted"] += any(r["num_preemptions"] > 0 for r in reqs)
        seen["rejected"] += any(r["status"] == "rejected" for r in reqs)
        seen["incomplete"] += any(r["status"] == "incomplete" for r in reqs)
        seen["truncated"] += any(r["status"] == "completed" and r["generated_tokens"] < o for r, o in zip(reqs, s["outputs"]))
        seen["closed"] += c["load"]["type"] == "closed_loop"
        seen["open"] += c["load"]["type"] == "trace"
        seen["detok_servers"] += c["detokenization"]["workers"] > 1 and c["detokenization"]["base_ms"] > 0
        seen["chunked"] += c["detokenization"]["chunk_size"] is not None
        seen["multi_rank"] += c["engine"]["aggregated"]["replicas"] * c["engine"]["aggregated"]["attention_dp"] > 1
    assert all(count >= 10 for count in seen.values()), seen


def test_cuda_graph_scenarios_pad_and_run_eager(monkeypatch):
    """Guards the generator: the graph scenarios have passes padded up to a size, passes on a
    size exactly and passes beyond the largest size (run unpadded), in many scenarios."""
    from tests.reference import sim as reference_sim

    batches = []
    original = reference_sim.PoolTiming.rank_time_ms

    def recording(self, s, run_at=None):
        if self.graph_sizes and s["num_prefill"] + s["num_decode"] > 0:
            batches.append((s["prefill_tokens"] + s["num_decode"], self.graph_sizes))
        return original(self, s, run_at)

    monkeypatch.setattr(reference_sim.PoolTiming, "rank_time_ms", recording)
    seen = dict(padded=0, on_size=0, eager=0)
    for seed in range(100):
        batches.clear()
        reference(random_scenario(seed, policy=("vllm", "sglang", "trtllm")[seed % 3], cuda_graphs=True))
        seen["padded"] += any(t <= sizes[-1] and t not in sizes for t, sizes in batches)
        seen["on_size"] += any(t in sizes for t, sizes in batches)
        seen["eager"] += any(t > sizes[-1] for t, sizes in batches)
    assert all(count >= 20 for count in seen.values()), seen


def test_disaggregated_scenarios_cover_the_features():
    seen = dict(preempted=0, rejected_on_prefill=0, rejected_on_decode=0, transfer=0, no_transfer=0, detok_servers=0, incomplete=0)
    for seed in range(NUM_PD_SCENARIOS):
        s = random_scenario(seed, disaggregated=True)
        _, slow = reference(s)
        reqs = slow["requests"]
        seen["preempted"] += any(r["num_preemptions"] > 0 for r in reqs)
        seen["rejected_on_prefill"] += any(r["status"] == "rejected" and r["transfer_end_ns"] is None for r in reqs)
        seen["rejected_on_decode"] += any(r["status"] == "rejected" and r["transfer_end_ns"] is not None for r in reqs)
        seen["transfer"] += any(r["transfer_end_ns"] is not None and r["transfer_end_ns"] > r["prompt_done_ns"] for r in reqs)
        seen["no_transfer"] += s["config"]["engine"]["kv_transfer"]["bandwidth_gb_per_second"] is None
        seen["detok_servers"] += s["config"]["detokenization"]["workers"] > 1 and s["config"]["detokenization"]["base_ms"] > 0
        seen["incomplete"] += any(r["status"] == "incomplete" for r in reqs)
    assert all(count >= 10 for count in seen.values()), seen


def test_prefix_caching_scenarios_cover_the_features():
    seen = dict(hits=0, hash_ids=0, shared_prefix=0, preempted_with_hits=0, disaggregated_hits=0)
    for seed in range(NUM_PREFIX_SCENARIOS):
        s = random_scenario(seed, prefix_caching=True, disaggregated=seed % 3 == 2)
        _, slow = reference(s)
        hit = any((r["cached_tokens"] or 0) > 0 for r in slow["requests"])
        seen["hits"] += hit
        seen["hash_ids"] += hit and s["hash_ids"] is not None
        seen["shared_prefix"] += hit and s["hash_ids"] is None
        seen["preempted_with_hits"] += hit and any(r["num_preemptions"] > 0 for r in slow["requests"])
        seen["disaggregated_hits"] += hit and s["config"]["engine"].get("mode") == "disaggregated"
    assert all(count >= 10 for count in seen.values()), seen


@pytest.mark.parametrize("policy", CACHING_POLICIES)
def test_policy_prefix_caching_scenarios_hit(policy):
    seen = dict(hits=0, hash_ids=0, shared_prefix=0, disaggregated_hits=0)
    for seed in range(NUM_PREFIX_SCENARIOS):
        s = random_scenario(seed, policy=policy, prefix_caching=True, disaggregated=seed % 3 == 2)
        _, slow = reference(s)
        hit = any((r["cached_tokens"] or 0) > 0 for r in slow["requests"])
        seen["hits"] += hit
        seen["hash_ids"] += hit and s["hash_ids"] is not None
        seen["shared_prefix"] += hit and s["hash_ids"] is None
        seen["disaggregated_hits"] += hit and s["config"]["engine"].get("mode") == "disaggregated"
    assert all(count >= 10 for count in seen.values()), seen


@pytest.mark.parametrize("policy", ["vllm", "sglang", "trtllm"])
def test_prefix_pressure_scenarios_evict_and_block(policy):
    """Guards the generator: the prompts' distinct blocks outnumber the cache (it
    must evict), prompts hit, requests wait and (but trtllm, which never
    preempts) are preempted, some repeat a hash."""
    seen = dict(more_blocks_than_cache=0, hits=0, waited=0, preempted_with_hits=0, repeated_hash=0)
    if policy == "trtllm":
        del seen["preempted_with_hits"]
    for seed in range(NUM_PREFIX_PRESSURE_SCENARIOS):
        s = random_scenario(seed, policy=policy, prefix_pressure=True)
        pool = s["config"]["engine"]["aggregated"]
        trace_block = s["config"]["workload"]["block_size"]
        distinct = {
            ident
            for k, (tokens, hashes) in enumerate(zip(s["inputs"], s["hash_ids"]))
            for ident in ReferenceSim.block_identities(k, tokens, pool["block_size"], hashes, trace_block, 0)
        }
        _, slow = reference(s)
        reqs = slow["requests"]
        hit = any((r["cached_tokens"] or 0) > 0 for r in reqs)
        seen["more_blocks_than_cache"] += len(distinct) > 2 * pool["num_blocks"]
        seen["hits"] += hit
        seen["waited"] += hit and any(r["first_admit_ns"] > r["arrival_ns"] for r in reqs if r["first_admit_ns"] is not None)
        if "preempted_with_hits" in seen:
            seen["preempted_with_hits"] += hit and any(r["num_preemptions"] > 0 for r in reqs)
        seen["repeated_hash"] += hit and any(len(set(h)) < len(h) for h in s["hash_ids"])
    assert seen["more_blocks_than_cache"] >= NUM_PREFIX_PRESSURE_SCENARIOS * 3 // 4, seen
    assert all(count >= 10 for count in seen.values()), seen


def test_long_output_sglang_scenarios_retract():
    retracting = 0
    for seed in range(NUM_LONG_SCENARIOS):
        _, slow = reference(random_scenario(seed, policy="sglang", long_outputs=True, disaggregated=seed % 4 == 3))
        retracting += any(r["num_preemptions"] > 0 for r in slow["requests"])
    assert retracting >= 10


@pytest.mark.parametrize("seed", range(200))
def test_open_loop_detokenization_matches_reference(seed):
    """Open loops with detokenization: the per-pass recurrence (the only one) against the reference."""
    compare_with_reference(random_scenario(seed, closed=False, detokenize=True, disaggregated=seed % 2 == 1))


@pytest.mark.parametrize("seed", range(NUM_FULL_ISL_SCENARIOS))
def test_reserve_full_isl_matches_reference(seed):
    compare_with_reference(
        random_scenario(
            seed, reserve_full_isl=True, disaggregated=seed % 3 == 2, prefix_caching=seed % 4 == 1,
            async_scheduling=seed % 2 == 1, long_outputs=seed % 7 == 3,
        )
    )



def chunk_off_scenario(seed):
    return random_scenario(
        seed, chunked_prefill_off=True, disaggregated=seed % 3 == 2, prefix_caching=seed % 4 == 1,
        async_scheduling=seed % 2 == 1, long_outputs=seed % 7 == 3, reserve_full_isl=seed % 5 == 4,
    )


@pytest.mark.parametrize("seed", range(NUM_CHUNK_OFF_SCENARIOS))
def test_chunked_prefill_off_matches_reference(seed):
    compare_with_reference(chunk_off_scenario(seed))


def test_chunked_prefill_off_scenarios_exercise_the_rule():
    """The family decides: turning chunking back on changes many of its runs."""
    differ = 0
    for seed in range(NUM_CHUNK_OFF_SCENARIOS):
        off = chunk_off_scenario(seed)
        on = dict(off, config=merge_config(off["config"]))
        for name in ("aggregated", "prefill", "decode"):
            on["config"]["engine"][name]["chunked_prefill"] = True
        differ += reference(on)[1]["passes"] != reference(off)[1]["passes"]
    assert differ >= NUM_CHUNK_OFF_SCENARIOS // 6, differ


@pytest.mark.parametrize("seed", range(NUM_SKEW_SCENARIOS))
def test_attention_skew_matches_reference(seed):
    policy = ("vllm", "vllm", "sglang", "trtllm")[seed % 4]
    compare_with_reference(
        random_scenario(
            seed, policy=policy, attention_skew=True, disaggregated=seed % 3 == 2, long_outputs=seed % 5 == 1,
            async_scheduling=policy == "vllm" and seed % 2 == 1, allreduce=seed % 6 == 0,
            cuda_graphs=seed % 7 == 3, steady=seed % 11 == 5 and policy != "sglang" and seed % 3 != 2,
        )
    )


def test_attention_skew_scenarios_change_pass_times():
    """The skew term decides: many scenarios have passes of decodes of mixed lengths."""
    differ = 0
    for seed in range(NUM_SKEW_SCENARIOS):
        on = random_scenario(seed, attention_skew=True)
        off = dict(on, config=merge_config(on["config"]))
        off["config"]["timing"]["attention_skew_alpha"] = 0.0
        differ += reference(on)[1]["passes"] != reference(off)[1]["passes"]
    assert differ >= NUM_SKEW_SCENARIOS // 6, differ


@pytest.mark.parametrize("seed", range(NUM_EP_SCENARIOS))
def test_expert_parallel_matches_reference(seed):
    """The attention-DP ranks' lock-step under expert parallelism (dummy batches, DP padding,
    the all-to-all) against the reference, mixed with the other features."""
    compare_with_reference(
        random_scenario(
            seed, expert_parallel=True, disaggregated=seed % 3 == 2, async_scheduling=seed % 2 == 1,
            prefix_caching=seed % 4 == 1, long_outputs=seed % 5 == 1,
        )
    )


NUM_POOL_TIMING_SCENARIOS = 80


@pytest.mark.parametrize("seed", range(NUM_POOL_TIMING_SCENARIOS))
def test_per_pool_timing_matches_reference(seed):
    """Each pool's own timing (engine.<pool>.timing) against the reference: P/D pools of different
    speeds (the hand-off, the decode pool's batches), aggregated pools, with the other features."""
    policy = ("vllm", "sglang", "trtllm")[seed % 3] if seed % 4 != 3 else "vllm"
    compare_with_reference(
        random_scenario(
            seed, per_pool_timing=True, disaggregated=seed % 4 != 1, policy=policy,
            expert_parallel=seed % 4 == 3, long_outputs=seed % 5 == 2,
        )
    )


def test_per_pool_timing_scenarios_change_pass_times():
    """The pools' own timing decides: most scenarios have other passes with it removed."""
    differ = 0
    for seed in range(NUM_POOL_TIMING_SCENARIOS):
        on = random_scenario(seed, per_pool_timing=True, disaggregated=True)
        off = dict(on, config=merge_config(on["config"]))
        for name in ("prefill", "decode"):
            off["config"]["engine"][name]["timing"] = None
        differ += reference(on)[1]["passes"] != reference(off)[1]["passes"]
    assert differ >= NUM_POOL_TIMING_SCENARIOS // 2, differ


def test_expert_parallel_scenarios_change_pass_times():
    """The lock-step decides: many scenarios have other pass times with it off."""
    differ = 0
    for seed in range(NUM_EP_SCENARIOS):
        on = random_scenario(seed, expert_parallel=True)
        off = dict(on, config=merge_config(on["config"]))
        for name in ("aggregated", "prefill", "decode"):
            off["config"]["engine"][name]["expert_parallel"] = False
        off["config"]["timing"]["moe"] = merge_config({})["timing"]["moe"]
        if off["config"]["timing"]["type"] == "linear" and off["config"]["timing"]["allreduce"]["bandwidth_gb_per_second"] is None:
            off["config"]["timing"]["num_layers"] = None
            off["config"]["timing"]["hidden_size"] = None
        differ += reference(on)[1]["passes"] != reference(off)[1]["passes"]
    assert differ >= NUM_EP_SCENARIOS // 4, differ
@pytest.mark.parametrize("policy", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("seed", range(NUM_SPEC_SCENARIOS))
def test_speculative_matches_reference(policy, seed):
    """Speculative decoding (docs/speculative.md): every policy, aggregated and P/D, prefix caching on and
    off, long outputs on a tight cache (preemption, retraction) and the other pools' features."""
    compare_with_reference(random_scenario(
        seed, policy=policy, disaggregated=seed % 3 == 2, prefix_caching=seed % 3 == 1, long_outputs=seed % 4 == 0,
        cuda_graphs=seed % 5 == 0 and policy != "sglang", speculative=True,
    ))


@pytest.mark.parametrize("seed", range(NUM_SPEC_SCENARIOS))
def test_speculative_with_vllm_features_matches_reference(seed):
    """Speculative decoding beside vLLM's whole-sequence admission, chunked prefill off, the attention
    skew, prefix caching and P/D (vllm policy)."""
    compare_with_reference(random_scenario(
        seed, disaggregated=seed % 3 == 2, prefix_caching=seed % 4 == 1, reserve_full_isl=seed % 2 == 0,
        chunked_prefill_off=seed % 5 == 3, attention_skew=seed % 3 == 0, long_outputs=seed % 4 == 2,
        speculative=True,
    ))


NUM_NGRAM_SCENARIOS = 60


@pytest.mark.parametrize("seed", range(NUM_NGRAM_SCENARIOS))
def test_ngram_steps_without_a_match_match_reference(seed):
    """vLLM's n-gram proposer whose steps propose with a proposal_rate in [0, 1) (docs/speculative.md):
    the speculative scenarios' pool turned into n-gram, aggregated and P/D, prefix caching on and off."""
    scenario = random_scenario(seed, disaggregated=seed % 3 == 2, prefix_caching=seed % 3 == 1,
                               long_outputs=seed % 4 == 0, cuda_graphs=seed % 5 == 0, speculative=True)
    spec = next(p["speculative"] for p in scenario["config"]["engine"].values()
                if isinstance(p, dict) and p.get("speculative"))
    form = spec["config"] if isinstance(spec["config"], dict) else json.loads(spec["config"])
    spec["config"] = {"method": "ngram", "num_speculative_tokens": form["num_speculative_tokens"]}
    spec["proposal_rate"] = (0.0, 0.25, 0.5, 0.9)[seed % 4]
    compare_with_reference(scenario)


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
@pytest.mark.parametrize("seed", range(NUM_QUEUE_ORDER_SCENARIOS))
def test_queue_orders_match_reference(policy, seed):
    """Keyed waiting-queue orders (docs/semantics.md): vLLM priority (its preemption of the
    lowest-priority request), SGLang lof, the shortest-job orders."""
    compare_with_reference(random_scenario(seed, policy=policy, queue_order=True, disaggregated=seed % 3 == 2,
                                           prefix_caching=seed % 4 == 1, long_outputs=policy == "sglang" and seed % 5 == 0))


@pytest.mark.parametrize("seed", range(NUM_LPM_SCENARIOS))
def test_lpm_matches_reference(seed):
    """SGLang lpm (docs/semantics.md): the radix cache's match at each extend batch, the in-batch
    prefix check, aggregated and P/D prefill pools, a tight cache a third of the time."""
    compare_with_reference(random_scenario(seed, policy="sglang", queue_order="lpm", prefix_caching=True,
                                           disaggregated=seed % 4 == 3, prefix_pressure=seed % 3 == 0 and seed % 4 != 3,
                                           long_outputs=seed % 5 == 0))


def test_lpm_scenarios_cover_the_features():
    """The lpm scenarios reorder queues (results differ from fcfs) and put requests last
    by the in-batch prefix check."""
    differs = 0
    ReferenceSim.lpm_deferred = 0
    for seed in range(NUM_LPM_SCENARIOS // 4):
        s = random_scenario(seed, policy="sglang", queue_order="lpm", prefix_caching=True,
                            disaggregated=seed % 4 == 3, prefix_pressure=seed % 3 == 0 and seed % 4 != 3,
                            long_outputs=seed % 5 == 0)
        _, slow = reference(s)
        fcfs = copy.deepcopy(s)
        for pool in fcfs["config"]["engine"].values():
            if isinstance(pool, dict) and pool.get("queue_order") == "lpm":
                pool["queue_order"] = "fcfs"
        _, base = reference(fcfs)
        differs += slow["requests"] != base["requests"]
    assert differs >= NUM_LPM_SCENARIOS // 20, differs
    assert ReferenceSim.lpm_deferred >= 100, ReferenceSim.lpm_deferred


def _dfs_weight_scenario(seed):
    return random_scenario(seed, policy="sglang", queue_order="dfs-weight", prefix_caching=True,
                           disaggregated=seed % 4 == 3, prefix_pressure=seed % 3 == 0 and seed % 4 != 3,
                           long_outputs=seed % 5 == 0)


@pytest.mark.parametrize("seed", range(NUM_DFS_WEIGHT_SCENARIOS))
def test_dfs_weight_matches_reference(seed):
    """SGLang dfs-weight (docs/semantics.md): the radix cache's match at each extend batch and the
    depth-first walk, heavier subtrees first, equal weights by the children's insertion order;
    aggregated and P/D prefill pools, a tight cache with long shared hash chains a third of the time."""
    compare_with_reference(_dfs_weight_scenario(seed))


def test_dfs_weight_scenarios_cover_the_features():
    """The dfs-weight scenarios reorder queues (results differ from fcfs and from lpm) and order
    equal-weight children by their insertion order."""
    differs = differs_lpm = 0
    ReferenceSim.dfs_reordered = ReferenceSim.dfs_birth_ties = 0
    for seed in range(NUM_DFS_WEIGHT_SCENARIOS // 4):
        s = _dfs_weight_scenario(seed)
        _, slow = reference(s)
        others = []
        for order in ("fcfs", "lpm"):
            other = copy.deepcopy(s)
            for pool in other["config"]["engine"].values():
                if isinstance(pool, dict) and pool.get("queue_order") == "dfs-weight":
                    pool["queue_order"] = order
            others.append(reference(other)[1]["requests"])
        differs += slow["requests"] != others[0]
        differs_lpm += slow["requests"] != others[1]
    assert differs >= NUM_DFS_WEIGHT_SCENARIOS // 20, differs
    assert differs_lpm >= NUM_DFS_WEIGHT_SCENARIOS // 20, differs_lpm
    assert ReferenceSim.dfs_reordered >= 100, ReferenceSim.dfs_reordered
    assert ReferenceSim.dfs_birth_ties >= 100, ReferenceSim.dfs_birth_ties


def test_queue_order_scenarios_cover_the_features():
    """The queue-order scenarios give orders that change results and vLLM priority preemptions."""
    differs = preempted = 0
    for seed in range(100):
        s = random_scenario(seed, queue_order=True)
        _, slow = reference(s)
        fcfs = copy.deepcopy(s)
        for pool in fcfs["config"]["engine"].values():
            if isinstance(pool, dict) and "queue_order" in pool:
                pool["queue_order"] = "fcfs"
        _, base = reference(fcfs)
        differs += slow["requests"] != base["requests"]
        preempted += any(r["num_preemptions"] > 0 for r in slow["requests"])
    assert differs >= 30 and preempted >= 10
