"""Waiting-queue orders (engine.<pool>.queue_order, docs/semantics.md "Queue orders"):
hand-worked timelines for each order and for vLLM's priority preemption, the
priority column and classes, and the one-line errors.  The engine is compared
with the reference implementation in tests/test_against_reference.py
(``test_queue_orders_match_reference``)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

import simcore
from simcore.config import ConfigError, load_config

FIXED = {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0}


def run(requests: dict, pool: dict, policy: str = "vllm", **config) -> dict:
    """One rank under ``policy``, fixed timing (SPEC §8): 10 ms for a pass with a prefill
    (extend) entry, plus 2 ms if it has a decode entry; open loop from ``send_ms``."""
    table = pa.table(requests)
    cfg = {
        "load": {"type": "trace"},
        "workload": {"num_requests": table.num_rows},
        "engine": {"policy": policy, "aggregated": pool},
        "timing": FIXED,
        **config,
    }
    return simcore.run(cfg, requests=table).requests.to_pydict()


FOUR = {
    "request_id": ["a", "b", "c", "d"], "input_tokens": [4, 4, 4, 4], "output_tokens": [1, 1, 1, 1],
    "send_ms": [0.0, 0.0, 0.0, 0.0], "priority": [1, 0, 1, -1],
}


@pytest.mark.parametrize("order, ttft", [
    # A budget of 4 tokens: one prompt per pass of 10 ms, each emitting its only token.
    # FCFS: a, b, c, d.
    ("fcfs", [10.0, 20.0, 30.0, 40.0]),
    # priority: by (priority, entry instant): d (-1), b (0), then a and c (1, both entered
    # at 0: a entered first and stays first).
    ("priority", [30.0, 20.0, 40.0, 10.0]),
    # shortest_prompt: every prompt has 4 tokens, so the key ties and arrival order stays.
    ("shortest_prompt", [10.0, 20.0, 30.0, 40.0]),
])
def test_vllm_waiting_order(order, ttft):
    pool = {"num_blocks": 100, "block_size": 1, "max_batched_tokens": 4, "queue_order": order}
    out = run(FOUR, pool)
    assert out["ttft_ms"] == ttft
    assert out["num_preemptions"] == [0, 0, 0, 0]


def test_vllm_shortest_output_reads_the_predicted_column():
    # Predicted outputs 9, 3, 5, 1: d, b, c, a (the true outputs are all 1).
    requests = {**FOUR, "predicted_output_tokens": [9, 3, 5, 1]}
    del requests["priority"]
    pool = {"num_blocks": 100, "block_size": 1, "max_batched_tokens": 4, "queue_order": "shortest_output"}
    assert run(requests, pool)["ttft_ms"] == [40.0, 20.0, 30.0, 10.0]


@pytest.mark.parametrize("order, ttft, e2el", [
    # a (output 1), b (3), c (2), all 4-token prompts sent at 0; max_prefill_tokens 4: one
    # prompt per extend batch, and extend batches go first.  FCFS: extends a [0, 10],
    # b [10, 20], c [20, 30]; then decodes of b and c [30, 32] (c's last), b [32, 34].
    ("fcfs", [10.0, 20.0, 30.0], [10.0, 34.0, 32.0]),
    # lof (longest output first): b [0, 10], c [10, 20], a [20, 30]; then decodes of b
    # and c [30, 32] (c's last), b [32, 34].
    ("lof", [30.0, 10.0, 20.0], [30.0, 34.0, 32.0]),
    # shortest_prompt: equal prompts, arrival order kept.
    ("shortest_prompt", [10.0, 20.0, 30.0], [10.0, 34.0, 32.0]),
])
def test_sglang_waiting_order(order, ttft, e2el):
    requests = {"request_id": ["a", "b", "c"], "input_tokens": [4, 4, 4], "output_tokens": [1, 3, 2],
                "send_ms": [0.0, 0.0, 0.0]}
    pool = {"num_blocks": 1000, "block_size": 1, "max_prefill_tokens": 4, "queue_order": order}
    out = run(requests, pool, policy="sglang")
    assert out["ttft_ms"] == ttft
    assert out["e2el_ms"] == e2el


def _documented_uniform(key: int, g: int, c: int, i: int) -> float:
    """docs/semantics.md, SGLang random: (h >> 11) * 2^-53, h = mix(mix(mix(key + gG) + cG) + iG)."""
    mask, golden = (1 << 64) - 1, 0x9E3779B97F4A7C15

    def mix(x):
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)

    h = mix((mix((mix((key + g * golden) & mask) + c * golden) & mask) + i * golden) & mask)
    return (h >> 11) * 2.0**-53


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sglang_random_shuffles_before_each_extend_batch(seed):
    """Five 4-token prompts of one output token sent at 0, one prompt per extend batch of
    10 ms: before batch c (c = 0..4) the c-th shuffle of the requests still waiting
    (Fisher-Yates from the last position down), and its head runs."""
    names = ["a", "b", "c", "d", "e"]
    key = int(np.random.SeedSequence(seed, spawn_key=(5,)).generate_state(1, dtype=np.uint64)[0]) & (2**63 - 1)
    waiting, admitted = list(names), []
    for c in range(len(names)):
        for i in range(len(waiting) - 1, 0, -1):
            j = int(_documented_uniform(key, 0, c, i) * (i + 1))
            waiting[i], waiting[j] = waiting[j], waiting[i]
        admitted.append(waiting.pop(0))
    requests = {"request_id": names, "input_tokens": [4] * 5, "output_tokens": [1] * 5, "send_ms": [0.0] * 5}
    pool = {"num_blocks": 1000, "block_size": 1, "max_prefill_tokens": 4, "queue_order": "random"}
    out = run(requests, pool, policy="sglang", seed=seed)
    assert out["ttft_ms"] == [10.0 * (admitted.index(name) + 1) for name in names]


def test_priority_preempts_the_lowest_priority_request_itself():
    """b (priority 1, 3 + 3 tokens) at 0, a (priority 0, 3 + 3) at 5; 7 blocks of 1 token.

    [0, 10] prefills b; [10, 22] decodes b (4 blocks) and prefills a (3 blocks, 7 used).
    At 22 b needs a 5th block and none is free.  FCFS preempts the last running
    request, a: [22, 24] decodes b's last token; a is prefilled again with its
    output (3 + 1 tokens) [24, 34] and decodes [34, 36].  Priority preempts the
    lowest-priority request, b, which is the one being scheduled: the step ends
    with nothing scheduled, and the retry at 22 decodes a [22, 24] (b needs 3 + 2
    blocks, 3 are free: head of line) and [24, 26] (a's last); b is prefilled again
    (5 tokens) [26, 36] and emits its last token at 36.
    """
    requests = {"request_id": ["b", "a"], "input_tokens": [3, 3], "output_tokens": [3, 3],
                "send_ms": [0.0, 5.0], "priority": [1, 0]}
    pool = {"num_blocks": 7, "block_size": 1, "max_batched_tokens": 100}
    fcfs = run(requests, {**pool, "queue_order": "fcfs"})
    assert fcfs["ttft_ms"] == [10.0, 17.0]
    assert fcfs["e2el_ms"] == [24.0, 31.0]
    assert fcfs["num_preemptions"] == [0, 1]
    prio = run(requests, {**pool, "queue_order": "priority"})
    assert prio["ttft_ms"] == [10.0, 17.0]
    assert prio["e2el_ms"] == [36.0, 21.0]
    assert prio["num_preemptions"] == [1, 0]


def test_priority_preempts_a_request_scheduled_earlier_in_the_pass():
    """c (priority 1, 2 + 3 tokens) at 0, a (priority 0, 4 + 3) at 5; 4 blocks of 2 tokens.

    [0, 10] prefills c (1 block); [10, 22] decodes c (2 blocks) and prefills a (2
    blocks): 4 used.  At 22 c's next token fits its blocks and is scheduled; a's
    needs a 3rd block and none is free.  FCFS preempts a itself: [22, 24] decodes
    c's last token; a is prefilled again (4 + 1 tokens) [24, 34] and decodes [34, 36].
    Priority preempts c, already scheduled in this pass: it leaves the batch and
    frees its 2 blocks, and a takes its 3rd: [22, 24] and [24, 26] decode a (c needs
    2 blocks for 2 + 2 tokens, 1 is free: head of line); c is prefilled again (4
    tokens) [26, 36] and emits its last token at 36.
    """
    requests = {"request_id": ["c", "a"], "input_tokens": [2, 4], "output_tokens": [3, 3],
                "send_ms": [0.0, 5.0], "priority": [1, 0]}
    pool = {"num_blocks": 4, "block_size": 2, "max_batched_tokens": 100}
    fcfs = run(requests, {**pool, "queue_order": "fcfs"})
    assert fcfs["e2el_ms"] == [24.0, 31.0]
    assert fcfs["num_preemptions"] == [0, 1]
    prio = run(requests, {**pool, "queue_order": "priority"})
    assert prio["ttft_ms"] == [10.0, 17.0]
    assert prio["e2el_ms"] == [36.0, 21.0]
    assert prio["num_preemptions"] == [1, 0]


def test_priority_classes_are_drawn_from_their_own_stream():
    """Classes change neither the lengths nor the sends, and the same seed draws the same classes."""
    base = {"workload": {"num_requests": 40, "input_dist": "uniform", "input_tokens": 64, "range_ratio": 0.5},
            "load": {"type": "poisson", "request_rate": 50.0}, "timing": FIXED, "seed": 7}
    plain = simcore.run(base).requests
    classes = {**base, "workload": {**base["workload"], "priority_classes": [0, 1], "priority_weights": [1, 3]},
               "engine": {"aggregated": {"queue_order": "priority"}}}
    first = simcore.run(classes).requests
    assert first.column("input_tokens").equals(plain.column("input_tokens"))
    assert first.column("send_ms").equals(plain.column("send_ms"))
    assert simcore.run(classes).requests.equals(first)
    assert set(first.column("priority").to_pylist()) == {0, 1}  # reported in the request table
    assert plain.column("priority").null_count == plain.num_rows


def test_shortest_output_needs_the_column():
    pool = {"num_blocks": 100, "block_size": 1, "queue_order": "shortest_output"}
    with pytest.raises(ConfigError, match=r"^queue_order=shortest_output needs the request table's "
                                          r"predicted_output_tokens column$"):
        run({"input_tokens": [4], "output_tokens": [1], "send_ms": [0.0]}, pool)


@pytest.mark.parametrize("column, message", [
    ({"priority": [0, 1.5]}, r"^requests: priority must be an integer from -\d+ to \d+ at row 1, got 1\.5$"),
    ({"priority": ["x", "y"]}, r"^requests: column priority has type string, expected integers$"),
    ({"priority": [0, 2**62 + 1]}, r"^requests: priority must be an integer .* at row 1"),
    ({"predicted_output_tokens": [3, 0]}, r"^requests: predicted_output_tokens must be >= 1 at row 1, got 0$"),
])
def test_bad_columns_name_the_row(column, message):
    requests = {"input_tokens": [4, 4], "output_tokens": [1, 1], "send_ms": [0.0, 0.0], **column}
    with pytest.raises(ConfigError, match=message) as error:
        run(requests, {"queue_order": "priority"})
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("config, message", [
    ({"engine": {"aggregated": {"queue_order": "hrrn"}}},
     r"^engine\.aggregated\.queue_order must be one of fcfs, priority, lof, random, lpm, dfs-weight, "
     r"shortest_prompt, shortest_output; "
     r"got 'hrrn'$"),
    ({"engine": {"policy": "sglang", "aggregated": {"queue_order": "priority"}}},
     r"^engine\.aggregated\.queue_order=priority is modelled for engine\.policy=vllm only, got sglang$"),
    ({"engine": {"aggregated": {"queue_order": "lof"}}},
     r"^engine\.aggregated\.queue_order=lof is modelled for engine\.policy=sglang only, got vllm$"),
    ({"engine": {"policy": "trtllm", "aggregated": {"queue_order": "shortest_prompt"}}},
     r"^engine\.aggregated\.queue_order=shortest_prompt is modelled for engine\.policy=vllm or sglang only, "
     r"got trtllm$"),
    ({"engine": {"aggregated": {"queue_order": "priority", "async_scheduling": True}}},
     r"^engine\.aggregated\.queue_order=priority is not modelled with engine\.aggregated\.async_scheduling=true$"),
    ({"workload": {"priority_classes": [0, 1]}},
     r"^workload\.priority_classes has no effect here: it is only used with engine\.<pool>\.queue_order=priority"),
    ({"workload": {"priority_classes": [0, 0]}, "engine": {"aggregated": {"queue_order": "priority"}}},
     r"^workload\.priority_classes must not repeat a value"),
    ({"workload": {"priority_classes": [0.5]}, "engine": {"aggregated": {"queue_order": "priority"}}},
     r"^workload\.priority_classes values must be integers"),
    ({"workload": {"priority_classes": []}, "engine": {"aggregated": {"queue_order": "priority"}}},
     r"^workload\.priority_classes must not be empty"),
    ({"workload": {"priority_classes": [0, 1], "priority_weights": [1]},
      "engine": {"aggregated": {"queue_order": "priority"}}},
     r"^workload\.priority_weights must give one weight per class \(2\), got 1$"),
    ({"workload": {"priority_classes": [0, 1], "priority_weights": [1, 0]},
      "engine": {"aggregated": {"queue_order": "priority"}}},
     r"^workload\.priority_weights"),
    ({"workload": {"priority_weights": [1]}, "engine": {"aggregated": {"queue_order": "priority"}}},
     r"^workload\.priority_weights needs workload\.priority_classes"),
])
def test_bad_keys_name_the_key(config, message):
    with pytest.raises(ConfigError, match=message) as error:
        load_config(config)
    assert "\n" not in str(error.value)


def test_fcfs_is_the_default_bit_for_bit():
    cfg = {"workload": {"num_requests": 30, "input_dist": "uniform", "input_tokens": 300, "range_ratio": 0.1,
                        "output_tokens": 40},
           "load": {"type": "poisson", "request_rate": 400.0},
           "engine": {"aggregated": {"num_blocks": 60, "block_size": 8}}, "timing": FIXED}
    default = simcore.run(cfg).requests
    explicit = simcore.run({**cfg, "engine": {"aggregated": {**cfg["engine"]["aggregated"], "queue_order": "fcfs"}}})
    assert explicit.requests.equals(default)
    assert np.asarray(default.column("num_preemptions")).sum() > 0  # the case exercises preemption


def test_the_batch_path_runs_every_order_as_a_single_run():
    """run_batch stacks the configurations' queue orders, keys and shuffle keys along its configuration axis."""
    base = {"workload": {"num_requests": 40, "input_dist": "uniform", "input_tokens": 200, "range_ratio": 0.1,
                         "output_tokens": 30},
            "load": {"type": "poisson", "request_rate": 300.0},
            "engine": {"aggregated": {"num_blocks": 40, "block_size": 8, "max_sequences": 4}}, "timing": FIXED}
    configs = [
        base,
        {**base, "workload": {**base["workload"], "priority_classes": [0, 1, 2]},
         "engine": {"aggregated": {**base["engine"]["aggregated"], "queue_order": "priority"}}},
        {**base, "engine": {"aggregated": {**base["engine"]["aggregated"], "queue_order": "shortest_prompt"}}},
    ]
    sglang = {**base, "engine": {"policy": "sglang",
                                 "aggregated": {"num_blocks": 320, "block_size": 1, "max_sequences": 4}}}
    configs += [sglang] + [{**sglang, "engine": {"policy": "sglang", "aggregated": {
        **sglang["engine"]["aggregated"], "queue_order": order}}} for order in ("lof", "random")]
    batched = simcore.run_batch(configs)
    singles = [simcore.run(config) for config in configs]
    for one, many in zip(singles, batched):
        assert many.requests.equals(one.requests)
    assert not singles[1].requests.equals(singles[0].requests)  # the orders change something here
    assert not singles[5].requests.equals(singles[3].requests)


# ------------------------------------------------------------------ SGLang lpm


def run_trace(tmp_path, rows: list[dict], pool: dict, **config) -> dict:
    """SGLang on one rank, prefix caching on at 16 tokens per block, a Mooncake trace
    hashed at 16 tokens (one engine block per hash), fixed timing (10 ms an extend batch)."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = {
        "workload": {"source": "mooncake", "path": str(trace), "num_requests": None, "block_size": 16},
        "load": {"type": "trace"},
        "engine": {"policy": "sglang", "aggregated": {"num_blocks": 1000, "block_size": 16,
                                                      "prefix_caching": True, **pool}},
        "timing": FIXED,
        **config,
    }
    return simcore.run(cfg).requests.to_pydict()


def row(ms: float, hashes: list[int], output: int = 1) -> dict:
    return {"timestamp": ms, "input_length": 16 * len(hashes), "output_length": output, "hash_ids": hashes}


# r0 (64 tokens, blocks 1 2 3 4) runs alone in [0, 10] and finishes; its 64 + 1 - 1 tokens
# join the radix tree.  At 5 ms arrive r1 (5 6 7 8: no match), r2 (1 2 9 10: 2 blocks,
# 32 tokens) and r3 (1 2 3 11: 3 blocks, 48 tokens, the cap (64 - 1) // 16 = 3 blocks).
# One prompt per extend batch (max_prefill_tokens 16 is spent by any first admission).
BY_MATCH = [row(0, [1, 2, 3, 4]), row(5, [5, 6, 7, 8]), row(5, [1, 2, 9, 10]), row(5, [1, 2, 3, 11])]


@pytest.mark.parametrize("order, ttft", [
    # FCFS: r1 [10, 20], r2 [20, 30], r3 [30, 40]; TTFT from 5 ms.
    ("fcfs", [10.0, 15.0, 25.0, 35.0]),
    # lpm at 10 ms: keys r1 0, r2 -32, r3 -48 (r2's 32 tokens are not over the in-batch
    # check's 32, but r1 shares nothing with it): r3 [10, 20], r2 [20, 30], r1 [30, 40].
    ("lpm", [10.0, 35.0, 25.0, 15.0]),
])
def test_sglang_lpm_orders_by_the_radix_match(tmp_path, order, ttft):
    out = run_trace(tmp_path, BY_MATCH, {"max_prefill_tokens": 16, "queue_order": order})
    assert out["ttft_ms"] == ttft
    assert out["cached_tokens"] == [0, 0, 32, 48]


@pytest.mark.parametrize("shared, order, ttft, cached", [
    # r0 (one block, 100) runs in [0, 10].  At 5 ms arrive r1 (1 2 3 4), r3 (sharing its first
    # `shared` blocks with r1, then its own) and r2 (5 6 7 8): no cache match for any.
    # max_prefill_tokens 129: two 64-token prompts per extend batch (129 - 64 = 65 > 64, then 1).
    # FCFS: r1 and r3 [10, 20] (r3 recomputes the shared blocks), r2 [20, 30].
    (2, "fcfs", [10.0, 15.0, 15.0, 25.0], [0, 0, 0, 0]),
    # lpm at 10 ms: r1 joins the waiting-queue tree; r3 shares 2 x 16 = 32 tokens with it,
    # at least the 32 of the deprioritise threshold: key infinity; r2 joins.  r1 and r2
    # [10, 20]; at 20 ms r3 matches r1's first 2 blocks in the cache (32 tokens): [20, 30].
    (2, "lpm", [10.0, 15.0, 25.0, 15.0], [0, 0, 32, 0]),
    # One shared block, 16 tokens: under the threshold, r3 joins the tree; keys all 0, FCFS.
    (1, "lpm", [10.0, 15.0, 15.0, 25.0], [0, 0, 0, 0]),
])
def test_sglang_lpm_defers_a_request_sharing_a_prefix_with_one_before_it(tmp_path, shared, order, ttft, cached):
    own = [1, 2, 3, 4][:shared] + [20, 21, 22, 23][shared:]
    rows = [row(0, [100]), row(5, [1, 2, 3, 4]), row(5, own), row(5, [5, 6, 7, 8])]
    out = run_trace(tmp_path, rows, {"max_prefill_tokens": 129, "queue_order": order})
    assert out["ttft_ms"] == ttft
    assert out["cached_tokens"] == cached


@pytest.mark.parametrize("fillers, ttft", [
    # r0 (1 2 3 4) runs in [0, 10]; at 5 ms arrive the fillers (4 blocks each, all their own)
    # and last the target (1 2 3 9: 48 tokens matched once r0 is in the tree); one prompt
    # per extend batch.  127 fillers: 128 wait at 10 ms, lpm sorts, the target runs first,
    # [10, 20].
    (127, 15.0),
    # 128 fillers: 129 wait, more than 128: FCFS, the first filler runs [10, 20]; at 20 ms
    # 128 wait, lpm sorts and the target runs [20, 30].
    (128, 25.0),
])
def test_sglang_lpm_is_fcfs_with_more_than_128_waiting(tmp_path, fillers, ttft):
    rows = ([row(0, [1, 2, 3, 4])] + [row(5, [1000 + 4 * i + j for j in range(4)]) for i in range(fillers)]
            + [row(5, [1, 2, 3, 9])])
    out = run_trace(tmp_path, rows, {"max_prefill_tokens": 16, "queue_order": "lpm"})
    assert out["ttft_ms"][-1] == ttft
    assert out["cached_tokens"][-1] == 48


def test_sglang_lpm_is_deterministic_and_leaves_fcfs_unchanged(tmp_path):
    rows = [row(i // 3, [1 + i % 3, 2 + i % 5, 50 + i, 70 + i], output=1 + i % 4) for i in range(40)]
    pool = {"num_blocks": 24, "max_sequences": 6}
    lpm = [run_trace(tmp_path, rows, {**pool, "queue_order": "lpm"}) for _ in range(2)]
    assert lpm[0] == lpm[1]
    assert run_trace(tmp_path, rows, {**pool, "queue_order": "fcfs"}) == run_trace(tmp_path, rows, pool)


@pytest.mark.parametrize("config, message", [
    ({"engine": {"policy": "sglang", "aggregated": {"queue_order": "lpm"}}},
     r"^engine\.aggregated\.queue_order=lpm needs engine\.aggregated\.prefix_caching=true \(without the radix "
     r"cache SGLang runs it as fcfs\)$"),
    ({"engine": {"aggregated": {"queue_order": "lpm", "prefix_caching": True}}},
     r"^engine\.aggregated\.queue_order=lpm is modelled for engine\.policy=sglang only, got vllm$"),
    ({"engine": {"policy": "sglang", "mode": "disaggregated", "prefill": {"prefix_caching": True},
                 "decode": {"queue_order": "lpm"}}},
     r"^engine\.decode\.queue_order=lpm needs engine\.decode\.prefix_caching=true"),
])
def test_lpm_keys_name_the_key(config, message):
    with pytest.raises(ConfigError, match=message) as error:
        load_config(config)
    assert "\n" not in str(error.value)


def test_order_codes_agree_with_the_kernels():
    from simcore.scheduler import nb, policies

    for name in ("ORDER_FCFS", "ORDER_KEY_INSTANT", "ORDER_KEY_STABLE", "ORDER_RANDOM", "ORDER_LPM",
                 "ORDER_DFS_WEIGHT"):
        assert getattr(nb, name) == getattr(policies, name)


def test_the_batch_path_runs_lpm_as_a_single_run():
    """run_batch stacks lpm and dfs-weight configurations beside an fcfs one (shared 64-token prefixes, prefix caching)."""
    pool = {"num_blocks": 900, "block_size": 1, "max_sequences": 4, "prefix_caching": True}
    base = {"workload": {"num_requests": 60, "input_dist": "uniform", "input_tokens": 200, "range_ratio": 0.1,
                         "output_tokens": 30, "prefix_tokens": 64},
            "load": {"type": "poisson", "request_rate": 300.0},
            "engine": {"policy": "sglang", "aggregated": pool}, "timing": FIXED}
    configs = [base] + [{**base, "engine": {"policy": "sglang", "aggregated": {**pool, "queue_order": order}}}
                        for order in ("lpm", "dfs-weight")]
    batched = simcore.run_batch(configs)
    singles = [simcore.run(config) for config in configs]
    for one, many in zip(singles, batched):
        assert many.requests.equals(one.requests)
    assert not singles[1].requests.equals(singles[0].requests)  # lpm changes something here
    assert not singles[2].requests.equals(singles[0].requests)  # so does dfs-weight


# ------------------------------------------------------------------ SGLang dfs-weight
# The radix tree below is drawn with one node per run of 16-token blocks, named by its hashes;
# each 64-token prompt of one output token runs alone in an extend batch of 10 ms
# (max_prefill_tokens 16 is spent by any first admission) and joins the tree when it finishes
# (64 + 1 - 1 = 64 tokens, 4 blocks).  Before each extend batch dfs-weight matches every waiting
# request on its whole blocks, weighs each node by the waiting requests whose match ends in its
# subtree, and walks the tree depth first from the root: children by decreasing weight, equal
# weights in the order the node received them, a node's own requests after its subtrees.
#
# r0 (11 12 13 14) runs [0, 10] and joins the tree at 10; r1 (5 6 7 8) runs [10, 20] and joins
# at 20, so the root's children are A = 11.. (received at 10) then B = 5.. (at 20); the older
# child has the larger hashes, so an order by hash would differ.  At 15 ms arrive, in this order,
# a (5 6 30 31), b (11 12 40 41), c (50 51 52 53), d (11 12 13 60), e (5 6 7 70).
#
# 20 ms, queue a b c d e.  Matches: a 5 6 | b 11 12 | c none | d 11 12 13 | e 5 6 7.
#   root ── A 11 12 (own b) ── 13 (own d) ── 14
#        └─ B 5 6   (own a) ── 7  (own e) ── 8
#   Weights: A 2 (b, d), B 2 (a, e): tied, A first (received first).  Under A: 13's subtree
#   (d), then A's own b; under B: e, then a; then the root's own c.  Order d b e a c: d runs
#   [20, 30] (48 tokens cached), then joins the tree (11 12 13 60).
# 30 ms, queue b e a c.  Weights: A 1 (b), B 2 (e, a): B first: e, a, then b, c.  e runs
#   [30, 40] (48 cached).
# 40 ms, queue a b c.  Weights: A 1 (b), B 1 (a): tied, A first: b a c.  b runs [40, 50]
#   (32 cached).
# 50 ms, queue a c: a (B, weight 1) then the root's c: a runs [50, 60] (32 cached), c [60, 70].
# TTFT from 15 ms: a 45, b 35, c 55, d 15, e 25.
# FCFS: a [20, 30], b [30, 40], c [40, 50], d [50, 60], e [60, 70].
# lpm at 20 ms: keys a -32, b -32, c 0, d -48, e -48 (a, b and c, at most 32 tokens matched,
# share no 32 tokens with one another): d e a b c; d [20, 30], e [30, 40]; at 40 ms a b c (keys
# -32, -32, 0, kept in that order): a [40, 50], b [50, 60], c [60, 70].
DFS_TREE = [row(0, [11, 12, 13, 14]), row(0, [5, 6, 7, 8]), row(15, [5, 6, 30, 31]), row(15, [11, 12, 40, 41]),
            row(15, [50, 51, 52, 53]), row(15, [11, 12, 13, 60]), row(15, [5, 6, 7, 70])]


@pytest.mark.parametrize("order, ttft", [
    ("dfs-weight", [10.0, 20.0, 45.0, 35.0, 55.0, 15.0, 25.0]),
    ("fcfs", [10.0, 20.0, 15.0, 25.0, 35.0, 45.0, 55.0]),
    ("lpm", [10.0, 20.0, 35.0, 45.0, 55.0, 15.0, 25.0]),
])
def test_sglang_dfs_weight_walks_the_radix_tree(tmp_path, order, ttft):
    out = run_trace(tmp_path, DFS_TREE, {"max_prefill_tokens": 16, "queue_order": order})
    assert out["ttft_ms"] == ttft
    assert out["cached_tokens"] == [0, 0, 32, 32, 0, 48, 48]


@pytest.mark.parametrize("order, ttft", [
    # r0 (1 2 3 4) runs [0, 10] and joins the tree.  At 5 ms arrive y (1 2 3 99) then x (1 2 3 4).
    # dfs-weight matches x on all 4 of its blocks (SGLang matches origin_input_ids + output_ids:
    # the cap at 64 - 1 tokens applies to the hit count, not to last_node): x's match ends at
    # block 4, a child of y's node 1 2 3, so x (that node's subtree) goes before y (its own):
    # x [10, 20], y [20, 30].
    ("dfs-weight", [10.0, 25.0, 15.0]),
    # lpm: both keys -48 (3 blocks, the cap), the sort is stable: y, x.
    ("lpm", [10.0, 15.0, 25.0]),
])
def test_sglang_dfs_weight_matches_the_whole_prompt(tmp_path, order, ttft):
    rows = [row(0, [1, 2, 3, 4]), row(5, [1, 2, 3, 99]), row(5, [1, 2, 3, 4])]
    out = run_trace(tmp_path, rows, {"max_prefill_tokens": 16, "queue_order": order})
    assert out["ttft_ms"] == ttft
    assert out["cached_tokens"] == [0, 48, 48]  # admission's match is capped at 63 tokens


@pytest.mark.parametrize("order, ttft", [
    # r0 (1 2 3 4) runs [0, 10]; at 5 ms arrive 128 fillers (their own hashes) and last the target
    # (1 2 3 9).  At 10 ms 129 wait.  dfs-weight has no cut-off by queue length: the target's match
    # ends under node 1 2 3 4 (weight 1), the fillers' at the root, after it: the target runs
    # [10, 20].  lpm turns FCFS above 128: the first filler runs [10, 20], the target [20, 30].
    ("dfs-weight", 15.0),
    ("lpm", 25.0),
])
def test_sglang_dfs_weight_has_no_queue_length_cut_off(tmp_path, order, ttft):
    rows = ([row(0, [1, 2, 3, 4])] + [row(5, [1000 + 4 * i + j for j in range(4)]) for i in range(128)]
            + [row(5, [1, 2, 3, 9])])
    out = run_trace(tmp_path, rows, {"max_prefill_tokens": 16, "queue_order": order})
    assert out["ttft_ms"][-1] == ttft
    assert out["cached_tokens"][-1] == 48


def test_sglang_dfs_weight_is_deterministic(tmp_path):
    # prefix-chained: the second hash stands for the first too
    rows = [row(i // 3, [1 + i % 3, 10 * (1 + i % 3) + i % 5, 100 + i, 200 + i], output=1 + i % 4) for i in range(40)]
    pool = {"num_blocks": 24, "max_sequences": 6, "queue_order": "dfs-weight"}
    runs = [run_trace(tmp_path, rows, pool) for _ in range(2)]
    assert runs[0] == runs[1]


@pytest.mark.parametrize("config, message", [
    ({"engine": {"policy": "sglang", "aggregated": {"queue_order": "dfs-weight"}}},
     r"^engine\.aggregated\.queue_order=dfs-weight needs engine\.aggregated\.prefix_caching=true \(without the "
     r"radix cache SGLang runs it as fcfs\)$"),
    ({"engine": {"aggregated": {"queue_order": "dfs-weight", "prefix_caching": True}}},
     r"^engine\.aggregated\.queue_order=dfs-weight is modelled for engine\.policy=sglang only, got vllm$"),
])
def test_dfs_weight_keys_name_the_key(config, message):
    with pytest.raises(ConfigError, match=message) as error:
        load_config(config)
    assert "\n" not in str(error.value)


def test_dfs_weight_needs_the_node_tree(tmp_path):
    """Hash 1 at two positions: not prefix-chained, the radix cache runs a node per block, whose
    children keep no insertion order: refused, naming the key."""
    rows = [row(0, [1, 2]), row(0, [2, 1])]
    with pytest.raises(ConfigError, match=r"^engine\.aggregated\.queue_order=dfs-weight needs a radix cache "
                                          r"that runs as a node tree") as error:
        run_trace(tmp_path, rows, {"queue_order": "dfs-weight"})
    assert "\n" not in str(error.value)
