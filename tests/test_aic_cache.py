"""The aic disk cache: an entry is used only if its checksum, layout and a few direct calls agree.

Skipped without aiconfigurator-core (the replaysim[aic] extra).
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from simcore.config import load_config

pytestmark = pytest.mark.skipif(importlib.util.find_spec("aiconfigurator_core") is None,
                                reason="aiconfigurator-core (the replaysim[aic] extra) is not installed")

CONFIG = {
    "timing": {"type": "aic", "model": "meta-llama/Meta-Llama-3.1-8B", "gpu": "h200_sxm"},
    "engine": {"aggregated": {"max_batched_tokens": 480, "max_sequences": 32, "context_length": 4000}},
}


@pytest.fixture()
def entry(tmp_path, monkeypatch):
    """``(spec, path, params, table, info)``: a sound entry copied into a private cache directory."""
    from simcore.timing import aic

    spec = aic.AicSpec.from_config(load_config(CONFIG).timing)
    params, table, info = aic.load_or_build(spec)  # the user's cache: built once
    key = aic.cache_key(spec, aic.package_version(spec.gpu))
    monkeypatch.setenv("REPLAYSIM_CACHE_DIR", str(tmp_path))
    path = tmp_path / "aic" / f"{key}.npz"
    path.parent.mkdir()
    save(path, params, table, info)
    monkeypatch.setattr(aic, "_MEMO", {})
    return spec, path, params, table, info


def save(path, params, table, info, digest=None):
    from simcore.timing import aic

    digest = aic.tables_digest(params, table) if digest is None else digest
    np.savez(path, params=params, table=table, info=np.array(json.dumps(info)), sha256=np.array(digest))


def test_a_sound_entry_is_loaded(entry):
    from simcore.timing import aic

    spec, path, params, table, _ = entry
    loaded = aic.load_entry(str(path), spec)
    assert loaded is not None
    assert np.array_equal(loaded[0], params) and np.array_equal(loaded[1], table)


@pytest.mark.parametrize("damage", ["scaled, checksum kept", "scaled, checksum updated", "empty table",
                                    "offsets x 1000", "params truncated", "no checksum"])
def test_a_damaged_entry_is_refused(entry, damage):
    from simcore.timing import aic

    spec, path, params, table, info = entry
    if damage == "scaled, checksum kept":
        save(path, params, table * 0.5, info, digest=aic.tables_digest(params, table))
    elif damage == "scaled, checksum updated":
        save(path, params, table * 0.5, info)  # only the direct calls can tell
    elif damage == "empty table":
        save(path, params, table[:0], info)
    elif damage == "offsets x 1000":
        save(path, params * 1000, table, info)
    elif damage == "params truncated":
        save(path, params[:-1], table, info)
    else:
        np.savez(path, params=params, table=table, info=np.array(json.dumps(info)))
    assert aic.load_entry(str(path), spec) is None


def test_a_damaged_entry_is_rebuilt_and_replaced(entry):
    from simcore.timing import aic

    spec, path, params, table, info = entry
    save(path, params, table * 0.5, info)
    rebuilt, rebuilt_table, _ = aic.load_or_build(spec)
    assert np.array_equal(rebuilt, params)
    np.testing.assert_allclose(rebuilt_table, table, rtol=1e-12)
    assert aic.load_entry(str(path), spec) is not None
