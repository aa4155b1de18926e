"""Self-checks of the pure-Python reference (tests/reference) on hand-worked cases.

Every expected number below is worked out by hand from SPEC.md (and, for the sglang
and trtllm policies, docs/policies.md) in the comments.
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

from simcore.config import load_config, merge_config  # noqa: E402
from tests.reference.metrics import percentile, percentile_key, summarize  # noqa: E402
from tests.reference.sim import (  # noqa: E402
    DEFAULT_KV_TOKENS, POLICY_POOL_DEFAULTS, ReferenceSim, fnv1a64, simulate)

MS = 1_000_000  # ns per ms


def make_config(**sections):
    """DEFAULTS with the given sections merged in (nested dicts), every pool key
    resolved as load_config resolves it (null keys take the policy's defaults;
    vllm: max_batched_tokens 8192, max_sequences 256, block_size 16, num_blocks
    416000 // block_size): the reference takes concrete pool values."""
    config = merge_config(sections)
    engine = load_config(sections).engine
    for name in ("aggregated", "prefill", "decode"):
        pool = getattr(engine, name)
        for key in config["engine"][name]:
            config["engine"][name][key] = getattr(pool, key)
    return config


def fixed(prefill_ms, decode_ms):
    return {"type": "fixed", "prefill_ms": prefill_ms, "decode_ms": decode_ms}


def run(config, inputs, outputs, send_ns=None, ids=None, hash_ids=None):
    ids = ids if ids is not None else [f"r{k}" for k in range(len(inputs))]
    return simulate(config, ids, inputs, outputs, send_ns, hash_ids)


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
    # prefix caching off: cached_tokens 0 for an admitted request, hit rate 0 / 100
    assert req["cached_tokens"] == 0 and s["prefix_cache_hit_rate"] == 0.0


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
    assert r0["cached_tokens"] is None  # rejected: never admitted
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
    # never admitted: cached_tokens None; the hit rate covers admitted rows 0, 1 only
    assert [r["cached_tokens"] for r in res["requests"]] == [0, 0, None]
    s = summarize(res, [10, 10, 10], [1, 1, 1], [50], {"ttft_ms": None, "tpot_ms": None,
                                                      "e2el_ms": None}, 15 * MS)
    assert s["prefix_cache_hit_rate"] == 0.0


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


# ---------------------------------------------------------------- P/D disaggregation (SPEC §6)

NO_SLO = {"ttft_ms": None, "tpot_ms": None, "e2el_ms": None}
STAGES = ("tokenization", "queue", "prefill", "transfer", "decode_wait", "detokenization")


def pd_engine(prefill=None, decode=None, bandwidth=None, bytes_per_token=None):
    """engine section for engine.mode=disaggregated (pools default to 1 x 1)."""
    return {"mode": "disaggregated", "prefill": prefill or {}, "decode": decode or {},
            "kv_transfer": {"bandwidth_gb_per_second": bandwidth,
                            "bytes_per_token": bytes_per_token}}


def stage_ns(r):
    """The six TTFT stages of one request dict in int ns (SPEC §10)."""
    return dict(
        tokenization=r["arrival_ns"] - r["send_ns"],
        queue=r["first_admit_ns"] - r["arrival_ns"],
        prefill=r["prompt_done_ns"] - r["first_admit_ns"],
        transfer=r["transfer_end_ns"] - r["prompt_done_ns"],
        decode_wait=r["first_emit_ns"] - r["transfer_end_ns"],
        detokenization=r["first_recv_ns"] - r["first_emit_ns"],
    )


def test_aggregated_reports_no_pd_fields():
    cfg = make_config(load={"concurrency": 1}, timing=fixed(30.0, 8.0))
    res = run(cfg, [100], [3])
    r = res["requests"][0]
    assert r["prompt_done_ns"] == r["first_emit_ns"] == 30 * MS
    for key in ("prefill_worker", "prefill_rank", "decode_worker", "decode_rank",
                "transfer_start_ns", "transfer_end_ns"):
        assert r[key] is None, key
    assert all(p["pool"] == "aggregated" for p in res["passes"])


def test_pd_lone_request_transfer_and_stages():
    # 1 prefill worker (global index 0), 1 decode worker (index 1); closed loop C=1.
    # input 1000, output 3; fixed 30 ms prefill / 8 ms decode; tokenizer 0.5 ms per
    # request, detokenizer 0.25 ms per job.
    # transfer ms = ((1000 * 1e6) / (1000 * 1e9)) * 1e3 = 1.0 ms.
    # send 0 -> arrival 0.5 -> prefill pass [0.5, 30.5]: n = 1000, computed == known ->
    #   handoff h=0 at 30.5, no token; transfer [30.5, 31.5].
    # at 31.5: decode worker 1 + 0 mod 1 = 1, rank 0; waiting with computed 999:
    #   pass [31.5, 39.5] is a decode entry (n=1, computed 999 >= 999): token 0 @ 39.5,
    #   received 39.75; tokens 1, 2 @ 47.5, 55.5, received 47.75, 55.75.
    # TTFT 39.75 = 0.5 tokenization + 0 queue + 30 prefill + 1 transfer + 8 decode_wait
    #   + 0.25 detokenization.
    cfg = make_config(load={"concurrency": 1}, timing=fixed(30.0, 8.0),
                      engine=pd_engine(bandwidth=1000.0, bytes_per_token=1e6),
                      tokenization={"base_ms": 0.5}, detokenization={"base_ms": 0.25})
    res = run(cfg, [1000], [3])
    r = res["requests"][0]
    assert r["status"] == "completed" and r["generated_tokens"] == 3
    assert (r["worker"], r["rank"]) == (0, 0)
    assert (r["prefill_worker"], r["prefill_rank"]) == (0, 0)
    assert (r["decode_worker"], r["decode_rank"]) == (1, 0)
    assert r["arrival_ns"] == r["first_admit_ns"] == 500_000
    assert r["prompt_done_ns"] == r["transfer_start_ns"] == 30_500_000
    assert r["transfer_end_ns"] == 31_500_000
    assert r["first_emit_ns"] == 39_500_000
    assert emits(res, 0) == [39_500_000, 47_500_000, 55_500_000]
    assert recvs(res, 0) == [39_750_000, 47_750_000, 55_750_000]
    assert r["end_ns"] == 55_750_000 and r["num_preemptions"] == 0

    passes = res["passes"]
    assert [(p["pool"], p["worker"], p["rank"], p["start_ns"], p["end_ns"]) for p in passes] == [
        ("prefill", 0, 0, 500_000, 30_500_000),
        ("decode", 1, 0, 31_500_000, 39_500_000),
        ("decode", 1, 0, 39_500_000, 47_500_000),
        ("decode", 1, 0, 47_500_000, 55_500_000)]
    assert (passes[0]["num_prefill"], passes[0]["prefill_tokens"],
            passes[0]["prefill_kv_tokens"]) == (1, 1000, 1000)
    assert [(p["num_decode"], p["decode_kv_tokens"]) for p in passes[1:]] == [
        (1, 1000), (1, 1001), (1, 1002)]
    # block_size 16: ceil(1000/16) = ceil(1001/16) = ceil(1002/16) = 63
    assert [p["blocks_in_use"] for p in passes] == [63, 63, 63, 63]

    st = stage_ns(r)
    assert st == dict(tokenization=500_000, queue=0, prefill=30 * MS, transfer=1 * MS,
                      decode_wait=8 * MS, detokenization=250_000)
    assert sum(st.values()) == r["first_recv_ns"] - r["send_ns"] == 39_750_000
    s = summarize(res, [1000], [3], [50], NO_SLO, None)
    assert s["mean_ttft_ms"] == 39.75
    assert [s[f"mean_{x}_ms"] for x in STAGES] == [0.5, 0.0, 30.0, 1.0, 8.0, 0.25]
    assert s["mean_tpot_ms"] == 8.0 and s["mean_e2el_ms"] == 55.75
    assert s["duration_s"] == 0.05575


def test_pd_without_kv_transfer_takes_zero_time():
    # kv_transfer off: the transfer ends at the prefill pass end, and the decode pass
    # starts at that same instant: prefill [0, 10], decode [10, 11] -> token 0 @ 11.
    cfg = make_config(load={"concurrency": 1}, timing=fixed(10.0, 1.0), engine=pd_engine())
    res = run(cfg, [20], [2])
    r = res["requests"][0]
    assert r["prompt_done_ns"] == r["transfer_start_ns"] == r["transfer_end_ns"] == 10 * MS
    assert emits(res, 0) == [11 * MS, 12 * MS]
    s = summarize(res, [20], [2], [50], NO_SLO, None)
    assert s["mean_transfer_ms"] == 0.0 and s["mean_decode_wait_ms"] == 1.0


def test_pd_rejection_on_decode_pool():
    # L_prefill = 26000*16 (accepts input 60), L_decode = min(50, ...) = 50 (60 >= 50).
    # transfer ms = ((input * 1e6) / (30 * 1e9)) * 1e3: input 60 -> 2 ms;
    #   input 20 -> 0.6666... ms -> 666_667 ns. Closed loop C=1, think 0, fixed 10/1.
    # row 0 (input 60): prefill [0, 10], transfer [10, 12]; at 12 its prefill blocks
    #   (ceil(60/16) = 4) are freed and it is rejected on decode worker 1, rank 0; it
    #   ends at the client at 12 -> row 1 sent at 12, arrives and is admitted at 12
    #   (phase (d) before (e)), holding ceil(20/16) = 2 blocks (row 0's are gone).
    # row 1 (input 20, output 2): prefill [12, 22], transfer [22, 22.666667],
    #   decode [22.666667, 23.666667] token 0, [23.666667, 24.666667] token 1 (final).
    cfg = make_config(load={"concurrency": 1}, timing=fixed(10.0, 1.0),
                      engine=pd_engine(decode={"context_length": 50},
                                       bandwidth=30.0, bytes_per_token=1e6))
    res = run(cfg, [60, 20], [1, 2])
    r0, r1 = res["requests"]
    assert r0["status"] == "rejected" and res["tokens"][0] == []
    assert r0["arrival_ns"] == r0["first_admit_ns"] == 0
    assert r0["prompt_done_ns"] == r0["transfer_start_ns"] == 10 * MS
    assert r0["transfer_end_ns"] == r0["end_ns"] == 12 * MS
    assert (r0["decode_worker"], r0["decode_rank"]) == (1, 0)
    assert r0["first_emit_ns"] is None and r0["generated_tokens"] == 0
    assert r1["send_ns"] == r1["arrival_ns"] == r1["first_admit_ns"] == 12 * MS
    assert r1["transfer_end_ns"] == 22_666_667
    assert emits(res, 1) == [23_666_667, 24_666_667]
    assert r1["status"] == "completed" and r1["end_ns"] == 24_666_667
    prefill_passes = [p for p in res["passes"] if p["pool"] == "prefill"]
    assert [(p["start_ns"], p["end_ns"], p["blocks_in_use"]) for p in prefill_passes] == [
        (0, 10 * MS, 4), (12 * MS, 22 * MS, 2)]
    s = summarize(res, [60, 20], [1, 2], [50], NO_SLO, None)
    assert (s["completed"], s["rejected"], s["incomplete"]) == (1, 1, 0)
    assert s["mean_ttft_ms"] == (23_666_667 - 12 * MS) / 1e6
    assert s["mean_transfer_ms"] == 0.666667 and s["mean_decode_wait_ms"] == 1.0


def test_pd_transfer_holds_prefill_blocks():
    # prefill pool: block_size 4, num_blocks 5 (L 20). A (row 0), B (row 1): input 10
    # (3 blocks each), output 1, both sent at 0. transfer ms = ((10 * 1e6) / (2 * 1e9))
    # * 1e3 = 5 ms. fixed 10/1.
    # @0: A admitted (3 blocks); B needs 3 -> 6 > 5: head-of-line blocked. [0, 10].
    # @10: A handed off; it leaves running but its 3 blocks stay used until 15, so B
    #   still does not fit: no pass at 10 (the prefill worker stays idle).
    # @15: A's transfer ends: blocks freed; A decodes [15, 16] on worker 1; B is
    #   admitted on the prefill rank [15, 25], transfer [25, 30], decode [30, 31].
    cfg = make_config(load={"type": "trace"}, timing=fixed(10.0, 1.0),
                      engine=pd_engine(prefill={"block_size": 4, "num_blocks": 5},
                                       bandwidth=2.0, bytes_per_token=1e6))
    res = run(cfg, [10, 10], [1, 1], send_ns=[0, 0])
    a, b = res["requests"]
    assert (a["prefill_rank"], b["prefill_rank"]) == (0, 0)
    assert a["transfer_start_ns"] == 10 * MS and a["transfer_end_ns"] == 15 * MS
    assert emits(res, 0) == [16 * MS]
    assert b["first_admit_ns"] == 15 * MS and b["prompt_done_ns"] == 25 * MS
    assert b["transfer_end_ns"] == 30 * MS and emits(res, 1) == [31 * MS]
    assert (a["decode_worker"], a["decode_rank"]) == (b["decode_worker"], b["decode_rank"]) == (1, 0)
    # pass records in pass-end order; decode block_size 16: ceil(10/16) = 1 block
    assert [(p["pool"], p["start_ns"], p["end_ns"], p["blocks_in_use"]) for p in res["passes"]] == [
        ("prefill", 0, 10 * MS, 3),
        ("decode", 15 * MS, 16 * MS, 1),
        ("prefill", 15 * MS, 25 * MS, 3),   # A's 3 blocks were freed at 15, B holds 3
        ("decode", 30 * MS, 31 * MS, 1)]
    assert stage_ns(b) == dict(tokenization=0, queue=15 * MS, prefill=10 * MS,
                               transfer=5 * MS, decode_wait=1 * MS, detokenization=0)


def test_pd_held_blocks_force_preempt_only_retries():
    # prefill pool: block_size 4, num_blocks 5, max_batched_tokens 8. A (row 0) input 8,
    # B (row 1) input 16, output 1, both sent at 0. transfer ms = ((input * 3.125e6) /
    # (1 * 1e9)) * 1e3: A 25 ms, B 50 ms. fixed 10/1.
    # @0: A n=8 (2 blocks); budget 0 -> B waits. [0, 10]: A handed off @10, holds 2 blocks
    #   until 35.
    # @10: B admitted (first_admit 10), n=8 -> 2 blocks (used 4). [10, 20].
    # @20: B needs ceil(16/4) = 4 blocks: 4 + 2 = 6 > 5 -> B preempts itself (batch empty,
    #   preempted) -> retry at once: B re-admitted, n=8 -> used 4. [20, 30]. Same @30:
    #   [30, 40]. (2 preemptions.)
    # @35: A's transfer ends (its 2 blocks freed, used 2); A decodes [35, 36].
    # @40: B needs 2 more blocks: 2 + 2 = 4 <= 5 -> [40, 50]; prompt done 50;
    #   transfer [50, 100]; decode [100, 101].
    cfg = make_config(load={"type": "trace"}, timing=fixed(10.0, 1.0),
                      engine=pd_engine(prefill={"block_size": 4, "num_blocks": 5,
                                                "max_batched_tokens": 8},
                                       bandwidth=1.0, bytes_per_token=3.125e6))
    res = run(cfg, [8, 16], [1, 1], send_ns=[0, 0])
    a, b = res["requests"]
    assert a["transfer_end_ns"] == 35 * MS and emits(res, 0) == [36 * MS]
    assert b["first_admit_ns"] == 10 * MS and b["num_preemptions"] == 2
    assert b["prompt_done_ns"] == 50 * MS and b["transfer_end_ns"] == 100 * MS
    assert emits(res, 1) == [101 * MS]
    prefill = [(p["start_ns"] // MS, p["end_ns"] // MS, p["prefill_tokens"],
                p["prefill_kv_tokens"], p["blocks_in_use"])
               for p in res["passes"] if p["pool"] == "prefill"]
    assert prefill == [(0, 10, 8, 8, 2), (10, 20, 8, 8, 4), (20, 30, 8, 8, 4),
                       (30, 40, 8, 8, 4), (40, 50, 8, 16, 4)]


def test_pd_placement_and_handoff_order():
    # prefill pool 2 x 1, decode pool 2 x 2 (global decode workers 2, 3). Four equal
    # requests sent at 0: prefill placement k mod 2 -> rows 0, 2 on worker 0 and rows 1,
    # 3 on worker 1. Both prefill passes end at 10: handoffs by worker, then running
    # order: row 0 h=0, row 2 h=1, row 1 h=2, row 3 h=3. Decode placement:
    # h=0 -> (2 + 0, 0), h=1 -> (2 + 1, 0), h=2 -> (2 + 0, 1), h=3 -> (2 + 1, 1).
    cfg = make_config(load={"type": "trace"}, timing=fixed(10.0, 1.0),
                      engine=pd_engine(prefill={"replicas": 2},
                                       decode={"replicas": 2, "attention_dp": 2}))
    res = run(cfg, [20] * 4, [2] * 4, send_ns=[0] * 4)
    place = [(r["prefill_worker"], r["prefill_rank"], r["decode_worker"], r["decode_rank"])
             for r in res["requests"]]
    assert place == [(0, 0, 2, 0), (1, 0, 2, 1), (0, 0, 3, 0), (1, 0, 3, 1)]
    assert [r["worker"] for r in res["requests"]] == [0, 1, 0, 1]
    for row in range(4):
        assert emits(res, row) == [11 * MS, 12 * MS]
    # one record per rank of each pass: prefill workers 0, 1 (1 rank), decode 2, 3 (2 ranks)
    first = [(p["pool"], p["worker"], p["rank"]) for p in res["passes"] if p["end_ns"] <= 11 * MS]
    assert first == [("prefill", 0, 0), ("prefill", 1, 0), ("decode", 2, 0), ("decode", 2, 1),
                     ("decode", 3, 0), ("decode", 3, 1)]


def test_pd_transfer_end_after_cap_never_happens():
    # lone request, input 10, prefill [0, 10], transfer 5 ms (as above) ends at 15 > cap 12.
    cfg = make_config(load={"concurrency": 1}, timing=fixed(10.0, 1.0), max_time_ms=12.0,
                      engine=pd_engine(bandwidth=2.0, bytes_per_token=1e6))
    res = run(cfg, [10], [1])
    r = res["requests"][0]
    assert r["status"] == "incomplete" and r["generated_tokens"] == 0
    assert r["prompt_done_ns"] == r["transfer_start_ns"] == 10 * MS
    assert r["transfer_end_ns"] is None
    assert r["decode_worker"] is None and r["decode_rank"] is None
    assert (r["prefill_worker"], r["prefill_rank"]) == (0, 0)
    assert [p["pool"] for p in res["passes"]] == ["prefill"]


def test_pd_decode_preemption_recomputes_on_decode_rank():
    # decode pool: block_size 4, num_blocks 5 (L 20); A, B input 8, output 10, sent at 0,
    # kv_transfer off, fixed 10/1; prefill pool default (both prefilled in one pass).
    # prefill [0, 10] -> handoffs h=0 (A), h=1 (B) at 10, both join decode rank 0 at 10.
    # decode @10: A needs ceil(8/4) = 2 blocks, B 2 -> both admitted (decode entries,
    #   kv 8) [10, 11]: token 0 of each @ 11.
    # @11: A n=1 -> 3 blocks (used 5); B needs 3 -> 6 > 5 -> B preempted (itself):
    #   A alone [11, 12]. B waits (9 tokens = 3 blocks) until A finishes:
    #   A tokens 1..9 @ 12..20, A finishes @ 20; @20 B recomputes 9 tokens (a prefill
    #   entry on the decode rank, 10 ms) -> token 1 @ 30, then tokens 2..9 @ 31..38.
    cfg = make_config(load={"type": "trace"}, timing=fixed(10.0, 1.0),
                      engine=pd_engine(decode={"block_size": 4, "num_blocks": 5}))
    res = run(cfg, [8, 8], [10, 10], send_ns=[0, 0])
    a, b = res["requests"]
    assert emits(res, 0) == [(11 + k) * MS for k in range(10)]
    assert emits(res, 1) == [11 * MS, 30 * MS] + [(29 + k) * MS for k in range(2, 10)]
    assert (a["num_preemptions"], b["num_preemptions"]) == (0, 1)
    assert b["first_admit_ns"] == 0 and b["prompt_done_ns"] == 10 * MS
    p20 = [p for p in res["passes"] if p["start_ns"] == 20 * MS]
    assert [(p["pool"], p["num_prefill"], p["prefill_tokens"], p["prefill_kv_tokens"])
            for p in p20] == [("decode", 1, 9, 9)]
    assert all(r["status"] == "completed" for r in res["requests"])


@pytest.mark.parametrize("seed", range(6))
def test_pd_many_requests_invariants(seed):
    # Consistency smoke test: a busy closed loop over 2 x 2 prefill and 2 x 1 decode
    # ranks with tight KV caches, transfers, tokenization and detokenization.
    rng = random.Random(seed)
    n = 40
    inputs = [rng.randint(1, 70) for _ in range(n)]
    outputs = [rng.randint(1, 20) for _ in range(n)]
    cfg = make_config(
        load={"concurrency": 8},
        engine=pd_engine(
            prefill={"replicas": 2, "attention_dp": 2, "block_size": 4, "num_blocks": 20,
                     "max_batched_tokens": 32, "max_sequences": 3},
            decode={"replicas": 2, "attention_dp": 1, "block_size": 4, "num_blocks": 16,
                    "max_batched_tokens": 16, "max_sequences": 4},
            bandwidth=0.5, bytes_per_token=2e5),
        detokenization={"workers": 2, "base_ms": 0.3, "per_output_us": 70.0},
        tokenization={"workers": 2, "base_ms": 0.1, "per_input_us": 3.0},
    )
    res = run(cfg, inputs, outputs)
    for k, r in enumerate(res["requests"]):
        assert r["worker"] == r["prefill_worker"] == k % 2
        if r["status"] == "rejected":
            assert inputs[k] >= 64  # L_decode = 16 x 4 (L_prefill = 80)
            assert res["tokens"][k] == []
            if inputs[k] < 80:
                assert r["transfer_end_ns"] == r["end_ns"]
            continue
        assert r["status"] == "completed"
        assert r["decode_worker"] in (2, 3) and r["decode_rank"] == 0
        toks = res["tokens"][k]
        assert len(toks) == r["generated_tokens"] >= 1
        assert r["generated_tokens"] == min(outputs[k], 64 - inputs[k])
        st = stage_ns(r)
        assert all(v >= 0 for v in st.values())
        assert sum(st.values()) == r["first_recv_ns"] - r["send_ns"]
        assert r["transfer_start_ns"] == r["prompt_done_ns"]
        # transfer ns = rint(((input * 2e5) / (0.5 * 1e9)) * 1e3 * 1e6) = input * 400_000
        assert r["transfer_end_ns"] - r["transfer_start_ns"] == inputs[k] * 400_000
    for p in res["passes"]:
        assert p["blocks_in_use"] <= (20 if p["pool"] == "prefill" else 16)
        assert p["pool"] == ("prefill" if p["worker"] < 2 else "decode")
    ends = [(p["end_ns"], p["worker"], p["rank"]) for p in res["passes"]]
    assert ends == sorted(ends)
    s = summarize(res, inputs, outputs, [50], NO_SLO, None)
    assert s["completed"] + s["rejected"] == n
    assert abs(sum(s[f"mean_{x}_ms"] for x in STAGES) - s["mean_ttft_ms"]) < 1e-9


# ---------------------------------------------------------------- policies (docs/policies.md)


def policy_config(policy, pool=None, mode="aggregated", **sections):
    """Open-loop trace, fixed 10 ms prefill / 2 ms decode unless given otherwise."""
    engine = {"policy": policy}
    if mode == "aggregated":
        engine["aggregated"] = pool or {}
    else:
        engine.update(pd_engine(**(pool or {})))
    sections.setdefault("load", {"type": "trace"})
    sections.setdefault("timing", fixed(10.0, 2.0))
    return make_config(engine=engine, **sections)


#: Pool-key defaults per policy, copied from the table of docs/policies.md (the
#: reference reads them off simcore's registry, which must agree with this copy).
DOCS_POOL_DEFAULTS = {
    "vllm": {"max_batched_tokens": 8192, "max_sequences": 256, "block_size": 16, "chunked_prefill": True},
    "sglang": {"max_sequences": 4096, "block_size": 1, "chunked_prefill_size": 8192,
               "max_prefill_tokens": 16384, "schedule_conservativeness": 1.0},
    "trtllm": {"max_batched_tokens": 8192, "max_sequences": 2048, "block_size": 32, "chunked_prefill": True},
}


def test_policy_pool_defaults_match_simcore_config():
    # The table is copied from docs/policies.md; simcore.config and the reference must agree.
    from simcore import config as simcfg
    assert DEFAULT_KV_TOKENS == simcfg.DEFAULT_KV_TOKENS == 416_000
    assert set(POLICY_POOL_DEFAULTS) == set(simcfg.POLICY_DEFAULTS) == {"vllm", "sglang", "trtllm"}
    assert POLICY_POOL_DEFAULTS == DOCS_POOL_DEFAULTS
    for policy, defaults in simcfg.POLICY_DEFAULTS.items():
        assert POLICY_POOL_DEFAULTS[policy] == {k: v for k, v in defaults.items() if v is not None}
        assert DOCS_POOL_DEFAULTS[policy] == {k: v for k, v in defaults.items() if v is not None}


@pytest.mark.parametrize("policy", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_reference_resolves_null_pool_keys_like_load_config(policy, mode):
    # merge_config leaves every pool key None; make_config resolves them through
    # simcore.config.load_config. The reference must give the same run on both.
    rng = random.Random(3)
    inputs = [rng.randint(1, 3000) for _ in range(12)]
    outputs = [rng.randint(1, 40) for _ in range(12)]
    engine = {"policy": policy, "mode": mode}
    sections = dict(load={"concurrency": 4}, timing=fixed(10.0, 1.0))
    raw = merge_config(dict(engine=engine, **sections))
    assert raw["engine"]["aggregated"]["block_size"] is None
    resolved = make_config(engine=engine, **sections)
    pool = resolved["engine"]["aggregated" if mode == "aggregated" else "decode"]
    assert pool["block_size"] == POLICY_POOL_DEFAULTS[policy]["block_size"]
    assert pool["num_blocks"] == 416_000 // pool["block_size"]
    assert run(raw, inputs, outputs) == run(resolved, inputs, outputs)


def test_reference_rejects_a_key_the_policy_does_not_use():
    raw = merge_config({"engine": {"policy": "sglang", "aggregated": {"max_batched_tokens": 64}}})
    with pytest.raises(ValueError, match="max_batched_tokens"):
        run(raw, [10], [1])
    raw = merge_config({"engine": {"policy": "trtllm", "aggregated": {"chunked_prefill_size": 64}}})
    with pytest.raises(ValueError, match="chunked_prefill_size"):
        run(raw, [10], [1])


# ---------------------------------------------------------------- trtllm


def test_trtllm_admits_only_what_fits_to_completion():
    # block_size 4, num_blocks 6 (L 24); a (8 in, 8 out), b (4, 4), c (4, 4) at 0;
    # fixed 10 ms prefill / 2 ms decode. Footprints: a ceil(min(16, 24)/4) = 4,
    # b = c = ceil(8/4) = 2.
    # @0: P = 0. a: 4 <= 6 - 0 - 0 -> admit n=8 (2 blocks), P = 4 - 2 = 2, used 2.
    #     b: 2 <= 6 - 2 - 2 = 2 -> admit n=4 (1 block), P = 2 + (2 - 1) = 3, used 3.
    #     c: 2 <= 6 - 3 - 3 = 0? no -> stop. Pass [0, 10]: 2 prefill entries.
    # @10: a 8 -> 9 (3 blocks), b 4 -> 5 (2 blocks): used 5, P = (4-3) + (2-2) = 1;
    #     c: 2 <= 6 - 5 - 1 = 0? no. Decode [10, 12]; same @12 [12, 14] (a 10 -> 3
    #     blocks, b 6 -> 2), @14 [14, 16] (a 11 -> 3, b 7 -> 2); b's 4th token @16: b
    #     finishes and frees 2 blocks.
    # @16: a 12 -> 3 blocks: used 3, P = 4 - 3 = 1; c: 2 <= 6 - 3 - 1 = 2 -> admitted
    #     n=4 (1 block, used 4). Prefill + decode entries: 10 + 2 = 12 ms -> [16, 28].
    # @28: a 13 -> 4 blocks, c 5 -> 2 blocks: used 6 = num_blocks, no preemption.
    #     a's tokens 28, 30, 32, 34 (8 in all), c's 28, 30, 32, 34.
    cfg = policy_config("trtllm", {"block_size": 4, "num_blocks": 6})
    res = run(cfg, [8, 4, 4], [8, 4, 4], send_ns=[0, 0, 0])
    a, b, c = res["requests"]
    assert emits(res, 0) == [t * MS for t in (10, 12, 14, 16, 28, 30, 32, 34)]
    assert emits(res, 1) == [t * MS for t in (10, 12, 14, 16)]
    assert c["first_admit_ns"] == 16 * MS
    assert emits(res, 2) == [t * MS for t in (28, 30, 32, 34)]
    assert all(r["num_preemptions"] == 0 and r["status"] == "completed" for r in res["requests"])
    passes = [(p["start_ns"] // MS, p["end_ns"] // MS, p["num_prefill"], p["num_decode"],
               p["blocks_in_use"]) for p in res["passes"]]
    assert passes[:6] == [(0, 10, 2, 0, 3), (10, 12, 0, 2, 5), (12, 14, 0, 2, 5),
                          (14, 16, 0, 2, 5), (16, 28, 1, 1, 4), (28, 30, 0, 2, 6)]
    # vllm on the same pool admits c at 0 (1 block fits) and preempts it @10: a needs
    # its 3rd block (used 5), b its 2nd (used 6), c its 2nd -> 7 > 6 -> c (the last).
    res_vllm = run(policy_config("vllm", {"block_size": 4, "num_blocks": 6}),
                   [8, 4, 4], [8, 4, 4], send_ns=[0, 0, 0])
    c_vllm = res_vllm["requests"][2]
    assert c_vllm["first_admit_ns"] == 0 and c_vllm["num_preemptions"] == 1


def test_trtllm_prefill_role_footprint_is_the_prompt():
    # P/D, trtllm. Prefill pool: block_size 4, num_blocks 4 (L 16); a, b: input 8,
    # output 2, at 0; kv_transfer off; fixed 10/1.
    # Prefill-role footprint = ceil(8/4) = 2: a: 2 <= 4 -> admit (2 blocks, P += 0);
    #   b: 2 <= 4 - 2 - 0 -> admit. Prefill [0, 10], handoffs a h=0, b h=1 @10.
    # Decode pool (defaults: block_size 32, 13000 blocks): footprint ceil(10/32) = 1;
    #   both admitted @10 with computed 7, n=1 (decode entries, kv 8 each): [10, 11]
    #   tokens 0 @11, [11, 12] tokens 1 @12.
    # Aggregated with the same pool the footprint is ceil(min(10, 16)/4) = 3:
    #   a: 3 <= 4 -> admit (2 blocks, P = 1, used 2); b: 3 <= 4 - 2 - 1 = 1? no.
    #   a [0, 10] token 0; @10 a -> 3 blocks (P 0); b: 3 <= 4 - 3 - 0? no; a [10, 11]
    #   token 1, finishes @11; b admitted @11: [11, 21], [21, 22].
    cfg = policy_config("trtllm", {"prefill": {"block_size": 4, "num_blocks": 4}},
                        mode="disaggregated", timing=fixed(10.0, 1.0))
    res = run(cfg, [8, 8], [2, 2], send_ns=[0, 0])
    assert [r["first_admit_ns"] for r in res["requests"]] == [0, 0]
    assert emits(res, 0) == emits(res, 1) == [11 * MS, 12 * MS]
    dec = [p for p in res["passes"] if p["pool"] == "decode"]
    assert (dec[0]["num_decode"], dec[0]["decode_kv_tokens"], dec[0]["blocks_in_use"]) == (2, 16, 2)
    cfg = policy_config("trtllm", {"block_size": 4, "num_blocks": 4}, timing=fixed(10.0, 1.0))
    res = run(cfg, [8, 8], [2, 2], send_ns=[0, 0])
    assert emits(res, 0) == [10 * MS, 11 * MS]
    assert res["requests"][1]["first_admit_ns"] == 11 * MS
    assert emits(res, 1) == [21 * MS, 22 * MS]


# ---------------------------------------------------------------- sglang


def test_sglang_extend_pass_does_not_decode_running_requests():
    # sglang, block_size 1, num_blocks 1000; a (4 in, 3 out) at 0, b (4, 1) at 5 ms;
    # fixed 10/2. init ratio 0.7 (conservativeness 1.0).
    # @0: empty rank -> a is the first request (no reservation check): n=4 -> [0, 10].
    # @10: a decodes (remaining 1): rem_total = (1000 - 4) * 1 - min(3 - 1, 4096) * 0.7
    #   = 996.0 - 1.4 = 994.6; b: need 4 + reserve 1 = 5 < 994.6 -> n=4. The extend
    #   batch holds b only (a waits): [10, 20], b's token @20 (final).
    # @20: nothing to extend -> decode a [20, 22], [22, 24]: a's tokens 10, 22, 24.
    cfg = policy_config("sglang", {"num_blocks": 1000})
    res = run(cfg, [4, 4], [3, 1], send_ns=[0, 5 * MS])
    assert emits(res, 0) == [10 * MS, 22 * MS, 24 * MS]
    assert emits(res, 1) == [20 * MS]
    assert res["requests"][1]["first_admit_ns"] == 10 * MS
    assert [(p["start_ns"] // MS, p["num_prefill"], p["prefill_tokens"], p["num_decode"],
             p["blocks_in_use"]) for p in res["passes"]] == [
        (0, 1, 4, 0, 4), (10, 1, 4, 0, 8), (20, 0, 0, 1, 5), (22, 0, 0, 1, 6)]
    # The ratio: init @0, unchanged by extend passes, lowered by (init - min) / 600 at
    # each decode pass (@20 and @22; the cap at 23.5 ms stops the run before the pass
    # end @24) ...
    sim = ReferenceSim(dict(cfg, max_time_ms=23.5), ["r0", "r1"], [4, 4], [3, 1], [0, 5 * MS])
    sim.run()
    init = 0.7 * 1.0
    decay = (init - init * 0.14) / 600
    assert sim.workers[0].ranks[0].new_token_ratio == (init - decay) - decay
    # ... and back at init once the pass end @24 leaves the worker with nothing to run.
    sim = ReferenceSim(cfg, ["r0", "r1"], [4, 4], [3, 1], [0, 5 * MS])
    sim.run()
    assert sim.workers[0].ranks[0].new_token_ratio == init


def test_sglang_chunked_prefill_and_budgets():
    # sglang, chunked_prefill_size 8 (rem_chunk 8 // 1 = 8), block_size 1; a (12 in,
    # 2 out), b (4, 2) at 0; fixed 10/2.
    # @0: a first on an empty rank; need 12 > 8 -> page-aligned chunk floor(8/1)*1 = 8;
    #   a chunked admission closes the batch: [0, 10] (b waits).
    # @10: the chunked request a: n = min(4, 8) = 4 == need -> rem_total -= 4 + 2,
    #   rem_chunk = 4; b: need 4 + 2 < rem_total, 4 <= 4 -> n=4. [10, 20]: both prompts
    #   done, tokens 0 @20. @20: decode both [20, 22]: tokens 1 @22.
    cfg = policy_config("sglang", {"chunked_prefill_size": 8})
    res = run(cfg, [12, 4], [2, 2], send_ns=[0, 0])
    assert emits(res, 0) == emits(res, 1) == [20 * MS, 22 * MS]
    assert res["requests"][1]["first_admit_ns"] == 10 * MS
    assert [(p["start_ns"] // MS, p["num_prefill"], p["prefill_tokens"], p["prefill_kv_tokens"],
             p["num_decode"], p["decode_kv_tokens"]) for p in res["passes"]] == [
        (0, 1, 8, 8, 0, 0), (10, 2, 8, 16, 0, 0), (20, 0, 0, 0, 2, 13 + 5)]
    # With attention_dp 2 both ranks get rem_chunk 8 // 2 = 4: a (rank 0) runs 4 + 4 + 4
    # tokens in [0, 10], [10, 20], [20, 30] -> token 0 @30, b (rank 1) [0, 10] -> @10.
    cfg = policy_config("sglang", {"chunked_prefill_size": 8, "attention_dp": 2})
    res = run(cfg, [12, 4], [2, 2], send_ns=[0, 0])
    assert [r["rank"] for r in res["requests"]] == [0, 1]
    assert emits(res, 0)[0] == 30 * MS and emits(res, 1)[0] == 10 * MS


def test_sglang_output_reservation_blocks_admission():
    # sglang, block_size 1, num_blocks 20 (L 20); a (4 in, 10 out) at 0, b (4, 10) at 0.
    # @0: a first (no check): rem_total = 20.0 - 4 - 10 = 6.0; b: 4 + 10 >= 6 -> stop.
    #   [0, 10] a; token 0 @10.
    # Before a's k-th decode pass (k = 0..8, starting @10 + 2k) a holds 4 + k blocks and
    #   has generated 1 + k: rem_total = (16 - k) - (9 - k) * r with r = init - k * decay
    #   (about 0.7); b is admitted only if 14 < rem_total, i.e. 2 - k > (9 - k) * r:
    #   k = 0: 2 > 6.3? no; k = 1: 1 > 5.6? no; k >= 2: the left side is <= 0. So a
    #   decodes alone [10, 12] ... [26, 28], its 10th token @28 finishes it.
    # @28: the rank is empty: b is the first request (no check): [28, 38] token 0, then
    #   9 decodes: 40, 42, ..., 56.
    cfg = policy_config("sglang", {"num_blocks": 20})
    res = run(cfg, [4, 4], [10, 10], send_ns=[0, 0])
    assert emits(res, 0) == [10 * MS] + [(10 + 2 * k) * MS for k in range(1, 10)]
    assert res["requests"][1]["first_admit_ns"] == 28 * MS
    assert emits(res, 1) == [38 * MS] + [(38 + 2 * k) * MS for k in range(1, 10)]


def test_sglang_pd_decode_arrival_is_a_decode_entry():
    # P/D sglang, defaults (block_size 1), kv_transfer off; a (4 in, 2 out), fixed 10/1.
    # prefill [0, 10] (first request, n=4), handoff @10; decode rank: a waits with
    # computed 3, need 1: extend batch n=1, computed 3 >= 4 - 1 -> a decode entry
    # (kv 4, 4 blocks): [10, 11] token 0, then decode [11, 12] token 1.
    cfg = policy_config("sglang", mode="disaggregated", timing=fixed(10.0, 1.0))
    res = run(cfg, [4], [2], send_ns=[0])
    assert emits(res, 0) == [11 * MS, 12 * MS]
    assert [(p["pool"], p["num_prefill"], p["num_decode"], p["decode_kv_tokens"],
             p["blocks_in_use"]) for p in res["passes"]] == [
        ("prefill", 1, 0, 0, 4), ("decode", 0, 1, 4, 4), ("decode", 0, 1, 5, 5)]


def test_sglang_retraction_hand_worked():
    # sglang, block_size 1, num_blocks 12 (L 12), schedule_conservativeness 0.1:
    # init = 0.7 * 0.1 = 0.06999999999999999, min = init * 0.14, decay = (init - min)/600.
    # a (2 in, 9 out) at 0, b (2 in, 6 out) at 5 ms; fixed 10/1.
    # @0: a first on an empty rank: [0, 10], token 0 @10 (a holds 2 blocks).
    # @10: rem_total = (12 - 2) - min(9 - 1, 4096) * init = 10.0 - 0.56 = 9.44;
    #   b: 2 + 6 = 8 < 9.44 -> n=2: [10, 20] (extend: a waits), b's token 0 @20.
    # @20, 21, 22, 23: decode a and b (2 new blocks each, free 8, 6, 4, 2): tokens @21..24;
    #   the ratio decays 4 times.
    # @24: a and b hold 6 blocks each (used 12): the step needs 2 > 0 free -> retract:
    #   both have generated 5 and input 2 -> the later in running order, b: b frees 6,
    #   computed 0, num_preemptions 1, back of waiting (known 7, need 7). a alone needs
    #   1 <= 6: ratio = min(1, (5 + 20 * 1) / 9) = 1.0. a decodes [24, 25].
    # @25: rem_total = (12 - 7) - min(9 - 6, 4096) * 1.0 = 2.0; b: 7 + 1 >= 2 -> decode
    #   a (ratio 1 - decay); @26: 4 - 2 * r; @27: 3 - 1 * r: b stays; a's 9th token @28,
    #   a finishes (2 + 9 = 11 < L).
    # @28: empty rank (b waits, so the worker does not idle: no ratio reset); b first
    #   (no check): n=7 (prefill entry, kv 7)
    #   [28, 38]: b's last token (its 6th) @38.
    cfg = policy_config("sglang", {"num_blocks": 12, "schedule_conservativeness": 0.1},
                        timing=fixed(10.0, 1.0))
    res = run(cfg, [2, 2], [9, 6], send_ns=[0, 5 * MS])
    a, b = res["requests"]
    assert emits(res, 0) == [t * MS for t in (10, 21, 22, 23, 24, 25, 26, 27, 28)]
    assert emits(res, 1) == [t * MS for t in (20, 21, 22, 23, 24, 38)]
    assert (a["num_preemptions"], b["num_preemptions"]) == (0, 1)
    assert b["first_admit_ns"] == 10 * MS and a["status"] == b["status"] == "completed"
    got = [(p["start_ns"] // MS, p["num_prefill"], p["prefill_tokens"], p["num_decode"],
            p["decode_kv_tokens"], p["blocks_in_use"]) for p in res["passes"]]
    assert got == [
        (0, 1, 2, 0, 0, 2), (10, 1, 2, 0, 0, 4),
        (20, 0, 0, 2, 6, 6), (21, 0, 0, 2, 8, 8), (22, 0, 0, 2, 10, 10), (23, 0, 0, 2, 12, 12),
        (24, 0, 0, 1, 7, 7), (25, 0, 0, 1, 8, 8), (26, 0, 0, 1, 9, 9), (27, 0, 0, 1, 10, 10),
        (28, 1, 7, 0, 0, 7)]
    # the ratio right after the pass built @27: 1.0 lowered three times (@25, 26, 27)
    init = 0.7 * 0.1
    decay = (init - init * 0.14) / 600
    capped = dict(cfg, max_time_ms=27.5)
    sim = ReferenceSim(capped, ["r0", "r1"], [2, 2], [9, 6], [0, 5 * MS])
    sim.run()
    assert sim.workers[0].ranks[0].new_token_ratio == ((1.0 - decay) - decay) - decay
    # ... and @23 (cap 23.5), four decays from init: ((((init - d) - d) - d) - d)
    sim = ReferenceSim(dict(cfg, max_time_ms=23.5), ["r0", "r1"], [2, 2], [9, 6], [0, 5 * MS])
    sim.run()
    assert sim.workers[0].ranks[0].new_token_ratio == (((init - decay) - decay) - decay) - decay


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_sglang_retraction_invariants(seed, mode):
    # Long outputs on a small pool and a low schedule_conservativeness: many decode
    # steps let the ratio decay, admissions overcommit, and decodes retract.
    rng = random.Random(100 + seed)
    n = 60
    inputs = [rng.randint(2, 40) for _ in range(n)]
    outputs = [rng.randint(20, 150) for _ in range(n)]
    pool = {"replicas": 1, "attention_dp": 2, "block_size": rng.choice([1, 2]),
            "num_blocks": 100, "max_sequences": 8, "chunked_prefill_size": 32,
            "schedule_conservativeness": 0.3}
    if mode == "aggregated":
        cfg = policy_config("sglang", pool, load={"concurrency": 16},
                            detokenization={"workers": 2, "base_ms": 0.3})
    else:
        cfg = policy_config("sglang", {"prefill": dict(pool, num_blocks=60), "decode": pool},
                            mode="disaggregated", load={"concurrency": 16},
                            detokenization={"workers": 2, "base_ms": 0.3})
    sim = ReferenceSim(cfg, [f"r{k}" for k in range(n)], inputs, outputs, None)
    res = sim.run()
    L = 100 * pool["block_size"]
    assert sum(r["num_preemptions"] for r in res["requests"]) > 0
    for k, r in enumerate(res["requests"]):
        assert r["status"] == "completed"
        assert r["generated_tokens"] == min(outputs[k], L - inputs[k])
        toks = res["tokens"][k]
        assert len(toks) == r["generated_tokens"]
        emitted = [e for e, _ in toks]
        assert emitted == sorted(emitted) and len(set(emitted)) == len(emitted)
        assert all(e <= rv for e, rv in toks)
    for p in res["passes"]:
        # a rank's pass is an extend or a decode batch (decode-rank entrants aside)
        assert p["num_prefill"] == 0 or p["num_decode"] == 0 or p["pool"] == "decode"
        assert p["blocks_in_use"] <= 100  # retraction keeps every rank within its cache
    for w in sim.workers:
        for rank in w.ranks:
            assert rank.used_blocks == 0 and not rank.running and not rank.waiting
    ends = [(p["end_ns"], p["worker"], p["rank"]) for p in res["passes"]]
    assert ends == sorted(ends)
    s = summarize(res, inputs, outputs, [50], NO_SLO, None)
    assert s["completed"] == n


@pytest.mark.parametrize("policy", ["sglang", "trtllm"])
@pytest.mark.parametrize("seed", range(3))
def test_policy_many_requests_invariants(policy, seed):
    # trtllm never preempts and never exceeds its blocks; both policies conserve
    # tokens and free every block at the end.
    rng = random.Random(seed)
    n = 50
    inputs = [rng.randint(1, 60) for _ in range(n)]
    outputs = [rng.randint(1, 40) for _ in range(n)]
    pool = {"replicas": 2, "attention_dp": 2, "block_size": 4, "num_blocks": 20,
            "max_sequences": 3}
    if policy == "trtllm":
        pool["max_batched_tokens"] = 32
    else:
        pool["chunked_prefill_size"] = 32
    sim = ReferenceSim(policy_config(policy, pool, load={"concurrency": 8},
                                     timing={"type": "linear"}),
                       [f"r{k}" for k in range(n)], inputs, outputs, None)
    res = sim.run()
    for k, r in enumerate(res["requests"]):
        if inputs[k] >= 80:
            assert r["status"] == "rejected"
            continue
        assert r["status"] == "completed"
        assert r["generated_tokens"] == min(outputs[k], 80 - inputs[k])
        if policy == "trtllm":
            assert r["num_preemptions"] == 0
    assert all(p["blocks_in_use"] <= 20 for p in res["passes"])
    assert all(rank.used_blocks == 0 for w in sim.workers for rank in w.ranks)


# ---------------------------------------------------------------- prefix caching
# docs/prefix-caching.md; the module docstring of tests/reference/sim.py lists the
# decisions taken where the text is silent.

LINEAR = {"type": "linear"}  # 5 ms + 30 us / prefill token + 20 us / decode seq + 40 ns / kv token


def pc_config(pool=None, workload=None, trace_block_size=None, **sections):
    """Aggregated vllm pool with prefix caching (block_size 4, 100 blocks unless
    given), open-loop trace, fixed 10/1 ms unless given.  ``trace_block_size`` sets
    workload.block_size (T) after validation (the validator keeps it for mooncake)."""
    base = {"block_size": 4, "num_blocks": 100, "prefix_caching": True}
    base.update(pool or {})
    sections.setdefault("load", {"type": "trace"})
    sections.setdefault("timing", fixed(10.0, 1.0))
    if workload is not None:
        sections["workload"] = workload
    cfg = make_config(engine={"aggregated": base}, **sections)
    if trace_block_size is not None:
        cfg["workload"]["block_size"] = trace_block_size
    return cfg


def lru_idents(sim, worker=0, rank=0):
    """The identities of a rank's cached blocks, LRU head first."""
    return [block.ident for block in sim.workers[worker].ranks[rank].lru]


def test_prefix_block_identities():
    # hash_ids at T = 8, engine bs 6, input 20: complete blocks j = 0, 1, 2 (18 <= 20)
    #   j=0: e=6,  m=(6-1)//8=0,  offset 6 - 0 = 6  -> ("h", 10, 6)
    #   j=1: e=12, m=11//8=1,     offset 12 - 8 = 4 -> ("h", 11, 4)
    #   j=2: e=18, m=17//8=2,     offset 18 - 16 = 2 -> ("h", 12, 2)
    ident = ReferenceSim.block_identities
    assert ident(3, 20, 6, [10, 11, 12], 8, 0) == [("h", 10, 6), ("h", 11, 4), ("h", 12, 2)]
    # hash_ids too short for a block (m = 2 past the end): unique to its row
    assert ident(3, 20, 6, [10, 11], 8, 0) == [("h", 10, 6), ("h", 11, 4), ("u", 3, 2)]
    # prefix_tokens P = 10, bs 4, input 13: blocks 0 (4 <= 10), 1 (8 <= 10) shared,
    # block 2 (12 > 10) unique; block 3 (16 > 13) is not complete.
    assert ident(5, 13, 4, None, 512, 10) == [("p", 0), ("p", 1), ("u", 5, 2)]
    assert ident(5, 13, 4, None, 512, 0) == [("u", 5, 0), ("u", 5, 1), ("u", 5, 2)]
    # input shorter than P: only complete blocks get identities
    assert ident(0, 5, 4, None, 512, 100) == [("p", 0)]


@pytest.mark.parametrize("source", ["prefix_tokens", "hash_ids"])
def test_prefix_shared_prefix_hit_shortens_ttft(source):
    # bs 4, linear timing; a and b both input 10, output 1, a at 0, b at 20 ms.
    # Shared 8-token prefix: prefix_tokens 8 -> blocks 0, 1 are ("p", 0), ("p", 1);
    # or hash_ids [7, 1] / [7, 2] at T = 8 -> blocks 0, 1 are (7, 4), (7, 8), block 2
    # (e = 12 > 10) is incomplete.
    # a @0: no hit; n = 10, 3 blocks; registers blocks 0, 1 (10 // 4 = 2).
    #   time 5 + 30*10/1000 + 40*10/1e6 = 5.3004 ms -> token (final) @5.3004: a frees
    #   block 2 (anonymous -> free), 1, 0 (-> LRU tail): LRU [a1, a0], used 0.
    # b @20: hits min(2, (10 - 1) // 4 = 2) = 2 blocks, both cached: computed 8, n = 2,
    #   new = ceil(10/4) - 2 = 1; 1 + 2 cached <= 100 - 0 -> admitted, cached_tokens 8.
    #   prefill entry n = 2, kv 10: 5 + 30*2/1000 + 40*10/1e6 = 5.0604 ms; in use 3.
    # hit rate = 8 / (10 + 10) = 0.4.
    if source == "prefix_tokens":
        cfg = pc_config(workload={"prefix_tokens": 8}, timing=LINEAR)
        hashes = None
    else:
        cfg = pc_config(trace_block_size=8, timing=LINEAR)
        hashes = [[7, 1], [7, 2]]
    res = run(cfg, [10, 10], [1, 1], send_ns=[0, 20 * MS], hash_ids=hashes)
    a, b = res["requests"]
    assert (a["cached_tokens"], b["cached_tokens"]) == (0, 8)
    assert emits(res, 0) == [5_300_400] and emits(res, 1) == [20 * MS + 5_060_400]
    p = res["passes"]
    assert [(x["prefill_tokens"], x["prefill_kv_tokens"], x["blocks_in_use"]) for x in p] == [
        (10, 10, 3), (2, 10, 3)]
    assert p[1]["rank_time_ms"] == 5.0 + 30.0 * 2 / 1000 + 20.0 * 0 / 1000 + 40.0 * 10 / 1e6
    s = summarize(res, [10, 10], [1, 1], [50], NO_SLO, None)
    assert s["prefix_cache_hit_rate"] == 0.4
    assert s["mean_ttft_ms"] == (5.3004 + 5.0604) / 2
    # the same run without prefix caching: b computes its whole prompt
    cfg["engine"]["aggregated"]["prefix_caching"] = False
    off = run(cfg, [10, 10], [1, 1], send_ns=[0, 20 * MS], hash_ids=hashes)
    assert emits(off, 1) == [20 * MS + 5_300_400]
    assert [r["cached_tokens"] for r in off["requests"]] == [0, 0]
    assert summarize(off, [10, 10], [1, 1], [50], NO_SLO, None)["prefix_cache_hit_rate"] == 0.0


def test_prefix_hash_ids_partial_match():
    # T = 8, bs 4, input 20 (5 complete blocks; the cap (20 - 1) // 4 = 4 blocks).
    # a hash [1, 2, 3]: (1,4) (1,8) (2,4) (2,8) (3,4), at 0 -> no hit, all 5 registered.
    # b hash [1, 2, 9] @20: (1,4) (1,8) (2,4) (2,8) resident, cap 4 -> 16 tokens.
    # c hash [1, 5, 3] @40: (1,4) (1,8) resident, (5,4) not -> 8 tokens (the later (3,4)
    #   is resident but the run stopped).
    # d hash [4, 2, 3] @60: (4,4) not resident -> 0.
    cfg = pc_config(trace_block_size=8)
    hashes = [[1, 2, 3], [1, 2, 9], [1, 5, 3], [4, 2, 3]]
    res = run(cfg, [20] * 4, [1] * 4, send_ns=[0, 20 * MS, 40 * MS, 60 * MS], hash_ids=hashes)
    assert [r["cached_tokens"] for r in res["requests"]] == [0, 16, 8, 0]
    assert [x["prefill_tokens"] for x in res["passes"]] == [20, 4, 12, 20]
    s = summarize(res, [20] * 4, [1] * 4, [50], NO_SLO, None)
    assert s["prefix_cache_hit_rate"] == 24 / 80


def test_prefix_last_token_cap_and_no_dedupe():
    # Identical prompts (hash [5], T 512), bs 4, 10 blocks, a at 0, b at 20 ms.
    # input 8: a registers (5,4), (5,8) and finishes @10: LRU [a1, a0] (reverse order).
    #   b: cap (8 - 1) // 4 = 1 block -> h = 1 (not 2), computed 4, n = 4, new =
    #   ceil(8/4) - 1 = 1; a0 leaves the LRU (used 1), b's new block 1 is completed by
    #   computed + n = 8, but (5,8) is resident (a1, cached) -> it stays anonymous.
    #   b finishes @30: its block 1 (anonymous) -> free, a0 -> LRU tail: [a1, a0].
    cfg = pc_config({"num_blocks": 10})
    sim = ReferenceSim(cfg, ["a", "b"], [8, 8], [1, 1], [0, 20 * MS], hash_ids=[[5], [5]])
    res = sim.run()
    assert [r["cached_tokens"] for r in res["requests"]] == [0, 4]
    assert [(x["prefill_tokens"], x["prefill_kv_tokens"], x["blocks_in_use"])
            for x in res["passes"]] == [(8, 8, 2), (4, 8, 2)]
    rank = sim.workers[0].ranks[0]
    assert lru_idents(sim) == [("h", 5, 8), ("h", 5, 4)]
    assert rank.used_blocks == 0 and len(rank.resident) == 2
    # input 9 (blocks 0, 1 complete, cap 8 // 4 = 2): b hits both: computed 8, n = 1,
    # and computed 8 >= 9 - 1 before the pass -> a DECODE entry (SPEC §5's rule on the
    # computed after hits): num_decode 1, decode_kv_tokens 9, fixed decode 1 ms.
    res = run(cfg, [9, 9], [1, 1], send_ns=[0, 20 * MS], hash_ids=[[5], [5]])
    assert res["requests"][1]["cached_tokens"] == 8
    assert [(x["num_prefill"], x["num_decode"], x["decode_kv_tokens"], x["blocks_in_use"])
            for x in res["passes"]] == [(1, 0, 0, 3), (0, 1, 9, 3)]
    assert emits(res, 1) == [21 * MS]


def test_prefix_lru_eviction_order():
    # bs 4, 8 blocks, fixed 10/1, output 1 each, T 512.
    # @0: a (input 8, hash [1]) and b (input 8, hash [2]): blocks a0 (1,4) a1 (1,8),
    #   b0 (2,4) b1 (2,8); pass [0, 10]; both finish @10 in running order a, b, each
    #   last block first: LRU [a1, a0, b1, b0], used 0, 4 truly free.
    # @20: c (input 24, hash [3]): 6 blocks: 4 truly free, then the LRU head a1, then
    #   a0 (both lose their identity): LRU [b1, b0]; c registers (3,4) ... (3,24).
    #   c finishes @30: LRU [b1, b0, c5, c4, c3, c2, c1, c0], 0 truly free.
    # @40: d (input 9, hash [2]): hits b0, b1 (cap 8 // 4 = 2): cached_tokens 8; new 1;
    #   check 1 + 2 <= 8 - 0. b0, b1 leave the LRU (used 2), the new block evicts c5
    #   (used 3). e (input 9, hash [1]): a's identities were evicted -> no hit; 3 new
    #   blocks, 3 <= 8 - 3: evicts c4, c3, c2 (used 6); registers (1,4), (1,8).
    #   Pass [40, 50]: d n = 1 at computed 8 -> decode entry; e prefill (9 tokens).
    #   Both finish @50: d: its block 2 -> free, b1, b0 -> LRU; e: block 2 -> free,
    #   e1, e0 -> LRU.  Final LRU [c1, c0, b1, b0, e1, e0], 2 truly free.
    cfg = pc_config({"num_blocks": 8})
    hashes = [[1], [2], [3], [2], [1]]
    sim = ReferenceSim(cfg, [f"r{k}" for k in range(5)], [8, 8, 24, 9, 9], [1] * 5,
                       [0, 0, 20 * MS, 40 * MS, 40 * MS], hash_ids=hashes)
    res = sim.run()
    assert [r["cached_tokens"] for r in res["requests"]] == [0, 0, 0, 8, 0]
    assert [(x["start_ns"] // MS, x["num_prefill"], x["prefill_tokens"], x["num_decode"],
             x["blocks_in_use"]) for x in res["passes"]] == [
        (0, 2, 16, 0, 4), (20, 1, 24, 0, 6), (40, 1, 9, 1, 6)]
    assert lru_idents(sim) == [("h", 3, 8), ("h", 3, 4), ("h", 2, 8), ("h", 2, 4),
                               ("h", 1, 8), ("h", 1, 4)]
    rank = sim.workers[0].ranks[0]
    assert rank.used_blocks == 0 and set(rank.resident) == set(lru_idents(sim))


def test_prefix_cached_hit_counts_in_admission_check():
    # bs 4, 4 blocks, fixed 10/1.  x (input 4, hash [5], output 3), a (input 8, hash
    # [1], output 1) at 0; b (input 10, hash [1], output 1) at 10.5 ms.
    # @0: x 1 block (5,4), a 2 blocks (1,4) (1,8): used 3. Pass [0, 10].
    # @10: a finishes: LRU [a1, a0], used 1. x decodes 4 -> 5: 2 blocks, the new one
    #   truly free (4 - 1 - 2 = 1): used 2. Pass [10, 11].
    # @11: x 5 -> 6 (no new block). b: hits a0, a1 (cap 9 // 4 = 2), computed 8, n = 2,
    #   new = ceil(10/4) - 2 = 1, but both hits are cached: 1 + 2 = 3 > 4 - 2 = 2 ->
    #   head of line (it would fit if the cached hits were not counted: 1 <= 2).
    # @12: x's 3rd token finished it @12 (block 1 anonymous -> free, x0 -> LRU tail):
    #   used 0, LRU [a1, a0, x0]; b: 3 <= 4 -> admitted @12 with cached_tokens 8.
    cfg = pc_config({"num_blocks": 4})
    res = run(cfg, [4, 8, 10], [3, 1, 1], send_ns=[0, 0, 10_500_000],
              hash_ids=[[5], [1], [1]])
    x, a, b = res["requests"]
    assert emits(res, 0) == [10 * MS, 11 * MS, 12 * MS]
    assert b["first_admit_ns"] == 12 * MS and b["cached_tokens"] == 8
    assert emits(res, 2) == [22 * MS]
    assert [(x["start_ns"] // MS, x["blocks_in_use"]) for x in res["passes"]] == [
        (0, 3), (10, 2), (11, 2), (12, 3)]


def test_prefix_registration_visible_in_the_same_pass():
    # Two identical prompts (input 10, hash [1], bs 4) at 0, fixed 10/1, output 1.
    # a is admitted first: n = 10, 3 blocks, registers (1,4), (1,8) at once. b is
    # considered next in the same pass: both identities resident (in use by a):
    # h = 2, computed 8, n = 2, new 1, no cached hit: 1 <= 100 - 3 -> cached_tokens 8.
    # Batch: 2 prefills, tokens 10 + 2, kv 10 + 10; in use 3 + 1 (shared counted once).
    # @10 both finish: a: block 2 -> free, a1, a0 -> ref 1 (b holds them); b: its block
    # 2 -> free, a1, a0 -> ref 0 -> LRU [a1, a0].
    cfg = pc_config()
    sim = ReferenceSim(cfg, ["a", "b"], [10, 10], [1, 1], [0, 0], hash_ids=[[1], [1]])
    res = sim.run()
    assert [r["cached_tokens"] for r in res["requests"]] == [0, 8]
    p = res["passes"]
    assert len(p) == 1
    assert (p[0]["num_prefill"], p[0]["prefill_tokens"], p[0]["prefill_kv_tokens"],
            p[0]["blocks_in_use"]) == (2, 12, 20, 4)
    assert lru_idents(sim) == [("h", 1, 8), ("h", 1, 4)]
    assert sim.workers[0].ranks[0].used_blocks == 0


def test_prefix_step1_registration_visible_to_step2():
    # A chunked prompt registers the blocks each step-1 decision completes.
    # bs 4, max_batched_tokens 12, fixed 10/1; a, b input 20, hash [1], output 1, at 0.
    # @0: a n = 12 (3 blocks, registers blocks 0..2), B = 0: b not considered.
    # @10: step 1: a n = 8 -> 5 blocks, registers blocks 3, 4 (20 // 4 = 5); B = 4.
    #   step 2: b hits blocks 0..3 (cap 19 // 4 = 4; block 3 was registered just
    #   now): computed 16, n = 4, new = 5 - 4 = 1 -> cached_tokens 16.
    #   Batch: 2 prefills, tokens 8 + 4, kv 20 + 20; in use 5 + 1.
    cfg = pc_config({"max_batched_tokens": 12})
    res = run(cfg, [20, 20], [1, 1], send_ns=[0, 0], hash_ids=[[1], [1]])
    assert [r["cached_tokens"] for r in res["requests"]] == [0, 16]
    assert [(x["num_prefill"], x["prefill_tokens"], x["prefill_kv_tokens"], x["blocks_in_use"])
            for x in res["passes"]] == [(1, 12, 12, 3), (2, 12, 40, 6)]
    assert emits(res, 0) == emits(res, 1) == [20 * MS]


def test_prefix_preempted_request_hits_its_own_blocks():
    # No prefix, no hash_ids: identities are unique per request, so only a preempted
    # request can hit its own cached blocks. bs 4, 6 blocks, fixed 10/1.
    # a (input 8, output 2), b (input 12, output 3) at 0.
    # @0: a 2 blocks, b 3 blocks (registered, unique): used 5. Tokens 0 @10.
    # @10: a 8 -> 9 needs 3 blocks (used 6); b 12 -> 13 needs 4: 7 > 6 -> preempt the
    #   last, b itself: blocks b2, b1, b0 -> LRU; used 3. a decodes: token 1 @11, a
    #   finishes: a2 -> free, a1, a0 -> LRU [b2, b1, b0, a1, a0], used 0.
    # @11: b (known 13) hits its 3 blocks (cap 12 // 4 = 3): computed 12, n = 1, new
    #   = ceil(13/4) - 3 = 1; 1 + 3 cached <= 6 -> admitted; computed 12 >= 11: a
    #   decode entry (kv 13, in use 4) -> token 1 @12, token 2 @13.
    #   cached_tokens stays 0 (its first admission @0 had no hit).
    # Without prefix caching b recomputes 13 tokens: prefill [11, 21], tokens @21, 22.
    cfg = pc_config({"num_blocks": 6})
    res = run(cfg, [8, 12], [2, 3], send_ns=[0, 0])
    a, b = res["requests"]
    assert b["num_preemptions"] == 1 and b["cached_tokens"] == 0
    assert emits(res, 1) == [10 * MS, 12 * MS, 13 * MS]
    p11 = [x for x in res["passes"] if x["start_ns"] == 11 * MS][0]
    assert (p11["num_prefill"], p11["num_decode"], p11["decode_kv_tokens"],
            p11["blocks_in_use"]) == (0, 1, 13, 4)
    cfg["engine"]["aggregated"]["prefix_caching"] = False
    off = run(cfg, [8, 12], [2, 3], send_ns=[0, 0])
    assert emits(off, 1) == [10 * MS, 21 * MS, 22 * MS]


def test_prefix_pd_prefill_pool_hits_blocks_held_by_transfer():
    # P/D; prefill pool bs 4, prefix caching; transfer = 10 * 1e6 / (1 * 1e9) * 1e3 =
    # 10 ms for input 10.  a, b input 10, hash [1], output 1; a at 0, b at 15 ms.
    # a: prefill [0, 10] (3 blocks, (1,4) (1,8) registered), handoff @10, transfer
    #   [10, 20]: its blocks stay in use (and resident) until 20.
    # b @15: hits a0, a1 (in use by the transfer): cached_tokens 8, n = 2, new 1:
    #   in use 3 + 1 = 4. Prefill [15, 25], transfer [25, 35].
    # @20: a's transfer end drops a2 (-> free), a1, a0 (ref 2 -> 1). @35: b's drops its
    #   block 2 (-> free), a1, a0 (-> LRU [a1, a0]).
    # Decode pool (defaults): a [20, 21], b [35, 36].
    engine = pd_engine(prefill={"block_size": 4, "num_blocks": 100, "prefix_caching": True},
                       bandwidth=1.0, bytes_per_token=1e6)
    cfg = make_config(engine=engine, load={"type": "trace"}, timing=fixed(10.0, 1.0))
    sim = ReferenceSim(cfg, ["a", "b"], [10, 10], [1, 1], [0, 15 * MS], hash_ids=[[1], [1]])
    res = sim.run()
    a, b = res["requests"]
    assert (a["cached_tokens"], b["cached_tokens"]) == (0, 8)
    assert (a["transfer_end_ns"], b["transfer_end_ns"]) == (20 * MS, 35 * MS)
    assert emits(res, 0) == [21 * MS] and emits(res, 1) == [36 * MS]
    pre = [(x["start_ns"] // MS, x["prefill_tokens"], x["prefill_kv_tokens"], x["blocks_in_use"])
           for x in res["passes"] if x["pool"] == "prefill"]
    assert pre == [(0, 10, 10, 3), (15, 2, 10, 4)]
    prefill_rank = sim.workers[0].ranks[0]
    assert prefill_rank.used_blocks == 0
    assert lru_idents(sim) == [("h", 1, 8), ("h", 1, 4)]
    assert summarize(res, [10, 10], [1, 1], [50], NO_SLO, None)["prefix_cache_hit_rate"] == 0.4


def test_prefix_hit_rate_none_without_admissions():
    cfg = pc_config({"context_length": 8})
    res = run(cfg, [20, 30], [1, 1], send_ns=[0, 0])  # both rejected (input >= L = 8)
    assert [r["cached_tokens"] for r in res["requests"]] == [None, None]
    assert summarize(res, [20, 30], [1, 1], [50], NO_SLO, None)["prefix_cache_hit_rate"] is None


class CheckedSim(ReferenceSim):
    """ReferenceSim checking the block accounting of every caching rank after every
    instant: in-use blocks are exactly the distinct blocks referenced by requests (with
    matching reference counts), cached blocks are identity-bearing, unreferenced and
    resident, and in-use + cached never exceed num_blocks."""

    def process_instant(self, t):
        super().process_instant(t)
        self.check_blocks()

    def check_blocks(self):
        for w in self.workers:
            if not w.pool.prefix_caching:
                continue
            for rank in w.ranks:
                refs = {}
                for req in self.requests:
                    if (req.worker, req.rank) == (w.index, rank.index):
                        for block in req.blocks:
                            refs[id(block)] = (block, refs.get(id(block), (block, 0))[1] + 1)
                assert rank.used_blocks == len(refs)
                assert all(block.ref == count for block, count in refs.values())
                assert rank.used_blocks + len(rank.lru) <= w.pool.num_blocks
                for block in rank.lru:
                    assert block.ref == 0 and id(block) not in refs
                    assert block.ident is not None and rank.resident[block.ident] is block
                for ident, block in rank.resident.items():
                    assert block.ident == ident and (block.ref > 0 or block in rank.lru)


def prefix_invariants_run(seed, mode):
    # Random small scenarios on a tight cache with shared prefixes: hits and
    # preemptions happen; blocks never exceed num_blocks; everything is freed at the end
    # (in use 0, cached + truly free = num_blocks).
    rng = random.Random(500 + seed)
    n = 50
    inputs = [rng.randint(1, 48) for _ in range(n)]
    outputs = [rng.randint(1, 25) for _ in range(n)]
    use_hashes = seed % 2 == 1
    T = rng.choice([4, 6, 8, 16])
    hashes = None
    if use_hashes:  # prefix-chained: a few roots, each extended by a few branches
        hashes = []
        for k in range(n):
            chain, node = [], rng.randint(0, 2)
            for m in range(-(-inputs[k] // T)):
                chain.append(node)
                node = node * 4 + rng.randint(0, 1 if m < 2 else 3) + 1
            hashes.append(chain)
    pool = {"replicas": 1, "attention_dp": 2, "block_size": rng.choice([2, 4, 5]),
            "num_blocks": 30, "max_batched_tokens": rng.choice([16, 40]),
            "max_sequences": 6, "prefix_caching": True}
    workload = None if use_hashes else {"prefix_tokens": rng.choice([8, 20])}
    if mode == "aggregated":
        engine = {"aggregated": pool}
    else:
        engine = pd_engine(prefill=pool, decode=dict(pool, prefix_caching=False),
                           bandwidth=1.0, bytes_per_token=1e5)
    sections = dict(engine=engine, load={"concurrency": 10}, timing={"type": "linear"})
    if workload:
        sections["workload"] = workload
    cfg = make_config(**sections)
    cfg["workload"]["block_size"] = T
    sim = CheckedSim(cfg, [f"r{k}" for k in range(n)], inputs, outputs, None, hash_ids=hashes)
    res = sim.run()
    L = 30 * pool["block_size"]
    for k, r in enumerate(res["requests"]):
        if inputs[k] >= L:
            assert r["status"] == "rejected" and r["cached_tokens"] is None
            continue
        assert r["status"] == "completed"
        assert r["generated_tokens"] == min(outputs[k], L - inputs[k])
        assert 0 <= r["cached_tokens"] <= inputs[k] - 1
        assert r["cached_tokens"] % pool["block_size"] == 0
    assert sum(r["cached_tokens"] or 0 for r in res["requests"]) > 0
    assert all(p["blocks_in_use"] <= 30 for p in res["passes"])
    caching = [w for w in sim.workers if w.pool.prefix_caching]
    assert caching
    for w in sim.workers:
        for rank in w.ranks:
            assert rank.used_blocks == 0 and not rank.running and not rank.waiting
            assert len(rank.lru) == len(rank.resident) <= w.pool.num_blocks
    s = summarize(res, inputs, outputs, [50], NO_SLO, None)
    admitted = [k for k in range(n) if res["requests"][k]["cached_tokens"] is not None]
    assert s["prefix_cache_hit_rate"] == (
        sum(res["requests"][k]["cached_tokens"] for k in admitted)
        / sum(inputs[k] for k in admitted))
    return res


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_prefix_caching_invariants(seed, mode):
    prefix_invariants_run(seed, mode)


def test_prefix_caching_invariants_see_preemptions():
    # The random scenarios above are tight enough to preempt (and re-admit with a hit).
    total = 0
    for seed in range(6):
        for mode in ("aggregated", "disaggregated"):
            res = prefix_invariants_run(seed, mode)
            total += sum(r["num_preemptions"] for r in res["requests"])
    assert total > 0
