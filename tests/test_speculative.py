"""Speculative decoding (docs/speculative.md): hand-worked passes, the engines' forms, the acceptance model."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pyarrow as pa
import pytest

import simcore
from simcore.config import load_config
from simcore.scheduler.speculative import acceptance_rates
from tests.scenarios import random_scenario
from tests.test_against_reference import reference

# base 1 ms, 10 us per prefill (and proposal) token, 5 us per decode sequence, no KV term
LINEAR = {"type": "linear", "base_ms": 1.0, "per_prefill_token_us": 10.0, "per_decode_seq_us": 5.0,
          "per_kv_token_ns": 0.0}
EAGLE3 = {"method": "eagle3", "num_speculative_tokens": 3}


def run(requests, speculative=None, pool=None, timing=LINEAR, policy="vllm"):
    """Rows (request_id, input, output) sent at 0; returns (requests, receipts by request, summary)."""
    columns = {"request_id": [r[0] for r in requests], "input_tokens": [r[1] for r in requests],
               "output_tokens": [r[2] for r in requests], "send_ms": [0.0] * len(requests)}
    pool = dict(pool or {})
    if speculative is not None:
        pool["speculative"] = speculative
    config = {"load": {"type": "trace"}, "timing": timing, "engine": {"policy": policy, "aggregated": pool},
              "output": {"tokens": True}}
    result = simcore.run(config, requests=pa.table(columns))
    received = {}
    for row in result.tokens.to_pylist():
        received.setdefault(row["request_id"], []).append(row["received_ms"])
    return {row["request_id"]: row for row in result.requests.to_pylist()}, received, result.summary


def test_acceptance_one_emits_four_tokens_per_pass():
    """k = 3, every proposal accepted: after the prefill pass each decode pass emits 4 tokens per request.

    Four requests of 8 prompt and 9 output tokens.  Prefill: 32 tokens, 1 + 32 x 10 / 1000 = 1.32 ms,
    first tokens.  Each verification pass: 4 decodes with 3 proposals each, 1 + 12 x 10 / 1000 +
    4 x 5 / 1000 = 1.14 ms, 4 tokens each: 1 + 4 + 4 = 9 tokens after two passes.
    """
    reqs, received, summary = run([(f"r{i}", 8, 9) for i in range(4)],
                                  {"config": EAGLE3, "acceptance_rates": [1.0, 1.0, 1.0]})
    for i in range(4):
        assert received[f"r{i}"] == pytest.approx([1.32] + [2.46] * 4 + [3.6] * 4, abs=1e-9)
        assert reqs[f"r{i}"]["e2el_ms"] == pytest.approx(3.6, abs=1e-9)
        assert reqs[f"r{i}"]["tpot_ms"] == pytest.approx(2.28 / 8, abs=1e-9)
    assert summary["spec_decode_num_drafts"] == 8  # 4 requests x 2 passes
    assert summary["spec_decode_draft_tokens"] == 24
    assert summary["spec_decode_accepted_tokens"] == 24
    assert summary["spec_decode_acceptance_rate"] == 1.0
    assert summary["spec_decode_acceptance_length"] == 4.0
    assert [summary[f"spec_decode_acceptance_rate_pos_{i}"] for i in (1, 2, 3)] == [1.0, 1.0, 1.0]


def test_acceptance_zero_emits_one_token_and_costs_the_verification_of_four():
    """Every proposal rejected: one token per pass, each pass priced with its 3 proposals (1.14 ms,
    not the 1.02 ms of a plain decode): 1.32 + 8 x 1.14 = 10.44 ms."""
    reqs, received, summary = run([(f"r{i}", 8, 9) for i in range(4)],
                                  {"config": EAGLE3, "acceptance_rates": [0.0, 0.0, 0.0]})
    plain, _, _ = run([(f"r{i}", 8, 9) for i in range(4)])
    for i in range(4):
        assert received[f"r{i}"] == pytest.approx([1.32 + 1.14 * j for j in range(9)], abs=1e-9)
        assert reqs[f"r{i}"]["tpot_ms"] == pytest.approx(1.14, abs=1e-9)
        assert plain[f"r{i}"]["e2el_ms"] == pytest.approx(1.32 + 8 * 1.02, abs=1e-9)
    assert summary["spec_decode_num_drafts"] == 32 and summary["spec_decode_accepted_tokens"] == 0
    assert summary["spec_decode_acceptance_length"] == 1.0 and summary["spec_decode_acceptance_rate"] == 0.0


def test_two_of_three_accepted_and_the_output_clipped():
    """Rates [1, 1, 0]: exactly 2 accepted, 3 tokens per pass.  One request, prompt 4, output 6:
    prefill 1 + 40 / 1000 = 1.04 ms; passes of 1 + 30 / 1000 + 5 / 1000 = 1.035 ms emit 3, then 2
    (the output ends inside the burst; vLLM drops the rest).  Counters: 2 verifications, 6 proposals,
    4 accepted (vLLM counts them before the output limit cuts them)."""
    reqs, received, summary = run([("a", 4, 6)], {"config": EAGLE3, "acceptance_rates": [1.0, 1.0, 0.0]})
    assert received["a"] == pytest.approx([1.04, 2.075, 2.075, 2.075, 3.11, 3.11], abs=1e-9)
    assert reqs["a"]["generated_tokens"] == 6
    assert summary["spec_decode_num_drafts"] == 2 and summary["spec_decode_accepted_tokens"] == 4
    assert summary["spec_decode_acceptance_length"] == 3.0
    assert summary["spec_decode_acceptance_rate_pos_3"] == 0.0


def test_proposals_count_against_the_token_budget():
    """Budget 5, two decoding requests: the first verifies 3 proposals (4 tokens), the second gets the
    last token only (a plain decode).  Pass: 1 + 3 x 10 / 1000 + 2 x 5 / 1000 = 1.04 ms."""
    reqs, received, summary = run([("a", 2, 5), ("b", 2, 5)], {"config": EAGLE3, "acceptance_rates": [1.0, 1.0, 1.0]},
                                  pool={"max_batched_tokens": 5})
    # prefill: 4 tokens, 1.04 ms; pass 2: a +4 (done), b +1; pass 3: b verifies 3 (+3, 4 left of 5: done)
    assert received["a"] == pytest.approx([1.04, 2.08, 2.08, 2.08, 2.08], abs=1e-9)
    assert received["b"][:2] == pytest.approx([1.04, 2.08], abs=1e-9)
    # pass 3: b alone verifies 3 proposals: 1 + 0.03 + 0.005
    assert received["b"][2:] == pytest.approx([2.08 + 1.035] * 3, abs=1e-9)
    assert summary["spec_decode_num_drafts"] == 2 and summary["spec_decode_draft_tokens"] == 6


def test_proposer_cost_per_pass():
    """EAGLE-3 with k = 3 runs 3 proposer passes per step: 3 x (0.2 + 10 x 1 / 1000) = 0.63 ms more
    per pass with a decode entry (one sequence); none on the prefill pass."""
    spec = {"config": EAGLE3, "acceptance_rates": [1.0, 1.0, 1.0], "proposer_step_ms": 0.2, "proposer_per_seq_us": 10.0}
    _, received, _ = run([("a", 4, 5)], spec)
    # prefill 1.04 ms; verification 1 + 0.03 + 0.005 = 1.035 ms, + 0.63
    assert received["a"] == pytest.approx([1.04] + [1.04 + 1.035 + 0.63] * 4, abs=1e-9)


@pytest.mark.parametrize("policy, form", [
    ("vllm", json.dumps(EAGLE3)),
    ("vllm", {"method": "mtp", "num_speculative_tokens": 3}),
    ("sglang", {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4}),
    ("sglang", {"--speculative-algorithm": "EAGLE3", "--speculative-num-steps": 3}),
    ("trtllm", {"decoding_type": "MTP", "num_nextn_predict_layers": 3}),
    ("trtllm", {"decoding_type": "Eagle", "max_draft_len": 3, "speculative_model_dir": "/models/eagle"}),
])
def test_each_engine_form_verifies_three_proposals(policy, form):
    """The same chain of 3 proposals in each engine's own form: same passes (acceptance 1: 1 + 4 + 4)."""
    reqs, received, _ = run([("a", 8, 9)], {"config": form, "acceptance_rates": [1.0, 1.0, 1.0]},
                            timing={"type": "fixed", "prefill_ms": 2.0, "decode_ms": 1.0}, policy=policy)
    assert received["a"] == pytest.approx([2.0] + [3.0] * 4 + [4.0] * 4, abs=1e-9)


