"""The metric registry and the key-scope table are what the outputs and the validator read."""

import numpy as np
import pytest

import simcore
from runners.report import format_summary
from simcore.config import DEFAULTS, KEY_SCOPES, ConfigError
from simcore.metrics.registry import DISTRIBUTIONS, STATISTICS, percentile_key, summary_key
from simcore.schema import REQUESTS_SCHEMA


def test_each_per_request_distribution_is_a_request_field_with_its_unit_and_formula():
    for metric in DISTRIBUTIONS:
        if metric.column is None:
            continue
        field = REQUESTS_SCHEMA.field(metric.column)
        assert field.metadata[b"unit"].decode() == metric.unit
        assert field.metadata[b"description"].decode() == metric.formula
        assert set(metric.depends) <= set(REQUESTS_SCHEMA.names) | {"received_ms"}


def test_the_summary_holds_every_statistic_of_every_distribution_and_the_report_shows_each():
    result = simcore.run({"workload": {"num_requests": 8}, "metrics": {"percentiles": [50, 99.9]}})
    for metric in DISTRIBUTIONS:
        for stat in (*STATISTICS, percentile_key(50), percentile_key(99.9)):
            assert summary_key(stat, metric) in result.summary
    report = format_summary(result.summary, "out")
    assert all(f"  {metric.label} " in report for metric in DISTRIBUTIONS)


def test_every_scoped_key_exists_and_is_rejected_where_it_has_no_effect():
    for scope in KEY_SCOPES:
        tree = DEFAULTS
        for part in scope.section.split("."):
            tree = tree[part]
        assert set(scope.keys) <= set(tree), scope
    with pytest.raises(ConfigError, match=r"^engine\.decode\.replicas is only used by engine\.mode=disaggregated"):
        simcore.load_config({"engine": {"decode": {"replicas": 2}}})


def test_calibration_metrics_are_the_registrys_and_a_measured_run_gives_each():
    import numpy as np

    from runners.calibrate import METRICS, _latencies

    assert METRICS == tuple((m.column, m.calibration) for m in DISTRIBUTIONS if m.column and m.calibration)
    assert [column for column, _ in METRICS] == ["ttft_ms", "tpot_ms", "e2el_ms"]
    measured = _latencies(np.array([1.0, 2.0]), np.array([5.0, 2.0]), np.array([3, 1]))
    assert {column for column, _ in METRICS} <= set(measured)


def test_goodput_keys_and_capacity_slo_keys_come_from_the_registry():
    from runners.capacity_search import parse_slo
    from simcore.metrics.registry import slo_metrics

    assert [m.column for m in slo_metrics()] == ["ttft_ms", "tpot_ms", "e2el_ms"]
    assert set(DEFAULTS["metrics"]["goodput"]) == {m.column for m in slo_metrics()}
    for metric in DISTRIBUTIONS:
        assert parse_slo({summary_key("p99", metric): 1.0}, 1.0).limits == {summary_key("p99", metric): 1.0}
    with pytest.raises(ConfigError, match=r"known: <mean\|median\|max\|p<P>>_<ttft\|tpot\|itl\|e2el>_ms, "):
        parse_slo({"p99_foo_ms": 1.0}, 1.0)


# A per-request metric with no vLLM or aiperf name, registered before any stage
# reads the registry (it imports nothing of the simulator, so it loads first):
# what a contributor's one Distribution in registry.py does.
_EXTRA_METRIC_RUN = r'''
import importlib.util, runpy, sys
spec = importlib.util.spec_from_file_location("simcore.metrics.registry", sys.argv[1])
registry = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = registry
spec.loader.exec_module(registry)
extra = registry.Distribution(
    name="e2el_per_token", label="E2EL / token", unit="ms", formula="e2el / generated tokens, completed requests",
    depends=("e2el_ms", "generated_tokens"), column="e2el_per_token_ms",
    compute=lambda cols: cols.e2el_ms / cols.run.generated, slo=True,
)
registry.DISTRIBUTIONS = (*registry.DISTRIBUTIONS, extra)
registry.BY_NAME[extra.name] = extra
from runners.capacity_search import parse_slo
parse_slo({"p99_e2el_per_token_ms": 5.0}, 1.0)  # a capacity SLO key
sys.argv = ["replaysim", *sys.argv[2:]]
runpy.run_module("runners.cli", run_name="__main__")
'''


def test_a_metric_without_vllm_or_aiperf_names_reaches_every_output_and_the_exports_skip_it(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    import pyarrow.parquet as pq

    root = Path(__file__).resolve().parents[1]
    script = tmp_path / "extra_metric.py"
    script.write_text(_EXTRA_METRIC_RUN)
    done = subprocess.run(
        [sys.executable, str(script), str(root / "simcore" / "metrics" / "registry.py"),
         f"hydra.run.dir={tmp_path / 'h'}", f"output.dir={tmp_path / 'out'}", "workload.num_requests=12",
         "workload.input_tokens=32", "workload.output_tokens=4", "metrics.goodput.e2el_per_token_ms=1000",
         "export.vllm_bench=true", "export.aiperf=true"],
        cwd=root, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    requests = pq.read_table(out / "requests.parquet")
    e2el = requests.column("e2el_ms").to_numpy()
    per_token = requests.column("e2el_per_token_ms").to_numpy()
    assert np.array_equal(per_token, e2el / requests.column("generated_tokens").to_numpy())
    for stat in STATISTICS:
        assert summary[f"{stat}_e2el_per_token_ms"] is not None
    assert summary["mean_e2el_per_token_ms"] == pytest.approx(float(np.mean(per_token)), rel=1e-12)
    assert summary["request_goodput"] == summary["request_throughput"]  # every request meets 1 s per token
    assert "E2EL / token" in done.stdout  # the terminal table
    bench_text = (out / "vllm_bench.json").read_text()
    bench = json.loads(bench_text)
    assert "None" not in bench_text and "e2el_per_token" not in bench_text
    assert bench["mean_e2el_ms"] == summary["mean_e2el_ms"] and bench["p99_ttft_ms"] == summary["p99_ttft_ms"]
    aiperf = json.loads((out / "profile_export_aiperf.json").read_text())
    assert "request_latency" in aiperf and "e2el_per_token" not in json.dumps(aiperf)
    assert aiperf["request_latency"]["avg"] == pytest.approx(float(np.mean(e2el)), rel=1e-12)
    assert (out / "profile_export_aiperf.csv").read_text().startswith("Metric,avg,min,max,p1,")
