"""Routing over workers and ranks (docs/routing.md): against the reference, hand-worked cases, laws."""

from __future__ import annotations

import copy

import pytest

import simcore
from simcore.config import ConfigError, load_config
from simcore.engine.router import RECEIVING_STREAM, route_draws
from tests.scenarios import routing_scenario
from tests.test_against_reference import compare_with_reference

NUM_ROUTING_SCENARIOS = 200  # per receiving policy; a third of them disaggregated
NUM_RANK_SCENARIOS = 200  # round robin over workers, least-loaded ranks
NUM_DECODE_SCENARIOS = 200  # P/D, per decode policy family
RECEIVING_POLICIES = ["random", "least_outstanding", "least_tokens", "power_of_two", "prefix_aware"]


@pytest.mark.parametrize("policy", RECEIVING_POLICIES)
@pytest.mark.parametrize("seed", range(NUM_ROUTING_SCENARIOS))
def test_routing_matches_reference(policy, seed):
    compare_with_reference(routing_scenario(seed, policy, disaggregated=seed % 3 == 2))


@pytest.mark.parametrize("seed", range(NUM_RANK_SCENARIOS))
def test_least_loaded_ranks_match_reference(seed):
    compare_with_reference(
        routing_scenario(seed, "round_robin", disaggregated=seed % 3 == 2, rank_policy="least_loaded")
    )


