"""Replay the measured vLLM 0.19.0 runs and compare with the measurements: docs/accuracy.md.

    python bench/accuracy.py [--data DIR] [--out docs/accuracy.md] [--no-aic] [--no-calibration]
        [--losses bench,requests,summary]

For each run in ``<data>/bench/<gpu>/<model>/`` (LLMServingSim's measured vLLM
runs, see the data set's README.md) the replay takes, and only takes, what the
run's own files state:

- requests: ``requests.jsonl`` lengths; send instants ``arrival_time -
  arrival_time[0]`` (``load.type=trace``); as shipped, the prompts' shared
  leading blocks (later turns of a conversation) from the run's own workload
  file (:func:`prompt_trace`);
- engine: policy ``vllm``, ``max_num_seqs``, ``max_num_batched_tokens``,
  ``max_model_len`` (null: the model's maximum position) from ``meta.json``,
  block size 16;
- KV capacity: ``kv_cache.num_gpu_blocks`` where ``meta.json`` gives it; else
  LLMServingSim's estimate from ``config.json``: ``floor((mem_size GiB x
  mem_util - weight bytes per GPU) / KV bytes per token per GPU / 16)`` with the
  model's bf16 weights and KV geometry (:data:`MODELS`);
- timing ``table``: the profile of the same GPU, model and TP under
  ``<data>/profiler``; timing ``aic``: the aiconfigurator-core database where it
  has the GPU and the model (vLLM backend, its current version); timing
  ``roofline``: the shipped catalogue's model and GPU, efficiency factors at
  their default 1 (nothing fitted), the as-shipped engine, prompts, CUDA-graph
  sizes and, at TP > 1, the stated link;
- "before": ``table`` as the tree gave it before TP all-reduce and asynchronous
  scheduling existed (synchronous, no communication time);
- "as shipped": ``table`` plus, at TP > 1, the TP all-reduce on the link that
  the run's ``config.json`` states (``link_bw`` GB/s, ``link_latency`` ns, ring
  model; the model's hidden size from :data:`MODELS`), and
  ``async_scheduling`` as the run's vLLM had it (``meta.json``'s resolved
  ``scheduler_config.async_scheduling``, else vLLM 0.19's default, on), and
  whole-sequence admission (``reserve_full_isl``) as the run's vLLM had it
  (``scheduler_config.scheduler_reserve_full_isl``, else vLLM 0.19.0's
  default, on), prefix caching as the run's vLLM had it (``meta.json``'s resolved
  ``cache_config.enable_prefix_caching``, else vLLM's default, on) with
  generated-block caching (``cache_generated_blocks``) wherever it is on (vLLM
  has no option for it: prefix caching hashes generated blocks too), the
  profile's own decode-attention skew fit (``timing.attention_skew_alpha`` =
  its ``meta.yaml`` ``skew_fit.per_tp.<tp>.alpha_default``, 0 where the
  profile has none), and CUDA-graph padding at the run's capture sizes (``meta.json``'s resolved
  ``compilation_config.cudagraph_capture_sizes``, else ``vllm_default``:
  none of the runs set ``enforce_eager``);
- "calibrated": ``runners.calibrate`` fits the time scales, the per-pass
  overhead and (TP > 1) the link bandwidth to the first half of the run (by
  send instant) and is scored on both halves; the columns use its default
  loss, and a section compares the fits of every loss it offers
  (``--losses``);
- LLMServingSim's own figures on the same runs: ``validation_summary.txt``.

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
import tempfile
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
        aic_model="meta-llama/Meta-Llama-3.1-8B", profile="meta-llama/Llama-3.1-8B", hidden=4096,
        roofline="llama-3.1-8b",
    ),
    "Qwen/Qwen3-32B": dict(
        params=32_762_123_264, layers=64, kv_heads=8, head_dim=128, max_position=40960,
        aic_model="Qwen/Qwen3-32B", profile="Qwen/Qwen3-32B", hidden=5120,
        roofline="qwen3-32b",
    ),
    # config.json as LLMServingSim keeps it (configs/model/Qwen/Qwen3-30B-A3B-Instruct-2507.json at
    # 5daddb2): hidden 2048, 48 layers (every one MoE: decoder_sparse_step 1, mlp_only_layers []),
    # 32 query / 4 KV heads of 128, vocabulary 151,936 (untied head), 128 experts of
    # moe_intermediate_size 768, 8 per token.  Parameters counted from those: embedding and head
    # 2 x 151,936 x 2,048; per layer q, k, v, o (2,048 x 4,096 + 2 x 2,048 x 512 + 4,096 x 2,048),
    # q/k norms (2 x 128), two RMSNorms (2 x 2,048), router (2,048 x 128) and the experts
    # (128 x 3 x 2,048 x 768 = 603,979,776); the final norm (2,048).
    "Qwen/Qwen3-30B-A3B-Instruct-2507": dict(
        params=2 * 151_936 * 2_048 + 48 * (2_048 * 4_096 + 2 * 2_048 * 512 + 4_096 * 2_048 + 2 * 128 + 2 * 2_048
                                          + 2_048 * 128 + 128 * 3 * 2_048 * 768) + 2_048,
        expert_params=48 * 128 * 3 * 2_048 * 768,
        layers=48, kv_heads=4, head_dim=128, max_position=262144,
        aic_model="Qwen/Qwen3-30B-A3B", profile="Qwen/Qwen3-30B-A3B-Instruct-2507", hidden=2048,
        num_experts=128, top_k=8, roofline="qwen3-30b-a3b",
    ),
}
#: GPUs of the runs and their aiconfigurator-core system names (None: not in its database).
AIC_SYSTEMS = {"RTX4090": None, "RTXPRO6000": "rtx_pro_6000_server"}
#: The runs' GPUs in the shipped catalogue (timing.type=roofline's timing.gpu).
ROOFLINE_GPUS = {"RTX4090": "RTX4090", "RTXPRO6000": "RTXPRO6000"}
METRICS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2E"))
#: vLLM V1 turns prefix caching on by default for generative models
#: (``EngineArgs``: ``enable_prefix_caching`` None resolves to True).
PREFIX_CACHING_DEFAULT = True
#: ``scheduler_reserve_full_isl`` defaults to True in vLLM 0.19.0 (the RTX 4090
#: run's resolved ``scheduler_config``, the only file of that version stating it).
RESERVE_FULL_ISL_DEFAULT = True
#: vLLM turns asynchronous scheduling on by default from 0.14 (vllm/config/vllm.py,
#: VllmConfig.__post_init__; not for PP > 1 or most speculative decoding).
ASYNC_DEFAULT_FROM = (0, 14)
#: The as-shipped column without one of its run-stated behaviours (engine and
#: timing keys switched off; True: the lengths alone, without the prompts' shared blocks),
#: reported per run.
ABLATIONS = (
    ("CUDA-graph padding", {}, {"cuda_graph_sizes": None}, False),
    ("prefix caching", {"prefix_caching": False, "cache_generated_blocks": False}, {}, False),
    ("generated-block caching", {"cache_generated_blocks": False}, {}, False),
    ("whole-sequence admission", {"reserve_full_isl": False}, {}, False),
    ("the attention skew term", {}, {"attention_skew_alpha": 0.0}, False),
    ("the shared prompt blocks", {}, {}, True),
    ("the last four (the as-shipped column before they were modelled)",
     {"prefix_caching": False, "cache_generated_blocks": False, "reserve_full_isl": False},
     {"attention_skew_alpha": 0.0}, True),
)
#: validation_summary.txt row labels of LLMServingSim's figures.
SUMMARY_ROWS = {"ttft": "TTFT", "tpot": "TPOT", "e2el": "Latency"}


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


def kv_blocks(meta: dict, cluster: dict, model: dict, tp: int, ep: int = 1) -> tuple[int, str]:
    kv = meta.get("kv_cache") or {}
    if kv.get("num_gpu_blocks"):
        return int(kv["num_gpu_blocks"]), "meta.json num_gpu_blocks"
    npu = cluster["nodes"][0]["instances"][0]["npu_mem"]
    experts = model.get("expert_params", 0)  # under expert parallelism a GPU holds 1/ep of the experts
    weights = ((model["params"] - experts) / tp + experts / (ep if ep > 1 else tp)) * 2
    per_token = 2 * model["layers"] * (model["kv_heads"] // tp) * model["head_dim"] * 2
    tokens = int((npu["mem_size"] * GIB * npu["mem_util"] - weights) // per_token)
    return tokens // BLOCK_SIZE, f"config.json: ({npu['mem_size']} GiB x {npu['mem_util']} - weights) / KV per token"


def resolved_flag(meta: dict, section: str, key: str, default: bool) -> tuple[bool, str]:
    """``meta.json``'s resolved ``<section>.<key>`` where the run states it, else vLLM's
    default for the run's version; and where the value comes from."""
    value = ((meta.get("resolved_config") or {}).get(section) or {}).get(key)
    if isinstance(value, bool):
        return value, f"meta.json resolved {section}"
    return default, f"vLLM {meta.get('vllm_version')} default"


def async_scheduling(meta: dict) -> tuple[bool, str]:
    """Whether the run's vLLM scheduled asynchronously, and where that comes from."""
    version = tuple(int(x) for x in str(meta.get("vllm_version", "0.0")).split(".")[:2])
    return resolved_flag(meta, "scheduler_config", "async_scheduling", version >= ASYNC_DEFAULT_FROM)


def prefix_caching(meta: dict) -> tuple[bool, str]:
    """Whether the run's vLLM cached prefixes, and where that comes from.

    It matters under KV pressure: a preempted request's freed blocks keep
    their hashes, so when it is admitted again it finds its own prompt blocks
    that were not evicted meanwhile instead of recomputing them.
    """
    return resolved_flag(meta, "cache_config", "enable_prefix_caching", PREFIX_CACHING_DEFAULT)


def reserve_full_isl(meta: dict) -> tuple[bool, str]:
    """Whether the run's vLLM admitted a waiting request only when its whole sequence fit."""
    return resolved_flag(meta, "scheduler_config", "scheduler_reserve_full_isl", RESERVE_FULL_ISL_DEFAULT)


