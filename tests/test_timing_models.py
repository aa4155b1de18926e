"""Table-driven timing models: the profile loader and kernel (timing.type=table) and the
aiconfigurator-core tables (timing.type=aic, skipped without the optional extra)."""

from __future__ import annotations

import csv
import importlib.util
import os
import sys
import tomllib

import numpy as np
import pytest

import simcore
from simcore.config import ConfigError, load_config
from simcore.timing import nb
from simcore.timing.api import timing_arrays
from simcore.timing.profile import load_profile, profile_arrays

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.normpath(os.path.join(ROOT, "..", "shared", "data", "llmservingsim-vllm-bench"))
RTXPRO_LLAMA = os.path.join(DATA, "profiler", "RTXPRO6000", "meta-llama", "Llama-3.1-8B", "bf16", "tp1")
needs_profile = pytest.mark.skipif(not os.path.isdir(RTXPRO_LLAMA), reason="the shared profiles are not beside this checkout")
HAS_AIC = importlib.util.find_spec("aiconfigurator_core") is not None

# ------------------------------------------------------------------ synthetic profile


def _attn(pc, kvp, nd, kvd):
    """Multilinear in (pc, kvp, nd, kvd): multilinear interpolation reproduces it exactly."""
    return 1 + 0.1 * pc + 0.01 * kvp + 2 * nd + 0.05 * nd * kvd


def write_profile(path, *, dense=None, seq=None, attention=None):
    os.makedirs(path, exist_ok=True)
    dense = dense or [
        ("layer", "tokens", "time_us"),
        ("embedding", 1, 1.0), ("embedding", 101, 2.0),
        ("layernorm", 1, 0.5), ("layernorm", 101, 1.5),
        ("qkv_proj", 1, 10.0), ("qkv_proj", 101, 30.0),
        ("final_layernorm", 1, 0.2), ("final_layernorm", 101, 0.4),
    ]
    seq = seq or [
        ("layer", "sequences", "time_us"),
        ("lm_head", 1, 100.0), ("lm_head", 11, 120.0),
        ("sampler", 1, 5.0), ("sampler", 11, 15.0),
    ]
    if attention is None:
        attention = [("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us")]
        for pc in (0, 16, 32):
            for kvp in ((0,) if pc == 0 else (0, 64)):
                for nd in (0, 1, 2):
                    for kvd in ((0,) if nd == 0 else (16, 48)):
                        if pc == 0 and nd == 0:
                            continue
                        attention.append((pc, kvp, nd, kvd, _attn(pc, kvp, nd, kvd)))
    for name, rows in (("dense.csv", dense), ("per_sequence.csv", seq), ("attention.csv", attention)):
        with open(os.path.join(path, name), "w", newline="") as handle:
            csv.writer(handle).writerows(rows)
    return str(path)


def pass_ms(params, table, *summary):
    return nb.rank_time_ms_nb(nb.TIMING_TABLE, params, table, *summary)


def test_table_interpolation_matches_hand_computed_values(tmp_path):
    params, table = profile_arrays(load_profile(write_profile(tmp_path / "p"), num_layers=4))
    # One prefill entry (24 new over 32 cached) with two decodes of 32 cached tokens each.
    # T = 26 tokens: layernorm 0.5 + 25/100 = 0.75 (twice per layer), qkv 10 + 0.25 * 20 = 15;
    # once per pass: embedding 1.25 + final_layernorm 0.25.  S = 3: lm_head 104 + sampler 7.
    # Attention at (24, 32, 2, 32): 1 + 2.4 + 0.32 + 4 + 3.2 = 10.92.
    expected = (4 * (2 * 0.75 + 15 + 10.92) + (1.25 + 0.25) + (104 + 7)) / 1000
    assert pass_ms(params, table, 1, 24, 56, 2, 66) == pytest.approx(expected, rel=1e-12)
    # Two prefill entries of mean 24 new over 32 cached, no decodes: the second adds a
    # prefill-only query at the same mean shape.  T = 48, S = 2.
    attention = 2 * (1 + 2.4 + 0.32)
    expected = (4 * (2 * 0.97 + 19.4 + attention) + (1.47 + 0.294) + (102 + 6)) / 1000
    assert pass_ms(params, table, 2, 48, 112, 0, 0) == pytest.approx(expected, rel=1e-12)
    # One decode of 5 cached tokens: kv_decode is clamped up to the first knot (16).
    # T = 1, S = 1; attention 1 + 2 + 0.8.
    expected = (4 * (2 * 0.5 + 10 + 3.8) + (1.0 + 0.2) + 105) / 1000
    assert pass_ms(params, table, 0, 0, 0, 1, 6) == pytest.approx(expected, rel=1e-12)
    # Beyond the last dense knot the last segment is extended: T = 201 tokens (one prefill, no
    # history) gives layernorm 2.5, qkv 50, embedding 3, final_layernorm 0.6; S = 1.
    attention = 1 + 0.1 * 201  # pc = 201 extends the [16, 32] segment of the pc axis
    expected = (4 * (2 * 2.5 + 50 + attention) + (3 + 0.6) + 105) / 1000
    assert pass_ms(params, table, 1, 201, 201, 0, 0) == pytest.approx(expected, rel=1e-12)
    assert pass_ms(params, table, 0, 0, 0, 0, 0) == 0.0


