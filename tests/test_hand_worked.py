"""Hand-worked cases through the public API, with the arithmetic in the test."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

import simcore
from tests.reference.sim import fnv1a64

FIXED = {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0}
DETOK_OFF = {"workers": 1, "base_ms": 0.0, "per_output_us": 0.0}


def run(requests: list[tuple], *, load=None, detok=None, tok=None, pool=None, timing=FIXED, **extra):
    """Run rows (request_id, input, output[, send_ms]) through the public API."""
    columns = {"request_id": [r[0] for r in requests], "input_tokens": [r[1] for r in requests], "output_tokens": [r[2] for r in requests]}
    if len(requests[0]) == 4:
        columns["send_ms"] = [float(r[3]) for r in requests]
    config = {
        "load": load or {"type": "trace"},
        "timing": timing,
        "detokenization": detok or DETOK_OFF,
        "engine": {"aggregated": pool or {}},
        "output": {"tokens": True},
        **extra,
    }
    if tok:
        config["tokenization"] = tok
    result = simcore.run(config, requests=pa.table(columns))
    rows = {row["request_id"]: row for row in result.requests.to_pylist()}
    received = {}
    for tok_row in result.tokens.to_pylist():
        received.setdefault(tok_row["request_id"], []).append(tok_row["received_ms"])
    return rows, received, result.summary


def ids_on_servers(workers: int, servers: list[int]) -> list[str]:
    """Request ids whose FNV-1a hash maps them to the given detokenizer servers."""
    out, i = [], 0
    for server in servers:
        while fnv1a64(f"q{i}") % workers != server:
            i += 1
        out.append(f"q{i}")
        i += 1
    return out


def test_lone_request_without_detokenization():
    # Pass 1 [0, 10]: prefill of 100 tokens emits token 1 at 10 ms.
    # Passes 2 and 3 are decodes of 2 ms each: tokens at 12 and 14 ms.
    rows, received, summary = run([("a", 100, 3, 0.0)])
    assert received["a"] == [10.0, 12.0, 14.0]
    a = rows["a"]
    assert (a["ttft_ms"], a["tpot_ms"], a["e2el_ms"]) == (10.0, 2.0, 14.0)
    assert (a["queue_ms"], a["prefill_ms"], a["detokenization_ms"]) == (0.0, 10.0, 0.0)
    assert summary["mean_itl_ms"] == 2.0 and summary["duration_s"] == 0.014
    assert summary["output_throughput"] == pytest.approx(3 / 0.014)


def test_lone_request_with_detokenization():
    # One output per job: service = 1 + 500 x 1 / 1000 = 1.5 ms.
    # Emitted at 10, 12, 14 -> received at 11.5, 13.5, 15.5 (the server is free each time).
    rows, received, _ = run([("a", 100, 3, 0.0)], detok={"workers": 1, "base_ms": 1.0, "per_output_us": 500.0})
    assert received["a"] == [11.5, 13.5, 15.5]
    a = rows["a"]
    assert (a["first_token_emit_ms"], a["ttft_ms"], a["e2el_ms"], a["detokenization_ms"]) == (10.0, 11.5, 15.5, 1.5)
    assert a["tpot_ms"] == 2.0


def test_two_requests_of_one_pass_share_one_server_as_one_job():
    # Both prefills run in pass 1 [0, 10] (fixed time) and emit at 10 ms.
    # One server: one job of k = 2 outputs, 1 + 500 x 2 / 1000 = 2 ms -> both at 12 ms.
    detok = {"workers": 1, "base_ms": 1.0, "per_output_us": 500.0}
    _, received, _ = run([("a", 10, 1, 0.0), ("b", 10, 1, 0.0)], detok=detok)
    assert received == {"a": [12.0], "b": [12.0]}


def test_two_requests_of_one_pass_on_two_servers_run_in_parallel():
    # Two servers, one job of k = 1 each: 1 + 500 x 1 / 1000 = 1.5 ms -> both at 11.5 ms.
    a, b = ids_on_servers(2, [0, 1])
    detok = {"workers": 2, "base_ms": 1.0, "per_output_us": 500.0}
    _, received, _ = run([(a, 10, 1, 0.0), (b, 10, 1, 0.0)], detok=detok)
    assert received == {a: [11.5], b: [11.5]}


def test_base_cost_occupies_the_server_so_later_passes_queue():
    # Jobs of 5 ms (base only). Token 1 emitted at 10 -> [10, 15]; token 2 emitted
    # at 12 waits for the server: [15, 20]; token 3 emitted at 14: [20, 25].
    rows, received, summary = run([("a", 100, 3, 0.0)], detok={"workers": 1, "base_ms": 5.0, "per_output_us": 0.0})
    assert received["a"] == [15.0, 20.0, 25.0]
    assert rows["a"]["tpot_ms"] == 5.0  # (25 - 15) / 2: the client sees the server's pace
    assert summary["duration_s"] == 0.025


def test_rejection_reaches_the_client_at_engine_time_and_delays_no_output():
    # L = num_blocks x block_size = 4 x 16 = 64. "big" (64 >= L) is rejected at its
    # arrival, 10 ms, the same instant "a"'s first token is emitted; it carries
    # no output, so "a"'s job is alone on the server: 10 + 1.5 = 11.5 ms.
    detok = {"workers": 1, "base_ms": 1.0, "per_output_us": 500.0}
    pool = {"num_blocks": 4, "block_size": 16}
    rows, received, summary = run([("a", 20, 2, 0.0), ("big", 64, 5, 10.0)], detok=detok, pool=pool)
    big = rows["big"]
    assert big["status"] == "rejected" and big["generated_tokens"] == 0
    assert big["engine_arrival_ms"] == 10.0 and big["first_admit_ms"] is None and big["e2el_ms"] is None
    assert received["a"] == [11.5, 13.5]
    alone, received_alone, _ = run([("a", 20, 2, 0.0)], detok=detok, pool=pool)
    assert received_alone["a"] == received["a"]
    assert (summary["completed"], summary["rejected"]) == (1, 1)


def test_closed_loop_client_sends_at_receive_time():
    # Concurrency 1. "r0": prefill [0, 10] -> token at 10, received 11.5; decode
    # [10, 12] -> token at 12, received 13.5. The client ends at 13.5 and, with a
    # think time of 0.5 ms, sends "r1" at 14.0; "r1" is then received 14+10+1.5 = 25.5.
    detok = {"workers": 1, "base_ms": 1.0, "per_output_us": 500.0}
    config = {
        "workload": {"num_requests": 2, "input_tokens": 100, "output_tokens": 2},
        "load": {"type": "closed_loop", "concurrency": 1, "think_time_ms": 0.5},
        "timing": FIXED,
        "detokenization": detok,
    }
    result = simcore.run(config)
    r0, r1 = result.requests.to_pylist()
    assert r0["last_token_ms"] == 13.5
    assert r1["send_ms"] == 14.0 and r1["first_token_ms"] == 25.5 and r1["ttft_ms"] == 11.5


def test_chunked_detokenization_with_first_and_final_costs():
    # Three one-token requests emit together at 10 ms on one server; chunk_size=2
    # makes jobs of 2 and 1 outputs. Each token is first and final:
    # job 1: 1 + 100x2/1000 + 200x2/1000 + 300x2/1000 = 2.2 ms -> [10, 12.2]
    # job 2: 1 + 0.1 + 0.2 + 0.3 = 1.6 ms -> [12.2, 13.8]
    detok = {"workers": 1, "base_ms": 1.0, "per_output_us": 100.0, "chunk_size": 2, "first_output_us": 200.0, "final_output_us": 300.0}
    _, received, _ = run([("a", 5, 1, 0.0), ("b", 5, 1, 0.0), ("c", 5, 1, 0.0)], detok=detok)
    assert received["a"] == received["b"] == [12.2]
    assert received["c"] == [13.8]


def test_tokenization_fifo_delays_the_engine_arrival():
    # Tokenizer job: 2 + 10 x 100 / 1000 = 3 ms per request; one server.
    # "a" sent at 0: [0, 3]; "b" sent at 1: queues, [3, 6]. Engine: a's prefill
    # [3, 13]; b arrives at 6 and waits for the pass: admitted at 13, [13, 23].
    tok = {"workers": 1, "base_ms": 2.0, "per_input_us": 10.0}
    rows, _, summary = run([("a", 100, 1, 0.0), ("b", 100, 1, 1.0)], tok=tok)
    assert rows["a"]["engine_arrival_ms"] == 3.0 and rows["a"]["ttft_ms"] == 13.0
    b = rows["b"]
    assert (b["tokenization_ms"], b["queue_ms"], b["prefill_ms"], b["ttft_ms"]) == (5.0, 7.0, 10.0, 22.0)
    assert summary["mean_tokenization_ms"] == 4.0


def test_linear_timing_and_the_slowest_rank():
    # Two DP ranks on one worker; rank 0 gets "a" (k=0), rank 1 gets "b" (k=1).
    # linear: base 1 + 10 us x prompt / 1000 + 40 ns x kv / 1e6.
    # rank 0: 1 + 10x100/1000 + 40x100/1e6 = 2.004 ms; rank 1 (300 tokens): 4.012 ms.
    # The pass lasts the slowest rank: both first tokens at 4.012 ms.
    timing = {"type": "linear", "base_ms": 1.0, "per_prefill_token_us": 10.0, "per_decode_seq_us": 0.0, "per_kv_token_ns": 40.0}
    rows, _, _ = run([("a", 100, 1, 0.0), ("b", 300, 1, 0.0)], timing=timing, pool={"attention_dp": 2})
    assert rows["a"]["rank"] == 0 and rows["b"]["rank"] == 1
    assert rows["a"]["ttft_ms"] == rows["b"]["ttft_ms"] == 4.012


def test_preemption_recomputes_the_last_running_request():
    # block_size 4, 3 blocks (L = 12); "a" and "b": 4-token prompts, 6 outputs.
    # Pass 1 [0, 10]: both prefill (1 block each), token 1 at 10 ms.
    # Pass 2 at 10: "a" needs a 2nd block (ceil(5/4) = 2): 1 free, taken (3 in use).
    #   "b" needs one too, none free: the last running request, "b" itself, is
    #   preempted (blocks freed, computed = 0) to the front of waiting.
    # "a" decodes alone, tokens at 12, 14, 16, 18, 20, holding 2 then 3 blocks, so
    # "b" (5 known tokens -> 2 blocks) is blocked at the head of waiting until "a"
    # finishes at 20. Pass [20, 30] recomputes b's 5 tokens (a prefill entry) and
    # emits its token 2 at 30; decodes follow at 32, 34, 36, 38.
    pool = {"num_blocks": 3, "block_size": 4, "max_batched_tokens": 64}
    rows, received, _ = run([("a", 4, 6, 0.0), ("b", 4, 6, 0.0)], pool=pool)
    assert (rows["a"]["num_preemptions"], rows["b"]["num_preemptions"]) == (0, 1)
    assert received["a"] == [10.0, 12.0, 14.0, 16.0, 18.0, 20.0]
    assert received["b"] == [10.0, 30.0, 32.0, 34.0, 36.0, 38.0]


def test_truncation_at_the_sequence_limit():
    # context_length 10: a 7-token prompt stops when 7 + generated >= 10, after 3 tokens.
    rows, received, summary = run([("a", 7, 8, 0.0)], pool={"context_length": 10})
    assert rows["a"]["status"] == "completed" and rows["a"]["generated_tokens"] == 3
    assert received["a"] == [10.0, 12.0, 14.0]
    assert summary["total_output_tokens"] == 3


def test_time_cap_drops_what_happens_after_it():
    # Cap 12.5 ms with detokenization 1.5 ms per job: tokens emitted at 10 and 12
    # are received at 11.5 and 13.5; the second receipt is after the cap.
    detok = {"workers": 1, "base_ms": 1.0, "per_output_us": 500.0}
    rows, received, summary = run([("a", 100, 3, 0.0)], detok=detok, max_time_ms=12.5)
    a = rows["a"]
    assert a["status"] == "incomplete" and a["generated_tokens"] == 2
    assert received["a"] == [11.5, None]
    assert (a["ttft_ms"], a["last_token_ms"], a["e2el_ms"], a["tpot_ms"]) == (11.5, 11.5, None, None)
    assert summary["completed"] == 0 and summary["duration_s"] is None and summary["mean_ttft_ms"] is None
    assert math.isclose(a["first_token_ms"], 11.5)