def test_sglang_tree_verifies_more_than_it_accepts():
    """SGLang with topk 4: 8 draft tokens verified (query 8), at most num_steps = 2 accepted: 3 tokens per pass.
    Pass: 1 + 7 x 10 / 1000 + 5 / 1000 = 1.075 ms."""
    form = {"speculative_algorithm": "EAGLE", "speculative_num_steps": 2, "speculative_eagle_topk": 4,
            "speculative_num_draft_tokens": 8}
    _, received, summary = run([("a", 4, 7)], {"config": form, "acceptance_rates": [1.0, 1.0]}, policy="sglang")
    assert received["a"] == pytest.approx([1.04] + [2.115] * 3 + [3.19] * 3, abs=1e-9)
    assert summary["spec_decode_draft_tokens"] == 14 and summary["spec_decode_accepted_tokens"] == 4


@pytest.mark.parametrize("spec, message", [
    ({"config": {"method": "eagle", "num_speculative_tokens": 3, "foo": 1, "bar": 2}, "mean_acceptance_length": 2.0},
     "unknown or unmodelled vLLM --speculative-config field(s) foo, bar"),
    ({"config": "{not json", "mean_acceptance_length": 2.0}, "is not valid JSON"),
    ({"config": EAGLE3}, "set exactly one of acceptance_rates and mean_acceptance_length"),
    ({"config": EAGLE3, "acceptance_rates": [0.5, 0.6, 0.1]}, "must be non-increasing"),
    ({"config": EAGLE3, "acceptance_rates": [0.5, 0.4]}, "must be a list of 3 probabilities"),
    ({"config": EAGLE3, "mean_acceptance_length": 4.5}, "must be in [1, 4]"),
    ({"config": {"method": "medusa", "num_speculative_tokens": 3}, "mean_acceptance_length": 2.0}, ".method must be one of"),
    ({"config": {"method": "eagle", "num_speculative_tokens": 33}, "mean_acceptance_length": 2.0}, "must be <= 32"),
    ({"mean_acceptance_length": 2.0}, "needs engine.aggregated.speculative.config"),
])
def test_bad_speculative_settings_name_the_key(spec, message):
    with pytest.raises(simcore.ConfigError) as error:
        load_config({"engine": {"aggregated": {"speculative": spec}}})
    assert message in str(error.value) and "\n" not in str(error.value)


