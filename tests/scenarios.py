"""Random small scenarios and adapters shared by the reference-comparison tests."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import simcore
import simcore.engine.api as engine_api
from simcore.config import load_config
from simcore.engine.api import simulate_engine
from simcore.metrics.api import POOL_NAMES, RequestColumns, STATUS_NAMES, summarize
from simcore.scheduler.policies import CACHE_AWARE_ORDERS, SCHEDULING_POLICIES
from simcore.workload.api import RequestTable

MOONCAKE_SAMPLE = Path(__file__).resolve().parents[1] / "runners" / "samples" / "mooncake_conversation_300.jsonl"


def _random_pool(rnd: random.Random, num_blocks: int, block_size: int, context_length, policy: str = "vllm") -> dict:
    pool = {
        "replicas": rnd.randint(1, 3),
        "attention_dp": rnd.randint(1, 2),
        "max_batched_tokens": rnd.randint(2, 64),
        "max_sequences": rnd.randint(1, 6),
        "num_blocks": num_blocks,
        "block_size": block_size,
        "context_length": context_length,
    }
    if policy == "sglang":
        pool["max_batched_tokens"] = None
        pool["chunked_prefill_size"] = rnd.randint(block_size * pool["attention_dp"], 64)
        pool["max_prefill_tokens"] = rnd.choice([rnd.randint(2, 64), 16384])
        pool["schedule_conservativeness"] = rnd.choice([0.05, 0.3, 1.0, 1.6])
    return pool


def random_scenario(
    seed: int,
    closed: bool | None = None,
    detokenize: bool | None = None,
    disaggregated: bool = False,
    policy: str = "vllm",
    long_outputs: bool = False,
    prefix_caching: bool = False,
    allreduce: bool = False,
    async_scheduling: bool = False,
    steady: bool = False,
    curve_dir: str | None = None,
    cuda_graphs: bool = False,
    prefix_pressure: bool = False,
    reserve_full_isl: bool = False,
    attention_skew: bool = False,
    chunked_prefill_off: bool = False,
    expert_parallel: bool = False,
    speculative: bool = False,
    queue_order: bool | str = False,
    per_pool_timing: bool = False,
) -> dict:
    """A small random scenario: config mapping, lengths, ids and open-loop sends.

    ``closed`` and ``detokenize`` force the loop type and the detokenizer stage
    on or off; None draws them.  ``disaggregated`` draws independent prefill
    and decode pools (tight KV on either) and a KV transfer, on or off.
    ``policy`` sets ``engine.policy`` (and its own pool keys).  ``long_outputs``
    draws outputs of 20-120 tokens, so that many decode steps run on a tight
    cache (SGLang's new_token_ratio decays and decodes retract).
    ``prefix_caching`` turns it on for the receiving pool, with prompts sharing
    prefixes through prefix-chained ``hash_ids`` or a synthetic shared prefix.
    ``allreduce`` replaces the timing with a linear model plus its pass terms
    (a TP all-reduce ring term, time scales, a per-pass overhead; drawn after everything else, so the rest of the scenario is the
    one the seed gives without it).  ``async_scheduling`` turns on the vllm
    policy's asynchronous scheduling on the aggregated or decode pool.
    ``steady`` (aggregated) makes it a light load of long outputs on one rank
    with room for its sequences: long runs of identical decode-only passes
    (the kernel's steady-decode path), broken by arrivals, finishes, block
    boundaries and the odd preemption; drawn last like ``allreduce``.
    ``curve_dir`` (with ``allreduce``) prices the all-reduce by a random measured
    curve written there (nccl-tests or Vidur layout) instead of the ring.
    ``cuda_graphs`` draws ``timing.cuda_graph_sizes`` (a list, or vllm_default on
    an aggregated vllm deployment), a fixed timing becoming linear.  Both are
    drawn after everything else.
    ``prefix_pressure`` (aggregated, any policy) makes it prefix caching on one rank
    under heavy eviction: 30-60 requests with long prompts that mostly share
    long hash_ids chains (a fifth of the scenarios also repeat hashes inside a
    prompt), on a cache a few prompts fill, with a waiting queue (head-of-line
    blocking, preemption); drawn last.
    ``reserve_full_isl`` turns on vLLM's whole-sequence admission on every pool
    (vllm policy), often with a token budget below the prompts (chunked
    prefills) and (without ``hash_ids``) prompts up to four times longer; drawn after
    everything else.
    ``attention_skew`` draws ``timing.attention_skew_alpha`` (a fixed timing
    becoming linear with a kv term); drawn after everything else.
    ``per_pool_timing`` gives each active pool, most of the time, timing keys of its own
    (``engine.<pool>.timing``: other coefficients of the section's type, a fixed section
    becoming linear, other pass scales and overhead); drawn last.
    ``chunked_prefill_off`` turns vLLM's chunked prefill off on every pool (vllm
    policy), its token budget L or a few tokens more, L often just above the
    longest prompt (so that prompts are passed over for want of budget); drawn last.
    ``expert_parallel`` (vllm policy) turns on the attention-DP ranks' lock-step on every
    pool, with 1-4 ranks per worker (often one idle: dummy batches), often CUDA-graph
    sizes (DP padding) and an all-to-all on a linear timing, and on a linear timing often the
    operator scales (from a stream of their own); drawn last.
    ``speculative`` turns on speculative decoding on the emitting pool in the
    policy's engine form (random method and proposals, acceptance rates or a
    mean acceptance length, proposer costs; half the fixed timings become
    linear, so that proposals are priced); drawn last.
    ``queue_order`` draws one of the policy's queue orders other than fcfs
    (docs/semantics.md) for the pools (each pool keeps fcfs a fifth of the
    time; an order that reads the prefix cache is drawn only with
    ``prefix_caching`` and set only on its pool), or names the order, with a random ``priority`` column (classes -1 to 2, or none) and a
    ``predicted_output_tokens`` column for ``shortest_output``; mostly one busy
    rank per pool with sends bunched (queues), half the time longer outputs
    (preemptions); drawn last.
    """
    rnd = random.Random(seed)
    n = rnd.randint(1, 24)
    closed = rnd.random() < 0.5 if closed is None else closed
    block_size = rnd.choice([1, 2, 4, 8])
    num_blocks = rnd.randint(2, 48)
    tight = rnd.random() < 0.5  # small KV: preemption and head-of-line blocking
    inputs = [rnd.randint(1, 12 if tight else 48) for _ in range(n)]
    outputs = [rnd.randint(20, 120) if long_outputs else rnd.randint(1, 10) for _ in range(n)]
    if long_outputs:  # room for two or three sequences: decodes outgrow the cache
        num_blocks = rnd.randint(120, 300) // block_size
        context_length = None
    if rnd.random() < 0.2:  # some prompts at or over the limit: rejections
        num_blocks = rnd.randint(2, 6)
    context_length = rnd.choice([None, None, rnd.randint(4, 40)])
    if rnd.random() < 0.5:
        timing = {"type": "fixed", "prefill_ms": rnd.choice([0.0, 1.5, 2.0000004]), "decode_ms": rnd.choice([0.0, 0.75, 1.0])}
    else:
        timing = {
            "type": "linear",
            "base_ms": rnd.choice([0.0, 0.5, 1.25]),
            "per_prefill_token_us": rnd.choice([0.0, 10.0, 33.3]),
            "per_decode_seq_us": rnd.choice([0.0, 20.0, 7.7]),
            "per_kv_token_ns": rnd.choice([0.0, 40.0, 123.4]),
        }
    tokenization = {"workers": 1, "base_ms": 0.0, "per_input_us": 0.0}
    if rnd.random() < 0.5:
        tokenization = {"workers": rnd.randint(1, 3), "base_ms": rnd.choice([0.0, 0.2, 1.1]), "per_input_us": rnd.choice([0.0, 15.0, 50.5])}
    detokenization = {"workers": 1, "base_ms": 0.0, "per_output_us": 0.0, "chunk_size": None, "first_output_us": 0.0, "final_output_us": 0.0}
    if (rnd.random() < 0.6) if detokenize is None else detokenize:
        detokenization = {
            "workers": rnd.randint(1, 3),
            "base_ms": rnd.choice([0.3, 2.85]),
            "per_output_us": rnd.choice([0.0, 61.6, 250.0]),
            "chunk_size": rnd.choice([None, None, 1, 2, 3]),
            "first_output_us": rnd.choice([0.0, 0.0, 100.0]),
            "final_output_us": rnd.choice([0.0, 0.0, 70.0]),
        }
    config = {
        "workload": {"num_requests": n},
        "load": {"type": "closed_loop", "concurrency": rnd.randint(1, 6), "think_time_ms": rnd.choice([0.0, 0.0, 0.4])}
        if closed
        else {"type": "trace"},
        "engine": {"policy": policy, "aggregated": _random_pool(rnd, num_blocks, block_size, context_length, policy)},
        "timing": timing,
        "tokenization": tokenization,
        "detokenization": detokenization,
        "max_time_ms": None if long_outputs else rnd.choice([None, None, None, rnd.uniform(0.5, 20.0)]),
        "metrics": {"goodput": {"ttft_ms": rnd.choice([None, 5.0]), "tpot_ms": None, "e2el_ms": rnd.choice([None, 30.0])}},
    }
    if disaggregated:
        config["engine"] = {
            "mode": "disaggregated",
            "policy": policy,
            "prefill": _random_pool(rnd, rnd.choice([num_blocks, rnd.randint(2, 12)]), rnd.choice([1, 4, 8]), rnd.choice([None, None, rnd.randint(4, 40)]), policy),
            "decode": _random_pool(rnd, rnd.choice([num_blocks, rnd.randint(2, 12)]), rnd.choice([1, 4, 8]), context_length, policy),
            "kv_transfer": rnd.choice(
                [
                    {"bandwidth_gb_per_second": None, "bytes_per_token": None},
                    {"bandwidth_gb_per_second": rnd.choice([1.0, 25.0]), "bytes_per_token": rnd.choice([1e5, 131072.0])},
                ]
            ),
        }
    if long_outputs:  # one busy rank per pool, several sequences at once
        for name in ("aggregated", "prefill", "decode"):
            if name in config["engine"]:
                config["engine"][name].update(replicas=1, attention_dp=1, max_sequences=rnd.randint(3, 6))
        if closed:
            config["load"]["concurrency"] = rnd.randint(3, 6)
    hash_ids = None
    if prefix_caching:
        receiving = "prefill" if disaggregated else "aggregated"
        config["engine"][receiving]["prefix_caching"] = True
        if rnd.random() < 0.5:
            hash_ids = _prefix_chained_hash_ids(rnd, inputs, trace_block=rnd.choice([2, 4, 8]))
            config["workload"]["source"] = "mooncake"
            config["workload"]["path"] = "scenario.jsonl"
            config["workload"]["block_size"] = hash_ids[1]
            hash_ids = hash_ids[0]
        else:
            config["workload"]["prefix_tokens"] = rnd.choice([4, 8, 16, 32])
    send_ns = None
    if not closed:
        t, send_ns = 0, []
        for _ in range(n):
            send_ns.append(t)
            t += rnd.choice([0, 0, 1, 250_000, 1_000_000, rnd.randint(0, 5_000_000)])
    if allreduce:
        config["timing"] = {
            "type": "linear",
            "base_ms": rnd.choice([0.0, 0.5, 1.25]),
            "per_prefill_token_us": rnd.choice([0.0, 10.0, 33.3]),
            "per_decode_seq_us": rnd.choice([0.0, 20.0, 7.7]),
            "per_kv_token_ns": rnd.choice([0.0, 40.0, 123.4]),
            "tp": rnd.choice([2, 4, 8]),
            "num_layers": rnd.choice([1, 32, 64]),
            "hidden_size": rnd.choice([1, 4096, 5120]),
            "dtype_bytes": rnd.choice([1, 2]),
            "allreduce": {
                "latency_us": rnd.choice([None, 0.0, 20.0, 7.3]),
                "bandwidth_gb_per_second": rnd.choice([16.0, 0.7, 450.0]),
                "curve": None,
            },
            "prefill_scale": rnd.choice([1.0, 0.8, 1.37]),
            "decode_scale": rnd.choice([1.0, 0.6, 2.5]),
            "pass_overhead_us": rnd.choice([0.0, 0.0, 150.0, 33.3]),
        }
    if async_scheduling:
        config["engine"]["decode" if disaggregated else "aggregated"]["async_scheduling"] = True
    if steady:
        outputs = [rnd.randint(20, 200) for _ in range(n)]
        config["engine"]["aggregated"].update(
            replicas=1, attention_dp=1, max_sequences=rnd.randint(2, 6), max_batched_tokens=rnd.randint(8, 64),
            num_blocks=rnd.choice([rnd.randint(40, 120), 4096]) // block_size + 1,
            context_length=rnd.choice([None, None, rnd.randint(60, 200)]),
        )
        config["max_time_ms"] = rnd.choice([None, None, rnd.uniform(5.0, 300.0)])
        if closed:
            config["load"]["concurrency"] = rnd.randint(1, 4)
        else:  # gaps of many passes
            t, send_ns = 0, []
            for _ in range(n):
                send_ns.append(t)
                t += rnd.choice([0, 5_000_000, 20_000_000, rnd.randint(0, 60_000_000)])
    if curve_dir is not None:
        assert allreduce, "a measured all-reduce curve replaces the ring of allreduce=True"
        config["timing"]["allreduce"] = {
            "latency_us": None,
            "bandwidth_gb_per_second": None,
            "curve": _random_curve_file(rnd, curve_dir, seed, config["timing"]["tp"]),
        }
    if cuda_graphs:
        _fixed_to_linear(rnd, config)
        if policy == "vllm" and not disaggregated and rnd.random() < 0.3:
            config["timing"]["cuda_graph_sizes"] = "vllm_default"
        else:  # small sizes, some passes beyond the largest (eager, unpadded)
            config["timing"]["cuda_graph_sizes"] = rnd.sample(range(1, rnd.choice([8, 16, 40])), rnd.randint(1, 6))
    if prefix_pressure:
        n = rnd.randint(30, 60)
        block_size = rnd.choice([1, 2, 4])
        trace_block = rnd.choice([2, 4, 8])
        inputs = [rnd.randint(8, 96) for _ in range(n)]
        outputs = [rnd.randint(1, 12) for _ in range(n)]
        largest = -(-max(inputs) // block_size)
        config["workload"].update(num_requests=n, source="mooncake", path="scenario.jsonl", block_size=trace_block)
        config["workload"].pop("prefix_tokens", None)
        config["engine"]["aggregated"].update(
            replicas=1, attention_dp=1, prefix_caching=True, block_size=block_size,
            num_blocks=largest + rnd.randint(1, largest), max_sequences=rnd.randint(2, 8),
            max_batched_tokens=rnd.randint(8, 64), context_length=None,
        )
        config["max_time_ms"] = None
        if policy == "sglang":  # its own budgets, at least a page per chunk
            config["engine"]["aggregated"].update(
                max_batched_tokens=None, chunked_prefill_size=rnd.randint(block_size, 64),
            )
        hash_ids = _prefix_chained_hash_ids(rnd, inputs, trace_block, long_shares=True)[0]
        # not prefix-chained: some prompts repeat a hash (a block-per-node cache: not with dfs-weight)
        if rnd.random() < 0.2 and queue_order != "dfs-weight":
            hash_ids = [[rnd.choice(ids) if rnd.random() < 0.3 else h for h in ids] for ids in hash_ids]
        if closed:
            config["load"]["concurrency"] = rnd.randint(2, 12)
        else:  # bursts: a queue builds up
            t, send_ns = 0, []
            for _ in range(n):
                send_ns.append(t)
                t += rnd.choice([0, 0, 0, 100_000, rnd.randint(0, 3_000_000)])
    if reserve_full_isl:
        assert policy == "vllm", "reserve_full_isl is a vllm admission rule"
        for name in ("aggregated", "prefill", "decode"):
            pool = config["engine"].get(name)
            if isinstance(pool, dict):
                pool["reserve_full_isl"] = True
                if rnd.random() < 0.7:  # chunked prompts: the first chunk fits long before the whole
                    pool["max_batched_tokens"] = rnd.randint(2, 8)
        if hash_ids is None:  # (hash chains are drawn for the prompts' lengths)
            inputs = [min(x * rnd.randint(1, 4), 160) for x in inputs]
    if attention_skew:
        _fixed_to_linear(rnd, config)
        if config["timing"]["per_kv_token_ns"] == 0.0:
            config["timing"]["per_kv_token_ns"] = rnd.choice([40.0, 123.4, 1e4])
        config["timing"]["attention_skew_alpha"] = rnd.choice([0.0543, 0.5, 1.0, 3.7])
    if chunked_prefill_off:
        assert policy == "vllm", "chunked_prefill=false is a vllm rule"
        for name in ("aggregated", "prefill", "decode"):
            pool = config["engine"].get(name)
            if isinstance(pool, dict):
                pool["chunked_prefill"] = False
                capacity = pool["num_blocks"] * pool["block_size"]
                if rnd.random() < 0.9:  # prompts just inside L: whole prompts barely fit a pass
                    pool["context_length"] = max(inputs) + rnd.randint(1, 4)
                    pool["max_sequences"] = max(pool["max_sequences"], rnd.randint(2, 6))
                limit = capacity if pool["context_length"] is None else min(pool["context_length"], capacity)
                pool["max_batched_tokens"] = limit + rnd.choice([0, 0, 1, 3])
    acceptance_length = None
    if speculative:
        positions = _speculative(rnd, config, policy, disaggregated)
        if rnd.random() < 0.4:  # some requests with their own acceptance (the table's column)
            acceptance_length = [rnd.choice([math.nan, 1.0, positions + 1.0, rnd.uniform(1.0, positions + 1.0)])
                                 for _ in inputs]
    if expert_parallel:
        assert policy == "vllm", "expert_parallel is modelled for the vllm policy"
        for name in ("aggregated", "prefill", "decode"):
            pool = config["engine"].get(name)
            if isinstance(pool, dict):
                pool["expert_parallel"] = True
                pool["attention_dp"] = rnd.randint(1, 4)
        if rnd.random() < 0.7:
            _fixed_to_linear(rnd, config)
            timing = config["timing"]
            if rnd.random() < 0.6 and "cuda_graph_sizes" not in timing:
                timing["cuda_graph_sizes"] = rnd.sample(range(1, rnd.choice([8, 16, 40])), rnd.randint(1, 6))
            if rnd.random() < 0.7:
                timing["num_layers"] = rnd.randint(1, 8)
                timing["hidden_size"] = rnd.choice([64, 2048])
                timing["moe"] = {
                    "num_experts": 8, "top_k": rnd.randint(1, 8), "num_layers": rnd.choice([None, 1]),
                    "alltoall": {"latency_us": rnd.choice([None, 0.0, 20.0]),
                                 "bandwidth_gb_per_second": rnd.choice([0.5, 16.0, 123.4])},
                }
        if config["timing"]["type"] == "linear":  # the operator scales, split within the lock-step
            own = random.Random(seed * 7919 + 17)  # its own stream: the rest as the seed gives it without
            if own.random() < 0.6:
                for name in ("prefill_token_scale", "decode_attention_scale", "decode_base_scale"):
                    config["timing"][name] = own.choice([1.0, 0.5, 1.37, 2.5])
    columns = {}
    if queue_order:
        order = rnd.choice([o for o in SCHEDULING_POLICIES[policy].queue_orders
                            if o != "fcfs" and (prefix_caching or o not in CACHE_AWARE_ORDERS)])
        if isinstance(queue_order, str):
            order = queue_order
        for name in ("aggregated", "prefill", "decode"):
            pool = config["engine"].get(name)
            if isinstance(pool, dict):
                pool["queue_order"] = order if rnd.random() < 0.8 else "fcfs"
                if order in CACHE_AWARE_ORDERS and not pool.get("prefix_caching"):
                    pool["queue_order"] = "fcfs"
        if order == "priority" and rnd.random() < 0.9:
            columns["priority"] = [rnd.choice([-1, 0, 0, 1, 2]) for _ in inputs]
        if order == "shortest_output":
            columns["predicted_output_tokens"] = [rnd.randint(1, 12) for _ in inputs]
        if rnd.random() < 0.7:  # one busy rank per pool: queues form and orders matter
            for name in ("aggregated", "prefill", "decode"):
                pool = config["engine"].get(name)
                if isinstance(pool, dict):
                    pool.update(replicas=1, attention_dp=1, max_sequences=rnd.randint(1, 4))
            if closed:
                config["load"]["concurrency"] = n
            else:
                send_ns = [x // 20 for x in send_ns]
        if rnd.random() < 0.5:  # decodes that outgrow the cache: preemptions
            outputs[:] = [rnd.randint(3, 25) for _ in outputs]
    if per_pool_timing:
        _per_pool_timing(rnd, config)
    ids = [f"req-{seed}-{k}" for k in range(n)]
    scenario = {"config": config, "inputs": inputs, "outputs": outputs, "send_ns": send_ns, "ids": ids,
                "hash_ids": hash_ids, **columns}
    if acceptance_length is not None:
        scenario["acceptance_length"] = acceptance_length
    if speculative and rnd.random() < 0.4:  # draws per prompt id (drawn last: the draws above stay as they were)
        spec = config["engine"]["decode" if disaggregated else "aggregated"]["speculative"]
        spec["draws"] = "prompt"
        if rnd.random() < 0.7:  # copies of a few prompts (else each request its own id)
            scenario["prompt_id"] = [rnd.randint(0, 2) for _ in inputs]
    return scenario


def _speculative(rnd: random.Random, config: dict, policy: str, disaggregated: bool) -> None:
    """Speculative decoding on the emitting pool, in the policy's engine form (docs/speculative.md)."""
    if config["timing"]["type"] == "fixed" and rnd.random() < 0.5:
        _fixed_to_linear(rnd, config)
    if policy == "sglang":
        algorithm = rnd.choice(["EAGLE", "EAGLE3", "NGRAM"])
        if algorithm == "NGRAM":
            form = {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": rnd.randint(2, 6)}
            positions = form["speculative_num_draft_tokens"] - 1
        else:
            steps, topk = rnd.randint(1, 4), rnd.choice([1, 1, 2, 4])
            form = {"speculative_algorithm": algorithm, "speculative_num_steps": steps, "speculative_eagle_topk": topk,
                    "speculative_num_draft_tokens": steps + 1 if topk == 1 else steps + rnd.randint(1, 4)}
            positions = steps
    elif policy == "trtllm":
        kind = rnd.choice(["Eagle", "Eagle3", "MTP", "NGram", "DraftTarget"])
        positions = rnd.randint(1, 5)
        form = {"decoding_type": kind}
        form["num_nextn_predict_layers" if kind == "MTP" else "max_draft_len"] = positions
    else:
        method = rnd.choice(["ngram", "eagle", "eagle3", "mtp", "draft_model"])
        positions = rnd.randint(1, 5)
        form = {"method": method, "num_speculative_tokens": positions}
        if method == "ngram" and rnd.random() < 0.5:
            form.update(prompt_lookup_min=2, prompt_lookup_max=4)
    spec = {"config": form if rnd.random() < 0.5 else json.dumps(form)}
    if form.get("method") == "ngram" and rnd.random() < 0.7:  # steps whose lookup finds no match
        spec["proposal_rate"] = rnd.choice([0.0, 1.0, 0.5, rnd.random()])
    draw = rnd.random()
    if draw < 0.15:
        spec["acceptance_rates"] = [1.0] * positions
    elif draw < 0.3:
        spec["acceptance_rates"] = [0.0] * positions
    elif draw < 0.7:
        rates = sorted((rnd.random() for _ in range(positions)), reverse=True)
        spec["acceptance_rates"] = rates
    else:
        spec["mean_acceptance_length"] = rnd.uniform(1.0, positions + 1.0)
    if rnd.random() < 0.5:
        spec["proposer_step_ms"] = rnd.choice([0.0, 0.05, 0.3])
        spec["proposer_per_seq_us"] = rnd.choice([0.0, 2.5, 40.0])
    config["engine"]["decode" if disaggregated else "aggregated"]["speculative"] = spec
    return positions


def _per_pool_timing(rnd: random.Random, config: dict) -> None:
    """Timing keys of each active pool's own (``engine.<pool>.timing``), merged over the section."""
    pools = ("prefill", "decode") if config["engine"].get("mode") == "disaggregated" else ("aggregated",)
    timing = config["timing"]
    for name in pools:
        if rnd.random() < 0.2:
            continue  # this pool keeps the section's timing
        if timing["type"] == "fixed" and rnd.random() < 0.5:
            own = {"prefill_ms": rnd.choice([0.5, 3.0, 12.5]), "decode_ms": rnd.choice([0.0, 0.7, 4.0])}
        elif timing["type"] == "fixed":  # a fixed section: this pool linear (another GPU's coefficients)
            own = {"type": "linear", "base_ms": rnd.choice([0.0, 1.5]), "per_prefill_token_us": rnd.choice([5.0, 60.0]),
                   "per_decode_seq_us": rnd.choice([3.0, 90.0]), "per_kv_token_ns": rnd.choice([0.0, 25.0])}
        else:
            own = {"base_ms": rnd.choice([0.0, 0.25, 2.0]), "per_prefill_token_us": rnd.choice([4.0, 50.0]),
                   "per_kv_token_ns": rnd.choice([0.0, 80.0])}
            if rnd.random() < 0.5:
                own.update(decode_scale=rnd.choice([0.5, 1.7]), pass_overhead_us=rnd.choice([0.0, 300.0]))
        config["engine"][name]["timing"] = own


def _fixed_to_linear(rnd: random.Random, config: dict) -> None:
    """A fixed timing becomes a random linear one (features that need per-token terms)."""
    if config["timing"]["type"] == "fixed":
        config["timing"] = {
            "type": "linear",
            "base_ms": rnd.choice([0.0, 0.5]),
            "per_prefill_token_us": rnd.choice([10.0, 33.3]),
            "per_decode_seq_us": rnd.choice([20.0, 7.7]),
            "per_kv_token_ns": rnd.choice([0.0, 40.0]),
        }


def _random_curve_file(rnd: random.Random, directory: str, seed: int, tp: int) -> str:
    """A random all-reduce curve file (nccl-tests output or a Vidur all_reduce.csv).

    A few knots log-uniform over 1 B .. 2 MB (the scenarios' messages span
    about that), a size sometimes listed twice (its times are averaged), and in
    Vidur's layout rows of other worker counts that must be skipped.
    """
    knots = sorted(int(10 ** rnd.uniform(0.0, 6.3)) for _ in range(rnd.randint(1, 6)))
    if rnd.random() < 0.3:
        knots.append(rnd.choice(knots))
    # rising times (a falling end segment extended far enough would price a message below 0)
    start, slope = rnd.choice([0.0, rnd.uniform(1.0, 40.0)]), rnd.uniform(0.0, 2e-4)
    times = [start + k * slope * rnd.uniform(1.0, 1.05) ** i for i, k in enumerate(knots)]
    path = f"{directory}/allreduce-{seed}.csv"
    with open(path, "w", encoding="utf-8") as handle:
        if rnd.random() < 0.5:
            handle.write("# nccl-tests all_reduce_perf\n#  size count type redop root time algbw busbw #wrong\n")
            for size, time_us in zip(knots, times):
                handle.write(f"{size} {max(size // 2, 1)} half sum -1 {time_us!r} 1.0 1.0 0 {time_us!r} 1.0 1.0 0\n")
        else:  # Vidur: size in fp16 elements (2 bytes each), median in ms
            handle.write("size,num_workers,time_stats.all_reduce.median\n")
            for size, time_us in zip(knots, times):
                handle.write(f"{max(size // 2, 1)},{tp},{time_us / 1000.0!r}\n")
                handle.write(f"{max(size // 2, 1)},{tp * 2},{rnd.uniform(0.0, 1.0)!r}\n")
    return path


def _prefix_chained_hash_ids(rnd: random.Random, inputs: list[int], trace_block: int, long_shares: bool = False):
    """Mooncake-like hash_ids: each prompt follows one of a few shared block
    chains for a random number of leading blocks (``long_shares``: all but 0-2
    of its blocks), then gets fresh blocks."""
    chains = [[1000 * c + b for b in range(64)] for c in range(3)]
    fresh = 10**6
    out = []
    for n in inputs:
        blocks = -(-n // trace_block)
        chain = rnd.choice(chains)
        shared = max(0, blocks - rnd.randint(0, 2)) if long_shares else rnd.randint(0, blocks)
        ids = chain[:shared]
        for _ in range(blocks - shared):
            ids.append(fresh)
            fresh += 1
        out.append(ids)
    return out, trace_block


def run_fast(scenario: dict, record_passes: bool = True):
    """Run the numba path on a scenario; returns (EngineRun, RequestColumns, summary)."""
    cfg = load_config(scenario["config"])
    hash_ids = scenario.get("hash_ids")
    table = RequestTable(
        pa.array(scenario["ids"], type=pa.string()),
        np.array(scenario["inputs"], dtype=np.int64),
        np.array(scenario["outputs"], dtype=np.int64),
        hash_ids=None if hash_ids is None else pa.array(hash_ids, type=pa.list_(pa.int64())),
        acceptance_length=None if scenario.get("acceptance_length") is None
        else np.array(scenario["acceptance_length"], dtype=np.float64),
        priority=None if scenario.get("priority") is None else np.array(scenario["priority"], dtype=np.int64),
        predicted_output_tokens=None if scenario.get("predicted_output_tokens") is None
        else np.array(scenario["predicted_output_tokens"], dtype=np.int64),
        prompt_id=None if scenario.get("prompt_id") is None else np.array(scenario["prompt_id"], dtype=np.int64),
    )
    send = None if scenario["send_ns"] is None else np.array(scenario["send_ns"], dtype=np.int64)
    run = simulate_engine(cfg, table, send, record_passes=record_passes)
    cols = RequestColumns(run)
    return run, cols, summarize(cols, table.input_tokens, cfg.metrics)


def longest_steady_stretch(passes: list[dict]) -> int:
    """The most consecutive decode-only passes of one batch size in a pass log (reference shape)."""
    stretch, best, last = 0, 0, None
    for p in passes:
        shape = (p["num_prefill"], p["num_decode"])
        stretch = stretch + 1 if shape == last and p["num_prefill"] == 0 else 1
        best, last = max(best, stretch), shape
    return best


def fast_as_reference(run, cols) -> dict:
    """The numba results in the reference simulator's output shape."""

    def opt(value):
        return None if value == -1 else int(value)

    requests, tokens = [], []
    for k in range(run.generated.shape[0]):
        lo, hi = run.token_offset[k], run.token_offset[k] + run.generated[k]
        tokens.append([(int(e), opt(r)) for e, r in zip(run.token_emit_ns[lo:hi], run.token_recv_ns[lo:hi])])
        requests.append(
            {
                "status": STATUS_NAMES[cols.status[k]],
                "worker": opt(run.worker[k]),  # -1: a session turn never sent
                "rank": opt(run.rank[k]),
                "generated_tokens": int(run.generated[k]),
                "num_preemptions": int(run.num_preemptions[k]),
                "send_ns": opt(run.send_ns[k]),
                "arrival_ns": opt(run.arrival_ns[k]),
                "first_admit_ns": opt(run.first_admit_ns[k]),
                "first_emit_ns": opt(run.first_emit_ns[k]),
                "first_recv_ns": opt(cols.first_recv_ns[k]),
                "last_recv_ns": opt(cols.last_recv_ns[k]),
                "prefill_worker": opt(run.worker[k]) if run.disaggregated else None,
                "prefill_rank": opt(run.rank[k]) if run.disaggregated else None,
                "decode_worker": opt(run.decode_worker[k]),
                "decode_rank": opt(run.decode_rank[k]),
                "prompt_done_ns": opt(run.prompt_done_ns[k]),
                "transfer_start_ns": opt(run.prompt_done_ns[k]) if run.disaggregated else None,
                "transfer_end_ns": opt(run.transfer_end_ns[k]),
                "cached_tokens": opt(run.cached_tokens[k]) if run.first_admit_ns[k] >= 0 else None,
            }
        )
    passes = None
    if run.pass_log is not None:
        keys = ["worker", "rank", "start_ns", "end_ns", "num_prefill", "prefill_tokens", "prefill_kv_tokens", "num_decode", "decode_kv_tokens", "blocks_in_use"]
        passes = [
            dict(zip(keys, map(int, row)), rank_time_ms=float(ms), pool=POOL_NAMES[run.worker_role[row[0]]])
            for row, ms in zip(run.pass_log, run.pass_ms)
        ]
    return {"requests": requests, "tokens": tokens, "passes": passes}


def routing_scenario(seed: int, policy: str, disaggregated: bool = False, rank_policy: str | None = None,
                     decode_policy: str | None = None) -> dict:
    """A random scenario (:func:`random_scenario`) routed by ``policy`` over 2-4 receiving workers.

    ``prefix_aware`` turns prefix caching on (so does every fourth seed); the
    others cycle through the three scheduling policies, a fifth of the vllm
    ones with asynchronous scheduling.  ``rank_policy`` and
    ``decode_policy`` (P/D) are drawn when None; every pool has 1-3 ranks and
    the run seed is drawn (it seeds ``random`` and ``power_of_two``).  The
    extra draws come from their own generator, after the base scenario's.
    """
    prefix_caching = policy == "prefix_aware" or seed % 4 == 1
    scheduler = ("vllm", "sglang", "trtllm")[seed % 3]  # every policy caches prefixes
    scenario = random_scenario(
        seed, disaggregated=disaggregated, prefix_caching=prefix_caching, policy=scheduler,
        async_scheduling=scheduler == "vllm" and seed % 5 == 0,
    )
    rnd = random.Random(seed + 1_000_003)
    config = scenario["config"]
    engine = config["engine"]
    config["seed"] = rnd.randint(0, 10_000)
    engine["router"] = {"policy": policy}
    if policy == "prefix_aware" and rnd.random() < 0.5:
        engine["router"]["weights"] = {key: rnd.choice([0.0, 0.5, 1.0, 3.0]) for key in ("prefix", "queue", "kv_cache")}
    pools = ("prefill", "decode") if disaggregated else ("aggregated",)
    engine[pools[0]]["replicas"] = rnd.randint(2, 4)
    for name in pools:
        engine[name]["attention_dp"] = rnd.randint(1, 3)
        engine[name]["rank_policy"] = rank_policy or rnd.choice(["round_robin", "least_loaded"])
        if engine[name].get("chunked_prefill_size") is not None:  # sglang: a page per rank
            engine[name]["chunked_prefill_size"] = max(
                engine[name]["chunked_prefill_size"], engine[name]["block_size"] * engine[name]["attention_dp"]
            )
    if disaggregated:
        engine["decode"]["replicas"] = rnd.randint(1, 3)
        engine["decode_router"] = {
            "policy": decode_policy or rnd.choice(["round_robin", "random", "least_outstanding", "least_tokens",
                                                   "power_of_two"])
        }
    return scenario


def mooncake_runs(policy_pools: list[tuple[str, dict]]) -> list[tuple[object, object]]:
    """Run the first 60 requests of the packaged Mooncake sample (at 4x its pace,
    linear timing, tokens and passes recorded) once per ``(engine.policy,
    engine.aggregated)`` pair, in order.

    Returns
    -------
    list of (run, prepared)
        Each run's ``simcore.run`` result and the ``engine.api.prepare`` result it used.
    """
    prepared = []
    prepare = engine_api.prepare

    def prepare_noted(*args, **kwargs):
        prepared.append(prepare(*args, **kwargs))
        return prepared[-1]

    runs = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine_api, "prepare", prepare_noted)
        for policy, pool in policy_pools:
            config = {"workload": {"source": "mooncake", "path": str(MOONCAKE_SAMPLE), "num_requests": None,
                                   "max_requests": 60},
                      "load": {"type": "trace", "speedup": 4.0}, "timing": {"type": "linear"},
                      "engine": {"policy": policy, "aggregated": pool}, "output": {"tokens": True, "passes": True}}
            runs.append(simcore.run(config))
    return list(zip(runs, prepared))


def autoscale_scenario(seed: int) -> dict:
    """A random aggregated scenario (:func:`random_scenario`, the three scheduling policies in turn, a fifth
    of the vllm ones asynchronous) autoscaled over 2-4 replicas of 1-2 ranks (docs/autoscaling.md).

    The metric, its target, the interval (0.3-5 ms: several decisions over a
    scenario's sends), the startup (0-6 ms, some exactly an interval) and
    min_replicas are drawn, with a router that can skip replicas and a rank
    policy; the extra draws come from their own generator, after the base
    scenario's.  Prefix caching is off (not modelled with autoscaling).
    """
    scheduler = ("vllm", "sglang", "trtllm")[seed % 3]
    scenario = random_scenario(seed, policy=scheduler, async_scheduling=scheduler == "vllm" and seed % 5 == 0)
    rnd = random.Random(seed + 2_000_029)
    engine = scenario["config"]["engine"]
    pool = engine["aggregated"]
    pool["replicas"] = rnd.randint(2, 4)
    pool["attention_dp"] = rnd.randint(1, 2)
    pool["rank_policy"] = rnd.choice(["round_robin", "least_loaded"])
    if pool.get("chunked_prefill_size") is not None:  # sglang: a page per rank
        pool["chunked_prefill_size"] = max(pool["chunked_prefill_size"], pool["block_size"] * pool["attention_dp"])
    engine["router"] = {"policy": rnd.choice(["round_robin", "least_outstanding", "least_tokens"])}
    metric = rnd.choice(["outstanding", "kv_usage"])
    interval = rnd.choice([0.3, 1.0, 2.5, 5.0])
    engine["autoscale"] = {
        "metric": metric,
        "target": rnd.choice([0.5, 1.0, 2.0, 3.5]) if metric == "outstanding" else rnd.choice([0.05, 0.2, 0.5]),
        "interval_ms": interval,
        "min_replicas": rnd.randint(1, pool["replicas"]),
        "startup_ms": rnd.choice([0.0, interval, 0.7, 6.0]),
    }
    return scenario


def _scale_section(rnd: random.Random, replicas: int, metrics: tuple[str, ...]) -> dict:
    """One pool's ``engine.autoscale`` keys, drawn (docs/autoscaling.md)."""
    metric = rnd.choice(metrics)
    interval = rnd.choice([0.3, 1.0, 2.5, 5.0])
    target = {
        "outstanding": rnd.choice([0.5, 1.0, 2.0, 3.5]), "kv_usage": rnd.choice([0.05, 0.2, 0.5]),
        "ttft": rnd.choice([0.5, 2.0, 5.0, 20.0]), "itl": rnd.choice([0.5, 1.0, 1.5, 3.0]),
    }[metric]
    return {"metric": metric, "target": target, "interval_ms": interval, "min_replicas": rnd.randint(1, replicas),
            "startup_ms": rnd.choice([0.0, interval, 0.7, 6.0])}


def pd_autoscale_scenario(seed: int) -> dict:
    """A random scenario whose pools are autoscaled on any metric, latencies included (docs/autoscaling.md).

    Even seeds: P/D (:func:`random_scenario` disaggregated, the three
    scheduling policies in turn), 1-3 prefill and 1-3 decode replicas of 1-2
    ranks, each pool scaled on its own metric (or not: one pool in five stays
    fixed, never both).  Odd seeds: aggregated over 2-4 replicas on ``ttft`` or
    ``itl``.  Half of the seeds draw long outputs (many decode passes, many
    decisions); half the fixed timings get 6 ms prefills (inter-token gaps that
    rise and fall with the prompts in a pass, so that ``itl`` also drains).
    Routers that can skip replicas and rank policies are drawn; the
    extra draws come from their own generator, after the base scenario's.
    Prefix caching is off (not modelled with autoscaling).
    """
    scheduler = ("vllm", "sglang", "trtllm")[(seed // 2) % 3]
    disaggregated = seed % 2 == 0
    scenario = random_scenario(seed, disaggregated=disaggregated, policy=scheduler,
                               async_scheduling=scheduler == "vllm" and seed % 5 == 0, long_outputs=seed % 4 >= 2)
    rnd = random.Random(seed + 4_000_037)
    engine = scenario["config"]["engine"]
    routers = ["round_robin", "least_outstanding", "least_tokens"]
    names = ("prefill", "decode") if disaggregated else ("aggregated",)
    for name in names:
        pool = engine[name]
        pool["replicas"] = rnd.randint(1, 3) if disaggregated else rnd.randint(2, 4)
        pool["attention_dp"] = rnd.randint(1, 2)
        pool["rank_policy"] = rnd.choice(["round_robin", "least_loaded"])
        if pool.get("chunked_prefill_size") is not None:  # sglang: a page per rank
            pool["chunked_prefill_size"] = max(pool["chunked_prefill_size"], pool["block_size"] * pool["attention_dp"])
    engine["router"] = {"policy": rnd.choice(routers)}
    metrics = ("outstanding", "kv_usage", "ttft", "itl")
    if disaggregated:
        engine["decode_router"] = {"policy": rnd.choice(routers)}
        fixed = rnd.choice([None, None, None, "autoscale", "decode_autoscale"])
        for section, name in (("autoscale", "prefill"), ("decode_autoscale", "decode")):
            if section != fixed:
                engine[section] = _scale_section(rnd, engine[name]["replicas"], metrics)
    else:
        engine["autoscale"] = _scale_section(rnd, engine["aggregated"]["replicas"], ("ttft", "itl"))
    timing = scenario["config"]["timing"]
    if timing["type"] == "fixed" and rnd.random() < 0.5:  # long prefills: gaps far longer in mixed passes
        timing["prefill_ms"] = 6.0
    return scenario


def failure_scenario(seed: int) -> dict:
    """A random aggregated scenario (:func:`random_scenario`, the three scheduling policies in turn, a fifth
    of the vllm ones asynchronous) over 2-4 replicas of 1-2 ranks with worker failures (docs/failures.md).

    Fixed failures (0-3, over the first 15 ms), random ones (mean 2-20 ms
    between them) or both, a repair time, the client's action and retry rule
    are drawn, with a router that can skip workers and a rank policy; the
    extra draws come from their own generator, after the base scenario's.
    """
    scheduler = ("vllm", "sglang", "trtllm")[seed % 3]
    scenario = random_scenario(seed, policy=scheduler, async_scheduling=scheduler == "vllm" and seed % 5 == 0)
    rnd = random.Random(seed + 3_000_017)
    engine = scenario["config"]["engine"]
    pool = engine["aggregated"]
    pool["replicas"] = rnd.randint(2, 4)
    pool["attention_dp"] = rnd.randint(1, 2)
    pool["rank_policy"] = rnd.choice(["round_robin", "least_loaded"])
    if pool.get("chunked_prefill_size") is not None:  # sglang: a page per rank
        pool["chunked_prefill_size"] = max(pool["chunked_prefill_size"], pool["block_size"] * pool["attention_dp"])
    engine["router"] = {"policy": rnd.choice(["round_robin", "least_outstanding", "least_tokens"])}
    fixed = [[rnd.randrange(pool["replicas"]), rnd.choice([0.0, 1.0, rnd.uniform(0.0, 15.0)])]
             for _ in range(rnd.randint(0, 3))]
    mtbf = rnd.choice([None, 2.0, 5.0, 20.0]) if fixed else rnd.choice([2.0, 5.0, 20.0])
    engine["failures"] = {
        "at": fixed, "mtbf_ms": mtbf, "repair_ms": rnd.choice([0.001, 0.5, 3.0, 10.0]),
        "on_failure": rnd.choice(["retry", "retry", "reject"]), "max_retries": rnd.randint(0, 3),
        "retry_delay_ms": rnd.choice([0.0, 0.3, 1.0]), "max_retry_delay_ms": rnd.choice([1.0, 2.0]),
    }
    scenario["config"]["seed"] = rnd.randint(0, 10_000)
    return scenario
