"""Self-checks of the pure-Python reference (tests/reference) on hand-worked cases.

Every expected number below is worked out by hand from SPEC.md in the comments.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from simcore.config import merge_config  # noqa: E402
from tests.reference.metrics import percentile, percentile_key, summarize  # noqa: E402
from tests.reference.sim import fnv1a64, simulate  # noqa: E402

MS = 1_000_000  # ns per ms


def make_config(**sections):
    """DEFAULTS with the given sections merged in (nested dicts)."""
    return merge_config(sections)


def fixed(prefill_ms, decode_ms):
    return {"type": "fixed", "prefill_ms": prefill_ms, "decode_ms": decode_ms}


def run(config, inputs, outputs, send_ns=None, ids=None):
    ids = ids if ids is not None else [f"r{k}" for k in range(len(inputs))]
    return simulate(config, ids, inputs, outputs, send_ns)


def emits(result, row):
    return [e for e, _ in result["tokens"][row]]


def recvs(result, row):
    return [r for _, r in result["tokens"][row]]


# ---------------------------------------------------------------- helpers


def test_fnv1a64_known_vectors():
    assert fnv1a64("") == 0xCBF29CE484222325
    assert fnv1a64("a") == 0xAF63DC4C8601EC8C
    assert fnv1a64("foobar") == 0x85944171F73967E8


def test_percentile_matches_numpy_linear():
    rng = random.Random(1)
    for n in (1, 2, 3, 7, 50):
        xs = sorted(rng.uniform(0, 100) for _ in range(n))
        for p in (0, 1, 25, 50, 90, 95, 99, 99.9, 100):
            assert percentile(xs, p) == float(np.percentile(xs, p))
    assert percentile_key(99) == "p99"
    assert percentile_key(99.0) == "p99"
    assert percentile_key(99.9) == "p99.9"


# ---------------------------------------------------------------- engine


def test_lone_request_fixed_timing():
    # input 100, output 3, fixed 30 ms prefill / 8 ms decode, closed loop C=1.
    # pass 1 [0, 30]: prefill n=100 -> computed 100 == known 100 -> token 0 @ 30 ms
    # pass 2 [30, 38]: decode n=1 (computed 100 >= 99) -> token 1 @ 38 ms
    # pass 3 [38, 46]: decode -> token 2 @ 46 ms, generated 3 == output -> finish.
    cfg = make_config(load={"concurrency": 1}, timing=fixed(30.0, 8.0))
    res = run(cfg, [100], [3])
    req = res["requests"][0]
    assert req["status"] == "completed"
    assert (req["worker"], req["rank"]) == (0, 0)
    assert req["send_ns"] == 0 and req["arrival_ns"] == 0 and req["first_admit_ns"] == 0
    assert emits(res, 0) == [30 * MS, 38 * MS, 46 * MS]
    assert recvs(res, 0) == [30 * MS, 38 * MS, 46 * MS]
    assert req["first_emit_ns"] == req["first_recv_ns"] == 30 * MS
    assert req["last_recv_ns"] == req["end_ns"] == 46 * MS
    passes = res["passes"]
    assert [(p["start_ns"], p["end_ns"]) for p in passes] == [
        (0, 30 * MS), (30 * MS, 38 * MS), (38 * MS, 46 * MS)]
    assert [(p["num_prefill"], p["prefill_tokens"], p["prefill_kv_tokens"]) for p in passes] == [
        (1, 100, 100), (0, 0, 0), (0, 0, 0)]
    assert [(p["num_decode"], p["decode_kv_tokens"]) for p in passes] == [
        (0, 0), (1, 101), (1, 102)]
    # block_size 16: ceil(100/16) = ceil(101/16) = ceil(102/16) = 7
    assert [p["blocks_in_use"] for p in passes] == [7, 7, 7]
    assert [p["rank_time_ms"] for p in passes] == [30.0, 8.0, 8.0]

    s = summarize(res, [100], [3], [50, 99.9], {"ttft_ms": None, "tpot_ms": None,
                                                "e2el_ms": None}, None)
    assert s["completed"] == 1 and s["rejected"] == 0 and s["incomplete"] == 0
    assert s["duration_s"] == 0.046
    assert s["mean_ttft_ms"] == 30.0 and s["mean_e2el_ms"] == 46.0
    assert s["mean_tpot_ms"] == 8.0  # (46 - 30) / (3 - 1)
    assert s["p50_itl_ms"] == 8.0 and s["p99.9_itl_ms"] == 8.0 and s["std_itl_ms"] == 0.0
    assert s["total_input_tokens"] == 100 and s["total_output_tokens"] == 3
    assert s["request_goodput"] is None
    assert s["mean_prefill_ms"] == 30.0 and s["mean_queue_ms"] == 0.0
    assert s["mean_detokenization_ms"] == 0.0 and s["mean_transfer_ms"] == 0.0


def test_linear_timing_two_ranks_max():
    # W=1, R=2: row 0 -> rank 0, row 1 -> rank 1 (k div W mod R).
    # rank 0: 5 + 30*100/1000 + 0 + 40*100/1e6 = 8.004 ms
    # rank 1: 5 + 30*200/1000 + 0 + 40*200/1e6 = 11.008 ms -> pass lasts 11.008 ms
    cfg = make_config(engine={"aggregated": {"attention_dp": 2}},
                      load={"type": "trace"})
    res = run(cfg, [100, 200], [1, 1], send_ns=[0, 0])
    assert [r["rank"] for r in res["requests"]] == [0, 1]
    assert emits(res, 0) == emits(res, 1) == [11_008_000]
    assert [p["rank_time_ms"] for p in res["passes"]] == [
        5.0 + 30.0 * 100 / 1000 + 20.0 * 0 / 1000 + 40.0 * 100 / 1e6,
        5.0 + 30.0 * 200 / 1000 + 20.0 * 0 / 1000 + 40.0 * 200 / 1e6]
    assert all(r["status"] == "completed" for r in res["requests"])


def test_two_requests_share_one_detokenizer_server():
    # One detok server, service = 1 + 500*k/1000 ms. Both sent at 0, input 10, output 2,
    # fixed 10 ms prefill / 1 ms decode.
    # pass 1 [0, 10]: both prefill -> tokens 0 @ 10; job k=2: 2 ms -> [10, 12]
    # pass 2 [10, 11]: both decode -> tokens 1 @ 11; job k=2 waits: [max(11,12)=12, 14]
    cfg = make_config(load={"type": "trace"}, timing=fixed(10.0, 1.0),
                      detokenization={"workers": 1, "base_ms": 1.0, "per_output_us": 500.0})
    res = run(cfg, [10, 10], [2, 2], send_ns=[0, 0])
    for row in (0, 1):
        assert emits(res, row) == [10 * MS, 11 * MS]
        assert recvs(res, row) == [12 * MS, 14 * MS]
        r = res["requests"][row]
        assert r["status"] == "completed" and r["end_ns"] == 14 * MS
    s = summarize(res, [10, 10], [2, 2], [50], {"ttft_ms": 12.0, "tpot_ms": 1.5,
                                               "e2el_ms": None}, None)
    assert s["mean_ttft_ms"] == 12.0 and s["mean_tpot_ms"] == 2.0
    assert s["request_goodput"] == 0.0  # tpot 2 > 1.5
    assert s["mean_detokenization_ms"] == 2.0  # 12 - 10
    assert s["duration_s"] == 0.014 and s["request_throughput"] == 2 / 0.014


def test_detok_chunks_and_first_final_costs():
    # Same as above but chunk_size=1 and per-token first/final costs:
    # service = 1 + 0 + 1000*n_first/1000 + 2000*n_final/1000 ms, one token per job.
    # pass 1 ends 10: job(r0 t0) 2 ms -> [10,12]; job(r1 t0) 2 ms -> [12,14]
    # pass 2 ends 11: job(r0 t1, final) 3 ms -> [14,17]; job(r1 t1) 3 ms -> [17,20]
    cfg = make_config(load={"type": "trace"}, timing=fixed(10.0, 1.0),
                      detokenization={"workers": 1, "base_ms": 1.0, "chunk_size": 1,
                                      "first_output_us": 1000.0, "final_output_us": 2000.0})
    res = run(cfg, [10, 10], [2, 2], send_ns=[0, 0])
    assert recvs(res, 0) == [12 * MS, 17 * MS]
    assert recvs(res, 1) == [14 * MS, 20 * MS]


def test_tokenization_fifo():
    # one tokenizer server, service = 1 + 10*100/1000 = 2 ms; both sent at 0
    # -> arrivals at 2 and 4 ms (FIFO). fixed 10/1 ms, output 1.
    cfg = make_config(load={"type": "trace"}, timing=fixed(10.0, 1.0),
                      tokenization={"workers": 1, "base_ms": 1.0, "per_input_us": 10.0})
    res = run(cfg, [100, 100], [1, 1], send_ns=[0, 0])
    a, b = res["requests"]
    assert (a["arrival_ns"], b["arrival_ns"]) == (2 * MS, 4 * MS)
    # row 0 runs [2, 12]; row 1 arrives during it and runs [12, 22]
    assert a["first_admit_ns"] == 2 * MS and b["first_admit_ns"] == 12 * MS
    assert emits(res, 0) == [12 * MS] and emits(res, 1) == [22 * MS]


def test_rejection_and_closed_loop_replacement():
    # L = min(50, 26000*16) = 50; row 0 input 60 >= 50 -> rejected at 0, ends at client
    # at 0 -> row 1 sent at 0 + think 2 ms; row 1 runs [2, 12] (fixed 10 ms prefill),
    # output 1 -> ends 12 ms -> row 2 sent at 14 ms.
    cfg = make_config(load={"concurrency": 1, "think_time_ms": 2.0}, timing=fixed(10.0, 1.0),
                      engine={"aggregated": {"context_length": 50}})
    res = run(cfg, [60, 20, 20], [1, 1, 1])
    r0, r1, r2 = res["requests"]
    assert r0["status"] == "rejected" and r0["end_ns"] == 0 and r0["arrival_ns"] == 0
    assert res["tokens"][0] == []
    assert r1["send_ns"] == 2 * MS and r1["end_ns"] == 12 * MS
    assert r2["send_ns"] == 14 * MS and r2["end_ns"] == 24 * MS
    s = summarize(res, [60, 20, 20], [1, 1, 1], [50], {"ttft_ms": None, "tpot_ms": None,
                                                      "e2el_ms": None}, None)
    assert s["rejected"] == 1 and s["completed"] == 2
    assert s["duration_s"] == 0.024  # last final receipt 24 ms - first send 0
    assert s["mean_tpot_ms"] is None and s["p50_itl_ms"] is None


def test_rejected_replacement_joins_pass_at_same_instant():
    # think 0: the replacement of a request rejected at 0 is sent, arrives and is
    # admitted at 0 (SPEC §5 equal-time order).
    cfg = make_config(load={"concurrency": 1}, timing=fixed(10.0, 1.0),
                      engine={"aggregated": {"context_length": 50}})
    res = run(cfg, [60, 20], [1, 1])
    assert res["requests"][1]["send_ns"] == 0
    assert res["requests"][1]["first_admit_ns"] == 0
    assert emits(res, 1) == [10 * MS]


def test_preemption_and_head_of_line_blocking():
    # block_size 4, num_blocks 5 (L = 20); A (row 0), B (row 1): input 8, output 10.
    # pass 1 [0,10]: A n=8 (2 blocks), B n=8 (2 blocks) -> both token 0 @ 10.
    # pass 2 @10: A n=1 -> 3 blocks (used 5); B n=1 needs 3 -> 6 > 5 -> preempt last = B
    #   itself (computed 0, blocks freed -> used 3), step 2 skipped. A decodes -> 11.
    # passes @11..18: B needs 9 tokens = 3 blocks, never fits beside A (3-4 blocks):
    #   head-of-line blocked. A's tokens 1..9 @ 11..19 ms; A finishes @ 19 (10 tokens).
    # pass @19: B re-admitted with n = 9 (prefill, kv 9) -> 10 ms -> token 1 @ 29,
    #   then tokens 2..9 @ 30..37 ms.
    cfg = make_config(load={"type": "trace"}, timing=fixed(10.0, 1.0),
                      engine={"aggregated": {"block_size": 4, "num_blocks": 5}})
    res = run(cfg, [8, 8], [10, 10], send_ns=[0, 0])
    a, b = res["requests"]
    assert emits(res, 0) == [10 * MS] + [(10 + k) * MS for k in range(1, 10)]
    assert emits(res, 1) == [10 * MS] + [29 * MS] + [(28 + k) * MS for k in range(2, 10)]
    assert (a["num_preemptions"], b["num_preemptions"]) == (0, 1)
    assert b["first_admit_ns"] == 0 and b["first_emit_ns"] == 10 * MS
    p19 = [p for p in res["passes"] if p["start_ns"] == 19 * MS]
    assert len(p19) == 1
    assert (p19[0]["num_prefill"], p19[0]["prefill_tokens"], p19[0]["prefill_kv_tokens"]) == (1, 9, 9)
    assert p19[0]["blocks_in_use"] == 3
    p10 = [p for p in res["passes"] if p["start_ns"] == 10 * MS][0]
    assert (p10["num_decode"], p10["decode_kv_tokens"], p10["blocks_in_use"]) == (1, 9, 3)
    assert all(r["status"] == "completed" for r in res["requests"])


def test_truncation_at_sequence_limit():
    # L = min(12, ...) = 12; input 10, output 5: token 0 @ prefill end (10 ms) makes
    # input + generated = 11 < 12; token 1 @ 11 ms makes 12 >= 12 -> finished, truncated.
    cfg = make_config(load={"concurrency": 1}, timing=fixed(10.0, 1.0),
                      engine={"aggregated": {"context_length": 12}})
    res = run(cfg, [10], [5])
    r = res["requests"][0]
    assert r["status"] == "completed" and r["generated_tokens"] == 2
    assert emits(res, 0) == [10 * MS, 11 * MS]


def test_time_cap():
    # lone request of test_lone_request_fixed_timing with a detok stage of 5 ms per job
    # and the cap at 40 ms: passes end 30, 38 (kept); the pass [38, 46] never ends.
    # receipts: 35 (kept), 43 (> cap -> None).
    cfg = make_config(load={"concurrency": 1}, timing=fixed(30.0, 8.0), max_time_ms=40.0,
                      detokenization={"base_ms": 5.0})
    res = run(cfg, [100], [3])
    r = res["requests"][0]
    assert r["status"] == "incomplete"
    assert r["generated_tokens"] == 2
    assert res["tokens"][0] == [(30 * MS, 35 * MS), (38 * MS, None)]
    assert r["first_recv_ns"] == r["last_recv_ns"] == 35 * MS and r["end_ns"] is None
    assert [p["end_ns"] for p in res["passes"]] == [30 * MS, 38 * MS]
    s = summarize(res, [100], [3], [50], {"ttft_ms": None, "tpot_ms": None,
                                         "e2el_ms": None}, 40 * MS)
    assert s["completed"] == 0 and s["incomplete"] == 1
    assert s["duration_s"] is None and s["request_throughput"] is None
    assert s["mean_ttft_ms"] is None and s["mean_tokenization_ms"] is None


def test_closed_loop_send_after_cap_does_not_happen():
    # C=1, output 1, fixed 10 ms: row 0 ends at 10, row 1 sent 10 ends 20;
    # cap 15 -> row 1 incomplete (admitted at 10, its pass never ends), row 2 never sent.
    cfg = make_config(load={"concurrency": 1}, timing=fixed(10.0, 1.0), max_time_ms=15.0)
    res = run(cfg, [10, 10, 10], [1, 1, 1])
    r0, r1, r2 = res["requests"]
    assert r0["status"] == "completed"
    assert r1["status"] == "incomplete" and r1["first_admit_ns"] == 10 * MS
    assert r1["generated_tokens"] == 0 and res["tokens"][1] == []
    assert r2["send_ns"] is None and r2["status"] == "incomplete"
    assert (r2["worker"], r2["rank"]) == (0, 0)


@pytest.mark.parametrize("chunk", [None, 2])
def test_many_requests_invariants(chunk):
    # Consistency smoke test on a busier closed loop with preemptions.
    rng = random.Random(7)
    n = 40
    inputs = [rng.randint(1, 60) for _ in range(n)]
    outputs = [rng.randint(1, 20) for _ in range(n)]
    cfg = make_config(
        load={"concurrency": 8},
        engine={"aggregated": {"replicas": 2, "attention_dp": 2, "block_size": 4,
                               "num_blocks": 20, "max_batched_tokens": 32,
                               "max_sequences": 3}},
        detokenization={"workers": 2, "base_ms": 0.3, "per_output_us": 70.0,
                        "chunk_size": chunk},
        tokenization={"workers": 2, "base_ms": 0.1, "per_input_us": 3.0},
    )
    res = run(cfg, inputs, outputs)
    for k, r in enumerate(res["requests"]):
        if r["status"] == "rejected":
            assert inputs[k] >= 80  # L = 20 blocks x 4
            continue
        assert r["status"] == "completed"
        toks = res["tokens"][k]
        assert len(toks) == r["generated_tokens"] >= 1
        assert all(e <= rv for e, rv in toks)
        assert r["send_ns"] <= r["arrival_ns"] <= r["first_admit_ns"] <= r["first_emit_ns"]
        assert r["end_ns"] == r["last_recv_ns"] == toks[-1][1]
    assert any(r["num_preemptions"] > 0 for r in res["requests"])
    for p in res["passes"]:
        assert p["blocks_in_use"] <= 20
    ends = [(p["end_ns"], p["worker"], p["rank"]) for p in res["passes"]]
    assert ends == sorted(ends)