def test_not_modelled_combinations():
    spec = {"config": EAGLE3, "mean_acceptance_length": 2.0}
    with pytest.raises(simcore.ConfigError, match="async_scheduling"):
        load_config({"engine": {"aggregated": {"speculative": spec, "async_scheduling": True}}})
    with pytest.raises(simcore.ConfigError, match="prefill pool emits no tokens"):
        load_config({"engine": {"mode": "disaggregated", "prefill": {"speculative": spec}}})
    with pytest.raises(simcore.ConfigError, match="speculative_algorithm"):
        load_config({"engine": {"policy": "sglang", "aggregated": {"speculative": spec}}})


@pytest.mark.parametrize("positions", [1, 3, 5])
@pytest.mark.parametrize("tau", [1.0, 1.7, 2.5])
def test_mean_acceptance_length_gives_the_geometric_model(positions, tau):
    """rates[i] = alpha ** (i + 1) and 1 + sum(rates) = tau (the mean of 1 + accepted)."""
    if tau > positions + 1:
        return
    rates = acceptance_rates("s", None, tau, positions)
    assert 1 + sum(rates) == pytest.approx(tau, abs=1e-12)
    assert all(math.isclose(r, rates[0] ** (i + 1), rel_tol=1e-12, abs_tol=1e-300) for i, r in enumerate(rates))


def test_per_position_rates_follow_the_given_model():
    """Law of large numbers: over ~12,000 verifications each position's acceptance is within 4
    standard errors of the configured rate, and the mean acceptance length of 1 + sum(rates)."""
    rates = [0.8, 0.5, 0.2]
    reqs = [(f"r{i}", 4, 400) for i in range(64)]
    _, _, summary = run(reqs, {"config": EAGLE3, "acceptance_rates": rates}, timing={"type": "fixed", "prefill_ms": 1.0,
                                                                                       "decode_ms": 1.0})
    drafts = summary["spec_decode_num_drafts"]
    assert drafts > 10_000
    for i, r in enumerate(rates):
        assert abs(summary[f"spec_decode_acceptance_rate_pos_{i + 1}"] - r) < 4 * math.sqrt(r * (1 - r) / drafts)
    assert summary["spec_decode_acceptance_length"] == pytest.approx(1 + sum(rates), abs=0.05)


def test_same_seed_same_tables_other_seed_other_draws():
    spec = {"config": EAGLE3, "acceptance_rates": [0.7, 0.4, 0.1]}
    config = {"seed": 5, "workload": {"source": "synthetic", "num_requests": 20, "input_tokens": 30, "output_tokens": 40},
              "load": {"type": "closed_loop", "concurrency": 8}, "timing": LINEAR,
              "engine": {"aggregated": {"speculative": spec}}}
    first, second = simcore.run(config), simcore.run(config)
    assert first.requests.equals(second.requests) and first.summary == second.summary
    other = simcore.run({**config, "seed": 6})
    assert other.summary["spec_decode_accepted_tokens"] != first.summary["spec_decode_accepted_tokens"]


def test_off_leaves_the_summary_without_speculation_keys():
    result = simcore.run({"workload": {"source": "synthetic", "num_requests": 3}, "load": {"type": "closed_loop"}})
    assert not any(key.startswith("spec_decode") for key in result.summary)


def test_speculative_scenarios_cover_the_features():
    """Guards the generator of the reference comparison: verifications with accepted and rejected
    proposals, budget-cut and limit-cut queries, preemptions, P/D and prefix caching, in many scenarios."""
    seen = dict(accepted=0, rejected=0, preempted=0, pd=0, caching=0, clipped=0)
    no_match = 0  # vLLM n-gram scenarios whose steps propose with a rate in (0, 1), with verifications
    shared = 0  # draws=prompt scenarios where requests share a prompt id
    for policy in ("vllm", "sglang", "trtllm"):
        for seed in range(40):
            scenario = random_scenario(seed, policy=policy, disaggregated=seed % 3 == 2,
                                       prefix_caching=seed % 3 == 1, long_outputs=seed % 4 == 0, speculative=True)
            _, slow = reference(scenario)
            counts = slow["spec_counts"]
            accepted = sum(counts[2:])
            seen["accepted"] += accepted > 0
            seen["rejected"] += counts[1] > accepted
            seen["preempted"] += counts[0] > 0 and any(r["num_preemptions"] > 0 for r in slow["requests"])
            seen["pd"] += counts[0] > 0 and seed % 3 == 2
            seen["caching"] += counts[0] > 0 and seed % 3 == 1
            seen["clipped"] += any(r["status"] == "completed" and r["generated_tokens"] == o and accepted > 0
                                   for r, o in zip(slow["requests"], scenario["outputs"]))
            pools = scenario["config"]["engine"]
            spec = next((p["speculative"] for p in pools.values() if isinstance(p, dict) and p.get("speculative")), {})
            no_match += 0 < spec.get("proposal_rate", 1.0) < 1 and counts[0] > 0
            ids = scenario.get("prompt_id")
            shared += spec.get("draws") == "prompt" and ids is not None and len(set(ids)) < len(ids) and counts[0] > 0
    assert all(count >= 10 for count in seen.values()), seen
    assert no_match >= 2, no_match
    assert shared >= 10, shared  # draws=prompt with requests sharing a prompt id, with verifications