def test_attention_skew_adds_alpha_of_the_gap_to_the_longest_context(tmp_path):
    """timing.attention_skew_alpha: attention + alpha x (A at the longest decode - A at the mean)."""
    from simcore.timing.allreduce import pass_terms_block

    params, table = profile_arrays(load_profile(write_profile(tmp_path / "p"), num_layers=4))
    cfg = load_config({"timing": {"type": "linear", "attention_skew_alpha": 0.25}}).timing
    skewed = np.concatenate([params, pass_terms_block(cfg, table.shape[0])[0]])
    # One prefill entry (24 over 32) and two decodes of 20 and 44 cached tokens (mean 32,
    # longest 44): the pass of the first hand-worked case plus 4 layers x 0.25 x
    # (A(24, 32, 2, 44) - A(24, 32, 2, 32)) = 4 x 0.25 x 0.05 x 2 x 12 = 1.2 us.
    plain = pass_ms(params, table, 1, 24, 56, 2, 66)
    assert pass_ms(skewed, table, 1, 24, 56, 2, 66, 45) == pytest.approx(plain + 1.2e-3, rel=1e-12)
    # Without the longest context, with one decode or equal contexts: nothing is added.
    assert pass_ms(skewed, table, 1, 24, 56, 2, 66) == plain
    assert pass_ms(skewed, table, 1, 24, 56, 2, 66, 33) == plain
    assert pass_ms(skewed, table, 0, 0, 0, 1, 6, 6) == pass_ms(params, table, 0, 0, 0, 1, 6)
    # linear: alpha x per_kv_token_ns x (decodes x longest - their sum): 0.5 x 100 x (3 x 40 - 90) ns.
    cfg = load_config({"timing": {"type": "linear", "base_ms": 1.0, "per_prefill_token_us": 0.0, "per_decode_seq_us": 0.0,
                                  "per_kv_token_ns": 100.0, "attention_skew_alpha": 0.5}}).timing
    model, lin, empty = timing_arrays(cfg)
    assert nb.rank_time_ms_nb(model, lin, empty, 0, 0, 0, 3, 90, 40) == pytest.approx(1.0 + 9e-3 + 1.5e-3, rel=1e-12)


@pytest.mark.parametrize(
    "timing",
    [{"type": "fixed", "attention_skew_alpha": 0.1}, {"type": "linear", "attention_skew_alpha": -0.1},
     {"type": "linear", "attention_skew_alpha": "x"}],
)
def test_bad_attention_skew_alpha_names_the_key(timing):
    with pytest.raises(ConfigError, match=r"timing\.attention_skew_alpha"):
        load_config({"timing": timing})