@pytest.mark.parametrize("decode_policy", ["least_outstanding", "least_tokens", "power_of_two"])
@pytest.mark.parametrize("seed", range(NUM_DECODE_SCENARIOS // 2))
def test_decode_routing_matches_reference(decode_policy, seed):
    compare_with_reference(routing_scenario(seed, "round_robin", disaggregated=True, decode_policy=decode_policy))


# ---------------------------------------------------------------- hand-worked cases

FIXED = {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 2.0}


def run_rows(rows, engine, **extra):
    """Rows (request_id, input, output, send_ms) through the public API; per-request dicts in row order."""
    columns = {
        "request_id": [r[0] for r in rows], "input_tokens": [r[1] for r in rows],
        "output_tokens": [r[2] for r in rows], "send_ms": [float(r[3]) for r in rows],
    }
    config = {"load": {"type": "trace"}, "timing": FIXED, "engine": engine, **extra}
    return simcore.run(config, requests=pa_table(columns)).requests.to_pylist()


def pa_table(columns):
    import pyarrow as pa

    return pa.table(columns)


# a: 10 tokens on its worker, 10 ms prefill then 2 ms decodes, busy until 28 ms;
# b: one token, done at 10 ms; c is sent at 15 ms.
LONG_SHORT_LATE = [("a", 16, 10, 0.0), ("b", 16, 1, 0.0), ("c", 16, 1, 15.0)]


def test_least_outstanding_sends_to_the_idle_worker():
    # Round robin: c is send 2 -> worker 2 mod 2 = 0, where a still runs; its
    # prefill waits for a's decode passes: a decodes at 10-12, 12-14, 14-16,
    # c's prefill joins the pass starting at 16 ms (fixed timing: a pass with a
    # prefill and a decode takes 10 + 2 ms) -> c's token at 28 ms, TTFT 13 ms.
    # least_outstanding at 15 ms: worker 0 has a (1), worker 1 none (b done at
    # 10 ms) -> worker 1, idle: c's token at 25 ms, TTFT 10 ms.
    engine = {"aggregated": {"replicas": 2}}
    rr = run_rows(LONG_SHORT_LATE, engine)
    lo = run_rows(LONG_SHORT_LATE, {**engine, "router": {"policy": "least_outstanding"}})
    assert [r["worker"] for r in rr] == [0, 1, 0]
    assert [r["worker"] for r in lo] == [0, 1, 1]
    assert rr[2]["ttft_ms"] == 13.0 and lo[2]["ttft_ms"] == 10.0


def test_least_tokens_counts_kv_in_use():
    # At 15 ms worker 0 holds a's KV: 16 + 5 tokens known -> 2 blocks of 16 =
    # 32 tokens; worker 1 holds none (b released its blocks at 10 ms): c -> 1.
    engine = {"aggregated": {"replicas": 2, "block_size": 16}, "router": {"policy": "least_tokens"}}
    assert [r["worker"] for r in run_rows(LONG_SHORT_LATE, engine)] == [0, 1, 1]


def test_ties_go_round_robin_from_the_send_number():
    # Four requests at once on three idle workers: every load ties at each
    # send except for the requests already placed, which count.  Send k scans
    # from worker k mod 3: 0 -> 0; 1 -> 1 (0 has one); 2 -> 2; 3 -> 0 (all one).
    rows = [(f"r{k}", 8, 2, 0.0) for k in range(4)]
    engine = {"aggregated": {"replicas": 3}, "router": {"policy": "least_outstanding"}}
    assert [r["worker"] for r in run_rows(rows, engine)] == [0, 1, 2, 0]


def test_least_loaded_rank_follows_vllms_dp_balancer():
    # One worker, two ranks.  Round robin: c is the worker's third request ->
    # rank 2 mod 2 = 0, beside a.  least_loaded at c's arrival (15 ms): rank 0
    # has a running (score 1), rank 1 nothing (0) -> rank 1.  The scan starts
    # at the worker's decision count: 0 for a (tie -> rank 0), 1 for b (rank 0
    # has a -> rank 1), 2 for c.
    engine = {"aggregated": {"attention_dp": 2}}
    rr = run_rows(LONG_SHORT_LATE, engine)
    ll = run_rows(LONG_SHORT_LATE, {"aggregated": {"attention_dp": 2, "rank_policy": "least_loaded"}})
    assert [r["rank"] for r in rr] == [0, 1, 0]
    assert [r["rank"] for r in ll] == [0, 1, 1]


def test_decode_router_picks_the_idle_decode_worker():
    # P/D, one prefill worker, two decode workers, no transfer time.  Handoffs
    # h = 0 (a), 1 (b) at 10 ms and 2 (c) at 25 ms (c's prefill runs 15-25).
    # Round robin: h mod 2 -> decode workers 1, 2, 1 (global indices); a still
    # decodes on worker 1 at 25 ms (its 10 tokens end at 10 + 10 x 2 = 30 ms).
    # least_outstanding: worker 1 has a, worker 2 none (b done at 12 ms) -> 2.
    engine = {"mode": "disaggregated", "decode": {"replicas": 2}}
    rr = run_rows(LONG_SHORT_LATE, engine)
    lo = run_rows(LONG_SHORT_LATE, {**engine, "decode_router": {"policy": "least_outstanding"}})
    assert [r["decode_worker"] for r in rr] == [1, 2, 1]
    assert [r["decode_worker"] for r in lo] == [1, 2, 2]


def test_prefix_aware_returns_to_the_worker_holding_the_prefix():
    # Two workers, prefix caching, two 64-token prompts sharing a 48-token
    # prefix (3 blocks of 16), one closed-loop client.  a goes to worker 0 (all
    # tie: send 0 scans from 0) and leaves its blocks cached at 10 ms, when b
    # is sent: worker 0 matches 3 of b's 4 blocks -> 3 x 3/4 + 2 x 1 + 2 x 1 =
    # 6.25 against 4 on worker 1.  Round robin sends b to worker 1, where
    # nothing is cached.
    config = {
        "workload": {"num_requests": 2, "input_tokens": 64, "output_tokens": 1, "prefix_tokens": 48},
        "load": {"concurrency": 1}, "timing": FIXED,
        "engine": {"aggregated": {"replicas": 2, "block_size": 16, "prefix_caching": True}},
    }
    rr = simcore.run(config).requests.to_pylist()
    config["engine"]["router"] = {"policy": "prefix_aware"}
    pa_ = simcore.run(config).requests.to_pylist()
    assert [r["worker"] for r in rr] == [0, 1] and rr[1]["cached_tokens"] == 0
    assert [r["worker"] for r in pa_] == [0, 0] and pa_[1]["cached_tokens"] == 48


def test_random_takes_the_seeded_draws():
    rows = [(f"r{k}", 8, 1, float(k)) for k in range(50)]
    engine = {"aggregated": {"replicas": 4}, "router": {"policy": "random"}}
    placed = [r["worker"] for r in run_rows(rows, engine, seed=7)]
    assert placed == route_draws(7, RECEIVING_STREAM, 50, 4)[0::2].tolist()
    assert placed != [r["worker"] for r in run_rows(rows, engine, seed=8)]


def test_power_of_two_picks_one_of_its_two_draws():
    rows = [(f"r{k}", 32, 20, 0.1 * k) for k in range(60)]
    engine = {"aggregated": {"replicas": 5}, "router": {"policy": "power_of_two"}}
    draws = route_draws(3, RECEIVING_STREAM, 60, 5)
    placed = [r["worker"] for r in run_rows(rows, engine, seed=3)]
    assert all(w in (draws[2 * k], draws[2 * k + 1]) for k, w in enumerate(placed))
    assert any(w != draws[2 * k] for k, w in enumerate(placed))  # the load decided some


# ---------------------------------------------------------------- laws and the default


def test_round_robin_everywhere_is_the_row_placement():
    # Explicit round robin through the kernel's routing path (a least-loaded
    # decode rank policy on single-rank decode workers changes nothing) gives
    # SPEC §3's placement: worker k mod W, rank (k div W) mod R.
    rows = [(f"r{k}", 24, 3, 0.5 * k) for k in range(30)]
    engine = {"mode": "disaggregated", "prefill": {"replicas": 3, "attention_dp": 2},
              "decode": {"replicas": 2, "rank_policy": "least_loaded"}}
    routed = run_rows(rows, engine)
    plain = run_rows(rows, {"mode": "disaggregated", "prefill": {"replicas": 3, "attention_dp": 2},
                            "decode": {"replicas": 2}})
    assert routed == plain
    assert [(r["prefill_worker"], r["prefill_rank"]) for r in routed] == [(k % 3, (k // 3) % 2) for k in range(30)]


def test_routing_is_deterministic_and_batches_agree():
    base = {"workload": {"num_requests": 120, "input_dist": "uniform", "range_ratio": 0.1},
            "load": {"type": "poisson", "request_rate": 60.0}, "seed": 5,
            "engine": {"aggregated": {"replicas": 3, "attention_dp": 2, "rank_policy": "least_loaded"}}}
    configs = []
    for policy in ("random", "least_outstanding", "least_tokens", "power_of_two"):
        config = copy.deepcopy(base)
        config["engine"]["router"] = {"policy": policy}
        configs.append(config)
    single = [simcore.run(c) for c in configs]
    again = simcore.run(configs[0])
    assert again.requests.equals(single[0].requests)
    for one, batched in zip(single, simcore.run_batch(configs)):
        assert one.requests.equals(batched.requests)


def test_outstanding_requests_obey_conservation():
    # Every request sent is placed on one worker of the pool and ends there:
    # per worker, placed = completed + rejected + incomplete.
    config = {"workload": {"num_requests": 200}, "load": {"type": "poisson", "request_rate": 80.0},
              "engine": {"aggregated": {"replicas": 4}, "router": {"policy": "least_outstanding"}},
              "max_time_ms": 1500.0}
    rows = simcore.run(config).requests.to_pylist()
    sent = [r for r in rows if r["send_ms"] is not None]
    assert all(0 <= r["worker"] < 4 for r in sent)
    assert all(r["worker"] is None for r in rows if r["send_ms"] is None)
    assert len(sent) < len(rows)  # the cap cut the run


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("mapping, key", [
    ({"engine": {"router": {"policy": "fastest"}}}, "engine.router.policy"),
    ({"engine": {"mode": "disaggregated", "decode_router": {"policy": "prefix_aware"}}}, "engine.decode_router.policy"),
    ({"engine": {"decode_router": {"policy": "least_outstanding"}}}, "engine.decode_router.policy"),
    ({"engine": {"aggregated": {"rank_policy": "busiest"}}}, "engine.aggregated.rank_policy"),
    ({"engine": {"router": {"policy": "prefix_aware"}}}, "engine.router.policy"),
    ({"engine": {"router": {"weights": {"queue": 1.0}}}}, "engine.router.weights.queue"),
    ({"engine": {"aggregated": {"prefix_caching": True}, "router": {"policy": "prefix_aware", "weights": {"prefix": -1}}}},
     "engine.router.weights.prefix"),
])
def test_bad_routing_keys_name_the_key(mapping, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(mapping)


def test_routing_scenarios_leave_round_robin():
    """Guards the generator: in many scenarios the policies place requests elsewhere than round robin would."""
    from tests.test_against_reference import reference

    moved = dict.fromkeys(RECEIVING_POLICIES + ["least_loaded", "decode"], 0)
    for seed in range(100):
        for policy in RECEIVING_POLICIES:
            scenario = routing_scenario(seed, policy, disaggregated=seed % 3 == 2, rank_policy="round_robin")
            pool = scenario["config"]["engine"]["prefill" if seed % 3 == 2 else "aggregated"]
            _, slow = reference(scenario)
            workers = [r["worker"] for r in slow["requests"] if r["send_ns"] is not None]
            moved[policy] += workers != [k % pool["replicas"] for k in range(len(workers))]
        scenario = routing_scenario(seed, "round_robin", rank_policy="least_loaded")
        pool = scenario["config"]["engine"]["aggregated"]
        _, slow = reference(scenario)
        ranks = [r["rank"] for r in slow["requests"] if r["arrival_ns"] is not None]
        moved["least_loaded"] += ranks != [(k // pool["replicas"]) % pool["attention_dp"] for k in range(len(ranks))]
        decode = [
            [r["decode_worker"] for r in reference(routing_scenario(seed, "round_robin", disaggregated=True,
                                                                    decode_policy=p))[1]["requests"]]
            for p in ("round_robin", "least_outstanding")
        ]
        moved["decode"] += decode[0] != decode[1]
    assert all(count >= 10 for count in moved.values()), moved


def test_a_bad_policy_on_the_command_line_exits_2_naming_the_key(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-m", "runners.cli", f"hydra.run.dir={tmp_path / 'run'}", "engine.router.policy=fastest"],
        cwd=root, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "engine.router.policy" in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- policy codes


def test_policy_names_and_codes_are_declared_together():
    from simcore.enums import RANK_POLICIES, ROUTER_POLICIES, RankPolicy, RouterPolicy

    assert ROUTER_POLICIES == RouterPolicy._fields and RANK_POLICIES == RankPolicy._fields
    assert [getattr(RouterPolicy, name) for name in ROUTER_POLICIES] == list(range(len(ROUTER_POLICIES)))
    assert [getattr(RankPolicy, name) for name in RANK_POLICIES] == list(range(len(RANK_POLICIES)))


def _route_call(policy, rank_policy):
    """Arguments of route_send_nb / route_handoff_nb for one worker of one rank and one request."""
    import numpy as np

    from simcore.engine.router_nb import allocate_route_nb

    one = np.ones(1, dtype=np.int64)
    zero = np.zeros(1, dtype=np.int64)
    return dict(
        route=allocate_route_nb(1, 1, 1), policy=policy, rank_policy=np.array([rank_policy], dtype=np.int64),
        first=0, count=1, draws=np.zeros(2, dtype=np.int64), weights=np.zeros(3), worker_first_rank=zero,
        worker_num_ranks=one, run_len=zero.copy(), blocks_used=zero.copy(), rank_num_blocks=one * 8,
        rank_block_size=one * 16, prefix_cache=(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)),
    )


def test_an_unknown_policy_code_is_an_error_in_the_kernel():
    """An undeclared code raises in the kernel instead of falling through to another policy."""
    import numpy as np

    from simcore.engine.router_nb import route_handoff_nb, route_send_nb
    from simcore.enums import RANK_POLICIES, ROUTER_POLICIES, RankPolicy, RouterPolicy

    def send(policy, rank_policy):
        a = _route_call(policy, rank_policy)
        placed = np.full(1, -1, dtype=np.int64)
        return route_send_nb(a["route"], 0, 0, a["policy"], a["rank_policy"], a["first"], a["count"], a["draws"],
                             a["weights"], np.array([8], dtype=np.int64), a["worker_first_rank"],
                             a["worker_num_ranks"], a["run_len"], a["blocks_used"], a["rank_num_blocks"],
                             a["rank_block_size"], a["prefix_cache"], placed), placed[0]

    def handoff(policy, rank_policy):
        a = _route_call(policy, rank_policy)
        return route_handoff_nb(a["route"], 0, 0, a["policy"], a["rank_policy"], a["first"], a["count"],
                                a["draws"], a["weights"], 8, a["worker_first_rank"], a["worker_num_ranks"],
                                a["run_len"], a["blocks_used"], a["rank_num_blocks"], a["rank_block_size"],
                                a["prefix_cache"])

    assert send(RouterPolicy.least_tokens, RankPolicy.round_robin) == (0, 0)
    assert send(RouterPolicy.least_outstanding, RankPolicy.least_loaded) == (0, -1)  # its rank at the arrival
    assert handoff(RouterPolicy.least_tokens, RankPolicy.least_loaded) == 0
    for bad in (len(ROUTER_POLICIES), -1):
        with pytest.raises(ValueError, match="unknown router policy code"):
            send(bad, RankPolicy.round_robin)
        with pytest.raises(ValueError, match="unknown router policy code"):
            handoff(bad, RankPolicy.round_robin)
    for bad in (len(RANK_POLICIES), -1):
        with pytest.raises(ValueError, match="unknown rank policy code"):
            send(RouterPolicy.round_robin, bad)
        with pytest.raises(ValueError, match="unknown rank policy code"):
            handoff(RouterPolicy.round_robin, bad)