def test_a_burst_is_one_detokenizer_job_of_its_tokens():
    """Detokenizer {1 server, base 1 ms, 100 us per output}: the prefill pass ends at 1.04 ms, its job
    of 1 output ends at 1.04 + 1.1 = 2.14; the verification pass (1 + 0.03 + 0.005 = 1.035 ms) ends
    at 2.075 and emits 4 tokens, one job of 4 outputs: start max(2.075, 2.14), service 1 + 0.4 ms,
    all 4 received at 3.54 ms.  TPOT (3.54 - 2.14) / 4 = 0.35 ms; ITL gaps 1.4, 0, 0, 0."""
    columns = {"request_id": ["a"], "input_tokens": [4], "output_tokens": [5], "send_ms": [0.0]}
    config = {"load": {"type": "trace"}, "timing": LINEAR, "output": {"tokens": True},
              "detokenization": {"workers": 1, "base_ms": 1.0, "per_output_us": 100.0},
              "engine": {"aggregated": {"speculative": {"config": EAGLE3, "acceptance_rates": [1.0, 1.0, 1.0]}}}}
    result = simcore.run(config, requests=pa.table(columns))
    received = [row["received_ms"] for row in result.tokens.to_pylist()]
    assert received == pytest.approx([2.14] + [3.54] * 4, abs=1e-9)
    assert result.requests.to_pylist()[0]["tpot_ms"] == pytest.approx(0.35, abs=1e-9)
    assert result.summary["max_itl_ms"] == pytest.approx(1.4, abs=1e-9)
    assert result.summary["min_itl_ms"] == 0.0


def test_exports_count_one_gap_per_chunk():
    """A verification's tokens reach the client as one chunk: vllm_bench.json's ``itls`` and ITL
    statistics and aiperf's ``inter_chunk_latency`` count one gap per chunk, as those tools do.
    Acceptance 1, k = 3, prompt 4, output 9: receipts 1.04, 2.075 x 4, 3.11 x 4 ms (passes of
    1 + 0.03 + 0.005 ms): chunk gaps 1.035, 1.035 ms; the per-token ITL of the summary has 8 gaps."""
    from runners.export import aiperf_document, vllm_bench_document

    columns = {"request_id": ["a"], "input_tokens": [4], "output_tokens": [9], "send_ms": [0.0]}
    config = {"load": {"type": "trace"}, "timing": LINEAR, "output": {"tokens": True},
              "engine": {"aggregated": {"speculative": {"config": EAGLE3, "acceptance_rates": [1.0, 1.0, 1.0]}}}}
    result = simcore.run(config, requests=pa.table(columns))
    document = vllm_bench_document(result, result.tokens)
    assert document["itls"] == [pytest.approx([1.035e-3, 1.035e-3], abs=1e-12)]
    assert document["mean_itl_ms"] == pytest.approx(1.035, abs=1e-9)
    assert document["std_itl_ms"] == pytest.approx(0.0, abs=1e-9)
    assert result.summary["mean_itl_ms"] == pytest.approx(2.07 / 8, abs=1e-9)  # SPEC's per-token gaps
    block = aiperf_document(result, result.tokens)["inter_chunk_latency"]
    assert block["avg"] == pytest.approx(1.035, abs=1e-9) and block["min"] == pytest.approx(1.035, abs=1e-9)


def test_table_model_prices_proposals_as_decode_rows(tmp_path):
    """``table``: D proposals of B decodes (kv sum K) are priced as B + D decode rows at the decodes'
    mean context, K + D x (K // B); ``linear`` as D more prefill (query) tokens."""
    from simcore.timing import nb
    from simcore.timing.profile import load_profile, profile_arrays
    from tests.test_timing_models import write_profile

    params, table = profile_arrays(load_profile(write_profile(tmp_path / "p"), num_layers=4))
    with_drafts = nb.rank_time_ms_nb(nb.TIMING_TABLE, params, table, 0, 0, 0, 2, 64, 33, 6)
    as_rows = nb.rank_time_ms_nb(nb.TIMING_TABLE, params, table, 0, 0, 0, 8, 64 + 6 * 32, 33)
    assert with_drafts == as_rows
    lin = np.array([1.0, 10.0, 5.0, 40.0])
    empty = np.zeros(0)
    # 1 + 10 x 6 / 1000 + 5 x 2 / 1000 + 40 x 64 / 1e6
    assert nb.rank_time_ms_nb(nb.TIMING_LINEAR, lin, empty, 0, 0, 0, 2, 64, 33, 6) == pytest.approx(
        1.0 + 0.06 + 0.01 + 0.00256, rel=1e-12)


