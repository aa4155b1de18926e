"""Multi-turn sessions (docs/semantics.md, Sessions): the kernel against the
reference to the nanosecond on random session scenarios, hand-worked cases,
the turn-timing law, the generator and table validation."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet  # noqa: F401  (pa.parquet)
import pytest

import simcore
from simcore.config import ConfigError, load_config, merge_config
from simcore.engine.api import simulate_engine
from simcore.metrics.api import RequestColumns, summarize
from simcore.workload.api import RequestTable, table_requests
from tests.reference.metrics import summarize as reference_summarize
from tests.reference.sim import simulate as reference_simulate
from tests.scenarios import fast_as_reference, longest_steady_stretch, random_scenario
from tests.test_against_reference import REQUEST_KEYS, assert_summaries_equal

NUM_SESSION_SCENARIOS = 300  # open and closed loops; a third with prefix caching, a fifth P/D
NUM_STEADY_SESSION_SCENARIOS = 60


def random_session_scenario(
    seed: int, prefix_caching: bool = False, disaggregated: bool = False, steady: bool = False, policy: str = "vllm"
) -> dict:
    """A random scenario of ``tests.scenarios`` whose rows become the turns of a few sessions.

    1-6 sessions of 1-4 turns, their rows interleaved in table order (each
    session's turns in order); turn t + 1's prompt is turn t's prompt and
    output plus 1-8 new tokens (the first turns: an optional system prompt plus
    1-12 tokens).  Open loop: first turns sent at random non-decreasing instants.
    ``steady``: the base scenario's light load of long outputs on one rank (the
    kernel's steady-decode path), outputs of 20-80 tokens.
    """
    base = random_scenario(seed, disaggregated=disaggregated, prefix_caching=prefix_caching, steady=steady,
                           policy=policy)
    rnd = random.Random(10_000 + seed)
    config = base["config"]
    system = rnd.choice([0, 0, 4, 8])
    think_ms = rnd.choice([0.0, 0.0, 0.3, 2.0000004])
    config["workload"] = {"source": "sessions", "sessions": {"think_time_ms": think_ms, "system_prompt_tokens": system}}
    turns = [rnd.randint(1, 4) for _ in range(rnd.randint(1, 6))]
    order = [s for s, count in enumerate(turns) for _ in range(count)]
    rnd.shuffle(order)  # rows interleaved; a session's k-th row is its turn k
    session, turn, inputs, outputs, seen = [], [], [], [], {}
    for s in order:
        t = seen.get(s, -1) + 1
        seen[s] = t
        out = rnd.randint(20, 80) if steady else rnd.randint(1, 6)
        if t == 0:
            prompt = system + rnd.randint(1, 12)
        else:
            last = max(k for k in range(len(session)) if session[k] == s)
            prompt = inputs[last] + outputs[last] + rnd.randint(1, 8)
        session.append(s)
        turn.append(t)
        inputs.append(prompt)
        outputs.append(out)
    n = len(order)
    send_ns = None
    if config["load"]["type"] != "closed_loop":
        send_ns, clock = [-1] * n, 0
        for k in range(n):
            if turn[k] == 0:
                send_ns[k] = clock
                clock += rnd.choice([0, 0, 1, 250_000, 1_000_000, rnd.randint(0, 5_000_000)])
    return {
        "config": config, "inputs": inputs, "outputs": outputs, "send_ns": send_ns, "session": session,
        "turn": turn, "system": system, "think_ms": think_ms, "ids": [f"req-{seed}-{k}" for k in range(n)],
    }


def session_table(scenario: dict) -> RequestTable:
    return RequestTable(
        pa.array(scenario["ids"], type=pa.string()),
        np.array(scenario["inputs"], dtype=np.int64),
        np.array(scenario["outputs"], dtype=np.int64),
        session_id=pa.array([f"s{s}" for s in scenario["session"]], type=pa.string()),
        session=np.array(scenario["session"], dtype=np.int64),
        turn=np.array(scenario["turn"], dtype=np.int64),
        shared_prefix_tokens=scenario["system"],
    )


def run_sessions(scenario: dict):
    cfg = load_config(scenario["config"])
    table = session_table(scenario)
    send = None if scenario["send_ns"] is None else np.array(scenario["send_ns"], dtype=np.int64)
    run = simulate_engine(cfg, table, send, record_passes=True)
    cols = RequestColumns(run)
    return cfg, run, cols, summarize(cols, table.input_tokens, cfg.metrics, table.turn)


def compare_sessions_with_reference(scenario: dict):
    config = merge_config(scenario["config"])
    slow = reference_simulate(
        config, scenario["ids"], scenario["inputs"], scenario["outputs"], scenario["send_ns"],
        sessions={"session": scenario["session"], "shared_prefix_tokens": scenario["system"]},
    )
    cfg, run, cols, summary = run_sessions(scenario)
    fast = fast_as_reference(run, cols)
    for k, (f, s) in enumerate(zip(fast["requests"], slow["requests"])):
        assert {key: f[key] for key in REQUEST_KEYS} == {key: s[key] for key in REQUEST_KEYS}, f"request {k}"
    assert fast["tokens"] == slow["tokens"]
    assert fast["passes"] == slow["passes"]
    cap_ns = None if config["max_time_ms"] is None else round(config["max_time_ms"] * 1e6)
    slow_summary = reference_summarize(
        slow, scenario["inputs"], scenario["outputs"], config["metrics"]["percentiles"], config["metrics"]["goodput"],
        cap_ns, turns=scenario["turn"],
    )
    assert_summaries_equal(summary, slow_summary)
    return run, cols, slow


@pytest.mark.parametrize("seed", range(NUM_SESSION_SCENARIOS))
def test_sessions_match_reference(seed):
    compare_sessions_with_reference(
        random_session_scenario(seed, prefix_caching=seed % 3 == 1, disaggregated=seed % 5 == 4)
    )


@pytest.mark.parametrize("policy", ["sglang", "trtllm"])
@pytest.mark.parametrize("seed", range(60))
def test_sessions_with_prefix_caching_match_reference_per_policy(seed, policy):
    """SGLang's radix cache (generated blocks included) and TensorRT-LLM's reuse across a session's turns."""
    compare_sessions_with_reference(
        random_session_scenario(seed, prefix_caching=True, disaggregated=seed % 5 == 4, policy=policy)
    )


@pytest.mark.parametrize("seed", range(NUM_STEADY_SESSION_SCENARIOS))
def test_steady_decode_sessions_match_reference(seed):
    """Long outputs on one rank: the kernel's steady-decode shortcut between session events."""
    compare_sessions_with_reference(random_session_scenario(seed, steady=True))


def test_session_scenarios_cover_the_features():
    """Guards the generator: both loops, several turns, prefix hits on later turns,
    rejected and incomplete turns, detokenization, P/D, equal send instants."""
    seen = dict(closed=0, open=0, later_turn_hits=0, rejected=0, incomplete=0, detok=0, pd=0, tied_sends=0, unsent=0)
    for seed in range(NUM_SESSION_SCENARIOS):
        scenario = random_session_scenario(seed, prefix_caching=seed % 3 == 1, disaggregated=seed % 5 == 4)
        config = merge_config(scenario["config"])
        slow = reference_simulate(
            config, scenario["ids"], scenario["inputs"], scenario["outputs"], scenario["send_ns"],
            sessions={"session": scenario["session"], "shared_prefix_tokens": scenario["system"]},
        )
        reqs = slow["requests"]
        seen["closed"] += config["load"]["type"] == "closed_loop"
        seen["open"] += config["load"]["type"] != "closed_loop"
        seen["later_turn_hits"] += any((r["cached_tokens"] or 0) > 0 and t > 0 for r, t in zip(reqs, scenario["turn"]))
        seen["rejected"] += any(r["status"] == "rejected" for r in reqs)
        seen["incomplete"] += any(r["status"] == "incomplete" for r in reqs)
        seen["detok"] += config["detokenization"]["base_ms"] > 0
        seen["pd"] += config["engine"].get("mode") == "disaggregated"
        sends = [r["send_ns"] for r in reqs if r["send_ns"] is not None]
        seen["tied_sends"] += len(sends) > len(set(sends))
        seen["unsent"] += any(r["send_ns"] is None for r in reqs)
    assert all(count >= 10 for count in seen.values()), seen


@pytest.mark.parametrize("seed", range(0, NUM_SESSION_SCENARIOS, 3))
def test_each_turn_follows_the_previous_receipt_plus_think(seed):
    """The law of sessions: a later turn is sent exactly at the previous turn's end at
    the client (its last receipt, or its rejection) plus the think time, and only then."""
    scenario = random_session_scenario(seed, prefix_caching=seed % 2 == 0)
    cfg, run, cols, _ = run_sessions(scenario)
    think_ns = round(scenario["think_ms"] * 1e6)
    end = np.where(run.reject_ns >= 0, run.reject_ns, np.where(cols.completed, cols.last_recv_ns, -1))
    cap = np.iinfo(np.int64).max if run.cap_ns is None else run.cap_ns
    previous = {}
    for k, (s, t) in enumerate(zip(scenario["session"], scenario["turn"])):
        if t > 0:
            before = previous[s]
            if end[before] >= 0 and end[before] + think_ns <= cap:
                assert run.send_ns[k] == end[before] + think_ns, k
            else:
                assert run.send_ns[k] == -1, k
        previous[s] = k


@pytest.mark.parametrize("seed", range(1, NUM_SESSION_SCENARIOS, 3))
def test_closed_loop_keeps_at_most_concurrency_sessions(seed):
    """Closed loop over sessions: the first min(C, S) sessions start at 0; at any
    instant at most C sessions have started and not ended at the client."""
    scenario = random_session_scenario(seed)
    if scenario["config"]["load"]["type"] != "closed_loop":
        return
    concurrency = scenario["config"]["load"]["concurrency"]
    cfg, run, cols, _ = run_sessions(scenario)
    end = np.where(run.reject_ns >= 0, run.reject_ns, np.where(cols.completed, cols.last_recv_ns, -1))
    sessions = sorted(set(scenario["session"]), key=scenario["session"].index)
    spans = []
    for s in sessions:
        rows = [k for k, x in enumerate(scenario["session"]) if x == s]
        start = run.send_ns[rows[0]]
        if start >= 0:
            stop = end[rows[-1]] if end[rows[-1]] >= 0 else np.iinfo(np.int64).max
            spans.append((start, stop))
    starts_at_zero = sum(1 for start, _ in spans if start == 0)
    assert starts_at_zero >= min(concurrency, len(sessions))
    for instant in {start for start, _ in spans}:
        # a session ending at an instant frees its slot before one starting then
        assert sum(1 for start, stop in spans if start <= instant < stop) <= concurrency


def hand_config(**overrides) -> dict:
    config = {
        "workload": {"source": "sessions", "sessions": {"think_time_ms": 0.5}},
        "load": {"type": "closed_loop", "concurrency": 1},
        "engine": {"aggregated": {"block_size": 4, "num_blocks": 64, "max_batched_tokens": 64}},
        # 1 ms per prompt token computed, 1 ms per decoding sequence
        "timing": {"type": "linear", "base_ms": 0.0, "per_prefill_token_us": 1000.0, "per_decode_seq_us": 1000.0,
                   "per_kv_token_ns": 0.0},
    }
    for key, value in overrides.items():
        config[key] = value
    return config


def hand_table() -> RequestTable:
    # One session: turn 0 = 4 prompt tokens, 2 out; turn 1 = 4 + 2 + 3 new = 9 prompt tokens, 1 out.
    return RequestTable(
        pa.array(["a", "b"]), np.array([4, 9], dtype=np.int64), np.array([2, 1], dtype=np.int64),
        session_id=pa.array(["s", "s"]), session=np.array([0, 0]), turn=np.array([0, 1]),
    )


@pytest.mark.parametrize("caching", [False, True])
def test_hand_worked_two_turns(caching):
    """Turn 0: prefill 4 tokens [0, 4 ms], decode [4, 5 ms]: received at 5 ms.  Turn 1
    is sent at 5 + 0.5 think = 5.5 ms; its prompt holds turn 0's prompt, so with
    prefix caching its first 4-token block is a hit: 5 tokens to compute, 5 ms, first
    (and last) token at 10.5 ms; without it 9 tokens, 14.5 ms."""
    config = hand_config()
    config["engine"]["aggregated"]["prefix_caching"] = caching
    run = simulate_engine(load_config(config), hand_table(), None)
    cols = RequestColumns(run)
    assert run.send_ns.tolist() == [0, 5_500_000]
    assert cols.last_recv_ns.tolist() == [5_000_000, 10_500_000 if caching else 14_500_000]
    assert run.cached_tokens.tolist() == [0, 4 if caching else 0]


def test_hand_worked_open_loop_ties_go_in_row_order():
    """Two sessions whose second turns are due at the same instant: the lower row is
    sent first, so it takes send number 2 and, over 2 replicas, worker 0."""
    config = hand_config(load={"type": "trace"})
    config["engine"]["aggregated"]["replicas"] = 2
    table = RequestTable(
        pa.array(["a0", "b0", "b1", "a1"]), np.array([4, 4, 9, 9], dtype=np.int64), np.array([2, 2, 1, 1]),
        session_id=pa.array(["a", "b", "b", "a"]), session=np.array([0, 1, 1, 0]), turn=np.array([0, 0, 1, 1]),
    )
    # Both first turns at 0, one per worker: both received at 5 ms, both later turns at 5.5 ms.
    run = simulate_engine(load_config(config), table, np.array([0, 0, -1, -1], dtype=np.int64))
    assert run.send_ns.tolist() == [0, 0, 5_500_000, 5_500_000]
    assert run.worker.tolist() == [0, 1, 0, 1]  # row 2 (b1) is send 2, row 3 (a1) send 3


def test_closed_loop_counts_sessions():
    """Concurrency 1 over two one-turn... two-turn sessions: session 1 starts when session
    0's last turn is received (plus load.think_time_ms), not after session 0's first turn."""
    config = hand_config()
    config["load"]["think_time_ms"] = 0.25
    table = RequestTable(
        pa.array(["a0", "a1", "b0", "b1"]), np.array([4, 9, 4, 9], dtype=np.int64), np.array([2, 1, 2, 1]),
        session_id=pa.array(["a", "a", "b", "b"]), session=np.array([0, 0, 1, 1]), turn=np.array([0, 1, 0, 1]),
    )
    run = simulate_engine(load_config(config), table, None)
    # a0 [0, 5], a1 sent 5.5 computes 9 tokens + emits at 14.5; b0 sent 14.75, done 19.75; b1 at 20.25
    assert run.send_ns.tolist() == [0, 5_500_000, 14_750_000, 20_250_000]


def test_generator_prompts_grow_by_answer_and_new_input():
    cfg = load_config({"workload": {"source": "sessions", "sessions": {
        "num_sessions": 3, "turns": 3, "new_input_tokens": 10, "output_tokens": 7, "system_prompt_tokens": 5}}})
    table = simcore.run(cfg).requests
    assert table.column("session_id").to_pylist() == ["s0"] * 3 + ["s1"] * 3 + ["s2"] * 3
    assert table.column("turn").to_pylist() == [0, 1, 2] * 3
    assert table.column("input_tokens").to_pylist() == [15, 32, 49] * 3


@pytest.mark.parametrize("dist", ["uniform", "geometric"])
def test_generator_turn_counts_are_at_least_one(dist):
    cfg = load_config({"workload": {"source": "sessions", "sessions": {
        "num_sessions": 200, "turns": 3, "turns_dist": dist, "new_input_tokens": 4, "output_tokens": 2}}})
    turns = np.array(simcore.run(cfg).requests.column("turn").to_pylist())
    counts = np.diff(np.r_[np.flatnonzero(turns == 0), turns.shape[0]])
    assert counts.min() >= 1 and counts.shape[0] == 200
    if dist == "uniform":
        assert counts.max() <= 3


def test_per_turn_keys_split_completed_requests():
    """first_turn/later_turns statistics are those of the request table's rows of that turn."""
    result = simcore.run({"workload": {"source": "sessions", "sessions": {"num_sessions": 8, "turns": 3}},
                          "load": {"concurrency": 4}, "engine": {"aggregated": {"prefix_caching": True}}})
    ttft = np.array(result.requests.column("ttft_ms").to_pylist())
    turn = np.array(result.requests.column("turn").to_pylist())
    assert result.summary["num_sessions"] == 8
    assert result.summary["max_ttft_first_turn_ms"] == ttft[turn == 0].max()
    assert result.summary["min_ttft_later_turns_ms"] == ttft[turn > 0].min()


def test_without_sessions_no_session_keys():
    result = simcore.run({"workload": {"num_requests": 4}})
    assert "num_sessions" not in result.summary
    assert result.requests.column("session_id").null_count == 4


@pytest.mark.parametrize(
    "columns, message",
    [
        ({"session_id": ["a", "a"], "turn": [0, 2]}, "turn 2 at row 1, expected turn 1"),
        ({"session_id": ["a", "a"], "turn": [1, 0]}, "turn 1 at row 0, expected turn 0"),
        ({"session_id": ["a", "b"]}, "needs both session_id and turn"),
        ({"session_id": ["a", "a"], "turn": [0, 1], "input_tokens": [10, 12]}, "fewer than the previous turn's"),
        ({"session_id": ["a", None], "turn": [0, 0]}, "session_id has a missing value at row 1"),
    ],
)
def test_bad_session_tables(columns, message):
    data = {"input_tokens": [10, 30], "output_tokens": [5, 5], **columns}
    with pytest.raises(ConfigError, match=message):
        table_requests(pa.table(data), "requests", None)


def test_bad_session_csv_names_the_line(tmp_path):
    path = tmp_path / "turns.csv"
    path.write_text("session_id,turn,input_tokens,output_tokens\nx,0,10,5\nx,0,30,5\n")
    with pytest.raises(ConfigError, match=r"turns.csv: session 'x' has turn 0 at line 3, expected turn 1"):
        simcore.run({"workload": {"source": "table", "path": str(path)}})


def test_session_table_from_csv_runs(tmp_path):
    path = tmp_path / "turns.csv"
    path.write_text("session_id,turn,input_tokens,output_tokens\nx,0,10,5\ny,0,10,5\nx,1,20,5\n")
    result = simcore.run({"workload": {"source": "table", "path": str(path), "sessions": {"think_time_ms": 1.0}}})
    rows = result.requests.to_pylist()
    assert [r["turn"] for r in rows] == [0, 0, 1]
    assert rows[2]["send_ms"] == pytest.approx(rows[0]["last_token_ms"] + 1.0, abs=1e-9)


def test_api_table_of_sessions_takes_the_think_time():
    table = pa.table({"session_id": [7, 7], "turn": [0, 1], "input_tokens": [10, 20], "output_tokens": [5, 5]})
    result = simcore.run({"workload": {"sessions": {"think_time_ms": 2.0}}}, requests=table)
    rows = result.requests.to_pylist()
    assert [r["session_id"] for r in rows] == ["7", "7"]
    assert rows[1]["send_ms"] == pytest.approx(rows[0]["last_token_ms"] + 2.0, abs=1e-9)


def test_think_time_without_sessions_is_an_error():
    with pytest.raises(ConfigError, match="workload.sessions.think_time_ms has no effect here"):
        simcore.run({"workload": {"num_requests": 4, "sessions": {"think_time_ms": 2.0}}})


def test_bounded_mode_and_batch_agree_with_detailed():
    """The bounded output mode and run_batch replay sessions as the detailed single run does."""
    config = {"workload": {"source": "sessions", "sessions": {"num_sessions": 12, "turns": 3, "turns_dist": "uniform",
                                                               "new_input_tokens": 64, "output_tokens": 16,
                                                               "think_time_ms": 3.0}},
              "load": {"concurrency": 5}, "detokenization": {"workers": 2, "base_ms": 1.5, "per_output_us": 40.0},
              "engine": {"aggregated": {"prefix_caching": True, "replicas": 2}}}
    detailed = simcore.run(config)
    bounded = simcore.run({**config, "output": {"mode": "bounded"}})
    batch = simcore.run_batch([config, {**config, "seed": 1}])
    for other in (bounded, batch[0]):
        for column in ("send_ms", "first_token_ms", "last_token_ms", "worker", "cached_tokens", "turn"):
            assert other.requests.column(column).equals(detailed.requests.column(column)), column
    assert batch[1].requests.column("turn").to_pylist() == simcore.run({**config, "seed": 1}).requests.column("turn").to_pylist()


def test_cli_preset_runs_and_writes_the_session_columns(tmp_path):
    from tests.test_cli import replaysim

    done = replaysim(tmp_path, "workload=sessions", "workload.sessions.num_sessions=6", "workload.sessions.turns=2",
                     "workload.sessions.new_input_tokens=32", "workload.sessions.output_tokens=4",
                     "engine.aggregated.prefix_caching=true", "load.concurrency=3")
    assert done.returncode == 0, done.stderr
    rows = pa.parquet.read_table(tmp_path / "run" / "requests.parquet").to_pylist()
    assert [(r["session_id"], r["turn"]) for r in rows] == [(f"s{s}", t) for s in range(6) for t in range(2)]
    assert all(r["cached_tokens"] == 32 for r in rows if r["turn"] == 1)  # turn 0's 2 whole 16-token blocks


def test_cli_bad_session_table_exits_2_naming_the_line(tmp_path):
    from tests.test_cli import replaysim, result_files

    (tmp_path / "turns.csv").write_text("session_id,turn,input_tokens,output_tokens\na,0,10,5\na,2,30,5\n")
    done = replaysim(tmp_path, "workload.source=table", "workload.path=turns.csv")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].endswith(
        "turns.csv: session 'a' has turn 2 at line 3, expected turn 1 (a session's turns are numbered 0, 1, ... in table order)"
    )
    assert result_files(tmp_path) == []


