"""Replay the measured vLLM 0.19.0 runs and compare with the measurements: docs/accuracy.md.

    python bench/accuracy.py [--data DIR] [--out docs/accuracy.md] [--no-aic]

For each run in ``<data>/bench/<gpu>/<model>/`` (LLMServingSim's measured vLLM
runs, see the data set's README.md) the replay takes, and only takes, what the
run's own files state:

- requests: ``requests.jsonl`` lengths; send instants ``arrival_time -
  arrival_time[0]`` (``load.type=trace``);
- engine: policy ``vllm``, ``max_num_seqs``, ``max_num_batched_tokens``,
  ``max_model_len`` (null: the model's maximum position) from ``meta.json``,
  block size 16;
- KV capacity: ``kv_cache.num_gpu_blocks`` where ``meta.json`` gives it; else
  LLMServingSim's estimate from ``config.json``: ``floor((mem_size GiB x
  mem_util - weight bytes per GPU) / KV bytes per token per GPU / 16)`` with the
  model's bf16 weights and KV geometry (:data:`MODELS`);
- timing ``table``: the profile of the same GPU, model and TP under
  ``<data>/profiler``; timing ``aic``: the aiconfigurator-core database where it
  has the GPU and the model (vLLM backend, its current version).

The measured metrics use the source validator's anchor (``queued_ts``):
TTFT = first_token_ts - queued_ts, TPOT = (last - first) / (output - 1),
E2E = last_token_ts - queued_ts; means and linear p90 (numpy), as the simulator's
summary.  Nothing is fitted to the measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import simcore  # noqa: E402
from simcore.config import ConfigError, load_config  # noqa: E402

DEFAULT_DATA = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data", "llmservingsim-vllm-bench"
)
GIB = 1 << 30
BLOCK_SIZE = 16

#: Architecture facts of the served models (their Hugging Face config.json, bf16):
#: parameters, layers, KV heads, head size, maximum position; and the AIC names.
MODELS = {
    "meta-llama/Llama-3.1-8B": dict(
        params=8_030_261_248, layers=32, kv_heads=8, head_dim=128, max_position=131072,
        aic_model="meta-llama/Meta-Llama-3.1-8B", profile="meta-llama/Llama-3.1-8B",
    ),
    "Qwen/Qwen3-32B": dict(
        params=32_762_123_264, layers=64, kv_heads=8, head_dim=128, max_position=40960,
        aic_model="Qwen/Qwen3-32B", profile="Qwen/Qwen3-32B",
    ),
}
#: GPUs of the runs and their aiconfigurator-core system names (None: not in its database).
AIC_SYSTEMS = {"RTX4090": None, "RTXPRO6000": "rtx_pro_6000_server"}
METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2E"))


def measured(rows: list[dict]) -> dict[str, float]:
    queued = np.array([r["queued_ts"] for r in rows])
    first = np.array([r["first_token_ts"] for r in rows])
    last = np.array([r["last_token_ts"] for r in rows])
    out = np.array([r["output_toks"] for r in rows])
    ttft = (first - queued) * 1e3
    e2e = (last - queued) * 1e3
    many = out > 1
    tpot = (last[many] - first[many]) / (out[many] - 1) * 1e3
    result = {}
    for key, values in (("ttft", ttft), ("tpot", tpot), ("e2el", e2e)):
        result[f"mean_{key}_ms"] = float(np.mean(values))
        result[f"p90_{key}_ms"] = float(np.percentile(values, 90))
    return result


def kv_blocks(meta: dict, cluster: dict, model: dict, tp: int) -> tuple[int, str]:
    kv = meta.get("kv_cache") or {}
    if kv.get("num_gpu_blocks"):
        return int(kv["num_gpu_blocks"]), "meta.json num_gpu_blocks"
    npu = cluster["nodes"][0]["instances"][0]["npu_mem"]
    weights = model["params"] * 2 / tp
    per_token = 2 * model["layers"] * (model["kv_heads"] // tp) * model["head_dim"] * 2
    tokens = int((npu["mem_size"] * GIB * npu["mem_util"] - weights) // per_token)
    return tokens // BLOCK_SIZE, f"config.json: ({npu['mem_size']} GiB x {npu['mem_util']} - weights) / KV per token"


def run_case(root: str, gpu: str, model_dir: str, *, use_aic: bool) -> dict:
    case = os.path.join(root, "bench", gpu, model_dir)
    with open(os.path.join(case, "vllm", "meta.json"), encoding="utf-8") as handle:
        meta = json.load(handle)
    with open(os.path.join(case, "config.json"), encoding="utf-8") as handle:
        cluster = json.load(handle)
    with open(os.path.join(case, "vllm", "requests.jsonl"), encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    name = meta["model"]
    model = MODELS[name]
    kwargs = meta["engine_kwargs"]
    tp = int(kwargs.get("tensor_parallel_size") or 1)
    blocks, blocks_source = kv_blocks(meta, cluster, model, tp)
    arrival = np.array([r["arrival_time"] for r in rows], dtype=np.float64)
    requests = pa.table(
        {
            "request_id": [str(r["request_id"]) for r in rows],
            "input_tokens": np.array([r["input_toks"] for r in rows], dtype=np.int64),
            "output_tokens": np.array([r["output_toks"] for r in rows], dtype=np.int64),
            "send_ms": (arrival - arrival[0]) * 1e3,
        }
    )
    engine = {
        "policy": "vllm",
        "aggregated": {
            "max_batched_tokens": int(kwargs["max_num_batched_tokens"]),
            "max_sequences": int(kwargs["max_num_seqs"]),
            "block_size": BLOCK_SIZE,
            "num_blocks": blocks,
            "context_length": int(kwargs.get("max_model_len") or model["max_position"]),
        },
    }
    base = {"load": {"type": "trace"}, "workload": {"num_requests": len(rows)}, "engine": engine}
    profile = os.path.join(root, "profiler", gpu, model["profile"], "bf16", f"tp{tp}")
    result = {
        "run": f"{gpu} {name.split('/')[-1]} TP{tp}",
        "requests": len(rows),
        "max_num_seqs": int(kwargs["max_num_seqs"]),
        "blocks": blocks,
        "blocks_source": blocks_source,
        "measured": measured(rows),
        "predicted": {},
        "notes": [],
        "seconds": {},
    }
    if os.path.isdir(profile):
        start = time.perf_counter()
        cfg = dict(base, timing={"type": "table", "profile": profile, "num_layers": model["layers"]})
        result["predicted"]["table"] = simcore.run(cfg, requests=requests).summary
        result["seconds"]["table"] = time.perf_counter() - start
    else:
        result["notes"].append(f"no profile at {profile}")
    system = AIC_SYSTEMS.get(gpu)
    if not use_aic:
        result["notes"].append("aic: skipped (--no-aic)")
    elif system is None:
        result["notes"].append(f"aic: the aiconfigurator-core database has no {gpu} data")
    else:
        timing = {"type": "aic", "model": model["aic_model"], "gpu": system, "backend": "vllm", "tp": tp}
        try:
            start = time.perf_counter()
            result["predicted"]["aic"] = simcore.run(dict(base, timing=timing), requests=requests).summary
            result["seconds"]["aic"] = time.perf_counter() - start
            from simcore.timing import aic

            cfg = load_config(dict(base, timing=timing))
            _, _, info = aic.load_or_build(aic.AicSpec.from_config(cfg.timing))
            result["aic_check"] = info
            auto = dict(base, timing=timing)
            auto["engine"] = json.loads(json.dumps(engine))
            auto["engine"]["aggregated"]["num_blocks"] = "auto"
            result["aic_auto_blocks"] = load_config(auto).engine.aggregated.num_blocks
        except ConfigError as exc:
            result["notes"].append(f"aic: {exc}")
    return result


def err(pred: float, meas: float) -> str:
    return f"{100 * (pred - meas) / meas:+.1f}%"


def render(results: list[dict], versions: dict) -> str:
    lines = [
        "# Accuracy against measured vLLM runs",
        "",
        "Generated by `python bench/accuracy.py` (do not edit by hand; rerun it). "
        "Data: `shared/data/llmservingsim-vllm-bench` (LLMServingSim's measured vLLM 0.19.0 runs: "
        "300 ShareGPT requests at ~10 req/s, fixed output lengths, in-process `AsyncLLM`). "
        "Each run is replayed with its own arrival times, lengths, `max_num_seqs`, "
        "`max_num_batched_tokens` = 2048, block size 16 and KV capacity; nothing is fitted. "
        "Error = (predicted - measured) / measured.",
        "",
        f"Versions: replaysim timing layout {versions['layout']}, aiconfigurator-core {versions['aic']}.",
        "",
        "| run | metric | measured ms | table ms | table err | aic ms | aic err |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for res in results:
        m = res["measured"]
        for key, label in METRICS:
            for stat in ("mean", "p90"):
                k = f"{stat}_{key}_ms"
                cells = [res["run"], f"{stat} {label}", f"{m[k]:,.1f}"]
                for model in ("table", "aic"):
                    summary = res["predicted"].get(model)
                    if summary is None or summary.get(k) is None:
                        cells += ["n/a", "n/a"]
                    else:
                        cells += [f"{summary[k]:,.1f}", err(summary[k], m[k])]
                lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Setup per run", ""]
    for res in results:
        lines.append(
            f"- **{res['run']}**: {res['requests']} requests, max_num_seqs {res['max_num_seqs']}, "
            f"KV {res['blocks']:,} blocks of 16 ({res['blocks_source']})."
        )
        if "aic_check" in res:
            c = res["aic_check"]
            lines.append(
                f"  - aic tables vs direct aiconfigurator-core calls on {c['passes']} random passes: "
                f"mean {100 * c['mean_rel_error']:.3f}%, p99 {100 * c['p99_rel_error']:.3f}%, "
                f"max {100 * c['max_rel_error']:.3f}% (built in {c['build_seconds']:.1f} s)"
            )
        if "aic_auto_blocks" in res:
            lines.append(
                f"  - for reference, `num_blocks: auto` (aiconfigurator-core memory model, memory fraction 0.9) "
                f"would give {res['aic_auto_blocks']:,} blocks (not used above)"
            )
        for note in res["notes"]:
            lines.append(f"  - {note}")
    lines += [
        "",
        "## What is and is not modelled",
        "",
        "- The profiles were taken with `enforce_eager` (no CUDA graphs) while the serving runs "
        "allowed CUDA graphs, so small decode batches are expected to be predicted slow.",
        "- The TP2 profile holds each GPU's share of the per-layer work; TP all-reduce "
        "communication is not in the profile and is not added (timing.type=table). This is "
        "the likely main cause of the Qwen3-32B TP2 underestimate: by the run's own config.json "
        "(link_bw 16 GB/s, link_latency 20 us), 64 layers x 2 all-reduces of tokens x 5120 x 2 "
        "bytes would add roughly 13 ms to a 128-decode pass and 170 ms to a 2048-token prefill "
        "pass (back-of-envelope, not modelled). The aic rows include aiconfigurator-core's own "
        "all-reduce estimate for this GPU.",
        "- aiconfigurator-core has no vLLM 0.19.0 GEMM/attention data for the RTX PRO 6000 "
        "(its current vLLM data is 0.24.0), so the aic rows compare a newer vLLM's kernels with "
        "a 0.19.0 run.",
        "- Prefix caching: the RTX 4090 run had `enable_prefix_caching` on (vLLM's default); "
        "the request files carry no prompt contents or block hashes, so no prefix can be "
        "shared in the replay (ShareGPT single-turn prompts rarely share whole 16-token blocks).",
        "- The replay has no tokenizer or detokenizer stage (the runs drove `AsyncLLM` in-process "
        "and the measured latencies start at `queued_ts`).",
        "- Batch-skew corrections (`skew.csv`, `skew_fit.csv`) of the profiler are not used.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.path.normpath(DEFAULT_DATA))
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "accuracy.md"))
    parser.add_argument("--no-aic", action="store_true", help="skip timing.type=aic")
    args = parser.parse_args(argv)
    cases = []
    for gpu in sorted(os.listdir(os.path.join(args.data, "bench"))):
        for model_dir in sorted(os.listdir(os.path.join(args.data, "bench", gpu))):
            cases.append((gpu, model_dir))
    results = [run_case(args.data, gpu, model_dir, use_aic=not args.no_aic) for gpu, model_dir in cases]
    try:
        from importlib import metadata

        aic_version = metadata.version("aiconfigurator-core")
    except Exception:
        aic_version = "not installed"
    from simcore.timing import aic as aic_module

    text = render(results, {"layout": aic_module.LAYOUT_VERSION, "aic": aic_version})
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