def test_vllm_capture_sizes_grow_with_the_proposals():
    """vLLM 0.12+: the largest capture size is min(2 x max_num_seqs x (1 + k), 512, max_num_batched_tokens)."""
    from simcore.derive import vllm_graph_sizes

    plain = load_config({"engine": {"aggregated": {"max_sequences": 8}}})
    spec = load_config({"engine": {"aggregated": {"max_sequences": 8, "speculative": {
        "config": EAGLE3, "mean_acceptance_length": 2.0}}}})
    assert vllm_graph_sizes(list(plain.engine.pools))[-1] == 16
    assert vllm_graph_sizes(list(spec.engine.pools))[-1] == 64


def test_a_proposer_cost_beyond_int64_time_is_refused():
    spec = {"config": {"method": "eagle", "num_speculative_tokens": 4}, "mean_acceptance_length": 2.0,
            "proposer_step_ms": 1e9}
    with pytest.raises(simcore.ConfigError, match="speculative.proposer_step_ms"):
        simcore.run({"workload": {"num_requests": 1000}, "engine": {"aggregated": {"speculative": spec}}})


def run_table(columns, speculative):
    config = {"load": {"type": "trace"}, "timing": LINEAR, "output": {"tokens": True},
              "engine": {"aggregated": {} if speculative is None else {"speculative": speculative}}}
    result = simcore.run(config, requests=pa.table(columns))
    received = {}
    for row in result.tokens.to_pylist():
        received.setdefault(row["request_id"], []).append(row["received_ms"])
    return received, result.summary


def test_a_request_column_overrides_the_pools_acceptance():
    """The table's acceptance_length: 4.0 (alpha 1: every proposal) for a, 1.0 (alpha 0: none) for b,
    beside the pool's rates.  Prefill of 16 tokens: 1.16 ms; two passes of 2 verifications
    (1 + 0.06 + 0.01 = 1.07 ms: a done at 9 tokens), then b alone (1 + 0.03 + 0.005 = 1.035 ms)."""
    columns = {"request_id": ["a", "b"], "input_tokens": [8, 8], "output_tokens": [9, 9], "send_ms": [0.0, 0.0],
               "acceptance_length": [4.0, 1.0]}
    received, summary = run_table(columns, {"config": EAGLE3, "acceptance_rates": [0.5, 0.5, 0.5]})
    assert received["a"] == pytest.approx([1.16] + [2.23] * 4 + [3.30] * 4, abs=1e-9)
    assert received["b"] == pytest.approx([1.16, 2.23, 3.30] + [3.30 + 1.035 * j for j in range(1, 7)], abs=1e-9)
    assert summary["spec_decode_num_drafts"] == 10 and summary["spec_decode_accepted_tokens"] == 6


def test_a_missing_request_value_takes_the_pools_rates():
    """A null acceptance_length: the pool's rates (1, 1, 1 here): 4 tokens per pass."""
    columns = pa.table({"request_id": ["a"], "input_tokens": [4], "output_tokens": [5], "send_ms": [0.0],
                        "acceptance_length": pa.array([None], type=pa.float64())})
    received, _ = run_table(columns.to_pydict() | {"acceptance_length": columns.column("acceptance_length")},
                            {"config": EAGLE3, "acceptance_rates": [1.0, 1.0, 1.0]})
    assert received["a"] == pytest.approx([1.04] + [2.075] * 4, abs=1e-9)


@pytest.mark.parametrize("values, speculative, message", [
    ([2.0], None, "acceptance_length column needs engine.aggregated.speculative.config"),
    ([4.5], {"config": EAGLE3, "mean_acceptance_length": 2.0}, "at most 1 + 3"),
    ([0.5], {"config": EAGLE3, "mean_acceptance_length": 2.0}, "must be a number >= 1 at row 0"),
])
def test_bad_acceptance_length_column(values, speculative, message):
    columns = {"request_id": ["a"], "input_tokens": [4], "output_tokens": [5], "send_ms": [0.0],
               "acceptance_length": values}
    with pytest.raises(simcore.ConfigError, match=re.escape(message)):
        run_table(columns, speculative)


def test_acceptance_length_column_of_a_csv_table(tmp_path):
    """``workload.source=table``: the column is read from a CSV file (acceptance 4.0: 4 tokens a pass)."""
    path = tmp_path / "requests.csv"
    path.write_text("request_id,input_tokens,output_tokens,send_ms,acceptance_length\na,4,5,0,4.0\n")
    config = {"workload": {"source": "table", "path": str(path)}, "load": {"type": "trace"}, "timing": LINEAR,
              "output": {"tokens": True},
              "engine": {"aggregated": {"speculative": {"config": EAGLE3, "acceptance_rates": [0.0, 0.0, 0.0]}}}}
    result = simcore.run(config)
    assert [row["received_ms"] for row in result.tokens.to_pylist()] == pytest.approx([1.04] + [2.075] * 4, abs=1e-9)
    path.write_text("request_id,input_tokens,output_tokens,send_ms,acceptance_length\na,4,5,0,x\n")
    with pytest.raises(simcore.ConfigError, match="requests.csv:2: acceptance_length must be a number"):
        simcore.run(config)


