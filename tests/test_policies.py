"""Hand-worked cases of the sglang and trtllm policies (docs/policies.md), with
the arithmetic in the test, and their conservation properties."""

from __future__ import annotations

import pyarrow as pa
import pytest

import simcore
from simcore.config import ConfigError

FIXED = {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0}


def run(policy: str, rows: list[tuple], pool: dict, **extra):
    table = pa.table(
        {
            "request_id": [r[0] for r in rows],
            "input_tokens": [r[1] for r in rows],
            "output_tokens": [r[2] for r in rows],
            "send_ms": [float(r[3]) for r in rows],
        }
    )
    config = {"load": {"type": "trace"}, "timing": FIXED, "engine": {"policy": policy, "aggregated": pool}, "output": {"tokens": True}, **extra}
    result = simcore.run(config, requests=table)
    rows_by_id = {row["request_id"]: row for row in result.requests.to_pylist()}
    received = {}
    for tok in result.tokens.to_pylist():
        received.setdefault(tok["request_id"], []).append(tok["received_ms"])
    return rows_by_id, received


def test_trtllm_admits_only_what_fits_to_completion():
    # block_size 4, 6 blocks (L = 24). Footprints: a = ceil((8+8)/4) = 4, b = c = ceil(8/4) = 2.
    # t=0: a admitted (4 <= 6); promised P = 4 - 2 held = 2. b: 2 <= 6 - 2 used - 2 = 2, admitted,
    # P = 2 + (2 - 1) = 3. c: 2 > 6 - 3 - 3 = 0: waits (FIFO stop).
    # b emits at 10, 12, 14, 16 and finishes; at 16 a holds ceil(11/4) = 3 blocks, P = 4 - 3 = 1,
    # so c fits (2 <= 6 - 3 - 1) and is admitted at 16. Pass [16, 28] has a's decode and c's
    # prefill (fixed: 10 + 2 ms): c's first token at 28.
    pool = {"block_size": 4, "num_blocks": 6, "max_batched_tokens": 64}
    rows, received = run("trtllm", [("a", 8, 8, 0), ("b", 4, 4, 0), ("c", 4, 4, 0)], pool)
    assert rows["c"]["first_admit_ms"] == 16.0 and rows["c"]["first_token_ms"] == 28.0
    assert received["a"] == [10.0, 12.0, 14.0, 16.0, 28.0, 30.0, 32.0, 34.0]
    assert received["b"] == [10.0, 12.0, 14.0, 16.0]
    assert all(row["num_preemptions"] == 0 for row in rows.values())


def test_vllm_admits_the_same_requests_at_once_and_preempts():
    # Same cache under vllm: all three prompts fit at t=0 (2 + 1 + 1 blocks). At 10 a and b
    # grow by a block each (6 in use); c needs one more: none free, c (the last) is preempted.
    pool = {"block_size": 4, "num_blocks": 6, "max_batched_tokens": 64}
    rows, _ = run("vllm", [("a", 8, 8, 0), ("b", 4, 4, 0), ("c", 4, 4, 0)], pool)
    assert rows["c"]["first_admit_ms"] == 0.0 and rows["c"]["num_preemptions"] >= 1


def test_sglang_prefill_passes_do_not_decode_running_requests():
    # a (4 tokens) prefills in [0, 10]: first token at 10 (no extra decode step). b arrives at
    # 5; at 10 it can be admitted, so the pass [10, 20] is a pure extend of b: b's token at 20,
    # and a does not decode in it. Then decode passes of 2 ms: a at 22, 24.
    pool = {"num_blocks": 1000}
    rows, received = run("sglang", [("a", 4, 3, 0), ("b", 4, 1, 5)], pool)
    assert received["a"] == [10.0, 22.0, 24.0]
    assert received["b"] == [20.0] and rows["b"]["ttft_ms"] == 15.0
    # vllm mixes them: a's decode and b's prefill share [10, 22] (10 + 2 ms).
    _, mixed = run("vllm", [("a", 4, 3, 0), ("b", 4, 1, 5)], {})
    assert mixed["b"] == [22.0]


