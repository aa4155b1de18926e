"""The metric registry and the key-scope table are what the outputs and the validator read."""

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
