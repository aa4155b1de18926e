"""The scheduling-policy registry (simcore.scheduler.policies, issue 26).

A variant of a policy is one registry entry: nothing compares policy names,
so a variant keeps every feature of its base (no guard silently refuses it
one), the same timing backend and prefix-cache fast paths, and the same
results.  The variant is registered for one test only (monkeypatch).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from simcore.config import ConfigError, load_config, merge_config
from simcore.scheduler import nb as scheduler_nb
from simcore.scheduler import policies
from simcore.scheduler.kv_tree import kv_tree_applies
from simcore.timing import settings as timing_settings
from tests.reference.sim import POLICY_POOL_DEFAULTS
from tests.scenarios import mooncake_runs

ROOT = Path(__file__).resolve().parents[1]
VARIANT = "vllm_variant"


@pytest.fixture
def variant(monkeypatch):
    """``vllm_variant``: vLLM's entry under another name, registered for the test."""
    spec = dataclasses.replace(policies.SCHEDULING_POLICIES["vllm"], name=VARIANT)
    monkeypatch.setitem(policies.SCHEDULING_POLICIES, VARIANT, spec)
    return spec


def test_kernel_codes_are_the_kernels():
    assert dict(policies.KERNEL_CODES) == {
        "vllm": scheduler_nb.POLICY_VLLM, "sglang": scheduler_nb.POLICY_SGLANG, "trtllm": scheduler_nb.POLICY_TRTLLM,
    }
    for name, spec in policies.SCHEDULING_POLICIES.items():
        assert spec.name == name
        assert spec.aic_backend in timing_settings.AIC_BACKENDS
    assert policies.FEATURES == ("async_scheduling", "reserve_full_isl", "cache_generated_blocks", "kv_offload",
                                 "chunked_prefill", "vllm_graph_sizes", "expert_parallel")


def test_a_malformed_entry_is_refused():
    vllm = policies.SCHEDULING_POLICIES["vllm"]
    with pytest.raises(ValueError, match="unknown kernel"):
        dataclasses.replace(vllm, kernel="vllm2")
    with pytest.raises(ValueError, match="defaults must give"):
        dataclasses.replace(vllm, defaults={"block_size": 16})


def test_no_source_compares_scheduling_policy_names():
    """Only the registry names policies: no ``== "sglang"``-style comparison in simcore/ or runners/."""
    names = set(policies.KERNEL_CODES) | set(policies.SCHEDULING_POLICIES)
    found = []
    for path in sorted([*(ROOT / "simcore").rglob("*.py"), *(ROOT / "runners").rglob("*.py")]):
        if path.name.endswith("nb.py") or path == ROOT / "simcore" / "scheduler" / "policies.py":
            continue  # the kernels compare codes; the registry declares the names
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                for operand in (node.left, *node.comparators):
                    constants = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                    for constant in constants:
                        if isinstance(constant, ast.Constant) and constant.value in names:
                            found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    # aiconfigurator's backend names (timing.backend) are not policies: aic.py compares the backend
    allowed = {"simcore/timing/aic.py", "runners/calibrate.py"}  # calibrate: a measured file's format "vllm"
    assert [where for where in found if where.split(":")[0] not in allowed] == []


def _pool(**keys):
    return {"aggregated": {"prefix_caching": True, **keys}}


@pytest.mark.parametrize("pool", [
    {"async_scheduling": True},
    {"reserve_full_isl": True},
    {"cache_generated_blocks": True},
    {"kv_offload": {"num_blocks": 64, "bandwidth_gb_per_second": 10.0, "bytes_per_token": 1000.0}},
    {"queue_order": "priority"},
])
def test_a_variant_keeps_its_bases_pool_features(variant, pool):
    for name in ("vllm", VARIANT):
        cfg = load_config({"engine": {"policy": name, **_pool(**pool)}})
        assert cfg.engine.policy == name
    with pytest.raises(ConfigError, match=r"modelled for engine\.policy=vllm or vllm_variant only( \(.*\))?, got sglang"):
        load_config({"engine": {"policy": "sglang", **_pool(**pool)}})


def test_a_variant_keeps_its_bases_defaults_graphs_and_aic_backend(variant):
    base = load_config({"engine": {"policy": "vllm"}, "timing": {"cuda_graph_sizes": "vllm_default"}})
    cfg = load_config({"engine": {"policy": VARIANT}, "timing": {"cuda_graph_sizes": "vllm_default"}})
    assert cfg.engine.aggregated == base.engine.aggregated
    assert cfg.timing == base.timing
    raw = merge_config({"timing": {"type": "aic", "model": "m", "gpu": "g"}})["timing"]
    assert timing_settings.parse(raw, "timing", VARIANT).backend == "vllm"
    assert timing_settings.parse(raw, "timing", "trtllm").backend == "trtllm"
    assert kv_tree_applies(cfg.engine.aggregated, VARIANT)
    # the reference implementation reads the registry too
    assert POLICY_POOL_DEFAULTS["vllm"] == {k: v for k, v in variant.defaults.items() if v is not None}


@pytest.mark.parametrize("pool", [
    {"prefix_caching": True, "num_blocks": 1500},
    {"prefix_caching": True, "num_blocks": 1500, "cache_generated_blocks": True},
    {"async_scheduling": True, "reserve_full_isl": True, "num_blocks": 1500},
    {"prefix_caching": True, "num_blocks": 1500,
     "kv_offload": {"num_blocks": 400, "bandwidth_gb_per_second": 0.5, "bytes_per_token": 131072.0}},
])
def test_a_variant_runs_as_its_base(variant, pool):
    (base, base_prep), (run, prep) = mooncake_runs([("vllm", pool), (VARIANT, pool)])
    assert run.requests.equals(base.requests)
    assert run.tokens.equals(base.tokens) and run.passes.equals(base.passes)
    assert (prep.kv_tree, prep.radix_tree) == (base_prep.kv_tree, base_prep.radix_tree)
    assert prep.offload_shape == base_prep.offload_shape
    for field in prep.ranks._fields:
        assert (getattr(prep.ranks, field) == getattr(base_prep.ranks, field)).all(), field
