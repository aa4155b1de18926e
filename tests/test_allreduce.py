"""Pass terms of the timing models: the TP all-reduce (timing.allreduce: the ring formula
and measured curves), time scales and the per-pass overhead, hand-worked, and their
configuration errors.  The engine with the ring term is compared with the
reference implementation in tests/test_against_reference.py."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from simcore.config import ConfigError, load_config
from simcore.timing import nb
from simcore.timing.api import timing_arrays
from tests.test_timing_models import write_profile


def pass_time(timing: dict, *summary) -> float:
    model, params, table = timing_arrays(load_config({"timing": timing}).timing)
    return nb.rank_time_ms_nb(model, params, table, *summary)


LINEAR_1MS = {"type": "linear", "base_ms": 1.0, "per_prefill_token_us": 0.0, "per_decode_seq_us": 0.0, "per_kv_token_ns": 0.0}


def test_ring_formula_hand_worked():
    # 1000 prefill tokens x 4096 x 2 bytes = 8,192,000 bytes per all-reduce; with n = 2
    # the ring moves 2 (n - 1) / n = 1 x the bytes: 8,192,000 / 16 GB/s = 512 us, + 20 us
    # latency = 532 us; two per layer, one layer: 1064 us.  The pass: 1 ms + 1.064 ms.
    timing = dict(LINEAR_1MS, tp=2, num_layers=1, hidden_size=4096, allreduce={"latency_us": 20.0, "bandwidth_gb_per_second": 16.0})
    assert pass_time(timing, 1, 1000, 1000, 0, 0) == pytest.approx(2.064, rel=1e-15)
    # n = 4: 2 x 3 / 4 = 1.5 x the bytes; 3 decodes x 4096 x 2 = 24,576 bytes:
    # 20 + 1.5 x 24,576 / 16,000 = 22.304 us; 64 layers x 2 = 128 all-reduces: 2.854912 ms.
    timing.update(tp=4, num_layers=64)
    assert pass_time(timing, 0, 0, 0, 3, 30) == pytest.approx(1.0 + 2.854912, rel=1e-15)


def test_no_allreduce_leaves_pass_times_unchanged():
    base = pass_time(dict(LINEAR_1MS, per_prefill_token_us=33.3), 2, 77, 90, 5, 400)
    assert base == 1.0 + 33.3 * 77 / 1000
    # the empty batch still takes 0
    timing = dict(LINEAR_1MS, tp=2, num_layers=1, hidden_size=8, allreduce={"bandwidth_gb_per_second": 1.0})
    assert pass_time(timing, 0, 0, 0, 0, 0) == 0.0


def test_scales_by_pass_kind_and_overhead_hand_worked():
    timing = dict(LINEAR_1MS, per_decode_seq_us=1000.0, prefill_scale=2.0, decode_scale=0.5, pass_overhead_us=100.0)
    # a pass with a prefill entry (and one decode): (1 + 1) ms x 2 + 0.1 ms
    assert pass_time(timing, 1, 10, 10, 1, 5) == 4.1
    # decode-only, two decodes: (1 + 2) ms x 0.5 + 0.1 ms
    assert pass_time(timing, 0, 0, 0, 2, 10) == 1.6
    # the scale applies to the model time only, not to the all-reduce: 1 ms x 2 + 1.064 ms
    timing = dict(LINEAR_1MS, prefill_scale=2.0, tp=2, num_layers=1, hidden_size=4096,
                  allreduce={"latency_us": 20.0, "bandwidth_gb_per_second": 16.0})
    assert pass_time(timing, 1, 1000, 1000, 0, 0) == pytest.approx(3.064, rel=1e-15)


def write_nccl(path, rows):
    lines = ["# nThread 1 nGpus 2", "#       size  count  type  redop  root  time  algbw  busbw  #wrong  time  algbw  busbw  #wrong"]
    for size, time_us in rows:
        lines.append(f"  {size}  {size // 2}  half  sum  -1  {time_us}  0.1  0.1  0  {time_us + 1}  0.1  0.1  0")
    lines.append("# Avg bus bandwidth    : 0.1")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_nccl_tests_curve_is_interpolated(tmp_path):
    curve = write_nccl(tmp_path / "ar.txt", [(1024, 10.0), (2048, 30.0)])
    # bytes = tokens x 1 x 1; two all-reduces (one layer), base 0.
    timing = dict(LINEAR_1MS, base_ms=0.0, tp=2, num_layers=1, hidden_size=1, dtype_bytes=1, allreduce={"curve": curve})
    assert pass_time(timing, 1, 1536, 1536, 0, 0) == 2 * 20.0 / 1000  # midway: 20 us each
    assert pass_time(timing, 1, 100, 100, 0, 0) == 2 * 10.0 / 1000  # below the first knot: its time
    assert pass_time(timing, 1, 3072, 3072, 0, 0) == 2 * 50.0 / 1000  # beyond: the last segment extended


def test_vidur_curve_counts_fp16_elements_and_keeps_its_tp_rows(tmp_path):
    header = ",time_stats.all_reduce.min,time_stats.all_reduce.max,time_stats.all_reduce.mean,time_stats.all_reduce.median,time_stats.all_reduce.std,rank,num_workers,size,collective,devices_per_node,max_devices_per_node"
    rows = [
        "0,0,0,0,0.010,0,0,2,512,all_reduce,2,8",  # 512 elements = 1024 bytes: 10 us
        "1,0,0,0,0.030,0,0,2,1024,all_reduce,2,8",  # 2048 bytes: 30 us
        "2,0,0,0,0.020,0,0,2,1024,all_reduce,2,8",  # measured again: the mean, 25 us
        "3,0,0,0,9.000,0,0,4,768,all_reduce,4,8",  # another TP degree: ignored
    ]
    path = tmp_path / "all_reduce.csv"
    path.write_text("\n".join([header] + rows) + "\n")
    timing = dict(LINEAR_1MS, base_ms=0.0, tp=2, num_layers=1, hidden_size=1, dtype_bytes=1, allreduce={"curve": str(path)})
    assert pass_time(timing, 1, 1536, 1536, 0, 0) == 2 * (0.5 * 10.0 + 0.5 * 25.0) / 1000


def test_table_timing_adds_the_term_to_the_profile_time(tmp_path):
    profile = write_profile(tmp_path / "p")
    plain = pass_time({"type": "table", "profile": profile, "num_layers": 4}, 1, 24, 56, 2, 66)
    timing = {"type": "table", "profile": profile, "num_layers": 4, "tp": 2, "hidden_size": 1000,
              "allreduce": {"latency_us": 5.0, "bandwidth_gb_per_second": 2.0}}
    # 26 tokens x 1000 x 2 bytes = 52,000 bytes: 5 + 52,000 / 2,000 = 31 us, x 8 = 0.248 ms
    assert pass_time(timing, 1, 24, 56, 2, 66) == pytest.approx(plain + 0.248, rel=1e-14)


@pytest.mark.parametrize(
    "timing, field",
    [
        ({"allreduce": {"latency_us": 3.0}}, "timing.allreduce.latency_us"),
        ({"tp": 2, "num_layers": 1, "hidden_size": 8, "allreduce": {"bandwidth_gb_per_second": 1.0, "curve": "x.csv"}}, "timing.allreduce.curve"),
        ({"num_layers": 1, "hidden_size": 8, "allreduce": {"bandwidth_gb_per_second": 1.0}}, "timing.tp"),
        ({"tp": 2, "hidden_size": 8, "allreduce": {"bandwidth_gb_per_second": 1.0}}, "timing.num_layers"),
        ({"tp": 2, "num_layers": 1, "allreduce": {"bandwidth_gb_per_second": 1.0}}, "timing.hidden_size"),
        ({"tp": 2, "num_layers": 1, "hidden_size": 8, "allreduce": {"bandwidth_gb_per_second": 0.0}}, "timing.allreduce.bandwidth_gb_per_second"),
        ({"tp": 2, "num_layers": 1, "hidden_size": 8, "allreduce": {"curve": "/nonexistent.csv"}}, "timing.allreduce.curve"),
        ({"type": "fixed", "tp": 2}, "timing.tp"),
        ({"type": "fixed", "allreduce": {"bandwidth_gb_per_second": 1.0}}, "timing.allreduce"),
        ({"num_layers": 4}, "timing.num_layers"),
        ({"prefill_scale": 0.0}, "timing.prefill_scale"),
        ({"decode_scale": -1.0}, "timing.decode_scale"),
        ({"pass_overhead_us": -5.0}, "timing.pass_overhead_us"),
        ({"type": "fixed", "decode_scale": 2.0}, "timing.decode_scale"),
        ({"tp": 2, "num_layers": 1, "hidden_size": 8, "dtype_bytes": 0, "allreduce": {"bandwidth_gb_per_second": 1.0}}, "timing.dtype_bytes"),
    ],
)
def test_bad_allreduce_config_names_the_field(timing, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config({"timing": timing})


def test_bad_curve_row_names_file_and_line(tmp_path):
    path = tmp_path / "ar.txt"
    path.write_text("# header\n  1024  512  half  sum  -1  10.0  0 0 0\n  2048  1024  half  sum  -1  oops  0 0 0\n")
    timing = dict(LINEAR_1MS, tp=2, num_layers=1, hidden_size=1, allreduce={"curve": str(path)})
    with pytest.raises(ConfigError, match=f"{path}:3"):
        timing_arrays(load_config({"timing": timing}).timing)


def test_allreduce_is_deterministic_in_a_run():
    import simcore

    cfg = {"workload": {"num_requests": 20}, "timing": dict(LINEAR_1MS, tp=2, num_layers=32, hidden_size=4096,
           allreduce={"latency_us": 20.0, "bandwidth_gb_per_second": 16.0})}
    a, b = simcore.run(cfg), simcore.run(cfg)
    assert a.requests.equals(b.requests)
    plain = simcore.run({"workload": {"num_requests": 20}, "timing": LINEAR_1MS})
    assert np.all(np.asarray(a.requests["e2el_ms"]) > np.asarray(plain.requests["e2el_ms"]))


@pytest.mark.skipif(importlib.util.find_spec("aiconfigurator_core") is None, reason="needs replaysim[aic]")
def test_aic_allreduce_replaces_the_databases_own():
    from aiconfigurator_core.sdk import EngineHandle

    from simcore.timing import aic

    base = {"type": "aic", "model": "meta-llama/Meta-Llama-3.1-8B", "gpu": "h200_sxm", "tp": 2}
    engine = {"aggregated": {"max_batched_tokens": 256, "max_sequences": 16}}
    ring = dict(base, allreduce={"latency_us": 20.0, "bandwidth_gb_per_second": 16.0})
    own = timing_arrays(load_config({"timing": base, "engine": engine}).timing)
    cfg = load_config({"timing": ring, "engine": engine})
    assert (cfg.timing.num_layers, cfg.timing.hidden_size) == (32, 4096)  # from the bundled config.json
    replaced = timing_arrays(cfg.timing)
    handle = EngineHandle.compile(base["model"], base["gpu"], "vllm", tp_size=2)
    _, _, _, _, _, ar_ctx, ar_gen = aic._op_indices(handle)
    assert len(ar_ctx) == 2 and len(ar_gen) == 2  # two per layer
    # decode-only, 8 requests: the database's two all-reduces at batch 8 out, the ring's in,
    # 2 x 32 layers x (20 us + 1 x 8 x 4096 x 2 bytes / 16 GB/s) (n = 2: 2 (n - 1) / n = 1)
    db_ms = sum(row[1] for row in handle.evaluate_generation_ops(ar_gen, batch_size=8, s=1))
    ring_ms = 64 * (20.0 + 8 * 4096 * 2 / 16e3) / 1000
    summary = (0, 0, 0, 8, 8 * 300)
    got = nb.rank_time_ms_nb(replaced[0], replaced[1], replaced[2], *summary)
    plain = nb.rank_time_ms_nb(own[0], own[1], own[2], *summary)
    assert got == pytest.approx(plain - db_ms + ring_ms, rel=1e-12)
    # a prefill pass of 200 tokens: the context all-reduces at 200 tokens
    db_ms = sum(row[1] for row in handle.evaluate_context_ops(ar_ctx, batch_size=1, s=200))
    ring_ms = 64 * (20.0 + 200 * 4096 * 2 / 16e3) / 1000
    got = nb.rank_time_ms_nb(replaced[0], replaced[1], replaced[2], 1, 200, 200, 0, 0)
    plain = nb.rank_time_ms_nb(own[0], own[1], own[2], 1, 200, 200, 0, 0)
    assert got == pytest.approx(plain - db_ms + ring_ms, rel=1e-12)
