"""The first token's path from its pass end to the client under vLLM asynchronous scheduling
(docs/semantics.md, "Where the first token waits between the engine step and the client"):
a hand-worked light-load timeline, with the output path (SPEC §7's detokenization stage) off
and on, and its wait growing with the outputs of the first token's pass."""

from __future__ import annotations

import pyarrow as pa
import pytest

import simcore

STAGES = ("tokenization_ms", "queue_ms", "prefill_ms", "transfer_ms", "decode_wait_ms", "detokenization_ms")


def run(background: int, detokenization: dict | None):
    """``background`` requests (8 prompt tokens, 50 outputs) sent at 0 ms and request ``r``
    (8, 2) at 33 ms; fixed timing: 10 ms for a pass with a prefill, + 10 ms with decodes."""
    ids = [f"g{i}" for i in range(background)] + ["r"]
    requests = pa.table({
        "request_id": ids, "input_tokens": [8] * len(ids), "output_tokens": [50] * background + [2],
        "send_ms": [0.0] * background + [33.0],
    })
    cfg = {
        "load": {"type": "trace"},
        "workload": {"num_requests": len(ids)},
        "engine": {"aggregated": {"async_scheduling": True}},
        "timing": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 10.0},
    }
    if detokenization is not None:
        cfg["detokenization"] = detokenization
    rows = simcore.run(cfg, requests=requests).requests.to_pylist()
    return next(row for row in rows if row["request_id"] == "r")


@pytest.mark.parametrize("background", [1, 3])
def test_the_first_token_leaves_at_its_pass_end(background):
    # Pass 1 [0, 10] prefills the background requests; from 0 on each pass start builds the
    # next one: decode passes [10, 20], [20, 30], [30, 40], [40, 50].  r arrives at 33, while
    # [30, 40] runs and [40, 50] is queued: it is first seen at 40, in the pass built then,
    # [50, 70] (decodes + r's prefill: 10 + 10 ms).  Its first token is emitted at 70.
    r = run(background, None)
    assert (r["first_admit_ms"], r["first_token_emit_ms"], r["first_token_ms"]) == (40.0, 70.0, 70.0)
    assert r["ttft_ms"] == 37.0  # 7 ms left of the running pass + the queued 10 + its own 20
    assert [r[s] for s in STAGES] == [0.0, 7.0, 30.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("background, wait", [(1, 1.0 + 0.5 * 2), (3, 1.0 + 0.5 * 4)])
def test_the_output_path_waits_for_the_whole_pass(background, wait):
    # One output server, 1 ms a job plus 0.5 ms an output.  The pass ending at 70 emits one
    # token per background request and r's first: one job of background + 1 outputs,
    # [70, 70 + 1 + 0.5 (background + 1)] (the job of the pass ending at 50, at most
    # 1 + 0.5 x 3 ms, is done by then).  r receives its first token at that job's end.
    r = run(background, {"workers": 1, "base_ms": 1.0, "per_output_us": 500.0})
    assert r["first_token_emit_ms"] == 70.0
    assert r["first_token_ms"] == 70.0 + wait
    assert r["ttft_ms"] == 37.0 + wait
    assert [r[s] for s in STAGES] == [0.0, 7.0, 30.0, 0.0, 0.0, wait]


def test_vllm_output_slices_split_the_wait():
    # chunk_size 2 (vLLM's output handler slices a step by VLLM_V1_OUTPUT_PROC_CHUNK_SIZE):
    # the pass ending at 70 has g0, g1, g2 then r (running order, r last): jobs [g0, g1]
    # 70 -> 72 and [g2, r] 72 -> 74 (1 + 0.5 x 2 ms each).
    r = run(3, {"workers": 1, "base_ms": 1.0, "per_output_us": 500.0, "chunk_size": 2})
    assert r["first_token_ms"] == 74.0
    assert r["detokenization_ms"] == 4.0
