"""Hand-worked cases of the sglang policy's chunked request and PrefillAdder
budgets (docs/policies.md, sglang), with the arithmetic in the test, checked
through the public API and against the reference implementation."""

from __future__ import annotations

import pyarrow as pa
import pytest

import simcore
from simcore.config import merge_config
from tests.reference.sim import ReferenceSim

FIXED = {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 1.0}
MS = 1_000_000


def run(rows: list[tuple], engine: dict, load: dict | None = None, timing: dict = FIXED):
    """Rows (request_id, input, output[, send_ms]); returns (requests by id,
    emission instants by id, pass rows) and checks the reference agrees."""
    columns = {"request_id": [r[0] for r in rows], "input_tokens": [r[1] for r in rows], "output_tokens": [r[2] for r in rows]}
    if len(rows[0]) == 4:
        columns["send_ms"] = [float(r[3]) for r in rows]
    config = {
        "load": load or {"type": "trace"},
        "timing": timing,
        "engine": {"policy": "sglang", **engine},
        "output": {"tokens": True, "passes": True},
    }
    result = simcore.run(config, requests=pa.table(columns))
    requests = {row["request_id"]: row for row in result.requests.to_pylist()}
    emitted = {}
    for tok in result.tokens.to_pylist():
        emitted.setdefault(tok["request_id"], []).append(tok["emitted_ms"])
    passes = result.passes.to_pylist()
    send_ns = None if len(rows[0]) == 3 else [round(r[3] * MS) for r in rows]
    slow = ReferenceSim(merge_config(config), columns["request_id"], columns["input_tokens"], columns["output_tokens"], send_ns).run()
    assert [[e / MS for e, _ in toks] for toks in slow["tokens"]] == [emitted.get(r[0], []) for r in rows]
    assert [r["num_preemptions"] for r in slow["requests"]] == [requests[r[0]]["num_preemptions"] for r in rows]
    return requests, emitted, passes


def batches(passes: list[dict], pool: str = "aggregated") -> list[tuple]:
    """(start ms, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens)."""
    keys = ("start_ms", "num_prefill", "prefill_tokens", "prefill_kv_tokens", "num_decode", "decode_kv_tokens")
    return [tuple(p[k] for k in keys) for p in passes if p["pool"] == pool]


def test_a_one_token_last_chunk_stays_the_chunked_request_and_is_an_extend_pass():
    # Closed loop, concurrency 2; 1000 one-token pages; chunked_prefill_size 8.
    # A (2 in, 4 out), B (7 in, 2 out), both sent at 0.
    # @0 (empty rank, ratio 0.7): A first, 2 <= rem_chunk 8: whole; offset = 2 + 4 = 6,
    #   rem_chunk 6. B: 7 + 2 = 9 < 1000 - 6; ceil_page(7) = 7 > 6: a chunk of 6 (B is
    #   now the chunked request) closes the batch. [0, 10]: A's token 1 @10.
    # @10: B has 1 prompt token left; it is still the chunked request, scheduled first:
    #   limit = min(8, int(992 - 3 * 0.7)) = 8, n = min(1, 8) = 1 = need (its last chunk).
    #   The batch is an extend batch (A does not decode in it) and its entry a prefill
    #   entry (1 token, kv 7): [10, 20], B's token 1 @20.
    # @20: decode A and B [20, 21]: both tokens 2 @21, B done. A alone: @22, @23.
    requests, emitted, passes = run(
        [("a", 2, 4), ("b", 7, 2)],
        {"aggregated": {"num_blocks": 1000, "chunked_prefill_size": 8}},
        load={"type": "closed_loop", "concurrency": 2},
    )
    assert emitted == {"a": [10.0, 21.0, 22.0, 23.0], "b": [20.0, 21.0]}
    assert batches(passes) == [
        (0.0, 2, 8, 8, 0, 0), (10.0, 1, 1, 7, 0, 0), (20.0, 0, 0, 0, 2, 3 + 8), (21.0, 0, 0, 0, 1, 4), (22.0, 0, 0, 0, 1, 5)]


