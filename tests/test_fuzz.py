"""Property-based fuzzing of the input boundary (hypothesis).

Invalid configurations, drawn over the classes of issue 13 (types, magnitudes,
keys without effect, unknown keys and choices), raise ``ConfigError`` from
:func:`simcore.run` and nothing else (exit 2 on the command line); valid small
configurations run and give no negative duration, no NaN, no instant past
the end of the run (the cap, and the worst-case bound of ``simcore.bounds``)
and the same tables when run again.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simcore
from simcore import bounds
from simcore.config import DEFAULTS, ConfigError
from simcore.schema import TTFT_STAGES
from tests.config_trees import merged, nested

#: Examples per property (about 3 s each in CI); REPLAYSIM_FUZZ_EXAMPLES=2000 for a deeper search.
FUZZ = settings(
    max_examples=int(os.environ.get("REPLAYSIM_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TINY = {"num_requests": 8, "input_tokens": 16, "output_tokens": 4}

COUNT_KEYS = [
    "workload.num_requests", "workload.input_tokens", "workload.output_tokens", "load.concurrency",
    "engine.aggregated.replicas", "engine.aggregated.attention_dp", "engine.aggregated.max_sequences",
    "engine.aggregated.num_blocks", "engine.aggregated.block_size", "engine.aggregated.max_batched_tokens",
    "engine.aggregated.context_length", "tokenization.workers", "detokenization.workers",
    "detokenization.chunk_size",
]
#: Non-negative costs (ms, us, ns) and the cap: every one of them is read by the default config.
COST_KEYS = [
    "timing.base_ms", "timing.per_prefill_token_us", "timing.per_decode_seq_us", "timing.per_kv_token_ns",
    "tokenization.base_ms", "tokenization.per_input_us", "detokenization.base_ms",
    "detokenization.per_output_us", "detokenization.first_output_us", "detokenization.final_output_us",
    "load.think_time_ms", "max_time_ms",
]
CHOICE_KEYS = [
    "workload.source", "workload.input_dist", "load.type", "engine.mode", "engine.policy", "timing.type", "output.mode",
]

NOT_A_NUMBER = st.one_of(st.text(max_size=8), st.booleans(), st.lists(st.integers(), max_size=2),
                         st.dictionaries(st.text(max_size=3), st.integers(), max_size=1))
HUGE_INTS = st.one_of(st.integers(min_value=2**63, max_value=2**70), st.just(10**400))
BAD_COUNTS = st.one_of(st.integers(max_value=0), HUGE_INTS, st.floats(allow_nan=True), NOT_A_NUMBER)
BAD_COSTS = st.one_of(
    st.floats(max_value=-1e-300), st.floats(min_value=1e200), st.sampled_from([math.nan, math.inf, -math.inf]),
    st.just(10**400), NOT_A_NUMBER,
)
BAD_RATES = st.one_of(st.floats(max_value=1e-200), st.sampled_from([math.nan, math.inf]), NOT_A_NUMBER)


@st.composite
def invalid_configs(draw) -> dict:
    base = {"workload": dict(TINY)}
    kind = draw(st.sampled_from(["count", "cost", "costs", "rate", "speedup", "choice", "unknown", "unused"]))
    if kind == "count":
        return merged(base, nested(draw(st.sampled_from(COUNT_KEYS)), draw(BAD_COUNTS)))
    if kind == "cost":
        return merged(base, nested(draw(st.sampled_from(COST_KEYS)), draw(BAD_COSTS)))
    if kind == "costs":  # two costs that are each finite but overflow together
        first, second = draw(st.lists(st.sampled_from(COST_KEYS[:-1]), min_size=2, max_size=2, unique=True))
        huge = st.floats(min_value=1e150, allow_infinity=False)
        return merged(base, nested(first, draw(huge)), nested(second, draw(huge)))
    if kind == "rate":
        load = {"type": draw(st.sampled_from(["constant_rate", "poisson", "gamma"])), "request_rate": draw(BAD_RATES)}
        return merged(base, {"load": load})
    if kind == "speedup":
        return merged(base, {"load": {"type": "trace", "speedup": draw(BAD_RATES)}})
    if kind == "choice":
        key = draw(st.sampled_from(CHOICE_KEYS))
        return merged(base, nested(key, draw(st.one_of(st.text(max_size=12), st.integers(), st.none()))))
    if kind == "unknown":
        section = draw(st.sampled_from(["", "workload.", "load.", "engine.aggregated.", "timing.", "metrics.goodput."]))
        name = draw(st.from_regex(r"[a-z]{1,12}", fullmatch=True))
        known = {k for k in DEFAULTS} | {k.rsplit(".", 1)[-1] for k in _leaves()}
        name = name if name not in known else name + "_x"
        return merged(base, nested(section + name, 1))
    # a key without effect in the chosen configuration, at a value other than its default
    return draw(st.sampled_from([
        merged(base, {"load": {"type": "poisson", "request_rate": 10.0, "concurrency": draw(st.integers(1, 63))}}),
        merged(base, {"timing": {"type": "fixed", "base_ms": draw(st.floats(0, 4.9))}}),
        merged(base, {"timing": {"type": "linear", "decode_ms": draw(st.floats(0, 7.9))}}),
        merged(base, {"workload": {"range_ratio": draw(st.floats(0.01, 0.99))}}),
        {"workload": {"source": "table", "path": "r.csv", "output_tokens": draw(st.integers(1, 127))}},
    ]))


def _leaves() -> list[str]:
    from simcore.config import dotted_keys

    return dotted_keys()


@FUZZ
@given(invalid_configs())
def test_invalid_configs_raise_config_error_only(config):
    with pytest.raises(ConfigError) as err:
        simcore.run(config)
    assert "\n" not in str(err.value)


CLI_VALUES = ["-1", "nan", "inf", "1e300", "9223372036854775808", "abc", "true", "[1,2]"]


@settings(max_examples=2, deadline=None)
@given(st.sampled_from(COUNT_KEYS + COST_KEYS), st.sampled_from(CLI_VALUES))
def test_a_bad_override_exits_2_with_one_line(tmp_path_factory, key, value):
    root = tmp_path_factory.mktemp("cli")
    done = subprocess.run(
        [sys.executable, "-m", "runners.cli", f"hydra.run.dir={root / 'run'}", f"{key}={value}"],
        cwd=root, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("replaysim: error: "), done.stderr
    assert not (root / "run" / "summary.json").exists()


@st.composite
def valid_configs(draw) -> dict:
    n, inp, out = draw(st.integers(1, 12)), draw(st.integers(1, 48)), draw(st.integers(1, 24))
    workload = {"num_requests": n, "input_tokens": inp, "output_tokens": out}
    if inp >= 2 and draw(st.booleans()):
        workload |= {"input_dist": "uniform", "range_ratio": draw(st.floats(0.5, 1.0))}
    if draw(st.booleans()):
        load = {"type": "closed_loop", "concurrency": draw(st.integers(1, 6)), "think_time_ms": draw(st.floats(0, 3))}
    else:
        load = {"type": draw(st.sampled_from(["constant_rate", "poisson"])), "request_rate": draw(st.floats(1, 2000))}
    policy = draw(st.sampled_from(["vllm", "sglang", "trtllm"]))

    def pool() -> dict:
        # A KV of about one to three requests: some prompts are rejected, running ones preempted.
        block = draw(st.integers(1, 8))
        blocks = draw(st.integers(max(2, inp // block), max(3, 3 * (inp + out) // block)))
        p = {"replicas": draw(st.integers(1, 2)), "attention_dp": draw(st.integers(1, 2)),
             "max_sequences": draw(st.integers(1, 8)), "num_blocks": blocks, "block_size": block}
        if policy == "sglang":
            p["chunked_prefill_size"] = draw(st.integers(16, 64))
        else:
            p["max_batched_tokens"] = draw(st.integers(8, 64))
        return p

    if draw(st.integers(0, 3)) == 0:
        engine = {"mode": "disaggregated", "prefill": pool(), "decode": pool(),
                  "kv_transfer": {"bandwidth_gb_per_second": draw(st.floats(1, 100)),
                                  "bytes_per_token": draw(st.floats(1e3, 1e6))}}
    else:
        engine = {"aggregated": pool()}
    engine["policy"] = policy
    costs = st.floats(0, 20)
    if draw(st.booleans()):
        timing = {"type": "fixed", "prefill_ms": draw(costs), "decode_ms": draw(st.floats(0, 5))}
    else:
        timing = {"type": "linear", "base_ms": draw(st.floats(0, 5)), "per_prefill_token_us": draw(costs),
                  "per_decode_seq_us": draw(costs), "per_kv_token_ns": draw(costs)}
    return {
        "seed": draw(st.integers(0, 2**32)),
        "workload": workload,
        "load": load,
        "engine": engine,
        "timing": timing,
        "tokenization": {"workers": draw(st.integers(1, 2)), "base_ms": draw(st.floats(0, 2)),
                         "per_input_us": draw(st.floats(0, 10))},
        "detokenization": {"workers": draw(st.integers(1, 2)), "base_ms": draw(st.floats(0, 2)),
                           "per_output_us": draw(st.floats(0, 100))},
        "max_time_ms": draw(st.one_of(st.none(), st.floats(0, 300))),
        "output": {"passes": draw(st.booleans()), "mode": draw(st.sampled_from(["detailed", "bounded"]))},
    }


INSTANTS = ["send_ms", "engine_arrival_ms", "first_admit_ms", "first_token_emit_ms", "first_token_ms",
            "last_token_ms", "transfer_start_ms", "transfer_end_ms"]


@FUZZ
@given(valid_configs())
def test_valid_configs_run_without_negative_nan_or_late_values(config):
    result = simcore.run(config)
    cfg = result.config
    table = result.requests
    floats = [name for name in table.column_names if name.endswith("_ms")]
    for name in floats:
        values = np.array([v for v in table.column(name).to_pylist() if v is not None], dtype=np.float64)
        assert not np.isnan(values).any(), name
        assert (values >= 0).all(), name
    size = bounds.table_size(cfg, np.asarray(table.column("input_tokens")), np.asarray(table.column("output_tokens")),
                             None, "requests")
    end_ms = bounds.worst_case_ms(cfg, size) + max((v or 0.0) for v in table.column("send_ms").to_pylist())
    if cfg.max_time_ms is not None:
        end_ms = min(end_ms, cfg.max_time_ms)
    for name in INSTANTS:
        for value in table.column(name).to_pylist():
            assert value is None or round(value * 1e6) <= round(end_ms * 1e6), (name, value, end_ms)
    for row in table.to_pylist():  # the stages of a received first token sum to its TTFT (SPEC §10)
        if row["ttft_ms"] is not None:
            assert sum(round(row[s] * 1e6) for s in TTFT_STAGES) == round(row["ttft_ms"] * 1e6)
    duration = result.summary["duration_s"]
    assert duration is None or (duration >= 0 and not math.isnan(duration))
    if result.passes is not None:
        starts, ends = (np.asarray(result.passes.column(c)) for c in ("start_ms", "end_ms"))
        assert (starts <= ends).all() and (ends <= end_ms).all()
    again = simcore.run(config)  # same config and seed: bit-identical results
    assert again.requests.equals(result.requests) and again.summary == result.summary
