"""Validation at the boundary: every invalid value class names its field."""

from __future__ import annotations

import pyarrow as pa
import pytest

import simcore
from simcore.config import DEFAULTS, ConfigError, dotted_keys, load_config


@pytest.mark.parametrize(
    "config, field",
    [
        ({"timing": {"base_ms": float("nan")}}, "timing.base_ms"),
        ({"timing": {"per_kv_token_ns": float("inf")}}, "timing.per_kv_token_ns"),
        ({"detokenization": {"base_ms": -1.0}}, "detokenization.base_ms"),
        ({"load": {"think_time_ms": -0.5}}, "load.think_time_ms"),
        ({"tokenization": {"workers": 0}}, "tokenization.workers"),
        ({"detokenization": {"workers": 1.5}}, "detokenization.workers"),
        ({"detokenization": {"workers": True}}, "detokenization.workers"),
        ({"engine": {"aggregated": {"num_blocks": 0}}}, "engine.aggregated.num_blocks"),
        ({"engine": {"aggregated": {"foo": 1}}}, "engine.aggregated.foo"),
        ({"bar": 1}, "bar"),
        ({"load": {"type": "poisson"}}, "load.request_rate"),
        ({"load": {"type": "poisson", "request_rate": 0.0}}, "load.request_rate"),
        ({"load": {"type": "closed_loop", "request_rate": 5.0}}, "load.request_rate"),
        ({"load": {"speedup": 2.0}}, "load.speedup"),
        ({"workload": {"input_dist": "zipf"}}, "workload.input_dist"),
        ({"workload": {"output_dist": "normal"}}, "workload.output_std"),
        ({"workload": {"range_ratio": 1.5}}, "workload.range_ratio"),
        ({"workload": {"source": "table"}}, "workload.path"),
        ({"metrics": {"percentiles": [50, 101]}}, "metrics.percentiles"),
        ({"metrics": {"goodput": {"ttft_ms": 0}}}, "metrics.goodput.ttft_ms"),
        ({"max_time_ms": -1}, "max_time_ms"),
        ({"timing": {"type": "analytic"}}, "timing.type"),
        ({"output": {"passes": "yes"}}, "output.passes"),
        ({"engine": {"prefill": {"replicas": 2}}}, "engine.prefill.replicas"),
        ({"engine": {"kv_transfer": {"bandwidth_gb_per_second": 10.0, "bytes_per_token": 1.0}}}, "engine.kv_transfer.bandwidth_gb_per_second"),
        ({"engine": {"mode": "disaggregated", "aggregated": {"num_blocks": 10}}}, "engine.aggregated.num_blocks"),
        ({"engine": {"mode": "disaggregated", "kv_transfer": {"bandwidth_gb_per_second": 10.0}}}, "engine.kv_transfer.bandwidth_gb_per_second"),
        ({"engine": {"mode": "disaggregated", "decode": {"attention_dp": 0}}}, "engine.decode.attention_dp"),
        ({"engine": {"policy": "sglang", "aggregated": {"max_batched_tokens": 100}}}, "engine.aggregated.max_batched_tokens"),
        ({"engine": {"policy": "orca"}}, "engine.policy"),
    ],
)
def test_invalid_values_name_their_field(config, field):
    with pytest.raises(ConfigError) as err:
        load_config(config)
    assert str(err.value).startswith(field), str(err.value)
    assert "\n" not in str(err.value)


def test_every_default_is_valid_and_every_key_is_reachable():
    cfg = load_config({})
    assert cfg.resolved == DEFAULTS
    assert "engine.aggregated.context_length" in dotted_keys()
    assert "metrics.goodput.e2el_ms" in dotted_keys()


@pytest.mark.parametrize(
    "columns, message",
    [
        ({"input_tokens": [1, 2]}, "missing column(s) output_tokens"),
        ({"request_id": ["a", "b", "a"], "input_tokens": [1, 2, 3], "output_tokens": [1, 1, 1]}, "duplicate request_id 'a' at row 2 (first at row 0)"),
        ({"input_tokens": [1, 0], "output_tokens": [1, 1]}, "input_tokens must be >= 1 at row 1"),
        ({"input_tokens": [1, 2], "output_tokens": [1, 1], "send_ms": [5.0, 1.0]}, "send_ms must be non-decreasing"),
        ({"input_tokens": [1], "output_tokens": [1], "temperature": [3]}, "unknown column(s) temperature"),
    ],
)
def test_bad_request_tables_are_rejected_with_the_row(columns, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        simcore.run({"load": {"type": "trace"}}, requests=pa.table(columns))


def test_csv_errors_name_file_and_line(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("request_id,input_tokens,output_tokens\nx,10,2\ny,abc,2\n")
    with pytest.raises(ConfigError, match=r"trace.csv:3: input_tokens must be a number, got 'abc'"):
        simcore.run({"workload": {"source": "table", "path": str(path), "num_requests": None}})
    path.write_text("request_id,input_tokens,output_tokens\nx,10,2\ny,11,2\nx,12,2\n")
    with pytest.raises(ConfigError, match=r"duplicate request_id 'x' at line 4 \(first at line 2\)"):
        simcore.run({"workload": {"source": "table", "path": str(path), "num_requests": None}})


def test_trace_without_send_times_is_an_error():
    with pytest.raises(ConfigError, match="load.type=trace needs send times"):
        simcore.run({"load": {"type": "trace"}}, requests=pa.table({"input_tokens": [1], "output_tokens": [1]}))


@pytest.mark.parametrize("value, expected", [(1e6, 1_000_000), (64.0, 64)])
def test_a_count_key_takes_a_float_that_is_exactly_an_integer(value, expected):
    cfg = load_config({"workload": {"num_requests": value}, "load": {"concurrency": 64.0}})
    assert cfg.workload.num_requests == expected and isinstance(cfg.workload.num_requests, int)
    assert cfg.load.concurrency == 64 and isinstance(cfg.load.concurrency, int)


def test_the_largest_float_a_count_key_takes_is_2_to_the_53():
    assert load_config({"seed": 2.0**53}).seed == 2**53  # every integer up to 2**53 is a float64 exactly
    with pytest.raises(ConfigError, match=r"^seed must be an integer; a float above 2\*\*53"):
        load_config({"seed": 2.0**53 + 2})


@pytest.mark.parametrize("value, words", [
    (1.5, "must be an integer >= 1, got 1.5"),
    (0.0, "must be an integer >= 1, got 0"),
    (float("inf"), "must be an integer >= 1, got inf"),
    (float("nan"), "must be an integer >= 1, got nan"),
])
def test_a_count_key_refuses_other_floats(value, words):
    with pytest.raises(ConfigError, match="^workload.num_requests ") as err:
        load_config({"workload": {"num_requests": value}})
    assert words in str(err.value)