def test_a_one_token_last_chunk_on_a_pd_prefill_rank():
    # P/D, kv_transfer off, the same A and B sent at 0; prefill pool chunked_prefill_size 8.
    # Prefill @0: A whole (2), B a chunk of 6: [0, 10]; A is handed off @10. Prefill @10:
    #   B's last chunk of 1 token, an extend (prefill entry, kv 7): [10, 20]; handoff @20.
    #   (A prefill rank never decodes: it has no request with its prompt computed.)
    # Decode rank: A enters @10 with 1 token to compute: its first step is a decode entry
    #   (kv 2), [10, 11] -> A's token 1 @11, then decodes @12, @13, @14. B enters @20:
    #   [20, 21] -> @21, decode @22.
    engine = {"mode": "disaggregated", "prefill": {"num_blocks": 1000, "chunked_prefill_size": 8}, "decode": {"num_blocks": 1000}}
    _, emitted, passes = run([("a", 2, 4, 0.0), ("b", 7, 2, 0.0)], engine)
    assert emitted == {"a": [11.0, 12.0, 13.0, 14.0], "b": [21.0, 22.0]}
    assert batches(passes, "prefill") == [(0.0, 2, 8, 8, 0, 0), (10.0, 1, 1, 7, 0, 0)]
    assert batches(passes, "decode")[0] == (10.0, 0, 0, 0, 1, 2)


def test_rem_total_subtracts_the_summed_reservations():
    # 18 one-token pages (L 18). D1 (2 in, 2 out) and D2 (3 in, 10 out) at 0, W (4 in,
    # 2 out) at 5 ms.
    # @0: D1 first on the empty rank: offset = 2 + 2 = 4. D2: 3 + 10 = 13 < 18 - 4 = 14:
    #   whole, offset 4 + 13 = 17. [0, 10]: both emit token 1.
    # @10 (ratio still 0.7): the running reservations, in running order, 1 x 0.7 = 0.7 and
    #   9 x 0.7 = 6.3, are summed first (PrefillAdder.__init__): offset = 0.7 + 6.3 = 7.0,
    #   rem_total = 13 - 7.0 = 6.0. W: 4 + 2 = 6 >= 6.0: not admitted. (Subtracting term
    #   by term, (13 - 0.7) - 6.3 = 6.000000000000001, would admit W @10.)
    #   Decode [10, 11]: D1 done (2 tokens) and frees its 3 blocks.
    # @11: offset = 8 x (0.7 - decay) < 5.6, rem_total > 14 - 5.6 = 8.4 > 6: W admitted,
    #   [11, 21], W's token 1 @21; decode [21, 22]: W @22.
    assert 13 - (0.7 + 6.3) == 6.0 and (13 - 0.7) - 6.3 == 6.000000000000001
    requests, emitted, _ = run([("d1", 2, 2, 0.0), ("d2", 3, 10, 0.0), ("w", 4, 2, 5.0)], {"aggregated": {"num_blocks": 18}})
    assert emitted["d1"] == [10.0, 11.0]
    assert requests["w"]["first_admit_ms"] == 11.0 and emitted["w"] == [21.0, 22.0]


def test_the_initial_ratio_is_capped_at_one():
    # schedule_conservativeness 1.6: init = min(0.7 x 1.6, 1) = 1.0 (not 1.12). 19 pages.
    # D (2 in, 11 out) at 0, W (4 in, 2 out) at 5 ms. @0: D alone [0, 10].
    # @10: offset = 10 x 1.0 = 10.0, rem_total = 17 - 10.0 = 7.0 > 4 + 2 = 6: W admitted
    #   [10, 20] (with 1.12: 17 - 11.2 = 5.8 <= 6, W would wait).
    requests, _, _ = run([("d", 2, 11, 0.0), ("w", 4, 2, 5.0)], {"aggregated": {"num_blocks": 19, "schedule_conservativeness": 1.6}})
    assert requests["w"]["first_admit_ms"] == 10.0 and requests["w"]["first_token_ms"] == 20.0