def test_table_extension_never_falls_beyond_the_last_knot(tmp_path):
    """A 2-knot end segment that slopes down holds the last knot's value past it; rising ones extend."""
    dense = [
        ("layer", "tokens", "time_us"),
        ("qkv_proj", 1, 10.0), ("qkv_proj", 51, 30.0), ("qkv_proj", 101, 20.0),  # end slope -0.2 us/token
        ("embedding", 1, 1.0), ("embedding", 101, 2.0),  # rising: extended
    ]
    seq = [("layer", "sequences", "time_us"), ("lm_head", 1, 100.0), ("lm_head", 11, 90.0)]  # falling
    attention = [("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us")]
    # prefill-only cells: (pc, kvp) on [16, 32] x [0, 64]; the pc segment falls at kvp = 64
    for pc, kvp, us in ((16, 0, 4.0), (32, 0, 6.0), (16, 64, 9.0), (32, 64, 5.0)):
        attention.append((pc, kvp, 0, 0, us))
    params, table = profile_arrays(load_profile(write_profile(tmp_path / "p", dense=dense, seq=seq, attention=attention), num_layers=2))
    # Inside the knots nothing changes: T = 76 on the falling segment, 30 - 0.5 * 10 = 25.
    assert nb.interp1_rising_nb(table, int(params[nb.P_DENSE_X]), int(params[nb.P_DENSE_LAYER]), int(params[nb.P_DENSE_N]), 76.0) == 25.0
    # One prefill of 201 tokens, no history: T = 201, S = 1.
    # qkv: the [51, 101] segment falls, so 20 (the plain extension gives 20 - 0.2 * 100 = 0).
    # embedding rises: 1 + 200 / 100 = 3.  lm_head at S = 1 is a knot: 100.
    # Attention at (201, 0): the kvp axis is inside (t = 0); the pc segment 4 -> 6 rises, so
    # 4 + 2 / 16 * (201 - 16) = 27.125.
    expected = (2 * (20 + 27.125) + 3 + 100) / 1000
    assert pass_ms(params, table, 1, 201, 201, 0, 0) == pytest.approx(expected, rel=1e-12)
    # Attention at (200, 64): along pc at kvp = 64 the segment 9 -> 5 falls: 5.
    assert nb.table_attention_us_nb(params, table, 200.0, 64.0, 0, 0.0) == 5.0
    # At (200, 32) the kv_prefill axis (inside, t = 1/2) is reduced first: 6.5 at pc = 16 and
    # 5.5 at pc = 32, a falling pc segment: 5.5.
    assert nb.table_attention_us_nb(params, table, 200.0, 32.0, 0, 0.0) == 5.5
    # Beyond both axes, (48, 128): kvp first, 4 -> 9 rises to 14 at pc = 16 and 6 -> 5 falls
    # to 5 at pc = 32; then pc, 14 -> 5 falls: 5.  (Plain bilinear extension: weights 1, -2, -2, 4
    # on 4, 6, 9, 5 give -6.)
    assert nb.table_attention_us_nb(params, table, 48.0, 128.0, 0, 0.0) == 5.0
    # Falling per-sequence segment: S = 21 sequences hold lm_head at 90 (plain: 80).
    assert nb.interp1_rising_nb(table, int(params[nb.P_SEQ_X]), int(params[nb.P_SEQ_Y]), int(params[nb.P_SEQ_N]), 21.0) == 90.0


@needs_profile
def test_mooncake_sample_beyond_the_profile_grid_gives_positive_pass_times():
    """Mooncake prompts (~14k tokens, 8k chunks over 49k cached) leave the grid on every axis."""
    cfg = {
        "timing": {"type": "table", "profile": RTXPRO_LLAMA, "num_layers": 32},
        "workload": {"source": "mooncake", "path": os.path.join(ROOT, "runners", "samples", "mooncake_conversation_300.jsonl"), "num_requests": 100},
        "output": {"passes": True},
    }
    result = simcore.run(cfg)
    passes = result.passes
    assert passes.num_rows > 0
    assert (passes["rank_time_ms"].to_numpy() > 0).all()
    assert (passes["prefill_tokens"].to_numpy() > 2048).any()  # beyond the last dense / chunk knot


@needs_profile
def test_table_grid_points_reproduce_the_csv_exactly():
    profile = load_profile(RTXPRO_LLAMA, num_layers=32)
    params, table = profile_arrays(profile)
    rows = np.loadtxt(os.path.join(RTXPRO_LLAMA, "attention.csv"), delimiter=",", skiprows=1)
    for pc, kvp, nd, kvd, us in rows:
        got = nb.table_attention_us_nb(params, table, pc, kvp, int(nd), kvd)
        assert got == us, (pc, kvp, nd, kvd)
    # Dense and per-sequence sums on their knots are the CSV values, weighted per op.
    dense = {}
    with open(os.path.join(RTXPRO_LLAMA, "dense.csv"), newline="") as handle:
        for layer, tokens, us in csv.reader(handle):
            if layer != "layer":
                dense.setdefault(int(tokens), {})[layer] = float(us)
    for tokens in (1, 7, 64, 1024, 2048):
        ops = dense[tokens]
        per_layer = sum(v * (2 if k == "layernorm" else 1) for k, v in ops.items() if k not in ("embedding", "final_layernorm"))
        i = int(np.searchsorted(profile.dense_x, tokens))
        assert profile.dense_layer[i] == pytest.approx(per_layer, rel=1e-14)
        assert profile.dense_pass[i] == pytest.approx(ops["embedding"] + ops["final_layernorm"], rel=1e-14)


