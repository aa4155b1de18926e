"""vLLM's whole-sequence admission (engine.<pool>.reserve_full_isl): a hand-worked
timeline, the scenarios' coverage, and configuration errors.  The engine is compared
with the reference implementation in tests/test_against_reference.py."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

import simcore
from simcore.config import ConfigError, load_config
from tests.scenarios import random_scenario
from tests.test_against_reference import NUM_FULL_ISL_SCENARIOS, reference


def run_two_prompts(reserve_full_isl: bool) -> dict:
    """a (6 prompt tokens, 2 outputs) and b (6, 1), both sent at 0; one rank of 10
    blocks of 1 token, a budget of 8 tokens; fixed timing: 1 ms a pass."""
    requests = pa.table(
        {"request_id": ["a", "b"], "input_tokens": [6, 6], "output_tokens": [2, 1], "send_ms": [0.0, 0.0]}
    )
    pool = {"num_blocks": 10, "block_size": 1, "max_batched_tokens": 8, "reserve_full_isl": reserve_full_isl}
    cfg = {
        "load": {"type": "trace"},
        "workload": {"num_requests": 2},
        "engine": {"aggregated": pool},
        "timing": {"type": "fixed", "prefill_ms": 1.0, "decode_ms": 1.0},
    }
    return simcore.run(cfg, requests=requests).requests.to_pydict()


def test_waiting_prompt_is_admitted_only_when_it_fits_whole():
    # Chunk rule: pass [0, 1] computes a's 6 tokens (6 blocks) and b's first 2 (the
    # budget's rest; 2 of the 4 free blocks).  Pass [1, 2] decodes a (block 7) and b's
    # next 4 tokens would need 4 blocks with 2 free: b, the last running request, is
    # preempted (its 2 blocks freed, 3 free) and a decodes alone; b is not re-admitted
    # in a pass that preempted.  At 2 a finishes (7 blocks freed), b restarts from 0.
    off = run_two_prompts(False)
    assert off["first_admit_ms"] == [0.0, 0.0]
    assert off["num_preemptions"] == [0, 1]
    # Whole sequence: at 0, b needs 6 blocks with 4 free, so it waits (head of line);
    # at 1 a decodes (7 blocks), b needs 6 with 3 free; at 2 a finishes and b is
    # admitted with all 10 free: one prefill of 6 tokens, its only token at 3.
    on = run_two_prompts(True)
    assert on["first_admit_ms"] == [0.0, 2.0]
    assert on["num_preemptions"] == [0, 0]
    assert on["ttft_ms"] == [1.0, 3.0]


def test_scenarios_hold_back_admissions():
    """The rule decides: in many scenarios an admission waits that the chunk rule would take."""
    differ = 0
    for seed in range(NUM_FULL_ISL_SCENARIOS):
        on = random_scenario(seed, reserve_full_isl=True)
        off = dict(on, config=json.loads(json.dumps(on["config"])))
        off["config"]["engine"]["aggregated"]["reserve_full_isl"] = False
        _, slow_on = reference(on)
        _, slow_off = reference(off)
        differ += [r["first_admit_ns"] for r in slow_on["requests"]] != [r["first_admit_ns"] for r in slow_off["requests"]]
    assert differ >= NUM_FULL_ISL_SCENARIOS // 10, differ


@pytest.mark.parametrize(
    "engine, key",
    [
        ({"policy": "sglang", "aggregated": {"reserve_full_isl": True}}, "engine.aggregated.reserve_full_isl"),
        ({"policy": "trtllm", "aggregated": {"reserve_full_isl": True}}, "engine.aggregated.reserve_full_isl"),
        ({"aggregated": {"reserve_full_isl": "yes"}}, "engine.aggregated.reserve_full_isl"),
    ],
)
def test_bad_reserve_full_isl_names_the_key(engine, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config({"engine": engine})