def test_steady_session_scenarios_run_steady_stretches():
    """Guards the generator: many steady scenarios have 10+ consecutive decode-only passes of one batch."""
    long_runs = 0
    for seed in range(NUM_STEADY_SESSION_SCENARIOS):
        scenario = random_session_scenario(seed, steady=True)
        slow = reference_simulate(
            merge_config(scenario["config"]), scenario["ids"], scenario["inputs"], scenario["outputs"],
            scenario["send_ns"], sessions={"session": scenario["session"], "shared_prefix_tokens": scenario["system"]},
        )
        long_runs += longest_steady_stretch(slow["passes"]) >= 10
    assert long_runs >= NUM_STEADY_SESSION_SCENARIOS // 3, long_runs



ROUTING_POLICIES = ("random", "least_outstanding", "least_tokens", "power_of_two", "prefix_aware")


@pytest.mark.parametrize("seed", range(100))
def test_routed_sessions_match_reference(seed):
    """Each turn routed at its send (the tie scan and the draws follow the send sequence number)."""
    rnd = random.Random(20_000 + seed)
    policy = ROUTING_POLICIES[seed % len(ROUTING_POLICIES)]
    scenario = random_session_scenario(seed, prefix_caching=policy == "prefix_aware" or seed % 3 == 0,
                                       disaggregated=seed % 4 == 3, policy=("vllm", "sglang", "trtllm")[seed % 3])
    engine = scenario["config"]["engine"]
    pool = "prefill" if engine.get("mode") == "disaggregated" else "aggregated"
    engine[pool]["replicas"] = rnd.randint(2, 4)
    engine[pool]["rank_policy"] = rnd.choice(["round_robin", "least_loaded"])
    engine["router"] = {"policy": policy}
    scenario["config"]["seed"] = rnd.randint(0, 1000)
    compare_sessions_with_reference(scenario)