#: The workloads' shared prompt blocks (``bench/prompt_prefixes.py``), with their sources' SHA-256.
PROMPT_PREFIXES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "prompt_prefixes")
_TRACES = tempfile.TemporaryDirectory(prefix="accuracy-prompts-")  # this process's prompt traces


def prompt_trace(meta: dict, requests_path: str) -> tuple[str | None, str]:
    """A Mooncake trace of the run whose ``hash_ids`` give its prompts' shared blocks, and its
    source; None where ``bench/data/prompt_prefixes`` has no file whose source's SHA-256 is the
    run's stated ``dataset_hash`` (the replay then gives every prompt blocks of its own)."""
    import prompt_prefixes

    name = os.path.splitext(os.path.basename(meta.get("dataset_path", "")))[0]
    with open(os.path.join(PROMPT_PREFIXES, "sources.json"), encoding="utf-8") as handle:
        source = json.load(handle).get(name)
    if source is None or source["sha256"] != meta.get("dataset_hash"):
        return None, f"shared prompt blocks: none known for {name or 'the workload'} (every prompt its own)"
    out = os.path.join(_TRACES.name, f"{name}-{len(os.listdir(_TRACES.name))}.jsonl")
    prompt_prefixes.trace(os.path.join(PROMPT_PREFIXES, f"{name}.csv"), requests_path, out)
    return out, (f"shared prompt blocks: bench/data/prompt_prefixes/{name}.csv (the prompts of {source['source']}, "
                 "SHA-256 = meta.json dataset_hash)")


def attention_skew_alpha(profile: str, tp: int) -> tuple[float, str]:
    """The profile's own pooled skew fit (``meta.yaml`` beside ``tp<N>``), 0 where it has none."""
    import yaml  # PyYAML, a dependency of hydra-core's omegaconf

    path = os.path.join(os.path.dirname(profile), "meta.yaml")
    with open(path, encoding="utf-8") as handle:
        fit = (yaml.safe_load(handle) or {}).get("skew_fit") or {}
    entry = (fit.get("per_tp") or {}).get(tp) or {}
    if not fit.get("enabled") or "alpha_default" not in entry:
        return 0.0, "profile meta.yaml: no skew fit"
    return float(entry["alpha_default"]), f"profile meta.yaml skew_fit.per_tp.{tp}.alpha_default"


def cuda_graph_sizes(meta: dict) -> tuple[list[int] | str | None, str]:
    """The run's CUDA-graph capture sizes (``timing.cuda_graph_sizes``), and where they come from."""
    compilation = (meta.get("resolved_config") or {}).get("compilation_config") or {}
    model = (meta.get("resolved_config") or {}).get("model_config") or {}
    if model.get("enforce_eager") or meta["engine_kwargs"].get("enforce_eager"):
        return None, "enforce_eager: no CUDA graphs"
    if compilation.get("cudagraph_capture_sizes") is not None:
        return list(compilation["cudagraph_capture_sizes"]), "meta.json resolved compilation_config"
    return "vllm_default", f"vLLM {meta.get('vllm_version')} default"


def llmservingsim_figures(case: str) -> dict[str, float]:
    """LLMServingSim's own errors on the run (its validation_summary.txt, 'Diff%' column)."""
    out = {}
    path = os.path.join(case, "validation_summary.txt")
    if not os.path.isfile(path):
        return out
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            fields = line.split()
            for key, label in SUMMARY_ROWS.items():
                for stat, word in (("mean", "Mean"), ("p90", "P90")):
                    if fields[:2] == [label, word]:
                        out[f"{stat}_{key}_ms"] = float(fields[4].rstrip("%")) / 100
    return out


def case_setup(root: str, gpu: str, model_dir: str) -> dict:
    """A measured run's files and the configs that replay it: ``base`` (lengths only, the run's
    engine limits), ``shipped`` (as shipped: each stated parameter, the prompts' trace), and what
    :func:`run_case` reports of them (every local below, by name)."""
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
    dp = int(kwargs.get("data_parallel_size") or 1)
    expert_parallel = bool(kwargs.get("enable_expert_parallel"))
    ep = dp * tp if expert_parallel else 1  # vLLM's EP group: the DP x TP GPUs
    blocks, blocks_source = kv_blocks(meta, cluster, model, tp, ep)
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
    if dp > 1:  # each DP rank its own scheduler and KV; vLLM's front end balances requests over them
        engine["aggregated"].update(attention_dp=dp, rank_policy="least_loaded", expert_parallel=expert_parallel)
    base = {"load": {"type": "trace"}, "workload": {"num_requests": len(rows)}, "engine": engine}
    profile = os.path.join(root, "profiler", gpu, model["profile"], "bf16", f"tp{tp}")
    asynchronous, async_source = async_scheduling(meta)
    shipped_engine = json.loads(json.dumps(engine))
    shipped_engine["aggregated"]["async_scheduling"] = asynchronous
    caching, caching_source = prefix_caching(meta)
    shipped_engine["aggregated"]["prefix_caching"] = caching
    # not a vLLM option: with prefix caching on, vLLM hashes generated blocks too
    shipped_engine["aggregated"]["cache_generated_blocks"] = caching
    whole, whole_source = reserve_full_isl(meta)
    shipped_engine["aggregated"]["reserve_full_isl"] = whole
    table_timing = {"type": "table", "profile": profile, "num_layers": model["layers"]}
    if "num_experts" in model:  # the MoE layers, priced from the profile's moe.csv
        table_timing["moe"] = {"num_experts": model["num_experts"], "top_k": model["top_k"]}
    graphs, graphs_source = cuda_graph_sizes(meta)
    shipped_timing = dict(table_timing, cuda_graph_sizes=graphs)
    prompts, prompts_source = prompt_trace(meta, os.path.join(case, "vllm", "requests.jsonl"))
    # as shipped: the run's requests with its prompts' shared blocks
    shipped_workload = base["workload"]
    if prompts:
        shipped_workload = dict(base["workload"], source="mooncake", path=prompts, block_size=BLOCK_SIZE)
    skew_note = ""
    if os.path.isdir(profile):
        alpha, alpha_source = attention_skew_alpha(profile, tp)
        shipped_timing["attention_skew_alpha"] = alpha
        skew_note = f"attention_skew_alpha {alpha:g} ({alpha_source})"
    link = ""
    if tp > 1:
        latency_us = cluster["link_latency"] / 1000  # config.json: ns
        shipped_timing.update(
            tp=tp, hidden_size=model["hidden"],
            allreduce={"latency_us": latency_us, "bandwidth_gb_per_second": float(cluster["link_bw"])},
        )
        link = f"TP all-reduce on config.json's link: {cluster['link_bw']} GB/s, {latency_us:g} us"
    if expert_parallel and dp > 1:
        latency_us = cluster["link_latency"] / 1000  # config.json: ns
        shipped_timing.update(
            hidden_size=model["hidden"],
            moe=dict(table_timing["moe"], alltoall={"latency_us": latency_us,
                                                   "bandwidth_gb_per_second": float(cluster["link_bw"])}),
        )
        link = (f"expert parallelism over the {dp} DP ranks (each rank idle in a step runs vLLM's dummy batch; "
                f"DP padding); MoE dispatch and combine on config.json's link: {cluster['link_bw']} GB/s, "
                f"{latency_us:g} us; requests balanced over the ranks by rank_policy least_loaded")
    shipped = dict(base, engine=shipped_engine, timing=shipped_timing, workload=shipped_workload)
    return dict(locals())