def test_sglang_chunked_prefill_and_budgets():
    # chunked_prefill_size 8, block (page) size 1. t=0: a needs 12 > 8: a page-aligned chunk of
    # 8 closes the batch (b waits). t=10: a's remaining 4 come first (rem_chunk 8 - 4 = 4),
    # then b (4 <= 4) fits whole: pass [10, 20] completes both prompts, both tokens at 20.
    # Then one decode pass [20, 22]: the second tokens.
    pool = {"num_blocks": 1000, "chunked_prefill_size": 8}
    rows, received = run("sglang", [("a", 12, 2, 0), ("b", 4, 2, 0)], pool)
    assert received == {"a": [20.0, 22.0], "b": [20.0, 22.0]}
    assert rows["a"]["first_admit_ms"] == 0.0 and rows["b"]["first_admit_ms"] == 10.0


def test_sglang_output_reservation_holds_back_admission():
    # 20 one-token pages. a: need 4 + reserve 10 = 14 on an empty rank: admitted;
    # rem_total = 20 - 14 = 6 and b (14 >= 6) waits. While a decodes, rem_total =
    # free (17 - g) - (10 - g) x ratio stays below 14, so b waits until a finishes
    # (its 10th token at 10 + 9 x 2 = 28): b's prefill [28, 38].
    pool = {"num_blocks": 20}
    rows, received = run("sglang", [("a", 4, 10, 0), ("b", 4, 10, 0)], pool)
    assert received["a"][-1] == 28.0
    assert rows["b"]["first_admit_ms"] == 28.0 and rows["b"]["first_token_ms"] == 38.0


@pytest.mark.parametrize(
    "policy, key, value",
    [("sglang", "max_batched_tokens", 4096), ("vllm", "chunked_prefill_size", 4096), ("trtllm", "max_prefill_tokens", 100), ("vllm", "schedule_conservativeness", 0.5)],
)
def test_a_key_the_policy_does_not_use_is_rejected(policy, key, value):
    with pytest.raises(ConfigError, match=rf"engine.aggregated.{key} is not used by engine.policy={policy}"):
        simcore.load_config({"engine": {"policy": policy, "aggregated": {key: value}}})


@pytest.mark.parametrize("policy", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_every_policy_conserves_tokens_and_blocks(policy, mode):
    engine = {"policy": policy, "mode": mode}
    pools = ["aggregated"] if mode == "aggregated" else ["prefill", "decode"]
    for name in pools:
        engine[name] = {"replicas": 2, "attention_dp": 2, "num_blocks": 3000 if policy != "trtllm" else 200}
        if policy == "sglang":
            engine[name]["num_blocks"] = 6000
    config = {
        "workload": {"num_requests": 300, "input_tokens": 512, "output_tokens": 64, "input_dist": "uniform", "range_ratio": 0.2},
        "load": {"type": "closed_loop", "concurrency": 96},
        "engine": engine,
        "detokenization": {"workers": 2, "base_ms": 2.85, "per_output_us": 61.6},
        "output": {"passes": True, "tokens": True},
    }
    result = simcore.run(config)
    s = result.summary
    assert s["completed"] == 300 and s["total_output_tokens"] == 300 * 64
    assert result.tokens.num_rows == 300 * 64 and result.tokens.column("received_ms").null_count == 0
    blocks = result.passes.column("blocks_in_use").to_pylist()
    capacity = {name: engine[name]["num_blocks"] for name in pools}
    pools_of_rows = result.passes.column("pool").to_pylist()
    assert all(b <= capacity[p] for b, p in zip(blocks, pools_of_rows))
    if policy == "trtllm":
        assert sum(result.requests.column("num_preemptions").to_pylist()) == 0
