"""Reference SPEC §10 summary computed in pure Python from ``sim.simulate`` output
(aggregated and disaggregated modes), plus ``prefix_cache_hit_rate``
(docs/prefix-caching.md).

Distributions and stage means cover completed requests only.  Means and stds use
``math.fsum`` (correctly rounded sums), so they may differ from numpy's pairwise sums
in the last bits: compare them with a tight relative tolerance, not bit for bit.
Percentiles follow ``numpy.percentile(method="linear")`` step by step.
"""

from __future__ import annotations

import math

METRICS = ("ttft", "tpot", "itl", "e2el")


def percentile_key(p) -> str:
    """SPEC §10: an integral P prints as an integer (p99), others as written (p99.9)."""
    p = float(p)
    return f"p{int(p)}" if p.is_integer() else f"p{p!r}"


def percentile(sorted_values, p):
    """numpy.percentile's default "linear" method, written out.

    position = (n - 1) * (p / 100); interpolate between floor and ceil of it
    (numpy's _lerp: a + (b - a) * g, or b - (b - a) * (1 - g) when g >= 0.5).
    """
    n = len(sorted_values)
    pos = (n - 1) * (float(p) / 100)
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    g = pos - lo
    a, b = sorted_values[lo], sorted_values[hi]
    diff = b - a
    if g >= 0.5:
        return b - diff * (1 - g)
    return a + diff * g


def mean(values):
    return math.fsum(values) / len(values)


def describe(values, percentiles, name, out):
    """mean/median/std/min/max/pP of one distribution (None for an empty one)."""
    keys = ["mean", "median", "std", "min", "max"] + [percentile_key(p) for p in percentiles]
    if not values:
        for key in keys:
            out[f"{key}_{name}_ms"] = None
        return
    xs = sorted(values)
    m = mean(xs)
    out[f"mean_{name}_ms"] = m
    out[f"median_{name}_ms"] = percentile(xs, 50)
    out[f"std_{name}_ms"] = math.sqrt(math.fsum((x - m) ** 2 for x in xs) / len(xs))  # population
    out[f"min_{name}_ms"] = xs[0]
    out[f"max_{name}_ms"] = xs[-1]
    for p in percentiles:
        out[f"{percentile_key(p)}_{name}_ms"] = percentile(xs, p)