@needs_profile
def test_real_rtxpro6000_profile_loads_and_drives_the_engine():
    import simcore

    profile = load_profile(RTXPRO_LLAMA, num_layers=32)
    assert profile.attention.shape == tuple(a.shape[0] for a in profile.axes) == (20, 20, 10, 20)
    assert np.isfinite(profile.attention).all() and (profile.attention >= 0).all()
    assert int(profile.measured.sum()) == 19364
    cfg = {
        "timing": {"type": "table", "profile": RTXPRO_LLAMA, "num_layers": 32},
        "workload": {"num_requests": 40, "input_tokens": 700, "output_tokens": 20},
        "load": {"concurrency": 16},
        "engine": {"aggregated": {"max_batched_tokens": 2048, "max_sequences": 128}},
        "output": {"passes": True},
    }
    result = simcore.run(cfg)
    passes = result.passes
    summary = np.stack(
        [passes[c].to_numpy() for c in ("num_prefill", "prefill_tokens", "prefill_kv_tokens", "num_decode", "decode_kv_tokens")],
        axis=1,
    ).astype(np.int64)
    model, params, table = timing_arrays(load_config(cfg).timing)
    want = np.zeros(summary.shape[0])
    nb.pass_times_nb(model, params, table, np.ascontiguousarray(summary), want)
    assert np.array_equal(passes["rank_time_ms"].to_numpy(), want)
    # An 8B model on this GPU: a full 2048-token prefill takes tens of ms, a 16-decode step ~20 ms.
    assert 40 < pass_ms(params, table, 1, 2048, 2048, 0, 0) < 150
    assert 10 < pass_ms(params, table, 0, 0, 0, 16, 16 * 1001) < 40


@pytest.mark.parametrize(
    "file, rows, where",
    [
        ("dense.csv", [("layer", "tokens", "time_us"), ("qkv_proj", 1, 1.0), ("qkv_proj", 2, "fast")], "dense.csv:3"),
        ("dense.csv", [("layer", "tokens", "time_us"), ("qkv_proj", 0, 1.0)], "dense.csv:2"),
        ("dense.csv", [("layer", "tokens", "time_us"), ("qkv_proj", 4, 1.0), ("o_proj", 4, 1.0), ("qkv_proj", 4, 2.0)], "dense.csv:4"),
        ("dense.csv", [("layer", "tokens", "time_us"), ("qkv_proj", 4, -1.0)], "dense.csv:2"),
        ("dense.csv", [("layer", "tokens", "us")], "dense.csv:1"),
        ("per_sequence.csv", [("layer", "sequences", "time_us"), ("lm_head", 1, 1.0, 7)], "per_sequence.csv:2"),
        ("per_sequence.csv", [("layer", "sequences", "time_us"), ("lm_head", 1.5, 1.0)], "per_sequence.csv:2"),
        ("attention.csv", [("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"), (16, 0, 0, 0, 1.0), (0, 0, 0, 0, 1.0)], "attention.csv:3"),
        ("attention.csv", [("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"), (16, 0, 0, 0, "nan")], "attention.csv:2"),
        ("attention.csv", [("prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"), (0, 16, 1, 16, 1.0)], "attention.csv:2"),
    ],
)
def test_bad_profile_rows_are_named_by_file_and_line(tmp_path, file, rows, where):
    path = write_profile(tmp_path / "p", **{{"dense.csv": "dense", "per_sequence.csv": "seq", "attention.csv": "attention"}[file]: rows})
    with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
        load_profile(path, num_layers=2)


@needs_profile
def test_timing_config_combinations(tmp_path):
    with pytest.raises(ConfigError, match="timing.model is only used by timing.type=aic"):
        load_config({"timing": {"model": "meta-llama/Meta-Llama-3.1-8B"}})
    with pytest.raises(ConfigError, match="timing.profile is only used by timing.type=table"):
        load_config({"timing": {"type": "aic", "model": "m", "gpu": "g", "profile": str(tmp_path)}})
    with pytest.raises(ConfigError, match="timing.gpu must be set"):
        load_config({"timing": {"type": "aic", "model": "meta-llama/Meta-Llama-3.1-8B"}})
    with pytest.raises(ConfigError, match="timing.backend must be one of"):
        load_config({"timing": {"type": "aic", "model": "m", "gpu": "g", "backend": "tgi"}})
    with pytest.raises(ConfigError, match="timing.memory_fraction must be in"):
        load_config({"timing": {"type": "aic", "model": "m", "gpu": "g", "memory_fraction": 1.5}})
    with pytest.raises(ConfigError, match="num_blocks=auto .* needs timing.type=aic or roofline"):
        load_config({"engine": {"aggregated": {"num_blocks": "auto"}}})
    with pytest.raises(ConfigError, match="timing.profile must be set"):
        load_config({"timing": {"type": "table"}})
    with pytest.raises(ConfigError, match="timing.num_layers must be set"):
        load_config({"timing": {"type": "table", "profile": RTXPRO_LLAMA}})
    cfg = load_config({"timing": {"type": "aic", "model": "m", "gpu": "g"}, "engine": {"policy": "sglang"}})
    assert (cfg.timing.backend, cfg.timing.tp, cfg.timing.memory_fraction) == ("sglang", 1, 0.9)
    path = write_profile(tmp_path / "p")
    with open(os.path.join(path, "meta.yaml"), "w") as handle:
        handle.write("num_layers: 6\n")
    assert load_config({"timing": {"type": "table", "profile": path}}).timing.num_layers == 6