def test_roofline_verification_reads_each_kv_once():
    """``roofline`` (catalogue Llama-3.1-8B on an H100 SXM): D proposals of B decodes run the GEMMs and
    ``lm_head`` on B + D rows, as B + D decode rows do; their attention reads each sequence's KV once, so
    over the B decodes alone it adds, where memory-bound, only the D rows' KV writes and outputs."""
    from simcore.timing import nb
    from simcore.timing.api import timing_arrays

    cfg = load_config({"timing": {"type": "roofline", "model": "llama-3.1-8b", "gpu": "H100-SXM"}})
    model, params, table = timing_arrays(cfg.timing)
    b, d, ctx = 16, 48, 2001
    with_drafts = nb.rank_time_ms_nb(model, params, table, 0, 0, 0, b, b * ctx, ctx, d)
    as_rows = nb.rank_time_ms_nb(model, params, table, 0, 0, 0, b + d, (b + d) * ctx, ctx)
    plain = nb.rank_time_ms_nb(model, params, table, 0, 0, 0, b, b * ctx, ctx)
    assert plain < with_drafts < as_rows
    gemms = nb.roofline_pass_ms_nb(params, table, 0, 0, 0, b, b * ctx, b + d, d) - nb.roofline_attention_ms_nb(
        params, table, 0, 0, 0, b, b * ctx, d)
    gemms_as_rows = nb.roofline_pass_ms_nb(params, table, 0, 0, 0, b + d, (b + d) * ctx, b + d) - (
        nb.roofline_attention_ms_nb(params, table, 0, 0, 0, b + d, (b + d) * ctx))
    assert gemms == pytest.approx(gemms_as_rows, rel=1e-12)
    added = 0.0  # the D rows' KV writes and outputs, per attention group, at the memory roofline
    for g in range(int(params[nb.RF_NUM_ATTN])):
        row = int(params[nb.RF_ATTN]) + g * nb.RF_ATTN_WIDTH
        added += table[row] * d * (table[row + 5] + table[row + 7]) / params[nb.RF_ATTN_BYTES_PER_MS]
    attention = nb.roofline_attention_ms_nb(params, table, 0, 0, 0, b, b * ctx, d)
    assert attention - nb.roofline_attention_ms_nb(params, table, 0, 0, 0, b, b * ctx) == pytest.approx(added, rel=1e-9)

# ---------------------------------------------------------------------------------------------
# vLLM's n-gram proposer: steps whose lookup finds no match (``proposal_rate``)

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 3, "prompt_lookup_max": 7}


def test_ngram_without_a_match_runs_plain_decode_steps():
    """proposal_rate 0: no step proposes.  Four requests of 8 prompt and 9 output tokens: prefill
    1 + 32 x 10 / 1000 = 1.32 ms; each step a plain decode of 4 sequences, 1 + 4 x 5 / 1000 = 1.02 ms,
    plus the lookup (one proposer pass of 0.1 ms): 1.32 + j x 1.12.  One token per step, no
    verification counted (vLLM counts drafts only for requests that proposed)."""
    spec = {"config": NGRAM, "acceptance_rates": [1.0, 1.0, 1.0], "proposal_rate": 0.0, "proposer_step_ms": 0.1}
    reqs, received, summary = run([(f"r{i}", 8, 9) for i in range(4)], spec)
    for i in range(4):
        assert received[f"r{i}"] == pytest.approx([1.32 + 1.12 * j for j in range(9)], abs=1e-9)
        assert reqs[f"r{i}"]["tpot_ms"] == pytest.approx(1.12, abs=1e-9)
    assert summary["spec_decode_num_drafts"] == 0 and summary["spec_decode_draft_tokens"] == 0
    assert summary["spec_decode_acceptance_rate"] is None and summary["spec_decode_acceptance_length"] is None


def test_ngram_proposal_rate_one_is_the_default_bit_for_bit():
    spec = {"config": NGRAM, "acceptance_rates": [0.7, 0.4, 0.1]}
    config = {"seed": 3, "workload": {"source": "synthetic", "num_requests": 20, "input_tokens": 30, "output_tokens": 40},
              "load": {"type": "closed_loop", "concurrency": 8}, "timing": LINEAR,
              "engine": {"aggregated": {"speculative": spec}}}
    first = simcore.run(config)
    config["engine"]["aggregated"]["speculative"] = {**spec, "proposal_rate": 1.0}
    second = simcore.run(config)
    assert first.requests.equals(second.requests) and first.summary == second.summary


def test_ngram_steps_propose_at_the_declared_rate():
    """Law of large numbers, every proposal accepted (k = 3): a step that proposes emits 4 tokens, one
    that does not emits 1, so a request's steps are its distinct receipt instants after the first and
    the verifications are the summary's drafts.  Over ~3,400 steps the share that proposed is within
    4 standard errors of proposal_rate = 0.3, every verification carried 3 proposals, and every token
    is accounted for: 4 per verification (the last one clipped by the output) plus 1 per plain step."""
    rate = 0.3
    spec = {"config": NGRAM, "acceptance_rates": [1.0, 1.0, 1.0], "proposal_rate": rate}
    reqs, received, summary = run([(f"r{i}", 4, 200) for i in range(32)], spec,
                                  timing={"type": "fixed", "prefill_ms": 1.0, "decode_ms": 1.0})
    steps = sum(len(set(times)) - 1 for times in received.values())
    drafts = summary["spec_decode_num_drafts"]
    assert steps > 3_000
    assert abs(drafts / steps - rate) < 4 * math.sqrt(rate * (1 - rate) / steps)
    assert summary["spec_decode_draft_tokens"] == 3 * drafts
    assert summary["spec_decode_accepted_tokens"] == 3 * drafts and summary["spec_decode_acceptance_length"] == 4.0
    plain = steps - drafts
    emitted = sum(r["generated_tokens"] - 1 for r in reqs.values())
    assert 4 * drafts + plain - 3 * len(reqs) <= emitted <= 4 * drafts + plain


