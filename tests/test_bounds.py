"""Values and combinations an int64 ns clock or the machine's memory cannot hold are ConfigErrors.

Each class of issue 13's defects has a test here that failed before: buffer
sizes from unchecked sums (a segfault), instants that wrapped (silent wrong
results), huge integers and floats that raised tracebacks, and keys that were
silently ignored.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

import simcore
from simcore import bounds
from simcore.config import ConfigError, InstantOverflow, load_config
from simcore.engine.api import prepare
from simcore.units import INT64_MAX, MAX_INSTANT_MS, ms_array_to_ns, ms_to_ns
from simcore.workload.api import RequestTable

TINY = {"workload": {"num_requests": 16, "input_tokens": 8, "output_tokens": 2}}


def rejects(config, field, requests=None):
    """simcore.run(config) raises a one-line ConfigError that names ``field``."""
    with pytest.raises(ConfigError) as err:
        simcore.run(config, requests=requests)
    message = str(err.value)
    assert field in message and "\n" not in message, message
    return message


# ---------------------------------------------------------------- checked arithmetic


def test_checked_total_is_exact_up_to_int64_and_an_error_beyond():
    half = 2**62
    assert bounds.checked_total(np.array([half, half - 1], dtype=np.int64), "x") == INT64_MAX
    with pytest.raises(ConfigError, match="x: the lengths sum to 9223372036854775808"):
        bounds.checked_total(np.array([half, half], dtype=np.int64), "x")
    assert bounds.checked_total(np.zeros(0, dtype=np.int64), "x") == 0


def test_prepare_refuses_a_token_count_that_wraps_int64():
    """The buffer capacity was an int64 cumsum: 2 x 2**62 wrapped to -2**63 and sized a buffer."""
    cfg = load_config({"output": {"mode": "bounded"}})
    requests = RequestTable(
        request_id=pa.array(["a", "b"]),
        input_tokens=np.array([8, 8], dtype=np.int64),
        output_tokens=np.array([2**62, 2**62], dtype=np.int64),
    )
    with pytest.raises(ConfigError, match="output_tokens: the lengths sum to"):
        prepare(cfg, requests, None)


def test_output_tokens_near_2_62_is_rejected_before_allocation():
    """Issue 13 item 1: 16 x 2**62 output tokens segfaulted."""
    rejects({"workload": {"num_requests": 16, "output_tokens": 2**62}}, "workload.output_tokens=4611686018427387904")
    rejects({"workload": {"num_requests": 16, "output_tokens": 2**62}, "output": {"mode": "bounded"}}, "output_tokens=4611686018427387904")


# ---------------------------------------------------------------- ms -> ns


def test_ms_to_ns_is_checked_at_the_int64_limit():
    assert ms_to_ns(1e12) == 10**18  # exact: 1e12 * 1e6 is a float64 integer
    assert ms_array_to_ns(np.array([1.5, 1e12])).tolist() == [1_500_000, 10**18]
    # 2**63 ns is 9223372036854.775808 ms: its float64 product is 2**63, one past int64.
    for bad in (2.0**63 / 1e6, 1e300, float("inf"), float("nan"), -1e300):
        with pytest.raises(InstantOverflow, match="max_time_ms of"):
            ms_to_ns(bad, "max_time_ms")
        with pytest.raises(InstantOverflow):
            ms_array_to_ns(np.array([1.0, bad]))


@pytest.mark.parametrize(
    "config, field",
    [
        ({"timing": {"base_ms": 1e300}}, "timing.base_ms"),
        ({"detokenization": {"per_output_us": 1e300}}, "detokenization.per_output_us"),
        ({"detokenization": {"first_output_us": 1e300}}, "detokenization.first_output_us"),
        ({"detokenization": {"base_ms": 1e300}}, "detokenization.base_ms"),
        ({"tokenization": {"base_ms": 1e300}}, "tokenization.base_ms"),
        ({"tokenization": {"per_input_us": 1e300}}, "tokenization.per_input_us"),
        ({"load": {"think_time_ms": 1e300}}, "load.think_time_ms"),
        ({"max_time_ms": 1e300}, "max_time_ms"),
        ({"load": {"type": "poisson", "request_rate": 1e-300}}, "load.request_rate"),
        ({"load": {"type": "constant_rate", "request_rate": 1e-300}}, "load.request_rate"),
        ({"timing": {"type": "fixed", "prefill_ms": 1e300}}, "timing.prefill_ms"),
        (
            {"engine": {"mode": "disaggregated", "kv_transfer": {"bandwidth_gb_per_second": 1.0, "bytes_per_token": 1e300}}},
            "engine.kv_transfer.bytes_per_token",
        ),
    ],
)
def test_costs_whose_instants_overflow_int64_are_rejected(config, field):
    """Issue 13 item 2: these gave TTFT 0, negative durations or negative instants, exit 0."""
    rejects(TINY | config, field)


def test_a_trace_speedup_that_spreads_sends_beyond_int64_names_the_speedup():
    table = pa.table({"input_tokens": [8, 8], "output_tokens": [2, 2], "send_ms": [0.0, 1.0]})
    rejects({"load": {"type": "trace", "speedup": 1e-300}}, "load.speedup=1e-300", requests=table)


def test_the_longest_accepted_run_keeps_exact_instants():
    """The bound is the sum of every service (simcore/bounds.py); up to it the clock must not wrap.

    One request of 1 input and 1 output token, fixed timing with prefill_ms =
    decode_ms = x, no tokenizer or detokenizer: the bound counts passes =
    outputs + requests + inputs // 8192 = 1 + 1 + 0 = 2, each lasting
    prefill_ms + decode_ms = 2x, so 4x in all (plus 2 ns for the 1 ns floor,
    below float64's resolution at this magnitude).  At x = MAX / 4 it reaches
    MAX and is rejected; at x = MAX / 4 - 1 the run is accepted, and its one
    pass (a 1-token prompt is one decode entry, SPEC §5) lasts rint(x ms) ns.
    """
    def config(x):
        return {"workload": {"num_requests": 1, "input_tokens": 1, "output_tokens": 1}, "load": {"concurrency": 1},
                "timing": {"type": "fixed", "prefill_ms": x, "decode_ms": x}}

    rejects(config(MAX_INSTANT_MS / 4), "timing.prefill_ms")
    x = MAX_INSTANT_MS / 4 - 1.0
    result = simcore.run(config(x))
    row = result.requests.to_pylist()[0]
    assert row["status"] == "completed"
    assert row["ttft_ms"] == row["e2el_ms"] == np.rint(x * 1e6) / 1e6
    assert result.summary["duration_s"] == np.rint(x * 1e6) / 1e9


# ---------------------------------------------------------------- huge integers


HUGE_INT_KEYS = [
    "workload.num_requests",
    "workload.input_tokens",
    "workload.output_tokens",
    "engine.aggregated.replicas",
    "engine.aggregated.attention_dp",
    "engine.aggregated.max_sequences",
    "engine.aggregated.num_blocks",
    "engine.aggregated.block_size",
    "tokenization.workers",
    "detokenization.workers",
]


def nested(key: str, value) -> dict:
    out: dict = {}
    node = out
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return out


@pytest.mark.parametrize("key", HUGE_INT_KEYS)
@pytest.mark.parametrize("value", [2**63, 2**63 - 1, 10**400], ids=["2^63", "2^63-1", "400 digits"])
def test_huge_integers_are_rejected_naming_their_key(key, value):
    """Issue 13 item 3: these raised OverflowError, MemoryError or numba errors (or segfaulted)."""
    leaf = key.rsplit(".", 1)[1]
    message = rejects(nested(key, value), leaf)
    assert len(message) < 600


def test_a_huge_block_size_is_reported_as_the_block_size():
    """It was reported as ``num_blocks must be >= 1, got 0`` (the derived default)."""
    rejects({"engine": {"aggregated": {"block_size": 2**62}}}, "engine.aggregated.block_size=4611686018427387904")


def test_huge_integers_given_to_float_keys_are_rejected():
    rejects({"timing": {"base_ms": 10**400}}, "timing.base_ms must be a finite number")


def test_the_command_line_rejects_a_huge_integer_in_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "runners.cli", f"output.dir={tmp_path / 'out'}", "workload.num_requests=16",
         "workload.output_tokens=4611686018427387904"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "workload.output_tokens=4611686018427387904" in done.stderr
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the API boundary


@pytest.mark.parametrize(
    "requests",
    [
        {"input_tokens": [1], "output_tokens": [1]},
        [{"input_tokens": 1, "output_tokens": 1}],
        "requests.csv",
        np.ones((2, 2), dtype=np.int64),
    ],
    ids=["dict", "list", "str", "ndarray"],
)
def test_requests_that_are_not_an_arrow_table_are_rejected(requests):
    rejects({}, "requests must be a pyarrow.Table", requests=requests)


def test_dataframes_as_requests_are_rejected():
    pd = pytest.importorskip("pandas")
    pl = pytest.importorskip("polars")
    data = {"input_tokens": [1], "output_tokens": [1]}
    rejects({}, "got pandas", requests=pd.DataFrame(data))
    rejects({}, "got polars", requests=pl.DataFrame(data))


@pytest.mark.parametrize(
    ("workload", "field"),
    [
        ({"input_tokens": 99}, "workload.input_tokens"),
        ({"output_dist": "uniform", "range_ratio": 0.5}, "workload.output_dist"),
        ({"prefix_tokens": 4}, "workload.prefix_tokens"),
        ({"num_requests": 5}, "workload.num_requests"),
    ],
)
def test_workload_keys_beside_a_requests_table_are_rejected(workload, field):
    table = pa.table({"input_tokens": [4, 4], "output_tokens": [1, 1]})
    rejects({"workload": workload}, field, requests=table)


def test_num_requests_may_state_the_row_count_of_a_requests_table():
    table = pa.table({"input_tokens": [4, 4], "output_tokens": [1, 1]})
    assert simcore.run({"workload": {"num_requests": 2}}, requests=table).summary["num_requests"] == 2


@pytest.mark.parametrize(
    ("timing", "field"),
    [
        ({"prefill_scale": 1e300}, "timing.prefill_scale=1e+300"),
        ({"decode_scale": 1e300}, "timing.decode_scale=1e+300"),
        ({"pass_overhead_us": 1e300}, "timing.pass_overhead_us=1e+300"),
        ({"tp": 2, "num_layers": 32, "hidden_size": 4096,
          "allreduce": {"latency_us": 1.0, "bandwidth_gb_per_second": 1e-300}},
         "allreduce.bandwidth_gb_per_second=1e-300"),
    ],
)
def test_linear_pass_scales_overhead_and_allreduce_count_in_the_worst_case(timing, field):
    rejects({"timing": timing}, field)


def test_a_scaled_linear_bound_is_the_unscaled_one_times_the_scale():
    cfg = load_config(TINY)
    scaled = load_config({**TINY, "timing": {"prefill_scale": 3.0, "decode_scale": 2.0}})
    size = bounds.configured_size(cfg)
    model = [ms for key, ms in bounds._time_terms(cfg, size, None) if key.startswith("timing.")]
    times3 = [ms for key, ms in bounds._time_terms(scaled, size, None) if key.startswith("timing.")]
    # the four linear terms scale by the larger factor; overhead and all-reduce are 0 in both
    assert times3 == [3.0 * ms for ms in model]


def test_hidden_size_without_an_allreduce_is_rejected():
    rejects({"timing": {"hidden_size": []}}, "timing.hidden_size")
    rejects({"timing": {"hidden_size": 4096}}, "timing.hidden_size")


def test_trace_sends_beyond_int64_name_the_table_column():
    table = pa.table({"input_tokens": [4, 4], "output_tokens": [1, 1],
                      "send_ms": pa.array([0, 10**12], pa.duration("s"))})
    message = rejects({"load": {"type": "trace"}}, "requests: send_ms", requests=table)
    assert "load.speedup=1.0" in message


def test_bad_config_and_progress_arguments_are_config_errors():
    rejects([("seed", 1)], "config must be a mapping")
    with pytest.raises(ConfigError, match="progress must be callable"):
        simcore.run(TINY, progress=3)
    with pytest.raises(ConfigError, match="config must be a mapping"):
        simcore.run_batch([TINY, 5])


def test_drawn_lengths_beyond_int64_are_rejected_before_drawing():
    rejects({"workload": {"output_dist": "normal", "output_std": 1e300}}, "workload.output_std=1e+300")
    rejects({"workload": {"input_dist": "lognormal", "input_std": 1e300}}, "workload.input_std=1e+300")


# ---------------------------------------------------------------- keys with no effect


@pytest.mark.parametrize(
    "config, field",
    [
        ({"load": {"type": "poisson", "request_rate": 5.0, "concurrency": 8}}, "load.concurrency"),
        ({"load": {"type": "trace", "concurrency": 8}}, "load.concurrency"),
        ({"workload": {"source": "table", "path": "x.csv", "input_tokens": 10}}, "workload.input_tokens"),
        ({"workload": {"source": "mooncake", "path": "x.jsonl", "output_dist": "uniform"}}, "workload.output_dist"),
        ({"workload": {"range_ratio": 0.5}}, "workload.range_ratio"),
        ({"workload": {"input_dist": "normal", "input_std": 3.0, "range_ratio": 0.5}}, "workload.range_ratio"),
        ({"timing": {"type": "fixed", "base_ms": 1.0}}, "timing.base_ms"),
        ({"timing": {"type": "fixed", "per_kv_token_ns": 1.0}}, "timing.per_kv_token_ns"),
        ({"timing": {"prefill_ms": 10.0}}, "timing.prefill_ms"),
        ({"timing": {"decode_ms": 1.0}}, "timing.decode_ms"),
    ],
)
def test_keys_without_effect_are_rejected(config, field):
    """Issue 13 item 5: each of these was silently ignored."""
    with pytest.raises(ConfigError) as err:
        load_config(config)
    assert str(err.value).startswith(f"{field} has no effect here"), str(err.value)


def test_unused_keys_left_at_their_default_are_accepted():
    """The command line passes every key: only a value that differs from the default counts as set."""
    load_config({"load": {"type": "poisson", "request_rate": 5.0, "concurrency": 64}})
    load_config({"timing": {"type": "fixed", "base_ms": 5.0, "prefill_ms": 2.0}})
    load_config({"workload": {"input_dist": "uniform", "range_ratio": 0.5}})
    load_config({"workload": {"output_dist": "uniform", "range_ratio": 0.5}})


def test_prefix_tokens_without_prefix_caching_is_rejected():
    with pytest.raises(ConfigError, match="^workload.prefix_tokens has no effect here: .*prefix_caching=true"):
        load_config({"workload": {"prefix_tokens": 16}})
    load_config({"workload": {"prefix_tokens": 16}, "engine": {"aggregated": {"prefix_caching": True}}})


def test_percentiles_given_as_a_mapping_are_rejected():
    with pytest.raises(ConfigError, match="^metrics.percentiles must be a list"):
        load_config({"metrics": {"percentiles": {}}})


def test_terms_whose_float_sum_overflows_are_rejected():
    """Two finite terms of 1.6e308 ms sum to inf (math.fsum raised OverflowError there)."""
    config = {"workload": {"num_requests": 1, "input_tokens": 1, "output_tokens": 1},
              "timing": {"type": "fixed", "prefill_ms": 8e307, "decode_ms": 8e307}}
    rejects(config, "could last up to inf ms")


def test_a_table_profile_whose_passes_overflow_names_num_layers():
    """A per-layer profile times 1e17 layers gave TTFT 1 ns, exit 0 (the pass ns wrapped in the kernel)."""
    from tests.test_timing_models import RTXPRO_LLAMA

    if not os.path.isdir(RTXPRO_LLAMA):
        pytest.skip("profile data not present")
    timing = {"type": "table", "profile": RTXPRO_LLAMA, "num_layers": 10**17}
    rejects({"workload": {"num_requests": 4}, "timing": timing}, "timing.type=table, timing.num_layers=100000000000000000")
    result = simcore.run({"workload": {"num_requests": 4}, "timing": dict(timing, num_layers=32)})
    assert result.summary["completed"] == 4


def test_memory_fraction_without_auto_blocks_is_rejected():
    """timing.memory_fraction only sizes num_blocks=auto; with explicit blocks it did nothing."""
    aic = {"type": "aic", "model": "meta-llama/Meta-Llama-3.1-8B", "gpu": "h200_sxm", "memory_fraction": 0.8}
    with pytest.raises(ConfigError, match="^timing.memory_fraction has no effect here: .*num_blocks=auto"):
        load_config({"timing": aic})