def test_rem_input_stops_a_request_that_does_not_fit_the_batch():
    # max_prefill_tokens 8: A (4 in) takes rem_input to 8 - 4 = 4; B (4 in): ceil_page(4) = 4
    # >= 4 with the batch not empty: B waits (add_one_req's OTHER). [0, 10] A; @10 B is
    # admitted alone, [10, 20].
    requests, _, _ = run([("a", 4, 1, 0.0), ("b", 4, 1, 0.0)], {"aggregated": {"num_blocks": 100, "max_prefill_tokens": 8}})
    assert requests["b"]["first_admit_ms"] == 10.0 and requests["b"]["first_token_ms"] == 20.0


def test_budgets_are_charged_whole_pages():
    # 4-token pages, chunked_prefill_size 8. A (3 in) is charged ceil_page(3) = 4: rem_chunk
    # 8 - 4 = 4. B (5 in): ceil_page(5) = 8 > 4: a page-aligned chunk of 4 (it would fit
    # whole with a charge of 3). [0, 10]: A's token, B computed 4.
    # @10: B's last chunk, 1 token, an extend: [10, 20], B's token @20 (kv 5).
    requests, emitted, passes = run([("a", 3, 1, 0.0), ("b", 5, 1, 0.0)], {"aggregated": {"num_blocks": 100, "block_size": 4, "chunked_prefill_size": 8}})
    assert emitted == {"a": [10.0], "b": [20.0]}
    assert batches(passes) == [(0.0, 2, 7, 7, 0, 0), (10.0, 1, 1, 5, 0, 0)]


def test_the_chunked_request_is_retracted_when_the_lone_decoder_cannot_grow():
    # P/D, kv_transfer off. A (5 in, 7 out), V (5, 8), E (16, 4) sent at 0; the prefill pool
    # (defaults) computes all three in [0, 10] and hands them off @10 in that order.
    # Decode rank: 20 one-token pages (L 20), chunked_prefill_size 4, conservativeness 0.05:
    # init ratio 0.035.
    # @10: A first (empty rank): 1 token, 5 pages, offset 1 + 7 = 8. V: 1 + 8 = 9 < 20 - 8:
    #   5 pages, offset 17. E: 1 + 4 = 5 >= 20 - 17: waits. [10, 11] A and V's first tokens.
    # @11..@15: E needs 16 pages, never more than 10 are free; A and V decode, 2 pages a
    #   step: free 10, 8, 6, 4, 2 -> 0 after the step @15 (tokens @12..@16).
    # @16: the step needs 2 pages, none free: retract V (6 generated each, prompts 5 each:
    #   the later one); V frees 10 pages and waits behind E (known 11). A decodes its 7th
    #   token @17 and finishes.
    # @17: empty rank, ratio 0.035. E first: 1 token, 16 pages, offset 1 + 4 = 5, rem_chunk 3.
    #   V: 11 + (8 - 6) = 13 < 20 - 5; ceil_page(11) > 3: a chunk of 3 (V is the chunked
    #   request). E's first step is a decode entry, V's chunk a prefill entry: [17, 28].
    #   1 page free.
    # @28: V first: limit = min(4, int(1 - (4 - 1) x 0.035)) = 0, so rem_chunk 4: n = min(8, 4)
    #   needs 4 pages > 1: skipped. Decode E [28, 29]: 0 pages free.
    # @29: V skipped again; E needs a page, none free, no other decoder: the chunked request
    #   V is retracted (num_preemptions 2, frees 3 pages). E decodes [29, 30], [30, 31].
    # @31: E done; V first on the empty rank: chunks of 4, 4 and 3 in [31, 41], [41, 51],
    #   [51, 61] (token 7 @61), then its 8th @62.
    engine = {"mode": "disaggregated", "prefill": {}, "decode": {"num_blocks": 20, "chunked_prefill_size": 4, "schedule_conservativeness": 0.05}}
    requests, emitted, passes = run([("a", 5, 7, 0.0), ("v", 5, 8, 0.0), ("e", 16, 4, 0.0)], engine)
    assert [requests[k]["num_preemptions"] for k in "ave"] == [0, 2, 0]
    assert emitted == {
        "a": [11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 17.0],
        "v": [11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 61.0, 62.0],
        "e": [28.0, 29.0, 30.0, 31.0],
    }
    decode = [(p["start_ms"], p["num_prefill"], p["prefill_tokens"], p["num_decode"], p["blocks_in_use"]) for p in passes if p["pool"] == "decode"]
    assert decode[6:10] == [(16.0, 0, 0, 1, 11), (17.0, 1, 3, 1, 19), (28.0, 0, 0, 1, 20), (29.0, 0, 0, 1, 18)]