def test_ngram_plain_steps_do_not_change_the_acceptance_draws():
    """A step's acceptance draw depends on its request and first token only: with every step
    proposing or only some, the verifications that happen at the same token accept the same."""
    spec = {"config": NGRAM, "acceptance_rates": [0.8, 0.5, 0.2]}
    fixed = {"type": "fixed", "prefill_ms": 1.0, "decode_ms": 1.0}
    _, all_steps, _ = run([("a", 4, 300)], spec, timing=fixed)
    _, some_steps, summary = run([("a", 4, 300)], {**spec, "proposal_rate": 0.5}, timing=fixed)
    assert summary["spec_decode_num_drafts"] > 0

    def bursts(times):  # first token index of each step -> tokens it emitted
        out, i = {}, 1
        while i < len(times):
            j = i
            while j < len(times) and times[j] == times[i]:
                j += 1
            out[i] = j - i
            i = j
        return out

    full, part = bursts(all_steps["a"]), bursts(some_steps["a"])
    shared = [i for i, n in part.items() if n > 1 and i in full and i + n < 300 and i + full[i] < 300]
    assert shared and all(part[i] == full[i] for i in shared)


@pytest.mark.parametrize("spec, policy, message", [
    ({"config": NGRAM, "mean_acceptance_length": 2.0, "proposal_rate": 1.5}, "vllm", "proposal_rate must be <= 1"),
    ({"config": NGRAM, "mean_acceptance_length": 2.0, "proposal_rate": -0.1}, "vllm", "proposal_rate must be >= 0"),
    ({"config": NGRAM, "mean_acceptance_length": 2.0, "proposal_rate": "x"}, "vllm", "proposal_rate must be a finite"),
    ({"config": EAGLE3, "mean_acceptance_length": 2.0, "proposal_rate": 0.5}, "vllm", "n-gram proposer only"),
    ({"config": {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 4}, "mean_acceptance_length": 2.0,
      "proposal_rate": 0.5}, "sglang", "n-gram proposer only"),
    ({"proposal_rate": 0.5}, "vllm", "needs engine.aggregated.speculative.config"),
])
def test_bad_proposal_rate_names_the_key(spec, policy, message):
    with pytest.raises(simcore.ConfigError) as error:
        load_config({"engine": {"policy": policy, "aggregated": {"speculative": spec}}})
    assert message in str(error.value) and "\n" not in str(error.value)
    assert "proposal_rate" in str(error.value)


# ---------------------------------------------------------------- draws=prompt (docs/speculative.md, "Draws")

def draw_uniform(seed, who, at):
    """The kernel's counter-based uniform, written out: key = 63 bits of the seed's stream 3;
    h = mix(mix(key + who x G) + at x G) (SplitMix64's finaliser, G the golden-ratio constant);
    u = (h >> 11) x 2**-53."""
    mask, golden = (1 << 64) - 1, 0x9E3779B97F4A7C15

    def mix(x):
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
        return x ^ (x >> 31)

    key = int(np.random.SeedSequence(seed, spawn_key=(3,)).generate_state(1, dtype=np.uint64)[0]) & ((1 << 63) - 1)
    x = mix((key + who * golden) & mask)
    x = mix((x + at * golden) & mask)
    return (x >> 11) * 2.0 ** -53


def run_copies(draws, prompt_id=None, send_ms=(0.0, 0.0), speculative=None, seed=0):
    columns = {"request_id": ["a", "b"], "input_tokens": [8, 8], "output_tokens": [9, 9], "send_ms": list(send_ms)}
    if prompt_id is not None:
        columns["prompt_id"] = prompt_id
    spec = dict(speculative or {"config": EAGLE3, "acceptance_rates": [0.5, 0.5, 0.5]})
    if draws is not None:  # None: the default
        spec["draws"] = draws
    config = {"seed": seed, "load": {"type": "trace"}, "timing": LINEAR, "output": {"tokens": True},
              "engine": {"aggregated": {"speculative": spec}}}
    result = simcore.run(config, requests=pa.table(columns))
    received = {}
    for row in result.tokens.to_pylist():
        received.setdefault(row["request_id"], []).append(row["received_ms"])
    return {row["request_id"]: row for row in result.requests.to_pylist()}, received, result.summary