def test_aic_extra_is_optional_and_named_when_missing(monkeypatch):
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as handle:
        extras = tomllib.load(handle)["project"]["optional-dependencies"]
    assert not any("aiconfigurator" in dep for dep in extras["dev"])
    assert extras["aic"] == ["aiconfigurator-core>=0.12,<0.13"]
    from simcore.timing import aic

    monkeypatch.setitem(sys.modules, "aiconfigurator_core", None)  # import fails as if absent
    with pytest.raises(ConfigError, match=r"replaysim\[aic\]"):
        aic.package_version()


@pytest.mark.skipif(not HAS_AIC, reason="aiconfigurator-core (the replaysim[aic] extra) is not installed")
def test_aic_tables_match_direct_calls_on_a_small_config():
    """Builds (or loads from the disk cache) the tables of a small configuration, then checks
    them against direct estimate_forward_pass_time_ms calls on random passes (< 1%)."""
    import simcore
    from simcore.timing import aic

    cfg = {
        "timing": {"type": "aic", "model": "meta-llama/Meta-Llama-3.1-8B", "gpu": "h200_sxm"},
        "engine": {"aggregated": {"max_batched_tokens": 480, "max_sequences": 32, "context_length": 4000, "num_blocks": "auto"}},
        "workload": {"num_requests": 64, "input_tokens": 600, "output_tokens": 16},
        "load": {"concurrency": 24},
    }
    timing = load_config(cfg).timing
    assert (timing.pass_tokens_limit, timing.pass_sequences_limit, timing.context_limit) == (512, 32, 4096)
    spec = aic.AicSpec.from_config(timing)
    params, table, info = aic.load_or_build(spec)
    assert info["max_rel_error"] < aic.MAX_REL_ERROR
    stats = aic.self_check(spec, params, table, count=150)  # fresh passes, raises above 1%
    assert stats["max_rel_error"] < 0.01
    result = simcore.run(cfg)
    assert result.summary["completed"] == 64
    assert 0 < result.summary["mean_tpot_ms"] < 50


@pytest.mark.skipif(not HAS_AIC, reason="aiconfigurator-core (the replaysim[aic] extra) is not installed")
def test_an_unknown_aic_gpu_is_refused_with_the_valid_names():
    from simcore.timing import aic

    names = aic.system_names()
    assert "h200_sxm" in names and "h100" not in names
    config = {"timing": {"type": "aic", "model": "meta-llama/Meta-Llama-3.1-8B", "gpu": "h100"},
              "workload": {"num_requests": 2}}
    with pytest.raises(ConfigError, match=r"timing\.gpu=h100 is not a system of aiconfigurator-core .*valid names: a100") as info:
        simcore.run(config)
    assert ", ".join(names) in str(info.value)


def test_third_party_log_records_go_to_the_log_file_only(tmp_path):
    import io
    import logging

    from runners.cli import third_party_logs_to_file

    root = logging.getLogger()
    console = logging.StreamHandler(io.StringIO())
    log_file = logging.FileHandler(tmp_path / "replaysim.log")
    saved = (root.handlers[:], root.level)
    library = logging.getLogger("aiconfigurator_core")
    saved_library = (library.handlers[:], library.propagate)
    try:
        root.handlers = [console, log_file]
        root.setLevel(logging.INFO)
        third_party_logs_to_file()
        logging.getLogger("aiconfigurator_core.sdk.perf_database").warning("Loading low-fidelity fallback rows")
        logging.getLogger("replaysim.test").info("our own line")
        log_file.flush()
    finally:
        root.handlers, _ = saved
        root.setLevel(saved[1])
        library.handlers, library.propagate = saved_library
        log_file.close()
    assert "low-fidelity" in (tmp_path / "replaysim.log").read_text()
    assert "low-fidelity" not in console.stream.getvalue() and "our own line" in console.stream.getvalue()