def test_schedule_conservativeness_accepts_zero_and_rejects_negatives():
    # SGLang asserts schedule_conservativeness >= 0. With 0 the ratio is 0 and running
    # requests reserve nothing. 15 pages; D (2 in, 11 out) at 0, W (4 in, 2 out) at 5 ms.
    # @10: rem_total = 13 - 10 x 0.0 = 13.0 > 4 + 2: W joins. At the default (ratio 0.7)
    # 13 - 7.0 = 6.0 <= 6: W waits.
    engine = {"aggregated": {"num_blocks": 15, "schedule_conservativeness": 0.0}}
    requests, _, _ = run([("d", 2, 11, 0.0), ("w", 4, 2, 5.0)], engine)
    assert requests["w"]["first_admit_ms"] == 10.0
    engine["aggregated"]["schedule_conservativeness"] = 1.0
    requests, _, _ = run([("d", 2, 11, 0.0), ("w", 4, 2, 5.0)], engine)
    assert requests["w"]["first_admit_ms"] > 10.0
    with pytest.raises(simcore.ConfigError, match=r"engine.aggregated.schedule_conservativeness must be >= 0, got -0.5"):
        simcore.load_config({"engine": {"policy": "sglang", "aggregated": {"schedule_conservativeness": -0.5}}})


def test_the_ratio_resets_only_when_the_worker_idles():
    # 9 one-token pages, conservativeness 0.1 (init 0.07); a (2 in, 5 out) at 0, b (1, 5) at
    # 5 ms, c (1, 8) at 16 ms.
    # @0: a [0, 10], token 1 @10. @10: rem_total = 7 - (5 - 1) x 0.07 = 6.72 > 1 + 5: b
    #   [10, 20] (a waits), token 1 @20. @20, @21, @22: a and b decode (free 6, 4, 2, 0).
    # @23: 2 pages needed, none free: retract a (4 generated each; a's prompt 2 > 1); it
    #   waits behind c. ratio = min(1, (4 + 20 x 1) / 5) = 1.0. b's 5th token @24: done.
    # @24: c and a wait, so the worker is not idle and the ratio stays 1.0. c first on the
    #   empty rank: offset 1 + 8 = 9 = the 9 free tokens, rem_total 0 ends the batch:
    #   [24, 34], c @34.
    # @34: rem_total = 8 - 7 x 1.0 = 1.0 <= 6 + (5 - 4): a waits; at the j-th later build
    #   rem_total < 8 - j <= 7: a waits until c's 8th token @41. @41: a [41, 51], its 5th
    #   token @51. (Reset to 0.07 @24, rem_total @34 would be 8 - 0.49 = 7.51 > 7.)
    rows = [("a", 2, 5, 0.0), ("b", 1, 5, 5.0), ("c", 1, 8, 16.0)]
    requests, emitted, _ = run(rows, {"aggregated": {"num_blocks": 9, "schedule_conservativeness": 0.1}})
    assert emitted == {
        "a": [10.0, 21.0, 22.0, 23.0, 51.0],
        "b": [20.0, 21.0, 22.0, 23.0, 24.0],
        "c": [34.0 + j for j in range(8)],
    }
    assert requests["a"]["num_preemptions"] == 1