def test_copies_of_one_prompt_accept_in_lockstep():
    """draws=prompt, a and b both prompt 7 (8 prompt, 9 output tokens, k = 3, every rate 0.5, seed 0).
    A step whose first emitted token is the request's j-th draws u_j = uniform(seed, 7, j): u_j < 0.5
    accepts all 3 proposals (4 tokens), else none (1 token).  Prefill of 16 tokens: 1 + 16 x 10 / 1000
    = 1.16 ms; every step verifies 3 proposals of both copies: 1 + 6 x 10 / 1000 + 2 x 5 / 1000 = 1.07 ms.
    Both copies emit the same tokens in every pass and finish at the same instant."""
    expected, t, j = [1.16], 1.16, 1
    while j < 9:
        t += 1.07
        burst = min(4 if draw_uniform(0, 7, j) < 0.5 else 1, 9 - j)
        expected += [t] * burst
        j += burst
    assert len(set(expected)) > 2 and len(set(expected)) < 9  # some steps accept, some do not
    reqs, received, _ = run_copies("prompt", prompt_id=[7, 7])
    assert received["a"] == pytest.approx(expected, abs=1e-9)
    assert received["b"] == received["a"]
    assert reqs["a"]["e2el_ms"] == reqs["b"]["e2el_ms"] == pytest.approx(expected[-1], abs=1e-9)


def test_request_draws_let_the_copies_part():
    """draws=request (the default), seed 0: a's first verification (row 0, its token 1 at offset 0)
    draws uniform(0, 0, 1) >= 0.5 and accepts none; b's (row 1, offset 9: token 10) draws
    uniform(0, 1, 10) < 0.5 and accepts all three.  At the end of that pass (1.16 + 1.07 = 2.23 ms)
    b has 5 tokens, a 2; they finish at different instants."""
    assert draw_uniform(0, 0, 1) >= 0.5 and draw_uniform(0, 1, 10) < 0.5
    for draws in ("request", None):
        spec = {"config": EAGLE3, "acceptance_rates": [0.5, 0.5, 0.5]}
        reqs, received, _ = run_copies(draws, prompt_id=[7, 7], speculative=spec)
        assert received["a"][:2] == pytest.approx([1.16, 2.23], abs=1e-9) and received["a"][2] > 2.23 + 1e-9
        assert received["b"][:5] == pytest.approx([1.16] + [2.23] * 4, abs=1e-9)
        assert reqs["a"]["e2el_ms"] != reqs["b"]["e2el_ms"]


def test_a_later_copy_accepts_alike_at_each_of_its_own_steps():
    """b, a copy of a sent after a has finished, runs alone as a did: with draws=prompt its steps
    emit the same bursts at the same output positions, its receipts a's shifted by the send gap."""
    reqs, received, _ = run_copies("prompt", prompt_id=[3, 3], send_ms=(0.0, 100.0))
    assert reqs["a"]["e2el_ms"] < 100.0
    assert [r - 100.0 for r in received["b"]] == pytest.approx(received["a"], abs=1e-9)


def test_ngram_copies_propose_in_lockstep():
    """vLLM n-gram with proposal_rate 0.5: whether a step proposes is drawn per prompt too, so the
    two copies' receipts are equal instant by instant."""
    spec = {"config": NGRAM, "acceptance_rates": [0.9, 0.6, 0.3], "proposal_rate": 0.5}
    _, received, summary = run_copies("prompt", prompt_id=[0, 0], speculative=spec, seed=5)
    assert received["a"] == received["b"] and summary["spec_decode_num_drafts"] > 0


def test_without_the_column_each_request_is_its_own_prompt():
    """draws=prompt and no prompt_id column: each row its own prompt id (its row), so copies part as
    with draws=request for a seed where their first draws fall on either side of 0.5."""
    assert draw_uniform(0, 0, 1) >= 0.5 and draw_uniform(0, 1, 1) < 0.5
    _, received, _ = run_copies("prompt")
    assert received["a"][:2] == pytest.approx([1.16, 2.23], abs=1e-9) and received["a"][2] > 2.23 + 1e-9
    assert received["b"][:5] == pytest.approx([1.16] + [2.23] * 4, abs=1e-9)


@pytest.mark.parametrize("draws", ["row", "", 1])
def test_bad_draws_names_the_key(draws):
    with pytest.raises(simcore.ConfigError) as error:
        load_config({"engine": {"aggregated": {"speculative": {"config": EAGLE3, "mean_acceptance_length": 2.0,
                                                               "draws": draws}}}})
    assert "engine.aggregated.speculative.draws" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("values, message", [
    ([-1, 0], "prompt_id must be an integer >= 0 at row 0"),
    ([0.5, 0], "prompt_id must be an integer >= 0 at row 0"),
    (["x", "y"], "column prompt_id has type string"),
])
def test_bad_prompt_id_column(values, message):
    with pytest.raises(simcore.ConfigError, match=re.escape(message)):
        run_copies("prompt", prompt_id=values)


def test_prompt_id_column_of_a_csv_table(tmp_path):
    """``workload.source=table``: prompt_id read from a CSV file; the copies finish together."""
    path = tmp_path / "requests.csv"
    path.write_text("request_id,input_tokens,output_tokens,send_ms,prompt_id\na,8,9,0,7\nb,8,9,0,7\n")
    spec = {"config": EAGLE3, "acceptance_rates": [0.5, 0.5, 0.5], "draws": "prompt"}
    config = {"workload": {"source": "table", "path": str(path)}, "load": {"type": "trace"}, "timing": LINEAR,
              "engine": {"aggregated": {"speculative": spec}}}
    rows = simcore.run(config).requests.to_pylist()
    assert rows[0]["e2el_ms"] == rows[1]["e2el_ms"]