def summarize(sim_result, input_tokens, output_tokens, percentiles, goodput, cap_ns, turns=None):
    """``turns``: multi-turn sessions, each request's turn (docs/metrics.md, per turn)."""
    reqs = sim_result["requests"]
    tokens = sim_result["tokens"]
    out = {}
    completed = [k for k, r in enumerate(reqs) if r["status"] == "completed"]
    out["num_requests"] = len(reqs)
    out["completed"] = len(completed)
    out["rejected"] = sum(1 for r in reqs if r["status"] == "rejected")
    out["incomplete"] = sum(1 for r in reqs if r["status"] == "incomplete")
    out["total_input_tokens"] = sum(int(input_tokens[k]) for k in completed)
    out["total_output_tokens"] = sum(reqs[k]["generated_tokens"] for k in completed)
    # docs/prefix-caching.md: sum cached_tokens / sum input_tokens over the requests
    # admitted at least once (cached_tokens not None; 0 without prefix caching), in
    # float64 from two exact integer sums; None if no request was admitted.
    admitted = [k for k, r in enumerate(reqs) if r["cached_tokens"] is not None]
    if admitted:
        out["prefix_cache_hit_rate"] = (
            float(sum(reqs[k]["cached_tokens"] for k in admitted))
            / float(sum(int(input_tokens[k]) for k in admitted)))
    else:
        out["prefix_cache_hit_rate"] = None
    # The tiers (docs/prefix-caching.md, CPU offload tier): GPU = cached - CPU; null without one.
    tiers = ("gpu_prefix_cache_hit_rate", "cpu_prefix_cache_hit_rate", "kv_offload_loaded_gb", "kv_offload_stored_gb")
    out.update(dict.fromkeys(tiers))
    if "loaded_bytes" in sim_result and admitted:
        prompt = float(sum(int(input_tokens[k]) for k in admitted))
        cpu = sum(reqs[k]["cpu_cached_tokens"] for k in admitted)
        gpu = sum(reqs[k]["cached_tokens"] for k in admitted) - cpu
        out.update(zip(tiers, (float(gpu) / prompt, float(cpu) / prompt,
                               sim_result["loaded_bytes"] / 1e9, sim_result["stored_bytes"] / 1e9)))

    # Speculative decoding (docs/speculative.md), only when the emitting pool speculates:
    # vLLM's counters over the verifications that ended by the cap.
    if "spec_counts" in sim_result:
        counts = sim_result["spec_counts"]
        drafts, proposed, accepted = counts[0], counts[1], sum(counts[2:])
        out["spec_decode_num_drafts"] = drafts
        out["spec_decode_draft_tokens"] = proposed
        out["spec_decode_accepted_tokens"] = accepted
        out["spec_decode_acceptance_rate"] = accepted / proposed if proposed else None
        out["spec_decode_acceptance_length"] = 1 + accepted / drafts if drafts else None
        for i in range(sim_result["spec_positions"]):
            out[f"spec_decode_acceptance_rate_pos_{i + 1}"] = counts[2 + i] / drafts if drafts else None

    # duration: last final receipt of a completed request - first send
    if completed:
        first_send = min(r["send_ns"] for r in reqs if r["send_ns"] is not None)
        last_end = max(reqs[k]["end_ns"] for k in completed)
        if cap_ns is not None:
            assert last_end <= cap_ns
        duration_s = (last_end - first_send) / 1e9
    else:
        duration_s = None
    out["duration_s"] = duration_s
    if duration_s is None:
        out["request_throughput"] = None
        out["output_throughput"] = None
        out["total_token_throughput"] = None
    else:
        out["request_throughput"] = len(completed) / duration_s
        out["output_throughput"] = out["total_output_tokens"] / duration_s
        out["total_token_throughput"] = (
            out["total_input_tokens"] + out["total_output_tokens"]) / duration_s

    # per-request metrics (vllm bench serve definitions), completed requests only
    ttft, tpot, itl, e2el = [], [], [], []
    per_request = {}
    for k in completed:
        r = reqs[k]
        t_ttft = (r["first_recv_ns"] - r["send_ns"]) / 1e6
        t_e2el = (r["last_recv_ns"] - r["send_ns"]) / 1e6
        ttft.append(t_ttft)
        e2el.append(t_e2el)
        t_tpot = None
        if r["generated_tokens"] >= 2:
            t_tpot = ((r["last_recv_ns"] - r["first_recv_ns"]) / 1e6) / (r["generated_tokens"] - 1)
            tpot.append(t_tpot)
        recvs = [recv for _, recv in tokens[k]]
        assert all(x is not None for x in recvs)
        for a, b in zip(recvs, recvs[1:]):
            itl.append((b - a) / 1e6)  # zero gaps kept
        per_request[k] = (t_ttft, t_tpot, t_e2el)

    # goodput: completed requests meeting every set SLO, per second
    slo_ttft = goodput.get("ttft_ms")
    slo_tpot = goodput.get("tpot_ms")
    slo_e2el = goodput.get("e2el_ms")
    if slo_ttft is None and slo_tpot is None and slo_e2el is None:
        out["request_goodput"] = None
    elif duration_s is None:
        out["request_goodput"] = None
    else:
        good = 0
        for k, (t_ttft, t_tpot, t_e2el) in per_request.items():
            ok = True
            if slo_ttft is not None and not t_ttft <= slo_ttft:
                ok = False
            if slo_tpot is not None and t_tpot is not None and not t_tpot <= slo_tpot:
                ok = False
            if slo_e2el is not None and not t_e2el <= slo_e2el:
                ok = False
            good += ok
        out["request_goodput"] = good / duration_s

    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2el", e2el)):
        describe(values, percentiles, name, out)

    # TTFT stage means over completed requests (SPEC §10).  The stages partition
    # send -> first receipt: tokenization (send -> arrival), queue (arrival -> first
    # admission), prefill (first admission -> prompt done), transfer (prompt done ->
    # transfer end; 0 in aggregated mode), decode_wait (transfer end -> first emission;
    # 0 in aggregated mode), detokenization (first emission -> first receipt).
    disaggregated = sim_result.get("mode", "aggregated") == "disaggregated"
    stages = {
        "tokenization": ("send_ns", "arrival_ns"),
        "queue": ("arrival_ns", "first_admit_ns"),
        "prefill": ("first_admit_ns", "prompt_done_ns"),
        "transfer": ("prompt_done_ns", "transfer_end_ns"),
        "decode_wait": ("transfer_end_ns", "first_emit_ns"),
        "detokenization": ("first_emit_ns", "first_recv_ns"),
    }
    for stage, (a, b) in stages.items():
        if stage in ("transfer", "decode_wait") and not disaggregated:
            vals = [0.0 for k in completed]
        else:
            vals = [(reqs[k][b] - reqs[k][a]) / 1e6 for k in completed]
        out[f"mean_{stage}_ms"] = mean(vals) if vals else None
    if turns is not None:
        out["num_sessions"] = sum(1 for turn in turns if turn == 0)
        for name in ("ttft", "e2el"):
            for group, chosen in (("first_turn", lambda turn: turn == 0), ("later_turns", lambda turn: turn >= 1)):
                values = [
                    (reqs[k]["first_recv_ns" if name == "ttft" else "last_recv_ns"] - reqs[k]["send_ns"]) / 1e6
                    for k in completed if chosen(turns[k])
                ]
                describe(values, percentiles, f"{name}_{group}", out)
    return out