def run_case(root: str, gpu: str, model_dir: str, *, use_aic: bool, losses: tuple[str, ...] = (),
             only_roofline: bool = False) -> dict:
    setup = case_setup(root, gpu, model_dir)
    (case, meta, cluster, rows, name, model, kwargs, tp, dp, expert_parallel, ep, blocks, blocks_source, requests,
     engine, base, profile, asynchronous, async_source, shipped_engine, caching, caching_source, whole, whole_source,
     table_timing, graphs, graphs_source, shipped_timing, prompts_source, shipped_workload, skew_note,
     link) = (setup[k] for k in (
        "case", "meta", "cluster", "rows", "name", "model", "kwargs", "tp", "dp", "expert_parallel", "ep", "blocks",
        "blocks_source", "requests", "engine", "base", "profile", "asynchronous", "async_source", "shipped_engine",
        "caching", "caching_source", "whole", "whole_source", "table_timing", "graphs", "graphs_source",
        "shipped_timing", "prompts_source", "shipped_workload", "skew_note", "link"))
    result = {
        "run": f"{gpu} {name.split('/')[-1]} TP{tp}" + (f" DP{dp} EP{ep}" if expert_parallel else ""),
        "requests": len(rows),
        "max_num_seqs": int(kwargs["max_num_seqs"]),
        "blocks": blocks,
        "blocks_source": blocks_source,
        "measured": measured(rows),
        "predicted": {},
        "notes": [
            f"async_scheduling {str(asynchronous).lower()} ({async_source})",
            f"cuda_graph_sizes {_graphs_note(graphs)} ({graphs_source})",
            f"prefix_caching {str(caching).lower()} ({caching_source})",
            f"cache_generated_blocks {str(caching).lower()} (not a vLLM option: with prefix caching on, "
            "vLLM hashes the full blocks of generated tokens too)",
            f"reserve_full_isl {str(whole).lower()} ({whole_source})",
            prompts_source,
        ] + [note for note in (skew_note, link) if note],
        "seconds": {},
        "llmservingsim": llmservingsim_figures(case),
    }
    if expert_parallel and dp > 1:  # the settings refuse the lock-step with roofline timing
        result["notes"].append("roofline: not run (engine.aggregated.expert_parallel over 2 DP ranks is modelled "
                               "with timing.type=fixed, linear or table)")
    else:
        roofline_case(result, gpu, model, tp, graphs, shipped_timing, case, rows,
                      dict(base, engine=shipped_engine, workload=shipped_workload), requests)
    if only_roofline:
        return result
    if os.path.isdir(profile):
        start = time.perf_counter()
        if "num_experts" not in model:  # (before this column's time the tree had no MoE timing at all)
            result["predicted"]["before"] = simcore.run(dict(base, timing=table_timing), requests=requests).summary
        shipped = dict(base, engine=shipped_engine, timing=shipped_timing, workload=shipped_workload)
        result["predicted"]["table"] = simcore.run(shipped, requests=_requests(shipped, requests)).summary
        # (a measured step is running / tokens per second on one engine; not with several DP ranks)
        result["decode_steps"] = decode_step_check(case, rows, shipped) if dp == 1 else {}
        result["interpolation"] = interpolation_check(profile)
        result["seconds"]["table"] = time.perf_counter() - start
        for name, engine_off, timing_off, lengths_only in ABLATIONS:  # what each stated behaviour moves
            engine_without = json.loads(json.dumps(shipped_engine))
            engine_without["aggregated"].update(engine_off)
            without = dict(shipped, engine=engine_without, timing=dict(shipped_timing, **timing_off))
            if lengths_only:
                without["workload"] = base["workload"]
            summary = simcore.run(without, requests=_requests(without, requests)).summary
            moved = ", ".join(
                f"{label} {pct(rel(summary, f'mean_{key}_ms', result['measured'][f'mean_{key}_ms']))}"
                for key, label in METRICS
            )
            result["notes"].append(f"as shipped without {name}: mean {moved}")
        path = os.path.join(case, "vllm", "requests.jsonl")
        result["calibrations"] = {loss: calibrate_case(path, shipped, tp, loss, dp if expert_parallel else 1)
                                  for loss in losses}
        if losses:
            result["sensitivity"] = part_sensitivity(path, shipped, result["calibrations"][losses[0]]["values"])
            result["cross_losses"] = cross_losses(path, shipped, result["calibrations"])
            result["pairing"] = pairing_check(path, shipped, result["calibrations"])
        result["preemption"] = preemption_check(case, rows, shipped, requests)
        if result["preemption"] and losses and shipped_engine["aggregated"]["cache_generated_blocks"]:
            # the default fit as it was before generated blocks were cached: what the key moved
            engine_without = json.loads(json.dumps(shipped_engine))
            engine_without["aggregated"]["cache_generated_blocks"] = False
            result["calibration_without_generated"] = calibrate_case(
                path, dict(shipped, engine=engine_without), tp, losses[0])
    else:
        result["notes"].append(f"no profile at {profile}")
    system = AIC_SYSTEMS.get(gpu)
    if not use_aic:
        result["notes"].append("aic: skipped (--no-aic)")
    elif system is None:
        result["notes"].append(f"aic: the aiconfigurator-core database has no {gpu} data")
    else:
        timing = {"type": "aic", "model": model["aic_model"], "gpu": system, "backend": "vllm", "tp": tp,
                  "cuda_graph_sizes": graphs}
        if tp > 1:  # the stated link replaces the database's own all-reduce
            timing["allreduce"] = shipped_timing["allreduce"]
        try:
            start = time.perf_counter()
            aic_cfg = dict(base, engine=shipped_engine, timing=timing, workload=shipped_workload)
            result["predicted"]["aic"] = simcore.run(aic_cfg, requests=_requests(aic_cfg, requests)).summary
            result["seconds"]["aic"] = time.perf_counter() - start
            from simcore.timing import aic

            cfg = load_config(aic_cfg)
            _, _, info = aic.load_or_build(aic.AicSpec.from_config(cfg.timing))
            result["aic_check"] = info
            auto = dict(base, timing=timing)
            auto["engine"] = json.loads(json.dumps(engine))
            auto["engine"]["aggregated"]["num_blocks"] = "auto"
            result["aic_auto_blocks"] = load_config(auto).engine.aggregated.num_blocks
        except ConfigError as exc:
            result["notes"].append(f"aic: {exc}")
    return result


def roofline_case(result: dict, gpu: str, model: dict, tp: int, graphs, shipped_timing: dict, case: str,
                  rows: list[dict], shipped: dict, requests: pa.Table) -> None:
    """``timing.type=roofline`` with the run's engine, prompts and link, nothing fitted: its summary,
    its decode steps against the measured ones, and its pass time at batch 1 and 64 in parts."""
    timing = {"type": "roofline", "model": model["roofline"], "gpu": ROOFLINE_GPUS[gpu], "tp": tp,
              "cuda_graph_sizes": graphs}
    if tp > 1:  # the stated link, as for table and aic
        timing["allreduce"] = shipped_timing["allreduce"]
    cfg = dict(shipped, timing=timing)
    start = time.perf_counter()
    result["predicted"]["roofline"] = simcore.run(cfg, requests=_requests(cfg, requests)).summary
    result["seconds"]["roofline"] = time.perf_counter() - start
    result["roofline_steps"] = decode_step_check(case, rows, cfg)
    profiled = dict(cfg, timing=shipped_timing) if os.path.isdir(shipped_timing["profile"]) else None
    result["roofline_parts"] = roofline_parts(cfg, profiled)


#: Passes the roofline is taken apart at (docs/accuracy.md): (label, SPEC §8 summary).
ROOFLINE_PASSES = (
    ("decode 1 at context 1000", (0, 0, 0, 1, 1000)),
    ("decode 64 at context 1000", (0, 0, 0, 64, 64000)),
    ("prefill 2048 new tokens", (1, 2048, 2048, 0, 0)),
)


def roofline_parts(cfg: dict, profiled: dict | None) -> dict[str, dict[str, float]]:
    """The roofline's time of :data:`ROOFLINE_PASSES` in parts, ms (GEMM groups with ``lm_head``,
    attention; the rest is the TP all-reduce), beside the as-shipped profile's (``table``) time."""
    from simcore.timing import nb
    from simcore.timing.api import timing_arrays

    model, params, table = timing_arrays(load_config(cfg).timing)
    reference = timing_arrays(load_config(profiled).timing) if profiled else None
    bare = params[: nb.ROOFLINE_NUM_PARAMS].copy()
    out = {}
    for label, summary in ROOFLINE_PASSES:
        tokens = summary[1] + summary[3]
        attention = nb.roofline_attention_ms_nb(bare, table, *summary)
        out[label] = {
            "total": nb.rank_time_ms_nb(model, params, table, *summary),
            "gemm": nb.roofline_pass_ms_nb(bare, table, *summary, tokens) - attention,
            "attention": attention,
            "profile": nb.rank_time_ms_nb(*reference, *summary) if reference else float("nan"),
        }
    return out


def roofline_section(results: list[dict]) -> list[str]:
    """docs/accuracy.md's roofline section (also written alone by ``--roofline-only``)."""
    lines = [
        ROOFLINE_HEADING,
        "",
        "`timing.type=roofline` with the shipped catalogue's model and GPU (`simcore/models/data`), "
        "every efficiency factor at its default 1 (the datasheet peaks: a lower bound on the time) and "
        "nothing fitted; the engine settings, prompts, CUDA-graph sizes, KV capacity and (TP2) stated "
        "link are the as-shipped column's. Error = (predicted - measured) / measured.",
        "",
        "| run | metric | measured ms | roofline ms | roofline |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    errors: dict[str, list[float]] = {}
    for res in results:
        pred = res["predicted"].get("roofline")
        if pred is None:
            continue
        for key, label in METRICS:
            for stat in ("mean", "p90"):
                k = f"{stat}_{key}_ms"
                err = rel(pred, k, res["measured"][k])
                if stat == "mean":
                    errors.setdefault(label, []).append(abs(err))
                lines.append(f"| {res['run']} | {stat} {label} | {res['measured'][k]:,.1f} | {pred[k]:,.1f} | {pct(err)} |")
    if errors:
        runs = len(errors["TTFT"])
        lines += ["", f"Mean absolute error of the means over {runs} runs: " + ", ".join(
            f"{label} {100 * float(np.mean(errors[label])):.1f}%" for _, label in METRICS) + " (target: mean TPOT and E2E within 15%)."]
    lines += [
        "",
        "Decode steps (the seconds of `timeseries.csv` described under [Decode steps the runs measured]"
        "(#decode-steps-the-runs-measured)), roofline step / measured step, median:",
        "",
        "| run | batch | measured step ms | roofline / measured |",
        "| --- | ---: | ---: | ---: |",
    ]
    for res in results:
        for batch, d in (res.get("roofline_steps") or {}).items():
            lines.append(f"| {res['run']} | {batch} | {d['measured_ms']:.2f} | {d['plain']:.3f} |")
    lines += [
        "",
        "The roofline's time of single passes in parts (GEMMs with `lm_head`, attention; the rest is the "
        "TP2 all-reduce), beside the as-shipped column's measured per-operator profile (`table`, same "
        "all-reduce) for the same pass:",
        "",
        "| run | pass | roofline ms | GEMMs | attention | profile ms | roofline / profile |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for res in results:
        for label, d in (res.get("roofline_parts") or {}).items():
            lines.append(f"| {res['run']} | {label} | {d['total']:.2f} | {d['gemm']:.2f} | {d['attention']:.2f} | "
                         f"{d['profile']:.2f} | {d['total'] / d['profile']:.3f} |")
    ratios = [d["total"] / d["profile"] for res in results for d in (res.get("roofline_parts") or {}).values()
              if np.isfinite(d["profile"])]
    steps = [d["plain"] for res in results for d in (res.get("roofline_steps") or {}).values()]
    if ratios and steps:
        lines += ["", ROOFLINE_READING.format(
            profile=f"{min(ratios):.2f}-{max(ratios):.2f}", steps=f"{min(steps):.2f}-{max(steps):.2f}"), ""]
    return lines


ROOFLINE_HEADING = "## Roofline timing, nothing fitted"
#: What the roofline rows show (docs/accuracy.md), filled with the ranges of the two ratio tables.
ROOFLINE_READING = (
    "Where it misses and why: every pass is faster than the hardware ran it, because the peaks are "
    "the datasheet's (a bound) and nothing is fitted. Against the measured decode steps the roofline "
    "takes {steps} of the time; against the runs' own per-operator profiles, pass by pass, {profile}. "
    "A small decode batch is the weights read once at the datasheet bandwidth, which the measured "
    "kernels reach 80-90% of; the roofline also leaves out kernel launches, elementwise kernels "
    "(norms, rotary embedding, activations, sampling) and the tile quantisation of GEMMs with few "
    "rows. The RTX PRO 6000's 2048-token prefill misses most among the passes: its measured "
    "GEMMs run well below the 503.8 bf16 TFLOPS quoted at the 2,617 MHz boost clock. TPOT and E2E "
    "inherit the per-pass shortfall (mixed prefill-and-decode passes included); TTFT misses most, "
    "because these runs queue (mean TTFTs of seconds against passes of tens of ms) and the shortfall "
    "accumulates over every pass ahead of a request. The gap is what "
    "`timing.roofline.bandwidth_efficiency`, `timing.roofline.flops_efficiency` and "
    "`timing.pass_overhead_us` are declared for; `replaysim-calibrate` can fit them, and here they "
    "stay at their defaults."
)


#: The section bench/calibration_transfer.py writes.
TRANSFER_HEADING = "## Calibration across runs (leave one run out)"
#: Sections of docs/accuracy.md written by other scripts, kept as they are when this one rewrites
#: the file: bench/calibration_transfer.py's and bench/specdecode_study.py's.
KEPT_SECTIONS = (TRANSFER_HEADING, "## Speculative decoding against a measured vLLM study")


def kept_sections(path: str, text: str) -> str:
    """``text`` followed by the :data:`KEPT_SECTIONS` that ``path`` holds now."""
    try:
        with open(path, encoding="utf-8") as handle:
            old = handle.read()
    except FileNotFoundError:
        return text
    for heading in KEPT_SECTIONS:
        if heading in old and heading not in text:
            kept = heading + old.split(heading, 1)[1].split("\n## ", 1)[0]
            text = text.rstrip("\n") + "\n\n" + kept.rstrip("\n") + "\n"
    return text


def splice_roofline(path: str, results: list[dict]) -> str:
    """``path``'s text with its roofline section replaced (or inserted before the decode-step
    section) by the one of ``results``."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    section = "\n".join(roofline_section(results))
    if ROOFLINE_HEADING in text:
        head, rest = text.split(ROOFLINE_HEADING, 1)
        tail = rest.split("\n## ", 1)
        return head + section + ("\n## " + tail[1] if len(tail) > 1 else "")
    marker = "## Decode steps the runs measured"
    head, rest = text.split(marker, 1) if marker in text else (text, None)
    return head + section + "\n" + (marker + rest if rest is not None else "")


def decode_step_check(case: str, rows: list[dict], shipped: dict) -> dict[int, dict]:
    """The timing model against the decode steps the run itself measured.

    A second of ``timeseries.csv`` with no prompt tokens and the same number of
    running requests as the second before ran decode-only steps of that batch:
    step = running / gen_throughput.  The running requests and their contexts
    at mid-second come from ``requests.jsonl`` (each request's tokens spread
    evenly between its first and last token), after aligning the two clocks
    by the running counts (the offset in -3..3 s that matches them best).  The
    model prices that decode batch with and without the attention skew term.

    Returns
    -------
    dict
        Per batch size: seconds used, median model / measured step ratio without
        and with the skew term, median longest / mean context.
    """
    import csv

    from simcore.timing.api import timing_arrays
    from simcore.timing.nb import pass_times_nb

    first = np.array([r["first_token_ts"] for r in rows])
    last = np.array([r["last_token_ts"] for r in rows])
    out = np.array([r["output_toks"] for r in rows])
    prompt = np.array([r["input_toks"] for r in rows])
    with open(os.path.join(case, "vllm", "timeseries.csv"), encoding="utf-8") as handle:
        ticks = [(float(r["t"]), float(r["prompt_throughput"]), float(r["gen_throughput"]), int(r["running"]))
                 for r in csv.DictReader(handle)]

    def active(tau):
        return (first <= tau) & (last >= tau)

    offsets = np.arange(-3.0, 3.0, 0.05)
    mismatch = [sum(abs(int(active(first.min() + t + off).sum()) - run) for t, _, _, run in ticks) for off in offsets]
    offset = offsets[int(np.argmin(mismatch))]
    plain = load_config(json.loads(json.dumps(shipped)))
    skewed_alpha = plain.timing.attention_skew_alpha
    shapes, batches = [], []
    for (_, _, _, before), (t, prompt_tps, gen_tps, running) in zip(ticks, ticks[1:]):
        tau = first.min() + t - 0.5 + offset
        now = active(tau)
        if prompt_tps != 0 or running != before or running == 0 or gen_tps == 0 or now.sum() != running:
            continue
        generated = 1 + (tau - first[now]) / np.maximum(last[now] - first[now], 1e-9) * (out[now] - 1)
        kv = np.rint(prompt[now] + generated).astype(np.int64) + 1  # computed + 1 per decode
        shapes.append((running, running / gen_tps * 1e3, kv.max() / kv.mean()))
        batches.append([0, 0, 0, running, int(kv.sum()), int(kv.max())])
    if not batches:
        return {}
    summaries = np.array(batches, dtype=np.int64)
    times = {}
    for label, alpha in (("plain", 0.0), ("skewed", skewed_alpha)):
        cfg = json.loads(json.dumps(shipped))
        cfg["timing"]["attention_skew_alpha"] = alpha
        model, params, table = timing_arrays(load_config(cfg).timing)
        times[label] = np.zeros(len(batches))
        pass_times_nb(model, params, table, summaries, times[label])
    result = {}
    for batch in sorted({s[0] for s in shapes}):
        sel = [i for i, s in enumerate(shapes) if s[0] == batch]
        step = np.array([shapes[i][1] for i in sel])
        result[batch] = {
            "seconds": len(sel),
            "measured_ms": float(np.median(step)),
            "plain": float(np.median(times["plain"][sel] / step)),
            "skewed": float(np.median(times["skewed"][sel] / step)),
            "spread": float(np.median([shapes[i][2] for i in sel])),
        }
    return result


ATTENTION_AXES = ("prefill_chunk", "kv_prefill", "n_decode", "kv_decode")


def interpolation_check(profile: str) -> dict[str, dict[str, float]]:
    """Leave-one-out on the profile's attention grid: each measured cell between two measured
    neighbours on one axis (others fixed, positive coordinates) predicted from them, linearly
    in the coordinate (the table model's rule) and linearly in its logarithm.

    Returns
    -------
    dict
        Per axis: cells, mean signed and mean absolute relative error of each rule.
    """
    import csv

    with open(os.path.join(profile, "attention.csv"), encoding="utf-8") as handle:
        grid = {tuple(int(r[a]) for a in ATTENTION_AXES): float(r["time_us"]) for r in csv.DictReader(handle)}
    result = {}
    for axis, name in enumerate(ATTENTION_AXES):
        lines: dict[tuple, dict[int, float]] = {}
        for key, value in grid.items():
            lines.setdefault(key[:axis] + key[axis + 1:], {})[key[axis]] = value
        errors: dict[str, list[float]] = {"linear": [], "log": []}
        for line in lines.values():
            xs = sorted(x for x in line if x > 0)
            for lo, mid, hi in zip(xs, xs[1:], xs[2:]):
                for rule, t in (("linear", (mid - lo) / (hi - lo)),
                                ("log", np.log(mid / lo) / np.log(hi / lo))):
                    errors[rule].append(((1 - t) * line[lo] + t * line[hi]) / line[mid] - 1)
        result[name] = {"cells": len(errors["linear"])}
        for rule, values in errors.items():
            result[name][f"{rule}_mean"] = float(np.mean(values))
            result[name][f"{rule}_abs"] = float(np.mean(np.abs(values)))
    return result


def _graphs_note(graphs: list[int] | str | None) -> str:
    if isinstance(graphs, list):
        return f"{len(graphs)} sizes {graphs[0]}..{graphs[-1]}"
    return str(graphs)


def calibrate_case(path: str, shipped: dict, tp: int, loss: str, ep_ranks: int = 1) -> dict:
    """Fit the scales, the overhead and (TP > 1, or expert parallelism over DP ranks) the link
    bandwidth on the run's first half."""
    from runners import calibrate as cal

    names = ["timing.prefill_scale", "timing.decode_scale", "timing.pass_overhead_us"]
    if tp > 1:
        names.append("timing.allreduce.bandwidth_gb_per_second")
    if ep_ranks > 1:
        names.append("timing.moe.alltoall.bandwidth_gb_per_second")
    overrides = {key: value for key, value in shipped.items() if key in ("engine", "timing")}
    if "source" in shipped.get("workload", {}):  # the prompts' trace
        overrides["workload"] = {k: v for k, v in shipped["workload"].items() if k != "num_requests"}
    start = time.perf_counter()
    fit = cal.parse_fit(names)
    found = cal.calibrate(cal.read_measured(path), overrides, fit, fit_fraction=0.5, loss=loss, seed=0)
    # a value on the edge of its search range: the optimum may lie beyond it
    on_bound = [key for key, low, high in fit if min(found.values[key] - low, high - found.values[key]) <= 1e-3 * (high - low)]
    return {"values": found.values, "report": found.report, "seconds": time.perf_counter() - start,
            "load": os.getloadavg()[0],  # the machine may be shared: its load beside the wall time
            "evaluations": found.evaluations, "on_bound": {key: (low, high) for key, low, high in fit if key in on_bound}}


def _replays(configs: list[dict], measured) -> list[tuple[object, dict[str, np.ndarray]]]:
    """Each config replayed on the measured run's workload (its ``requests.jsonl`` lengths, or the
    trace with the prompts' shared blocks that the configs name), with its per-request latencies
    in the measured order."""
    from runners import calibrate as cal

    requests, rows_of = cal.replay_inputs(configs[0], measured)
    results = simcore.run_batch(configs, requests=requests)
    return [(r, cal.predicted_latency(r, rows_of)) for r in results]


def _requests(cfg: dict, table: pa.Table) -> pa.Table | None:
    """The lengths-only request table, unless ``cfg`` names a workload (the prompts' trace)."""
    return None if "source" in cfg.get("workload", {}) else table


#: The step of each fitted parameter in :func:`part_sensitivity` (factor, or added us).
OVERHEAD_STEP_US = 1000.0
SCALE_STEP = 1.1


def part_sensitivity(path: str, shipped: dict, values: dict[str, float]) -> dict[str, dict]:
    """How each part's mean TTFT and TPOT move when one fitted parameter steps from its fitted
    value (scales and bandwidth x :data:`SCALE_STEP`, the overhead + :data:`OVERHEAD_STEP_US`),
    and the share of each part's output tokens emitted by passes that also computed prompt tokens.

    Where the two parts answer the steps in other proportions, parameter sets that the fit
    part cannot tell apart predict the held-out part differently.
    """
    from runners import calibrate as cal

    measured = cal.read_measured(path)
    n = len(measured.request_id)
    parts = {"fit": slice(0, n // 2), "held_out": slice(n // 2, n)}

    steps = {key: value + OVERHEAD_STEP_US if key == "timing.pass_overhead_us" else value * SCALE_STEP
             for key, value in values.items()}
    fitted_cfg = dict(_with_values(shipped, values), output={"passes": True, "tokens": True})
    fitted = simcore.run(fitted_cfg, requests=_requests(fitted_cfg, measured.requests_table()))
    passes = fitted.passes
    mixed_ends = passes["end_ms"].to_numpy()[passes["prefill_tokens"].to_numpy() > 0]
    part_of = {rid: "fit" if i < n // 2 else "held_out" for i, rid in enumerate(measured.request_id)}
    token_part = np.array([part_of[rid] for rid in fitted.tokens["request_id"].to_pylist()])
    in_mixed = np.isin(fitted.tokens["emitted_ms"].to_numpy(), mixed_ends)
    mixed_share = {part: float(in_mixed[token_part == part].mean()) for part in parts}
    configs = [_with_values(shipped, values)]
    configs += [_with_values(shipped, dict(values, **{key: stepped})) for key, stepped in steps.items()]
    means = [{part: cal.part_metrics(latency, rows) for part, rows in parts.items()}
             for _, latency in _replays(configs, measured)]
    return {
        "mixed_share": mixed_share,
        "steps": {
            key: {"from": values[key], "to": steps[key], "moved": {
                part: {name: means[i + 1][part][name] / means[0][part][name] - 1 for name in ("mean_ttft_ms", "mean_tpot_ms")}
                for part in parts}}
            for i, key in enumerate(steps)
        },
    }


def _with_values(shipped: dict, values: dict[str, float]) -> dict:
    """A copy of the as-shipped config with fitted ``values`` (dotted keys) set."""
    from runners import calibrate as cal

    cfg = json.loads(json.dumps(shipped))
    for key, value in values.items():
        cal.set_dotted(cfg, key, value)
    return cfg


def cross_losses(path: str, shipped: dict, calibrations: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Each loss's fitted values scored by every loss on the fit part: {fitted with: {loss: value}}."""
    from runners import calibrate as cal

    measured = cal.read_measured(path)
    n = len(measured.request_id)
    configs = [_with_values(shipped, c["values"]) for c in calibrations.values()]
    return {
        fitted: {loss: cal.loss_value(loss, latency, measured, slice(0, n // 2)) for loss in cal.LOSSES}
        for fitted, (_, latency) in zip(calibrations, _replays(configs, measured))
    }


def preemption_check(case: str, rows: list[dict], shipped: dict, requests: pa.Table) -> dict | None:
    """Preemption and recompute of the as-shipped replay, per part, against what the run shows.

    The run's files do not count preemptions (``timeseries.csv``'s prompt throughput sums to
    the prompt tokens exactly: a recomputed prompt is not counted again), but each second gives
    the requests preempted and waiting: admitted (``scheduled_ts``) - finished - running. The
    replay gives the same from its passes, its preemptions per request, its recomputed tokens
    (prefill tokens computed - prompt tokens not found cached at first admission; also without
    generated-block caching) and, from the emission gaps (a request preempted k times: its k
    longest), the tokens each had generated when preempted, which vLLM, hashing full blocks of
    generated tokens too, finds again on readmission where they were not evicted (as the replay
    does with ``cache_generated_blocks``). None when the replay preempts nothing.
    """
    import csv

    cfg = json.loads(json.dumps(shipped))
    cfg["output"] = {"passes": True, "tokens": True}
    result = simcore.run(cfg, requests=_requests(cfg, requests))
    table = result.requests.to_pydict()
    preemptions = np.array(table["num_preemptions"])
    if not preemptions.any():
        return None
    passes = result.passes.to_pydict()
    prompts = np.array(table["input_tokens"])
    n = len(prompts)
    # the fit part: the first half by send instant, as replaysim-calibrate splits
    by_send = np.argsort(np.array(table["send_ms"], dtype=np.float64), kind="stable")
    part_of = np.empty(n, dtype=object)
    part_of[by_send[: n // 2]] = "fit"
    part_of[by_send[n // 2:]] = "held_out"
    order = {rid: i for i, rid in enumerate(table["request_id"])}
    emitted: dict[int, list[tuple[int, float]]] = {}
    for rid, index, at in zip(result.tokens["request_id"].to_pylist(), result.tokens["index"].to_pylist(),
                              result.tokens["emitted_ms"].to_pylist()):
        emitted.setdefault(order[rid], []).append((index, at))
    generated_at_preemption = np.zeros(n, dtype=np.int64)
    for i in np.flatnonzero(preemptions):
        times = np.array([at for _, at in sorted(emitted[i])])
        longest = np.argsort(np.diff(times))[-preemptions[i]:]
        generated_at_preemption[i] = int(np.sum(longest + 1))  # tokens emitted before each gap
    start = np.array(passes["start_ms"])
    running = np.array(passes["num_prefill"]) + np.array(passes["num_decode"])
    admitted = np.sort(np.array(table["first_admit_ms"], dtype=np.float64))
    finished = np.sort(np.array(table["last_token_ms"], dtype=np.float64))
    waiting = np.searchsorted(admitted, start, "right") - np.searchsorted(finished, start, "right") - running
    span = np.diff(np.append(start, passes["end_ms"][-1])) / 1e3
    with open(os.path.join(case, "vllm", "timeseries.csv"), encoding="utf-8") as handle:
        ticks = [(float(r["t"]), int(r["running"])) for r in csv.DictReader(handle)]
    queued0 = min(r["queued_ts"] for r in rows)
    run_admitted = np.sort([r["scheduled_ts"] for r in rows])
    run_finished = np.sort([r["last_token_ts"] for r in rows])
    run_waiting = [np.searchsorted(run_admitted, queued0 + t, "right") - np.searchsorted(run_finished, queued0 + t, "right") - run
                   for t, run in ticks]
    parts = {part: part_of == part for part in ("fit", "held_out")}
    without = json.loads(json.dumps(cfg))
    without["engine"]["aggregated"]["cache_generated_blocks"] = False
    without_result = simcore.run(without, requests=_requests(without, requests))
    return {
        "preemptions": {part: int(preemptions[rows_].sum()) for part, rows_ in parts.items()},
        "preempted_requests": {part: int((preemptions[rows_] > 0).sum()) for part, rows_ in parts.items()},
        "generated_at_preemption": {part: int(generated_at_preemption[rows_].sum()) for part, rows_ in parts.items()},
        # every readmission recomputing all it knew: its prompt and the outputs before the preemption
        "recompute_bound": int(np.sum(prompts * preemptions) + generated_at_preemption.sum()),
        "recomputed_tokens": _recomputed_tokens(result),
        "recomputed_tokens_without_generated": _recomputed_tokens(without_result),
        "prompt_tokens": int(prompts.sum()),
        "replay_waiting_request_s": float(np.sum(np.clip(waiting, 0, None) * span)),
        "run_waiting_request_s": float(np.sum(np.clip(run_waiting, 0, None))),  # one-second ticks
        "replay_waiting_max": int(waiting.max()),
        "run_waiting_max": int(max(run_waiting)),
    }


def _recomputed_tokens(result) -> int:
    """Prompt tokens computed beyond each prompt once, less its cached tokens at first admission."""
    table = result.requests.to_pydict()
    return int(np.sum(result.passes["prefill_tokens"].to_numpy()) - np.sum(table["input_tokens"])
               + np.nansum(np.array(table["cached_tokens"], dtype=np.float64)))


#: Issue 12's targets: |error| of the mean, per metric, for a column.
TARGETS = {"as shipped": {"ttft": 0.06, "tpot": 0.03, "e2el": 0.04},
           "calibrated held out": {"ttft": 0.05, "tpot": 0.02, "e2el": 0.03}}
#: Issue 28's targets for the MoE run with expert parallelism (its label names ``EP``).
TARGETS_MOE = {"as shipped": {"ttft": 0.08, "tpot": 0.015, "e2el": 0.02},
               "calibrated held out": {"ttft": 0.05, "tpot": 0.01, "e2el": 0.015}}


def calibrated_error(res: dict, loss: str, part: str, name: str) -> float | None:
    """The relative error of metric ``name`` on ``part`` (fit, held_out) of the fit with ``loss``."""
    report = (res.get("calibrations") or {}).get(loss, {}).get("report", {})
    return report.get(part, {}).get("calibrated", {}).get(name, {}).get("error")


def _target_misses(results: list[dict], loss: str, columns: tuple[str, ...] = tuple(TARGETS),
                   targets: dict = TARGETS) -> str:
    """The runs and metrics that miss issue 12's targets (calibrated: the fit with ``loss``), as a sentence."""
    misses = []
    for res in results:
        for column in columns:
            for key, label in METRICS:
                name = f"mean_{key}_ms"
                if column == "as shipped":
                    error = rel(res["predicted"].get("table"), name, res["measured"][name])
                else:
                    error = calibrated_error(res, loss, "held_out", name)
                if error is not None and abs(error) > targets[column][key]:
                    misses.append(f"{res['run']} {column} mean {label} {pct(error)}")
    return "Missed: " + "; ".join(misses) + "." if misses else "All met."


def _fitted_values(c: dict) -> str:
    """A calibration's fitted values, those on the edge of their search range marked."""
    return ", ".join(
        f"`{k}` = {v:.4g}" + (f" (at its search bound, range {c['on_bound'][k][0]:g}..{c['on_bound'][k][1]:g})"
                              if k in c.get("on_bound", {}) else "")
        for k, v in c["values"].items()
    )


def _loss_section(results: list[dict], default: str) -> list[str]:
    """Every loss's fit of every run: mean errors on both parts, and the held-out target misses."""
    losses = list(dict.fromkeys(loss for res in results for loss in res.get("calibrations") or {}))
    if not losses:
        return []
    lines = [
        "",
        "## Calibration losses",
        "",
        f"The calibrated columns use `replaysim-calibrate`'s default loss, `{default}` "
        "(`runners/calibrate.py` docstring). `quantiles` compares each metric's sorted values (the "
        "i-th smallest predicted TTFT with the i-th smallest measured one: a squared 2-Wasserstein "
        "distance between the distributions, per metric over the sum of squared measured values); "
        "`requests` is the same least squares request by request, unsorted, and was the default "
        "before it; `bench` weighs the fit part's mean, median and p90 of TTFT, TPOT and E2E alike "
        "(nine squared relative errors, what `vllm bench serve` reports of each metric), `summary` "
        "the means and p90s alone. Paired least squares is least where the predicted spread of a "
        "metric is r times the measured one, r being the request-by-request correlation (the "
        "third table below): where the replay cannot tell which requests a real engine preempts or "
        "queues, it buys a smaller spread with a biased mean. `quantiles` became the default for "
        "that reason and for its fit-part figures, decided before its held-out figures were "
        "computed, while the replay still gave every prompt blocks of its own: there the RTX 4090 "
        "run's per-request TPOT correlated with the measured at r = 0.76 and the fit part's mean "
        "TPOT was -2.1% with `requests`, -0.9% with `quantiles` (held out -2.5% and +0.3%). With "
        "the prompts' shared blocks r is 1.00 there and the two losses fit alike. "
        "Each loss below fits the same parameters on the same fit part with the same optimiser "
        "budget and seed.",
        "",
        "| run | loss | fit mean TTFT | fit mean TPOT | fit mean E2E | held out mean TTFT | held out mean TPOT | held out mean E2E |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for res in results:
        for loss in res.get("calibrations") or {}:
            cells = [pct(calibrated_error(res, loss, part, f"mean_{key}_ms"))
                     for part in ("fit", "held_out") for key, _ in METRICS]
            name = f"`{loss}`" + (" (default)" if loss == default else "")
            lines.append(f"| {res['run']} | {name} | " + " | ".join(cells) + " |")
    lines.append("")
    for loss in losses:
        held_out = [[abs(e) for res in results if (e := calibrated_error(res, loss, "held_out", f"mean_{key}_ms")) is not None]
                    for key, _ in METRICS]
        mae = ", ".join(f"{label} {100 * float(np.mean(e)):.1f}%" for (_, label), e in zip(METRICS, held_out) if e)
        lines.append(f"- `{loss}`, held out, mean absolute error of the means over the runs: {mae}; against the "
                     "targets (<= 5% / 2% / 3%): " + _target_misses(results, loss, ("calibrated held out",)))
    lines += [
        "",
        "Each fit scored by every loss on the fit part; beside, the fit part's measured mean and median TTFT. "
        + _optimiser_shortfalls(results, losses) + " A "
        "relative error weighs a small statistic as much as a large one: where the fit part's "
        "median TTFT is far below its mean (most of its requests admitted at once, after one "
        "prefill), a few ms on the median cost `bench` as much as several percent of a mean.",
        "",
        "| run | fitted with | " + " | ".join(f"`{loss}` loss" for loss in losses)
        + " | fit part mean TTFT ms | median TTFT ms |",
        "| --- | --- | " + " | ".join("---:" for _ in losses) + " | ---: | ---: |",
    ]
    for res in results:
        report = (res.get("calibrations") or {}).get(default, {}).get("report", {}).get("fit", {}).get("calibrated", {})
        for fitted, scores in (res.get("cross_losses") or {}).items():
            cells = [f"{scores[loss]:.5f}" for loss in losses]
            cells += [f"{report[k]['measured']:,.1f}" if k in report else "n/a" for k in ("mean_ttft_ms", "p50_ttft_ms")]
            lines.append(f"| {res['run']} | `{fitted}` | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Request by request on the fit part: the correlation r of predicted and measured values and "
        "the predicted spread over the measured one (standard deviations), as shipped and for each "
        "loss's fit. Paired least squares (`requests`) is least at spread = r.",
        "",
        "| run | replay | " + " | ".join(f"{label} r | {label} spread" for _, label in METRICS) + " |",
        "| --- | --- | " + " | ".join("---: | ---:" for _ in METRICS) + " |",
    ]
    for res in results:
        for name, metrics in (res.get("pairing") or {}).items():
            cells = [f"{metrics[f'{key}_ms']['r']:.2f} | {metrics[f'{key}_ms']['spread']:.2f}" for key, _ in METRICS]
            label = name if name == "as shipped" else f"`{name}` fit"
            lines.append(f"| {res['run']} | {label} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"How each part's mean TTFT and TPOT move when one parameter of the `{default}` fit steps from "
        f"its fitted value (scales and bandwidth x{SCALE_STEP:g}, the overhead +{OVERHEAD_STEP_US:g} us). "
        "The fit part pins only the combinations of the parameters it answers to; where the held-out "
        "part answers the steps in other proportions (its requests run in other batches: the last "
        "column gives the share of each part's output tokens emitted by passes that also computed "
        "prompt tokens, fit / held out), parameters that fit the first part alike predict the "
        "second differently.",
        "",
        "| run | step | fit mean TTFT | fit mean TPOT | held out mean TTFT | held out mean TPOT | tokens in mixed passes |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for res in results:
        sens = res.get("sensitivity") or {"steps": {}}
        for key, step in sens["steps"].items():
            moved = step["moved"]
            cells = [pct(moved[part][name]) for part in ("fit", "held_out") for name in ("mean_ttft_ms", "mean_tpot_ms")]
            share = sens["mixed_share"]
            cells.append(f"{share['fit']:.0%} / {share['held_out']:.0%}")
            lines.append(f"| {res['run']} | `{key}` {step['from']:.4g} -> {step['to']:.4g} | " + " | ".join(cells) + " |")
    lines += _preemption_lines(results)
    return lines


def _optimiser_shortfalls(results: list[dict], losses: list[str]) -> str:
    """Where another loss's fit scores lower on a loss than that loss's own fit, as a sentence."""
    found = []
    for res in results:
        scores = res.get("cross_losses") or {}
        for loss in losses:
            if loss not in scores:
                continue
            for fitted, row in scores.items():
                if fitted != loss and row[loss] < scores[loss][loss]:
                    found.append(f"on {res['run']} the `{fitted}` fit scores {row[loss]:.5f} on the `{loss}` "
                                 f"loss, its own fit {scores[loss][loss]:.5f}")
    if not found:
        return "Each loss's own fit scores lowest on it."
    return ("The optimiser stopped short of a loss's minimum within its budget where another fit scores lower "
            "on it: " + "; ".join(found) + ".")


def _preemption_lines(results: list[dict]) -> list[str]:
    """The replays that preempt: preemption and recompute per part against the run."""
    lines = []
    for res in results:
        p = res.get("preemption")
        if not p:
            continue
        lines += [
            "",
            f"Preemption in the as-shipped replay of {res['run']} (`preemption_check` in "
            f"`bench/accuracy.py`): fit part {p['preemptions']['fit']} preemptions of "
            f"{p['preempted_requests']['fit']} requests, held out {p['preemptions']['held_out']} of "
            f"{p['preempted_requests']['held_out']}; {p['recomputed_tokens']:,} prompt and generated "
            f"tokens recomputed ({p['recomputed_tokens'] / p['prompt_tokens']:.1%} of the "
            f"{p['prompt_tokens']:,} prompt tokens; without generated-block caching "
            f"{p['recomputed_tokens_without_generated']:,}, "
            f"{p['recomputed_tokens_without_generated'] / p['prompt_tokens']:.1%}). Requests preempted and waiting, summed over time: "
            f"replay {p['replay_waiting_request_s']:,.0f} request-s (at most {p['replay_waiting_max']} at once), "
            f"run {p['run_waiting_request_s']:,.0f} request-s (at most {p['run_waiting_max']}; per second of "
            "`timeseries.csv`, admitted - finished - running; replay / run "
            + (f"{p['replay_waiting_request_s'] / p['run_waiting_request_s']:.2f}" if p["run_waiting_request_s"] else "n/a")
            + "). The run's files do not say how many tokens it recomputed (its prompt throughput "
            "counts each prompt once). Of the replay's recompute, the tokens generated before each "
            f"preemption: fit part {p['generated_at_preemption']['fit']:,}, held out "
            f"{p['generated_at_preemption']['held_out']:,}. vLLM hashes the full blocks of generated "
            "tokens too and finds those not evicted meanwhile again on readmission, and so does the "
            "as-shipped replay (`cache_generated_blocks`, `docs/prefix-caching.md`).",
        ]
        lines += _generated_block_lines(res, p)
    return lines


def _generated_block_lines(res: dict, p: dict) -> list[str]:
    """What generated-block caching changed on a run that preempts, and what is left of a missed
    calibrated held-out target there, as prose with the run's own figures."""
    bound, recomputed = p["recompute_bound"], p["recomputed_tokens"]
    saved = p["recomputed_tokens_without_generated"] - recomputed
    generated = sum(p["generated_at_preemption"].values())
    text = (
        f"Generated-block caching changes the recompute by {-saved:+,} tokens, of the {generated:,} "
        "outputs generated before the preemptions. Had every readmission recomputed all it knew "
        f"(its prompt and those outputs) the replay would recompute {bound:,} tokens; readmissions "
        f"find {bound - recomputed:,} of them again."
    )
    if saved < 0.05 * generated:
        text += (
            " Almost all are prompt tokens: a request's blocks are freed last first (vLLM's "
            "`KVCacheManager.free`, the replay alike), so its generated blocks, the tail of its "
            "chain, are the first of them the LRU queue evicts, and a block is of no use once one "
            "before it is evicted; on a cache this full they are gone before the request returns. "
            "The finished requests' generated blocks, cached too, take LRU places that were free "
            "before."
        )
    fits = res.get("calibrations") or {}
    without = res.get("calibration_without_generated")
    if without and fits:
        loss = next(iter(fits))
        held = lambda fit, name: fit["report"]["held_out"]["calibrated"][f"mean_{name}_ms"]["error"]  # noqa: E731
        text += (
            f" The `{loss}` fit without generated-block caching: held out mean TTFT "
            f"{pct(held(without, 'ttft'))}, TPOT {pct(held(without, 'tpot'))}, E2E {pct(held(without, 'e2el'))}; "
            f"with it {pct(held(fits[loss], 'ttft'))}, {pct(held(fits[loss], 'tpot'))}, "
            f"{pct(held(fits[loss], 'e2el'))}."
        )
        limit = TARGETS["calibrated held out"]["tpot"]
        tpot_held = held(fits[loss], "tpot")
        if abs(tpot_held) > limit:
            fit_part = fits[loss]["report"]["fit"]["calibrated"]
            tpot_fit = fit_part["mean_tpot_ms"]["error"]
            others = [(other, held(fit, "tpot")) for other, fit in fits.items() if other != loss]
            whose = "the fit does better"
            if abs(tpot_fit) >= abs(tpot_held) / 2:
                whose = "most of the miss is the fit's own"
            text += (
                f" The held-out mean TPOT still misses its target ({pct(tpot_held)}, target "
                f"|error| <= {limit:.0%}), and {whose}: on the part it "
                f"fits, the `{loss}` fit gives mean TPOT {pct(tpot_fit)} beside mean TTFT "
                f"{pct(fit_part['mean_ttft_ms']['error'])} and E2E {pct(fit_part['mean_e2el_ms']['error'])} "
                "(the loss weighs each request's TTFT, TPOT and E2E together: this is where its fit "
                "on that part lands); "
                f"the parts differ by {abs(tpot_held - tpot_fit) * 100:.1f} points, the fit part having "
                f"{p['preemptions']['fit']} preemptions and {p['generated_at_preemption']['fit']:,} "
                f"outputs generated before them, the held-out part {p['preemptions']['held_out']} and "
                f"{p['generated_at_preemption']['held_out']:,}."
            )
            if others:
                text += " Held out, the fits of the other losses give mean TPOT " + ", ".join(
                    f"{pct(error)} (`{other}`)" for other, error in others) + "."
    return ["", text]


def _step(results: list[dict], run: str, batch: int, key: str) -> str:
    """A decode-step figure of the run whose name starts with ``run``, as prose."""
    for res in results:
        d = (res.get("decode_steps") or {}).get(batch)
        if res["run"].startswith(run) and d:
            if key == "spread":
                return f"{d[key]:.1f} x"
            ratio = d[key] - 1
            return f"{100 * abs(ratio):.1f}% {'over' if ratio > 0 else 'under'}"
    return "(not measured)"


def pct(x: float | None) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{100 * x:+.1f}%"


def rel(summary: dict | None, key: str, meas: float) -> float | None:
    if summary is None or summary.get(key) is None:
        return None
    return summary[key] / meas - 1


def render(results: list[dict], versions: dict) -> str:
    from runners.calibrate import DEFAULT_LOSS

    lines = [
        "# Accuracy against measured vLLM runs",
        "",
        "Generated by `python bench/accuracy.py` (do not edit by hand; rerun it). "
        "Data: `shared/data/llmservingsim-vllm-bench` (LLMServingSim's measured vLLM 0.19.0 runs: "
        "300 ShareGPT requests at ~10 req/s, fixed output lengths, in-process `AsyncLLM`). "
        "Each run is replayed with its own arrival times, lengths, `max_num_seqs`, "
        "`max_num_batched_tokens` = 2048, block size 16 and KV capacity. "
        "Error = (predicted - measured) / measured.",
        "",
        "Columns: **before**: `timing.type=table` as the tree gave it before TP all-reduce and "
        "asynchronous scheduling (synchronous scheduling, no communication time); **as shipped**: "
        "`table` with each run's own stated parameters and nothing fitted (at TP2 the ring "
        "all-reduce on the link of the run's `config.json`; asynchronous scheduling, prefix "
        "caching (generated blocks included), whole-sequence admission and CUDA-graph padding as "
        "the run's vLLM had them; the prompts' shared leading blocks from the run's own workload "
        "file; "
        "the decode-attention skew fit of the profile's own `meta.yaml`); **aic**: aiconfigurator-core's database with the same engine settings and prompts and, "
        "at TP2, the same stated link in place of the database's all-reduce; the MoE run (DP2, expert "
        "parallelism) as shipped: its profile's `moe.csv` with the model's 128 experts and top 8, the "
        "two DP ranks stepping together (dummy batches, DP padding; `docs/semantics.md`, \"Expert "
        "parallelism\"), each MoE layer's dispatch and combine on the link of its `config.json`, "
        "requests balanced over the ranks by `rank_policy: least_loaded`, no `before` column (the tree "
        "had no MoE timing); **calibrated**: `replaysim-calibrate`'s fit of `timing.prefill_scale`, "
        "`timing.decode_scale`, `timing.pass_overhead_us` (and at TP2 "
        "`timing.allreduce.bandwidth_gb_per_second`, for the MoE run "
        "`timing.moe.alltoall.bandwidth_gb_per_second`) to the first 150 requests by send instant "
        "(fit part), scored on them and on the other 150 (held out; their own measured values), "
        f"with its default loss `{DEFAULT_LOSS}` (below, [Calibration losses](#calibration-losses), "
        "every loss it offers); "
        "**LLMServingSim**: its own published errors on the same runs (`bench/<gpu>/<model>/"
        "validation_summary.txt` of the data set, from LLMServingSim's `bench/examples/*/validation/"
        "summary.txt`).",
        "",
        f"Versions: replaysim timing layout {versions['layout']}, aiconfigurator-core {versions['aic']}.",
        "",
        "| run | metric | measured ms | before | as shipped ms | as shipped | aic | calibrated fit | calibrated held out | LLMServingSim |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    maes: dict[str, dict[str, list[float]]] = {}
    for res in results:
        m = res["measured"]
        for key, label in METRICS:
            for stat in ("mean", "p90"):
                k = f"{stat}_{key}_ms"
                shipped = res["predicted"].get("table")
                errors = {
                    "before": rel(res["predicted"].get("before"), k, m[k]),
                    "as shipped": rel(shipped, k, m[k]),
                    "aic": rel(res["predicted"].get("aic"), k, m[k]),
                    "calibrated fit": calibrated_error(res, DEFAULT_LOSS, "fit", k),
                    "calibrated held out": calibrated_error(res, DEFAULT_LOSS, "held_out", k),
                    "LLMServingSim": res["llmservingsim"].get(k),
                }
                if stat == "mean":
                    for column, value in errors.items():
                        if value is not None:
                            maes.setdefault(column, {}).setdefault(label, []).append(abs(value))
                cells = [res["run"], f"{stat} {label}", f"{m[k]:,.1f}", pct(errors["before"]),
                         "n/a" if shipped is None else f"{shipped[k]:,.1f}"]
                cells += [pct(errors[c]) for c in ("as shipped", "aic", "calibrated fit", "calibrated held out", "LLMServingSim")]
                lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Mean absolute error of the means, over the runs",
        "",
        "| column | runs | mean TTFT | mean TPOT | mean E2E |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for column in ("before", "as shipped", "aic", "calibrated fit", "calibrated held out", "LLMServingSim"):
        if column not in maes:
            continue
        runs = len(maes[column]["TTFT"])
        cells = [f"{100 * float(np.mean(maes[column][label])):.1f}%" for _, label in METRICS]
        lines.append(f"| {column} | {runs} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Targets (issue 12): as shipped, every run: |error| of mean TTFT <= 6%, mean TPOT <= 3%, "
        "mean E2E <= 4%; calibrated, held out: <= 5% / 2% / 3%. "
        + _target_misses(results, DEFAULT_LOSS),
        "",
    ]
    moe_runs = [res for res in results if " EP" in res["run"]]
    if moe_runs:
        lines += [
            "Targets (issue 28, the MoE run with expert parallelism): as shipped |error| of mean TTFT <= 8%, "
            "mean TPOT <= 1.5%, mean E2E <= 2%; calibrated, held out: <= 5% / 1% / 1.5%. "
            + _target_misses(moe_runs, DEFAULT_LOSS, targets=TARGETS_MOE),
            "",
        ]
    lines += _loss_section(results, DEFAULT_LOSS)
    lines += ["", *roofline_section(results)]
    lines += [
        "## Decode steps the runs measured",
        "",
        "Seconds of each run's `timeseries.csv` with no prompt tokens and the same number of "
        "running requests as the second before: decode-only steps of that batch, step = running / "
        "generated tokens per second. The running requests' contexts at mid-second come from "
        "`requests.jsonl` (tokens spread evenly between a request's first and last token; the "
        "two clocks aligned by the running counts). Ratio = the as-shipped timing model's step / "
        "the measured one, median over the seconds.",
        "",
        "| run | batch | seconds | measured step ms | model / measured, no skew term | with it | longest / mean context |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for res in results:
        for batch, d in (res.get("decode_steps") or {}).items():
            lines.append(
                f"| {res['run']} | {batch} | {d['seconds']} | {d['measured_ms']:.2f} | {d['plain']:.3f} | "
                f"{d['skewed']:.3f} | {d['spread']:.2f} |"
            )
    lines += [
        "",
        "## Interpolation between measured shapes",
        "",
        "Leave-one-out on each profile's attention grid (the profile of each run): every measured "
        "cell that has measured neighbours on both sides along one axis (the other three fixed, "
        "positive coordinates) is predicted from those two, linearly in the coordinate (the "
        "`table` model's rule, `docs/timing.md`) or linearly in its logarithm (the profiler "
        "sweeps every axis geometrically). Mean signed / mean absolute relative error.",
        "",
        "| profile | axis | cells | linear | linear abs | log | log abs |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for res in results:
        for axis, d in (res.get("interpolation") or {}).items():
            lines.append(
                f"| {res['run']} | `{axis}` | {d['cells']:,} | {pct(d['linear_mean'])} | {100 * d['linear_abs']:.1f}% | "
                f"{pct(d['log_mean'])} | {100 * d['log_abs']:.1f}% |"
            )
    lines += [
        "",
        "Attention is close to linear in each coordinate (decode attention reads KV in "
        "proportion to `n_decode x kv_decode`), so the model's piecewise-linear rule is the one "
        "the grid supports; a log-coordinate blend overprices every axis. Dense ops and "
        "`lm_head`/`sampler` are measured at every count to 16, every 4 to 64 and every 16 "
        "beyond (to 2048 tokens, 256 sequences): knots close enough that the rule matters "
        "little there.",
        "",
        "## Setup per run",
        "",
    ]
    for res in results:
        lines.append(
            f"- **{res['run']}**: {res['requests']} requests, max_num_seqs {res['max_num_seqs']}, "
            f"KV {res['blocks']:,} blocks of 16 ({res['blocks_source']})."
        )
        for loss, c in (res.get("calibrations") or {}).items():
            lines.append(f"  - calibrated, `--loss {loss}`: {_fitted_values(c)} "
                         f"({c['evaluations']} candidates, {c['seconds']:.0f} s at a load average of {c['load']:.1f})")
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
        "- What the TP1 errors were (the per-run notes above give each behaviour's share). RTX "
        "4090: the run is KV-bound (2,588 blocks; ~30-45 running, the cache ~99% full in "
        "`timeseries.csv`) and preempts; without prefix caching a resumed request recomputed "
        "its whole prompt, while the run's vLLM (`enable_prefix_caching: true`) finds its own "
        "freed prompt blocks again when they were not evicted; whole-sequence admission "
        "(`scheduler_reserve_full_isl: true`) admits fewer prompts that would preempt others. "
        f"RTX PRO 6000: no KV pressure, 128 running for most of the run; the decode-step table "
        f"shows the profile priced a 128-decode step {_step(results, 'RTXPRO6000 Llama', 128, 'plain')} "
        f"the measured one, but a 1-decode step {_step(results, 'RTXPRO6000 Llama', 1, 'plain')}: not "
        f"a uniform eager-against-graph gap, but the spread of contexts in a large batch (longest "
        f"{_step(results, 'RTXPRO6000 Llama', 128, 'spread')} the mean), which the profile, measured "
        f"at one context per batch, prices at the mean; with the profiler's own skew fit the "
        f"128-decode step is {_step(results, 'RTXPRO6000 Llama', 128, 'skewed')} the measured one.",
        "- The profiles were taken with `enforce_eager` (no CUDA graphs) while the serving runs "
        "replayed CUDA graphs (FULL for decode batches, PIECEWISE for mixed ones: the RTX 4090 "
        "run's `cudagraph_mode` [2, 1]). The as-shipped column pads every pass of at most the "
        "largest capture size to the next size (`timing.cuda_graph_sizes`, `docs/semantics.md`). "
        f"The decode-step table bounds what graph replay saves at small batches: the eager "
        f"profile prices the RTX PRO 6000 Llama 1-decode step {_step(results, 'RTXPRO6000 Llama', 1, 'plain')} "
        f"the measured one; Qwen3-32B TP2 {_step(results, 'RTXPRO6000 Qwen3', 1, 'plain')} (with "
        f"the stated 20 us per all-reduce, 128 of them a step, 2.56 ms); the RTX 4090 at 15-16 "
        f"decodes {_step(results, 'RTX4090', 16, 'plain')} (its profile has no skew fit).",
        "- The skew term uses the profile's pooled fit (`alpha_default`); its per-bucket "
        "table (`skew_fit.csv`, by chunk, batch, skew rate, longest context and prefix) is not "
        "in the shared data set. The RTX 4090 profile has no skew fit (`skew_fit.enabled: "
        "false`), so its runs get none.",
        "- TP2: the per-GPU profile has no communication; the as-shipped column adds two ring "
        "all-reduces per layer of tokens x 5120 x 2 bytes on the link the run's `config.json` "
        "states (16 GB/s, 20 us); so do the aic rows, in place of aiconfigurator-core's own "
        "all-reduce figures.",
        "- aiconfigurator-core has no vLLM 0.19.0 GEMM/attention data for the RTX PRO 6000 "
        "(its current vLLM data is 0.24.0), so the aic rows compare a newer vLLM's kernels with "
        "a 0.19.0 run.",
        "- Asynchronous scheduling is modelled with zero host time (`docs/semantics.md`); "
        "per-step host time appears only as the calibrated `timing.pass_overhead_us`. vLLM's "
        "source has no host-cost constants (scheduling, input preparation, the sampler's "
        "host side and output processing are measured, not stated), and under asynchronous "
        "scheduling (all three runs) they overlap the GPU step; the runs' files give no "
        "per-step timing, so no host term enters the as-shipped column.",
        "- Prefix caching is on as in the runs (`enable_prefix_caching`, vLLM's default; the "
        "RTX 4090 file states it). The request files carry only lengths, but the runs' "
        "workloads (`meta.json` `dataset_path`, LLMServingSim's ShareGPT files, whose SHA-256 "
        "is the stated `dataset_hash`) make each turn of a conversation a prompt that holds "
        "the turns before it: 32 of the 300 prompts begin with whole blocks of an earlier one "
        "(7.6% of the prompt tokens with the Llama tokenizer, 7.9% with Qwen's). The "
        "as-shipped replay gives those prompts the same leading blocks "
        "(`bench/prompt_prefixes.py`, `bench/data/prompt_prefixes/`), so a later turn finds "
        "its conversation's blocks cached where they were not evicted, as the run's vLLM did; "
        "the calibration replays the same trace. Prefix caching also changes preemption "
        "under KV pressure (the RTX 4090 run): a preempted request's freed blocks keep their "
        "hashes, and when it is admitted again it reuses those not evicted meanwhile instead "
        "of recomputing them. vLLM also hashes the full blocks of generated tokens (no "
        "option: prefix caching means it), and so does the as-shipped replay "
        "(`cache_generated_blocks`, `docs/prefix-caching.md`).",
        "- The replay has no tokenizer or detokenizer stage (the runs drove `AsyncLLM` in-process "
        "and the measured latencies start at `queued_ts`).",
        "- The MoE run (Qwen3-30B-A3B, two RTX PRO 6000, DP2 with expert parallelism): each DP rank "
        "has its own scheduler and KV cache (38,590 blocks of 16: (96 GiB x 0.9 - the non-expert weights "
        "and half the experts) / KV per token, the figure LLMServingSim's log states too); vLLM 0.19's "
        "front end balances requests over the ranks by `4 x waiting + running` on a snapshot (the "
        "replay's `least_loaded` is 0.28's score on exact counts, `docs/routing.md`). A step's MoE layers "
        "see both ranks' tokens: the profile's `moe.csv` (one GPU, all 128 experts, forced routing) is "
        "queried at the tokens whose pairs reach a GPU's 64 experts and their expected distinct count "
        "under uniform routing, with no load imbalance (`timing.moe.imbalance` 1; `docs/timing.md`). The "
        "profile's `dense.csv` has no MLP rows (the experts are in `moe.csv`), and its `qk_norm` counts "
        "once per layer. The run's per-second decode steps are not compared (two ranks step at once, "
        "`timeseries.csv` sums them).",
    ]
    return "\n".join(lines) + "\n"


def pairing_check(path: str, shipped: dict, calibrations: dict[str, dict]) -> dict[str, dict[str, dict[str, float]]]:
    """On the fit part, per metric: the request-by-request correlation of predicted and measured
    values and the predicted spread over the measured one (standard deviations), as shipped and
    for each loss's fit. Paired least squares is least at spread ratio = correlation."""
    from runners import calibrate as cal

    measured = cal.read_measured(path)
    rows = slice(0, len(measured.request_id) // 2)
    configs = [shipped] + [_with_values(shipped, c["values"]) for c in calibrations.values()]
    out = {}
    for name, (_, predicted) in zip(["as shipped"] + list(calibrations), _replays(configs, measured)):
        out[name] = {}
        for column, _ in cal.METRICS:
            m, p = measured.latency[column][rows], predicted[column][rows]
            known = ~(np.isnan(m) | np.isnan(p))
            m, p = m[known], p[known]
            out[name][column] = {"r": float(np.corrcoef(p, m)[0, 1]), "spread": float(np.std(p) / np.std(m))}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=os.path.normpath(DEFAULT_DATA))
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "accuracy.md"))
    parser.add_argument("--no-aic", action="store_true", help="skip timing.type=aic")
    parser.add_argument("--no-calibration", action="store_true", help="skip the calibrated columns")
    parser.add_argument("--roofline-only", action="store_true",
                        help="replay timing.type=roofline alone and replace only --out's roofline section")
    parser.add_argument("--losses", default=None, metavar="A,B",
                        help="replaysim-calibrate losses fitted and compared (default: all; the default loss first)")
    args = parser.parse_args(argv)
    from runners.calibrate import DEFAULT_LOSS, LOSSES

    losses = [DEFAULT_LOSS] + [loss for loss in LOSSES if loss != DEFAULT_LOSS]
    if args.losses is not None:
        losses = list(dict.fromkeys([DEFAULT_LOSS] + args.losses.split(",")))
        unknown = [loss for loss in losses if loss not in LOSSES]
        if unknown:
            parser.error(f"--losses: unknown loss {unknown[0]!r} (one of {', '.join(LOSSES)})")
    if args.no_calibration:
        losses = []
    cases = []
    for gpu in sorted(os.listdir(os.path.join(args.data, "bench"))):
        for model_dir in sorted(os.listdir(os.path.join(args.data, "bench", gpu))):
            cases.append((gpu, model_dir))
    if args.roofline_only:
        results = []
        for gpu, model_dir in cases:
            try:
                results.append(run_case(args.data, gpu, model_dir, use_aic=False, only_roofline=True))
            except KeyError as exc:  # a run whose model MODELS does not describe
                print(f"skipped {gpu}/{model_dir}: no MODELS entry {exc}", file=sys.stderr)
        text = splice_roofline(args.out, results)
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(text)
        print("\n".join(roofline_section(results)))
        print(f"wrote {args.out}")
        return 0
    results = [
        run_case(args.data, gpu, model_dir, use_aic=not args.no_aic, losses=tuple(losses))
        for gpu, model_dir in cases
    ]
    try:
        from importlib import metadata

        aic_version = metadata.version("aiconfigurator-core")
    except Exception:
        aic_version = "not installed"
    from simcore.timing import aic as aic_module

    text = kept_sections(args.out, render(results, {"layout": aic_module.LAYOUT_VERSION, "aic": aic_version}))
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
