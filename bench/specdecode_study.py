"""Replay a measured study of speculative decoding on vLLM and compare the speedups: docs/accuracy.md.

    python bench/specdecode_study.py [--requests N] [--out docs/accuracy.md] [--predictions JSON]
    python bench/specdecode_study.py derive --simulator GITDIR --figure fig1.pdf

The study: X. Liu, J. Yu, J. Park, I. Stoica, A. Cheung, *Speculative Decoding:
Performance or Illusion?*, arXiv:2601.11580 (vLLM v0.10.1, one H100 80GB for the
8B models; the data set's README.md, ``bench/data/specdecode_bench/``).  Its
procedure (its ``scripts/bench_latency.py``): per dataset, each request's prompt
is sent ``B`` times at once to an offline ``LLM.generate`` (greedy, prefix
caching off, CUDA graphs on), timed from call to return; a batch's throughput is
``B x output tokens / duration``, averaged over the requests; the speedup is the
average throughput with speculation over the one without, per batch size
``B`` in 1, 16, 64, 128 (``scripts/vis_speedup.py``).

The replay takes, and only takes, what the study publishes:

- requests: per dataset the Llama-3.1-8B-Instruct requests of the study's
  simulator data (prompt and output lengths of its greedy runs), ``B`` copies
  sent at 0 (``load.type=trace``); the duration is the last copy's last token.
  The copies are one greedy run repeated, so they share a ``prompt_id`` (the
  request's row in its dataset's file) and the pool draws per prompt
  (``speculative.draws=prompt``): they accept, and with n-gram propose, in
  lockstep, as the study's copies do;
- acceptance: per request and method, the study's own per-position acceptance
  data (``acc_len``: the tokens one step emits when it starts at that position,
  with unlimited proposals) walked with ``k`` proposals per step as the study's
  simulator walks it (each step emits ``min(acc_len, k + 1)`` tokens); the
  request's mean acceptance length (tokens emitted per verification, vLLM's
  ``1 + accepted / drafts``) is its ``acceptance_length`` column;
- n-gram steps without a match: vLLM's lookup proposes nothing when no suffix
  of at least ``prompt_lookup_min`` tokens of the context recurs in it
  (:func:`ngram_walk` on the study's published prompt and output tokens), and
  that step is a plain decode.  Per request, the share of its steps with a
  match is the run's ``proposal_rate`` and the acceptance length of those steps
  its ``acceptance_length``; the model with every step proposing is shown
  beside it;
- engine: vLLM's defaults for the offline ``LLM`` class on an H100 in v0.10.1
  (``EngineArgs._set_default_args_v1``, ``vllm/engine/arg_utils.py``: 80 GB and
  not an A100, so ``max_num_batched_tokens`` 16,384 and ``max_num_seqs`` 1,024),
  block size 16, prefix caching off (the study's ``enable_prefix_caching=False``),
  synchronous scheduling (v0.10.1's default), CUDA-graph padding at vLLM's sizes
  (``timing.cuda_graph_sizes=vllm_default``);
- timing: ``timing.type=roofline``, the catalogue ``llama-3.1-8b`` on the
  catalogue ``H100-SXM``, every efficiency factor at its default 1, no per-pass
  host time: nothing fitted;
- the proposer: two columns.  "proposer free": its cost at the shipped default
  0.  "proposer priced": an EAGLE-3 head priced by the same physical rule as the
  roofline's decode, from the head's architecture (:data:`EAGLE3_HEAD`): per
  draft pass its weights read once at the datasheet bandwidth
  (``proposer_step_ms``), plus per sequence its one layer's KV at the run's mean
  context and ``2 x parameters`` FLOPs at the bf16 peak
  (``proposer_per_seq_us``); ``k`` draft passes per step (docs/speculative.md).
  An n-gram lookup runs on the CPU and is priced 0 in both;
- a third column, "study's measured costs": the proposer's and the host's costs
  of the study's own simulator (:data:`STUDY_PREDICTOR`, class ``Llama8BH100``),
  which it fitted to its profiled runs (InstructCoder, batch sizes 1-64) and
  which are stated parameters of that run here, not fitted to the speedups:
  its drafting per step ``2.135 ms + 0.84 us x query tokens + 2.38 ns x KV
  tokens`` (:func:`study_costs`) and its host time per step, 1.207 ms, as
  ``timing.pass_overhead_us`` in both runs (its simulator adds it to every step
  of both).  Its n-gram drafting, 0.59% of the verification's time, has no
  counterpart among the proposer keys and is left at 0.

Nothing is fitted to the measured speedups; a point that misses is reported as
missed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
import zlib

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "bench", "data", "specdecode_bench")
DATASETS = ("gsm8k", "cnn", "sharegpt", "instructcoder")
DATASET_NAMES = {"gsm8k": "GSM8K", "cnn": "CNN/DailyMail", "sharegpt": "ShareGPT", "instructcoder": "InstructCoder"}
BATCH_SIZES = (1, 16, 64, 128)
#: Methods replayed: name, vLLM --speculative-config, acceptance data key and proposals per step.
METHODS = (
    ("EAGLE-3 k=3", {"method": "eagle3", "num_speculative_tokens": 3}, "acc_eagle", 3),
    ("n-gram k=3", {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 3, "prompt_lookup_max": 7},
     "acc_ngram", 3),
    ("n-gram k=5", {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 3, "prompt_lookup_max": 7},
     "acc_ngram", 5),
)
#: n-gram with k=5 was run on InstructCoder only (the study's scripts/run-l3-8b.sh).
K5_DATASETS = ("instructcoder",)
#: vLLM v0.10.1, EngineArgs._set_default_args_v1: the LLM class on a GPU of >= 70 GiB that is not an A100.
MAX_BATCHED_TOKENS = 16_384
MAX_SEQUENCES = 1_024
BLOCK_SIZE = 16
GPU = "H100-SXM"
MODEL = "llama-3.1-8b"
#: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B, the study's EAGLE-3 head for Llama-3.1-8B-Instruct
#: (its scripts/common.py, get_eagle_model): one decoder layer whose attention reads the token's
#: embedding and the fused hidden state side by side (q, k, v projections from 2 x hidden), a
#: gated MLP, the fusion of three target layers' hidden states (3 x hidden -> hidden) and an
#: lm_head over the draft vocabulary (config.json: hidden_size 4096, intermediate_size 14336,
#: 32 heads, 8 KV heads of 128, draft_vocab_size 32000).
EAGLE3_HEAD = dict(hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128, draft_vocab=32000)
#: The study simulator's time model (SpecDecode-Bench/simulator at 2fdccbd, predictor.py, class
#: Llama8BH100, ll. 4-16, seconds; "fitted with instructcoder bs=1,8,16,32,64", l. 5):
#: ``predict_draft_time`` (ll. 42-48) of an EAGLE step is ``draft_c_kv x KV tokens +
#: draft_c_num_spec_tokens x the request's query tokens + draft_c_fixed``, the batch's KV tokens
#: and the request's step input length (simulator.py ll. 180-196), its maximum over the batch
#: paid once per step (ll. 188-206); ``overhead_constant_per_step`` (l. 15, ll. 50-51) is added to
#: every step of both runs, prefill included (simulator.py ll. 130, 145, 171, 206); n-gram's
#: drafting is ``ngram_draft_percentage`` of the verification (ll. 43-44).
STUDY_PREDICTOR = "SpecDecode-Bench/simulator at 2fdccbd, predictor.py"
STUDY_DRAFT_C_KV_S = 2.37768493e-09  # l. 10
STUDY_DRAFT_C_SPEC_TOKEN_S = 8.41429603e-07  # l. 11
STUDY_DRAFT_C_FIXED_S = 2.13526175e-03  # l. 12
STUDY_NGRAM_DRAFT_SHARE = 0.005875  # l. 14 (not applied: no proposer key is a share of the pass)
STUDY_HOST_PER_STEP_S = 1.20683946e-03  # l. 15
#: Requests per dataset and batch size the study averages (its scripts/vis_speedup.py, max_reqs).
REQUESTS = 100
SECTION_HEADING = "## Speculative decoding against a measured vLLM study"
#: Red Hat's gpt-oss-120B EAGLE-3 study on H200: why it is not replayed (its figures are not readable here).
REDHAT_URL = "https://developers.redhat.com/articles/2026/04/16/performance-improvements-speculative-decoding-vllm-gpt-oss"
REDHAT_NOTE = [
    "Not replayed either: Red Hat's study of gpt-oss-120B with EAGLE-3 on vLLM up to 200 concurrent requests "
    f"(Red Hat Developer, 2026-04-16, {REDHAT_URL}). The copies of it that could be read for this replay are "
    "the article's opening (its motivation and the three questions it sets out to answer) and summaries of it "
    "(app.daily.dev's digest of the article; cloudai.pt naming vLLM v0.13.0): gpt-oss-120B on H200 GPUs, three "
    "datasets (ShareGPT, MLPerf, SWE-bench), two tensor-parallel sizes, output throughput +10% to +21% and "
    "end-to-end latency -12% to -20% with speculation, 19.4% lower cost per million output tokens on SWE-bench, "
    "2 to 3 draft tokens best. Its per-concurrency throughputs and speedups, the acceptance lengths it measured, "
    "which tensor-parallel size and draft-token count each figure holds, and the requests' lengths (the "
    "article's sections and figures after its introduction) were not in any copy read, so there is no point "
    "to compare and no acceptance to feed: a replay would have to invent them. The catalogue has the pieces "
    "(`gpt-oss-120b`, `H200`) for when those figures can be read.",
]
TARGET = 0.10


def eagle3_head_params(h: dict = EAGLE3_HEAD) -> int:
    """Weights of the EAGLE-3 head read per draft pass (bf16 elements)."""
    q, kv = h["heads"] * h["head_dim"], h["kv_heads"] * h["head_dim"]
    attention = 2 * h["hidden"] * (q + 2 * kv) + q * h["hidden"]
    mlp = 3 * h["hidden"] * h["intermediate"]
    fusion = 3 * h["hidden"] * h["hidden"]
    head = h["draft_vocab"] * h["hidden"]
    return attention + mlp + fusion + head


def proposer_cost(mean_context: float, h: dict = EAGLE3_HEAD) -> tuple[float, float]:
    """``(proposer_step_ms, proposer_per_seq_us)`` of one EAGLE-3 draft pass on the catalogue GPU.

    The decode roofline's rule: the weights read once per pass at the datasheet
    bandwidth; per sequence its one layer's KV (``mean_context`` tokens, bf16)
    at that bandwidth and ``2 x parameters`` FLOPs at the bf16 peak.
    """
    from simcore.models import catalogue

    gpu = catalogue.gpu(GPU)
    bytes_per_ms = gpu.bandwidth_gb_per_s * 1e6
    flops_per_ms = gpu.tflops["bf16"] * 1e9
    params = eagle3_head_params(h)
    step_ms = 2 * params / bytes_per_ms
    kv_bytes = mean_context * 2 * h["kv_heads"] * h["head_dim"] * 2
    per_seq_us = (kv_bytes / bytes_per_ms + 2 * params / flops_per_ms) * 1000
    return step_ms, per_seq_us


def study_costs(mean_context: float, k: int) -> tuple[float, float, float]:
    """``(proposer_step_ms, proposer_per_seq_us, pass_overhead_us)`` of the study simulator's time model.

    Its EAGLE drafting per step, ``C_fixed + C_spec x (k + 1) + C_kv x (the batch's KV
    tokens)``, is spread over the ``k`` draft passes the replay charges per step
    (``passes x (proposer_step_ms + proposer_per_seq_us x sequences / 1000)``): the
    constant and the query term (``k + 1`` tokens of the request's step) per pass, the
    KV term per sequence at the run's ``mean_context``.  Its host time per step is
    ``timing.pass_overhead_us``.
    """
    step_ms = (STUDY_DRAFT_C_FIXED_S + STUDY_DRAFT_C_SPEC_TOKEN_S * (k + 1)) * 1e3 / k
    per_seq_us = STUDY_DRAFT_C_KV_S * mean_context * 1e6 / k
    return step_ms, per_seq_us, STUDY_HOST_PER_STEP_S * 1e6


# ---------------------------------------------------------------------------------------------
# derive: the study's published figures into bench/data/specdecode_bench/


def walk(acc_len: list[int], k: int) -> tuple[int, int]:
    """Verifications and tokens they emit for a request with ``k`` proposals per step.

    The first output token comes from the prefill; a step starting after ``n``
    tokens emits ``min(acc_len[n - 1], k + 1)`` (the study's simulator,
    ``simulator.py``: ``get_step_gen_len`` and ``min(step_gen_len, input_len)``),
    until the output's length is reached.
    """
    done, steps, emitted = 1, 0, 0
    while done < len(acc_len):
        step = min(int(acc_len[done - 1]), k + 1)
        steps += 1
        emitted += step
        done += step
    return steps, emitted


def ngram_walk(context: list[int], prompt_tokens: int, acc_len: list[int], k: int,
               min_n: int = 3) -> tuple[int, int, int, int]:
    """The walk of :func:`walk` for vLLM's n-gram proposer, with the steps whose lookup finds no match.

    ``context``: the prompt's tokens followed by the output's.  A step starting after ``n``
    output tokens proposes only if some suffix of ``context[:prompt_tokens + n]`` of at least
    ``min_n`` tokens (``prompt_lookup_min``) occurs earlier in it (vLLM's
    ``_find_longest_matched_ngram_and_propose_tokens`` returns no tokens otherwise): a longer
    suffix matching implies its last ``min_n`` tokens do, so the test is whether the last
    ``min_n``-gram starts at an earlier position too.  A step with a match emits
    ``min(acc_len[n - 1], k + 1)``; one without emits 1 (a plain decode step).

    Returns
    -------
    tuple of int
        ``(steps with proposals, tokens they emit, steps without, steps without whose acc_len
        exceeds 1)``: the last counts data where the study's run accepted proposals this rule
        says vLLM would not have made.
    """
    first: dict[tuple, int] = {}
    for start in range(len(context) - min_n + 1):
        first.setdefault(tuple(context[start:start + min_n]), start)
    done, matched, emitted, plain, contradicted = 1, 0, 0, 0, 0
    while done < len(acc_len):
        start = prompt_tokens + done - min_n
        if start > 0 and first[tuple(context[start:start + min_n])] < start:
            step = min(int(acc_len[done - 1]), k + 1)
            matched += 1
            emitted += step
        else:
            step = 1
            plain += 1
            contradicted += int(acc_len[done - 1]) > 1
        done += step
    return matched, emitted, plain, contradicted


def derive_requests(simulator: str) -> list[dict]:
    """Per request of the study's simulator data: lengths and acceptance per method."""
    rows = []
    for dataset in DATASETS:
        path = f"data/llama3.1-8B/combined_{dataset}.jsonl"
        if os.path.isdir(os.path.join(simulator, "data")):
            with open(os.path.join(simulator, path), encoding="utf-8") as handle:
                text = handle.read()
        else:
            text = subprocess.run(["git", f"--git-dir={simulator}", "show", f"HEAD:{path}"], check=True,
                                  capture_output=True, text=True).stdout
        for line in text.splitlines():
            record = json.loads(line)
            row = {"dataset": dataset, "request_id": record["id"], "prompt_tokens": len(record["prompt_token_ids"]),
                   "output_tokens": len(record["generated_token_ids"])}
            for key, name in (("acc_eagle", "eagle3"), ("acc_ngram", "ngram")):
                acc = record[key]["acc_len"]
                row[f"{name}_output_tokens"] = len(acc)
                for k in (3, 5):
                    steps, emitted = walk(acc, k)
                    row[f"{name}_k{k}_verifications"] = steps
                    row[f"{name}_k{k}_emitted"] = emitted
            context = list(record["prompt_token_ids"]) + list(record["generated_token_ids"])
            for k in (3, 5):
                matched, emitted, plain, contradicted = ngram_walk(
                    context, len(record["prompt_token_ids"]), record["acc_ngram"]["acc_len"], k)
                if contradicted:
                    raise SystemExit(f"{dataset} request {record['id']}: {contradicted} steps without an n-gram "
                                     f"match accept proposals in the study's data (k = {k})")
                row[f"ngram_k{k}_matched"] = matched
                row[f"ngram_k{k}_matched_emitted"] = emitted
            rows.append(row)
    return rows


#: fig1.pdf's panels: (row, column) -> model; columns are the datasets in DATASETS order.
PANEL_MODELS = ("Llama-3.1-8B-Instruct", "Llama-3-70B-Instruct", "Qwen3-8B")
#: The y-axis ticks of each panel as the figure prints them (first tick, step), row by row.
PANEL_TICKS = (
    ((1.0, 0.25), (1.0, 0.25), (1.0, 0.25), (1.0, 0.25)),
    ((1.0, 0.5), (1.0, 0.25), (1.0, 0.25), (1.0, 0.5)),
    ((1.0, 0.25), (1.0, 0.25), (1.0, 0.25), (1.0, 0.5)),
)
#: Series colours (matplotlib's defaults the figure uses) -> method.
SERIES = {
    (0.1215686, 0.4666667, 0.7058824): "n-gram",
    (1.0, 0.4980392, 0.05490196): "EAGLE",
    (0.172549, 0.627451, 0.172549): "EAGLE-3",
    (0.5803922, 0.4039216, 0.7411765): "Draft Model",
}
GRID = (0.6901961,)


def _pdf_paths(pdf: bytes) -> list[tuple[tuple, list[tuple[float, float]], tuple | None]]:
    """Every stroked path of the PDF's first content stream: (stroke colour, points, clip rectangle),
    in page coordinates."""
    match = re.search(rb"<<(.*?)>>\s*stream\r?\n", pdf, re.S)
    stream = zlib.decompress(pdf[match.end():pdf.find(b"endstream", match.end())]).decode("latin-1")
    tokens = re.findall(r"/[A-Za-z0-9]+|[-+]?\d*\.?\d+(?:[eE][-+]?\d+)?|[A-Za-z*']+", stream)

    def concat(a, b):
        return [a[0] * b[0] + a[1] * b[2], a[0] * b[1] + a[1] * b[3], a[2] * b[0] + a[3] * b[2],
                a[2] * b[1] + a[3] * b[3], a[4] * b[0] + a[5] * b[2] + b[4], a[4] * b[1] + a[5] * b[3] + b[5]]

    def point(m, x, y):
        return (m[0] * x + m[2] * y + m[4], m[1] * x + m[3] * y + m[5])

    ctm, stack, stroke, clip, rect = [1, 0, 0, 1, 0, 0], [], None, None, None
    operands, subpaths, current, paths = [], [], [], []
    for token in tokens:
        if token[0] in "-+.0123456789":
            operands.append(float(token))
            continue
        if token.startswith("/"):
            operands = []
            continue
        if token == "q":
            stack.append((ctm[:], stroke, clip))
        elif token == "Q":
            ctm, stroke, clip = stack.pop()
        elif token == "cm":
            ctm = concat(operands[-6:], ctm)
        elif token == "SC":
            stroke = tuple(operands[-3:]) if len(operands) >= 3 else tuple(operands[-1:])
        elif token == "m":
            if current:
                subpaths.append(current)
            current = [point(ctm, *operands[-2:])]
        elif token in ("l", "c") and current and len(operands) >= 2:
            current.append(point(ctm, *operands[-2:]))
        elif token == "re":
            x, y, w, h = operands[-4:]
            rect = (point(ctm, x, y), point(ctm, x + w, y + h))
            if current:
                subpaths.append(current)
            current = []
        elif token == "W":
            clip = rect
        elif token in ("S", "s"):
            if current:
                subpaths.append(current)
            paths.extend((stroke, p, clip) for p in subpaths)
            subpaths, current = [], []
        elif token in ("n", "f", "F", "f*", "B", "B*", "b", "b*"):
            subpaths, current = [], []
        operands = []
    return paths


def derive_speedups(figure: str) -> list[dict]:
    """The measured speedups of the study's Figure 1, read from the figure's vector paths.

    Each series is a polyline through its points; a panel's horizontal grid
    lines sit at its y ticks (:data:`PANEL_TICKS`) and its vertical ones at the
    batch sizes, so a vertex's speedup is exact to the PDF's coordinates.
    """
    with open(figure, "rb") as handle:
        paths = _pdf_paths(handle.read())
    panels: dict[tuple, dict] = {}
    for colour, points, clip in paths:
        if clip is None:
            continue
        key = (round(clip[0][0], 1), round(clip[0][1], 1))
        panel = panels.setdefault(key, {"h": set(), "v": set(), "series": []})
        if colour == GRID and len(points) == 2:
            (x0, y0), (x1, y1) = points
            if abs(y0 - y1) < 1e-6:
                panel["h"].add(y0)
            elif abs(x0 - x1) < 1e-6:
                panel["v"].add(x0)
        elif colour is not None and tuple(round(c, 6) for c in colour) in {tuple(round(c, 6) for c in s) for s in SERIES}:
            name = next(v for s, v in SERIES.items() if all(abs(a - b) < 1e-6 for a, b in zip(s, colour)))
            panel["series"].append((name, points))
    axes = [(k, v) for k, v in panels.items() if len(v["h"]) >= 3 and len(v["v"]) == len(BATCH_SIZES)]
    rows = sorted({k[1] for k, _ in axes}, reverse=True)
    out = []
    for key, panel in axes:
        row = rows.index(key[1])
        column = sorted(k[0] for k, _ in axes if k[1] == key[1]).index(key[0])
        first, step = PANEL_TICKS[row][column]
        grid_y = sorted(panel["h"])
        scale = (grid_y[-1] - grid_y[0]) / (step * (len(grid_y) - 1))
        grid_x = sorted(panel["v"])
        seen: dict[str, int] = {}
        for name, points in panel["series"]:
            if len(points) != len(BATCH_SIZES):
                raise SystemExit(f"{figure}: a {name} series of {len(points)} points in panel {row},{column}")
            seen[name] = seen.get(name, 0) + 1
            # InstructCoder's two n-gram lines: k = 3 (squares) drawn first, then k = 5 (circles).
            k = 5 if name == "n-gram" and seen[name] == 2 else 3
            for x, y in points:
                batch = BATCH_SIZES[int(np.argmin([abs(x - g) for g in grid_x]))]
                out.append({"model": PANEL_MODELS[row], "dataset": DATASETS[column], "method": name, "k": k,
                            "batch_size": batch, "speedup": round(first + (y - grid_y[0]) / scale, 3)})
    return sorted(out, key=lambda r: (PANEL_MODELS.index(r["model"]), DATASETS.index(r["dataset"]), r["method"],
                                      r["k"], r["batch_size"]))


def write_csv(path: str, rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


# ---------------------------------------------------------------------------------------------
# replay


def _config(speculative: dict | None, overhead_us: float = 0.0) -> dict:
    pool = {"max_batched_tokens": MAX_BATCHED_TOKENS, "max_sequences": MAX_SEQUENCES, "block_size": BLOCK_SIZE,
            "num_blocks": "auto", "prefix_caching": False}
    if speculative is not None:
        pool["speculative"] = speculative
    return {
        "load": {"type": "trace"},
        "timing": {"type": "roofline", "model": MODEL, "gpu": GPU, "cuda_graph_sizes": "vllm_default",
                   "pass_overhead_us": overhead_us},
        "engine": {"policy": "vllm", "aggregated": pool},
    }


def batch_table(prompt: int, output: int, copies: int, acceptance: float | None,
                prompt_id: int | None = None) -> pa.Table:
    """``copies`` identical requests sent at 0; ``prompt_id``: the copies' one prompt (speculative draws)."""
    columns = {
        "request_id": pa.array([f"c{i}" for i in range(copies)]),
        "input_tokens": pa.array([prompt] * copies, pa.int64()),
        "output_tokens": pa.array([output] * copies, pa.int64()),
        "send_ms": pa.array([0.0] * copies, pa.float64()),
    }
    if acceptance is not None:
        columns["acceptance_length"] = pa.array([acceptance] * copies, pa.float64())
    if prompt_id is not None:
        columns["prompt_id"] = pa.array([prompt_id] * copies, pa.int64())
    return pa.table(columns)


def duration_ms(config: dict, table: pa.Table) -> tuple[float, float]:
    """The batch's duration (last copy's last token) and the copies' mean finish, ms."""
    import simcore

    result = simcore.run(config, table)
    last = result.requests.column("last_token_ms").to_numpy()
    return float(last.max()), float(last.mean())


def replay(requests: list[dict], limit: int | None, batch_sizes=BATCH_SIZES, seed: int = 0,
           cache: str | None = None) -> list[dict]:
    """Predicted speedup per dataset, method and batch size (both proposer columns).

    ``cache``: a JSON file of earlier predictions of the same requests, by dataset; those
    datasets are not replayed again, and each dataset replayed is added to it.
    """
    out = []
    kept = {}
    if cache and os.path.exists(cache):
        with open(cache, encoding="utf-8") as handle:
            kept = json.load(handle)
        if kept.get("requests") != limit:
            kept = {}
    for dataset in DATASETS:
        if dataset in kept.get("datasets", {}):
            out.extend(kept["datasets"][dataset])
            continue
        first = len(out)
        rows = [r for r in requests if r["dataset"] == dataset][:limit]
        mean_context = float(np.mean([int(r["prompt_tokens"]) + int(r["output_tokens"]) / 2 for r in rows]))
        step_ms, per_seq_us = proposer_cost(mean_context)
        for batch in batch_sizes:
            base, base_study = [], []
            for r in rows:
                out_tokens = int(r["output_tokens"])
                table = batch_table(int(r["prompt_tokens"]), out_tokens, batch, None)
                dur, _ = duration_ms({**_config(None), "seed": seed}, table)
                base.append(batch * out_tokens / dur)
                dur, _ = duration_ms({**_config(None, STUDY_HOST_PER_STEP_S * 1e6), "seed": seed}, table)
                base_study.append(batch * out_tokens / dur)
            base_tpt = {"": float(np.mean(base)), "study": float(np.mean(base_study))}
            for name, spec_config, key, k in METHODS:
                if k == 5 and dataset not in K5_DATASETS:
                    continue
                prefix = "eagle3" if key == "acc_eagle" else "ngram"
                # EAGLE-3: the head free and priced; n-gram (priced 0): the steps proposing as the
                # lookup matches ("free") and, the previous model, every step proposing ("every").
                # "study": the study simulator's own drafting (EAGLE-3) and host costs.
                variants = ["free", "priced", "study"] if prefix == "eagle3" else ["free", "every", "study"]
                study_step_ms, study_per_seq_us, overhead_us = study_costs(mean_context, k)
                if prefix == "ngram":  # a lookup on the CPU: no proposer key for a share of the pass
                    study_step_ms = study_per_seq_us = 0.0
                tpts = {v: [] for v in variants}
                spread, taus, rates = [], [], []
                for index, r in enumerate(rows):
                    out_tokens = int(r[f"{prefix}_output_tokens"])
                    verifications = int(r[f"{prefix}_k{k}_verifications"])
                    if verifications == 0:
                        continue
                    tau_all = int(r[f"{prefix}_k{k}_emitted"]) / verifications
                    rate, tau = 1.0, tau_all
                    if prefix == "ngram":  # the steps whose lookup matched, and their acceptance
                        matched = int(r[f"ngram_k{k}_matched"])
                        rate = matched / verifications
                        tau = int(r[f"ngram_k{k}_matched_emitted"]) / matched if matched else 1.0
                    taus.append(tau)
                    rates.append(rate)
                    for v in variants:
                        fed = tau_all if v == "every" else tau
                        # the copies are one greedy run: one prompt id, its draws in lockstep
                        spec = {"config": spec_config, "mean_acceptance_length": min(fed, k + 1.0), "draws": "prompt"}
                        if v == "priced":
                            spec["proposer_step_ms"] = step_ms
                            spec["proposer_per_seq_us"] = per_seq_us
                        if v == "study" and study_step_ms > 0:
                            spec["proposer_step_ms"] = study_step_ms
                            spec["proposer_per_seq_us"] = study_per_seq_us
                        if prefix == "ngram" and v in ("free", "study"):
                            spec["proposal_rate"] = rate
                        table = batch_table(int(r["prompt_tokens"]), out_tokens, batch, fed, prompt_id=index)
                        config = _config(spec, overhead_us if v == "study" else 0.0)
                        dur, mean_finish = duration_ms({**config, "seed": seed}, table)
                        tpts[v].append(batch * out_tokens / dur)
                        if v == "free":
                            spread.append(dur / mean_finish)
                for v in variants:
                    out.append({"dataset": dataset, "method": name, "k": k, "batch_size": batch,
                                "proposer": v, "requests": len(tpts[v]),
                                "speedup": float(np.mean(tpts[v])) / base_tpt["study" if v == "study" else ""],
                                "acceptance_length": float(np.mean(taus)), "proposal_rate": float(np.mean(rates)),
                                "finish_spread": float(np.mean(spread)),
                                "step_ms": {"priced": step_ms, "study": study_step_ms}.get(v, 0.0),
                                "per_seq_us": {"priced": per_seq_us, "study": study_per_seq_us}.get(v, 0.0),
                                "overhead_us": overhead_us if v == "study" else 0.0})
                print(f"{dataset} {name} B={batch}: " + ", ".join(
                    f"{v} {float(np.mean(tpts[v])) / base_tpt['study' if v == 'study' else '']:.3f}"
                    for v in variants), flush=True)
        if cache:
            kept.setdefault("datasets", {})[dataset] = out[first:]
            kept["requests"] = limit
            with open(cache, "w", encoding="utf-8") as handle:
                json.dump(kept, handle)
    return out


# ---------------------------------------------------------------------------------------------
# docs/accuracy.md's section



def _crossover(points: dict[int, float]) -> str:
    """The first batch size where speculation stops paying (speedup < 1), or that it pays at all."""
    for batch in sorted(points):
        if points[batch] < 1.0:
            return f"B = {batch}"
    return "none (pays up to 128)"


def section(measured: list[dict], predicted: list[dict], limit: int | None,
            prices: list[dict] | None = None) -> str:
    """The markdown section: sources, the per-point table, the crossovers and what is not replayed."""
    study = {(r["dataset"], r["method"], int(r["k"]), int(r["batch_size"])): float(r["speedup"])
             for r in measured if r["model"] == "Llama-3.1-8B-Instruct"}
    pred = {(r["dataset"], r["method"], r["k"], r["batch_size"], r["proposer"]): r for r in predicted}
    lines = [SECTION_HEADING, "", "Generated by `python bench/specdecode_study.py` (do not edit by hand; rerun it).", ""]
    lines.append(
        "Source: X. Liu, J. Yu, J. Park, I. Stoica, A. Cheung, *Speculative Decoding: Performance or "
        "Illusion?*, arXiv:2601.11580 (v1, 2025-12-31); its project page "
        "(github.com/SpecDecode-Bench/specdecode-bench.github.io at fb0e242) and its published data and "
        "scripts (github.com/SpecDecode-Bench/simulator at 2fdccbd, github.com/SpecDecode-Bench/vllm). "
        "Measured on vLLM v0.10.1, one NVIDIA H100 80GB, Llama-3.1-8B-Instruct in bf16, greedy, prefix "
        "caching off, CUDA graphs on, k = 3 proposals per step (n-gram also k = 5 on InstructCoder; "
        "`prompt_lookup_min` 3, `prompt_lookup_max` 7), EAGLE-3 head yuhuili/EAGLE3-LLaMA3.1-Instruct-8B; "
        "a batch is one request's prompt sent B times at once. The measured speedups are the study's "
        "Figure 1 (read from the figure's vector paths, `bench/data/specdecode_bench/measured_speedup.csv`); "
        "the acceptance fed is the study's per-request, per-position acceptance data walked with k "
        "proposals per step (`requests.csv`; the column below is its mean over the requests). For n-gram, "
        "each step's proposals exist only if vLLM's lookup matches: some suffix of at least "
        "`prompt_lookup_min` = 3 tokens of the step's context (the study's published prompt and output "
        "tokens) occurs earlier in it; the proposal rate fed is, per request, the share of its steps with a "
        "match (`proposal_rate`, a stated parameter of the run, not fitted), and the acceptance length fed "
        "is that of those steps. In all 1,410 requests of the data, every step without a match has an "
        "acceptance of 1 in the study's data (none contradicts the rule). The study's own simulator instead "
        "draws a match at steps accepting nothing with a rough per-dataset probability (its `simulator.py`, "
        "`NGRAM_MATCHING_PROBABILITY`: 0.2 to 0.8); the rate here is counted from the tokens. "
        "Data set and derivation: `bench/data/specdecode_bench/README.md`; replay: "
        "`python bench/specdecode_study.py` (its docstring states every input; nothing is fitted)."
    )
    lines.append("")
    lines.append(
        f"Replayed: catalogue `{MODEL}` on `{GPU}` (`timing.type=roofline`, efficiencies 1), "
        f"vLLM's v0.10.1 offline defaults on an H100 (`max_batched_tokens` {MAX_BATCHED_TOKENS:,}, "
        f"`max_sequences` {MAX_SEQUENCES:,}), block size {BLOCK_SIZE}, prefix caching off, synchronous "
        "scheduling, `timing.cuda_graph_sizes=vllm_default`, "
        + (f"the first {limit} requests" if limit else "every request")
        + " of each dataset's file; a batch's B copies share one `prompt_id` and the pool draws per prompt "
        "(`speculative.draws=prompt`, docs/speculative.md), so they accept and propose in lockstep as the "
        "study's identical greedy copies do. \"proposer free\": the proposer's cost at its default 0, no "
        "host time; \"proposer priced\": the EAGLE-3 head's draft passes priced by the roofline's decode rule "
        "from its architecture (n-gram: 0), no host time; \"study's measured costs\": the study simulator's "
        f"own time model ({STUDY_PREDICTOR}, class `Llama8BH100`, ll. 10-15, fitted by the study on "
        "InstructCoder at batch sizes 1-64), stated parameters of its run, not fitted here: EAGLE-3 drafting "
        f"{STUDY_DRAFT_C_FIXED_S * 1e3:.3f} ms per step + {STUDY_DRAFT_C_SPEC_TOKEN_S * 1e6:.2f} us per query "
        f"token + {STUDY_DRAFT_C_KV_S * 1e9:.2f} ns per KV token (spread over the k draft passes, the KV at "
        f"the dataset's mean context), host time {STUDY_HOST_PER_STEP_S * 1e3:.3f} ms per step as "
        "`timing.pass_overhead_us` in both runs; n-gram drafting (the study's 0.59% of a verification) 0. "
        "Error = predicted / measured - 1; target |error| <= 10%."
    )
    lines.append("")
    lines.append("| dataset | method | B | acceptance length fed | proposal rate fed | measured | "
                 "predicted, proposer free | error | predicted, proposer priced | error | "
                 "predicted, study's measured costs | error | copies' last / mean finish |")
    lines.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    misses = {"free": [], "priced": [], "study": []}
    counted = {"free": 0, "priced": 0, "study": 0}
    crossover_rows = []
    for dataset in DATASETS:
        for name, _, key, k in METHODS:
            method = name.split(" k=")[0]
            series_m, series_free, series_priced, series_study = {}, {}, {}, {}
            for batch in BATCH_SIZES:
                free = pred.get((dataset, name, k, batch, "free"))
                if free is None or (dataset, method, k, batch) not in study:
                    continue
                meas = study[(dataset, method, k, batch)]
                priced = pred.get((dataset, name, k, batch, "priced"))
                # n-gram's proposer costs 0 in both columns: the priced prediction is the free one.
                shown_priced = priced if priced is not None else free
                costs = pred[(dataset, name, k, batch, "study")]
                cells = []
                for label, row in (("free", free), ("priced", shown_priced), ("study", costs)):
                    err = row["speedup"] / meas - 1
                    counted[label] += 1
                    if abs(err) > TARGET:
                        misses[label].append(f"{DATASET_NAMES[dataset]} {name} B={batch} {err:+.1%}")
                    cells.append(f"{row['speedup']:.3f} | {err:+.1%}")
                series_m[batch], series_free[batch] = meas, free["speedup"]
                series_priced[batch] = shown_priced["speedup"]
                series_study[batch] = costs["speedup"]
                lines.append(f"| {DATASET_NAMES[dataset]} | {name} | {batch} | {free['acceptance_length']:.3f} | "
                             f"{free.get('proposal_rate', 1.0):.3f} | {meas:.3f} | {cells[0]} | {cells[1]} | "
                             f"{cells[2]} | {free['finish_spread']:.3f} |")
            if series_m:
                crossover_rows.append((DATASET_NAMES[dataset], name, _crossover(series_m), _crossover(series_free),
                                       _crossover(series_priced), _crossover(series_study)))
    lines.append("")
    for label, title in (("free", "proposer free"), ("priced", "proposer priced"),
                         ("study", "study's measured costs")):
        missed = misses[label]
        lines.append(f"- {title}: {counted[label] - len(missed)} of {counted[label]} points within 10%"
                     + (f"; missed: {'; '.join(missed)}." if missed else "."))
    every = sorted(((d, n, k, b) for (d, n, k, b, p) in pred if p == "every" and (d, n.split(" k=")[0], k, b) in study),
                   key=lambda x: (DATASETS.index(x[0]), x[2], x[3]))
    if every:
        lines.append("")
        lines.append("n-gram, the steps without a match (docs/speculative.md, `proposal_rate`): the prediction "
                     "with every step verifying k proposals at the acceptance length of all steps (the model "
                     "without `proposal_rate`), and with the steps proposing at the rate the lookup matches and "
                     "the acceptance length of those steps (the table above):")
        lines.append("")
        lines.append("| dataset | method | B | measured | every step proposes | error | steps as the lookup "
                     "matches | error |")
        lines.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for d, n, k, b in every:
            meas = study[(d, n.split(" k=")[0], k, b)]
            before, after = pred[(d, n, k, b, "every")]["speedup"], pred[(d, n, k, b, "free")]["speedup"]
            lines.append(f"| {DATASET_NAMES[d]} | {n} | {b} | {meas:.3f} | {before:.3f} | {before / meas - 1:+.1%} | "
                         f"{after:.3f} | {after / meas - 1:+.1%} |")
    lines.append("")
    lines.append("Where speculation stops paying (first replayed batch size with speedup < 1):")
    lines.append("")
    lines.append("| dataset | method | measured | predicted, proposer free | predicted, proposer priced | "
                 "predicted, study's measured costs |")
    lines.append("| --- | --- | --- | --- | --- | --- |")
    for row in crossover_rows:
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    replayed = {(d, n.split(" k=")[0], k) for d, n, k, _, _ in pred}
    skipped = [r for r in measured if not (r["model"] == "Llama-3.1-8B-Instruct"
                                            and (r["dataset"], r["method"], int(r["k"])) in replayed)]
    groups: dict[tuple[str, str], int] = {}
    for r in skipped:
        groups[(r["model"], r["method"])] = groups.get((r["model"], r["method"]), 0) + 1
    lines.append(
        f"Not replayed: {len(skipped)} of the figure's {len(measured)} points ("
        + ", ".join(f"{m} {meth}: {n}" for (m, meth), n in sorted(groups.items()))
        + "). The study publishes per-request acceptance data for Llama-3.1-8B-Instruct with EAGLE-3 and "
        "n-gram only; for EAGLE on Llama-3.1-8B and for Llama-3-70B and Qwen3-8B it gives acceptance as "
        "box plots (its Figure 7, Qwen3-8B only in its thinking variant) and per-position rates in the "
        "paper, not per request or as the means of the timed runs, so feeding them would mean reading "
        "medians off a plot for a different statistic. Their crossovers (measured): Qwen3-8B with its "
        "draft model falls below 1 at B = 128 on CNN/DailyMail and ShareGPT, n-gram on GSM8K at B = 128."
    )
    lines.append("")
    lines.extend(REDHAT_NOTE)
    if prices:
        lines.append("")
        lines.append("The roofline's price of one pass, ms (k = 3, every sequence at its dataset's mean context: "
                     "prompt + half the output): a plain decode step; a verification step as the replay prices "
                     "it (each sequence's KV read once for its k + 1 query rows, docs/speculative.md); the same "
                     "step with each proposal a decode row reading its sequence's KV again (the `table` and "
                     "`aic` rule; a diagnostic, not used above).")
        lines.append("")
        lines.append("| dataset | context | B | plain | verification as priced | ratio | KV read per row | ratio |")
        lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in prices:
            lines.append(f"| {DATASET_NAMES[r['dataset']]} | {r['context']} | {r['batch_size']} | {r['plain']:.2f} | "
                         f"{r['priced']:.2f} | {r['priced'] / r['plain']:.2f} | {r['reread']:.2f} | "
                         f"{r['reread'] / r['plain']:.2f} |")
    lines.append("")
    crossings = {label: [f"{row[0]} {row[1]} crossover {row[2]} measured, {row[column]} predicted"
                         for row in crossover_rows if row[2] != row[column]]
                 for label, column in (("free", 3), ("priced", 4), ("study", 5))}
    lines.extend(_reading(study, pred, prices or [], {label: misses[label] + crossings[label] for label in misses},
                          counted))
    lines.append("")
    return "\n".join(lines)


def _span(values: list[float], fmt: str = "{:+.0%}") -> str:
    return fmt.format(min(values)) + " to " + fmt.format(max(values)) if values else "n/a"


def _reading(study: dict, pred: dict, prices: list[dict], misses: dict[str, list[str]],
             counted: dict[str, int]) -> list[str]:
    """Where the replay misses and why, with the figures of the tables above."""
    def errors(method: str, k: int, batches, proposer: str) -> list[float]:
        out = []
        for (dataset, name, kk, batch, prop), row in pred.items():
            key = (dataset, name.split(" k=")[0], kk, batch)
            if name.startswith(method) and kk == k and batch in batches and prop == proposer and key in study:
                out.append(row["speedup"] / study[key] - 1)
        return out

    def ratios(batches, column: str) -> list[float]:
        return [r[column] / r["plain"] for r in prices if r["batch_size"] in batches]

    def all_errors(batches, proposer: str) -> list[float]:
        return (errors("EAGLE-3", 3, batches, proposer) + errors("n-gram", 3, batches, proposer)
                + errors("n-gram", 5, batches, proposer))

    spread = [r["finish_spread"] for r in pred.values() if r["batch_size"] > 1 and r["proposer"] == "free"]
    ngram_rows = [r for r in pred.values() if r["method"].startswith("n-gram") and r["proposer"] == "free"
                  and r["k"] == 3 and r["batch_size"] == BATCH_SIZES[0]]
    rates_by_dataset = [f"{DATASET_NAMES[r['dataset']]} {r['proposal_rate']:.0%}" for r in ngram_rows]
    price = {(r["dataset"], r["batch_size"]): r for r in prices}
    implied, between, above = [], 0, []
    for (d, n, k, b, prop), row in pred.items():
        if n.startswith("EAGLE-3") and prop == "free" and b in (64, 128) and (d, "EAGLE-3", k, b) in study:
            ratio = row["acceptance_length"] / study[(d, "EAGLE-3", k, b)]
            implied.append(ratio)
            if (d, b) in price:
                r = price[(d, b)]
                if r["priced"] / r["plain"] <= ratio <= r["reread"] / r["plain"]:
                    between += 1
                elif ratio > r["reread"] / r["plain"]:
                    above.append(f"{DATASET_NAMES[d]} B = {b}")

    def verdict(label: str, title: str) -> str:
        missed = misses[label]
        points = [m for m in missed if "crossover" not in m]
        crossings = [m for m in missed if "crossover" in m]
        return (f"{title}: {counted[label] - len(points)} of {counted[label]} points within 10%"
                + (f" (missed: {'; '.join(points)})" if points else "")
                + (f"; crossovers off: {'; '.join(crossings)}" if crossings else "; every crossover where the study "
                   "has it") + ".")

    return [
        "Where it misses and why (nothing above is fitted; the misses are the model's):",
        "",
        "- **B = 1, EAGLE-3**: a pass at B = 1 is the weights read once, and the roofline prices a "
        f"verification of four rows like a plain step (ratio {_span(ratios((1,), 'priced'), '{:.2f}')} above), "
        "so with the proposer free and no host time "
        f"the predicted speedup is close to the acceptance length itself ({_span(errors('EAGLE-3', 3, (1,), 'free'))}). "
        "The study's own breakdown (its Figure 4) puts the EAGLE-3 head's drafting at about a fifth of the "
        "time at B = 1; the head priced by the roofline's rule (three draft passes, each reading its 0.42 billion "
        f"weights) brings the points to {_span(errors('EAGLE-3', 3, (1,), 'priced'))}; with the study's own "
        f"drafting ({STUDY_DRAFT_C_FIXED_S * 1e3:.2f} ms per step, its per-token terms adding microseconds at "
        f"B = 1) and host time ({STUDY_HOST_PER_STEP_S * 1e3:.2f} ms per step, in both runs) they are at "
        f"{_span(errors('EAGLE-3', 3, (1,), 'study'))}. n-gram at B = 1 costs nothing "
        f"to propose and lands at {_span(errors('n-gram', 3, (1,), 'free') + errors('n-gram', 5, (1,), 'free'))} "
        f"without host time, {_span(errors('n-gram', 3, (1,), 'study') + errors('n-gram', 5, (1,), 'study'))} "
        "with it.",
        "- **B >= 16, every method**: the replay prices a verification step with each sequence's KV read "
        "once for its k + 1 query rows (docs/speculative.md, Timing): "
        f"{_span(ratios((16, 64), 'priced'), '{:.2f}')}x a plain step at B = 16-64 and "
        f"{_span(ratios((128,), 'priced'), '{:.2f}')}x at B = 128 in the table above (each proposal row "
        f"reading the KV again, the `table`/`aic` rule, would cost {_span(ratios((16, 64), 'reread'), '{:.2f}')}x "
        f"and {_span(ratios((128,), 'reread'), '{:.2f}')}x). The measured EAGLE-3 speedups imply a speculative step "
        "(drafting and host time included) of acceptance length / speedup = "
        f"{_span(implied, '{:.2f}')} plain steps at B = 64 and 128: between the two prices at {between} of "
        f"those {len(implied)} points"
        + (f", above both at {', '.join(above)} (short contexts, where the KV is a small part of the step "
           "and drafting and host time are a large one)" if above else "")
        + ". With the study's measured costs the points at B >= 16 are at "
        f"{_span(all_errors((16, 64, 128), 'study'))} (proposer free: {_span(all_errors((16, 64, 128), 'free'))}).",
        "- **n-gram**: vLLM's lookup proposes nothing when no suffix of 3 to 7 tokens recurs in the "
        "context, and that step runs as a plain decode. In the study's tokens "
        f"{_span([r['proposal_rate'] for r in ngram_rows], '{:.0%}')} of a request's steps find a match "
        f"on average, by dataset ({', '.join(rates_by_dataset)}); fed as `proposal_rate` with the acceptance "
        "length of the matching steps, the n-gram points land at "
        f"{_span(errors('n-gram', 3, BATCH_SIZES, 'free') + errors('n-gram', 5, BATCH_SIZES, 'free'))} "
        f"({_span(errors('n-gram', 3, (128,), 'free') + errors('n-gram', 5, (128,), 'free'))} at B = 128) "
        "with the proposer free, "
        f"{_span(errors('n-gram', 3, BATCH_SIZES, 'study') + errors('n-gram', 5, BATCH_SIZES, 'study'))} with "
        "the study's host time. With every step verifying k proposals (the model without `proposal_rate`, the "
        "second table) they were at "
        f"{_span(errors('n-gram', 3, BATCH_SIZES, 'every') + errors('n-gram', 5, BATCH_SIZES, 'every'))}"
        f" ({_span(errors('n-gram', 3, (128,), 'every') + errors('n-gram', 5, (128,), 'every'))} at B = 128): "
        "at B = 128 a verification row costs most (the ratios above), and it was paid in every step "
        "instead of the matching ones.",
        "- **The copies** (last column): the study's B copies are one greedy run repeated; here they share "
        "a `prompt_id` with `speculative.draws=prompt`, so each copy's step j draws what every other copy's "
        "step j draws (acceptance and, for n-gram, whether the lookup matches): they stay in lockstep, and "
        f"the last copy finishes at {_span(spread, '{:.3f}')}x the copies' mean finish at B >= 16.",
        "- **Host time** per step (synchronous scheduling, sampling; 10-15% of a step at B = 1 in the study's "
        "Figure 4) is in neither the free nor the priced column (`timing.pass_overhead_us` 0). The third "
        f"column adds the study's own {STUDY_HOST_PER_STEP_S * 1e3:.2f} ms per step to both runs: a cost per "
        "step pulls a speedup toward the ratio of the two runs' step counts, so alone (n-gram, whose lookup "
        "is priced 0 in every column) it raises the points, from "
        f"{_span(errors('n-gram', 3, BATCH_SIZES, 'free') + errors('n-gram', 5, BATCH_SIZES, 'free'))} to "
        f"{_span(errors('n-gram', 3, BATCH_SIZES, 'study') + errors('n-gram', 5, BATCH_SIZES, 'study'))}; "
        "for EAGLE-3 the study's drafting per step outweighs it.",
        "",
        "Against the target (|error| <= 10% at every point, the crossover at the same batch size): "
        + verdict("free", "proposer free") + " " + verdict("priced", "Proposer priced") + " "
        + verdict("study", "With the study's measured costs")
        + " The costs in the third column are the study's own, fitted by it to its profiled runs, and are "
        "stated parameters of that run here; nothing is tuned to the speedups.",
    ]


def splice(text: str, section_text: str) -> str:
    """``text`` with its speculative-decoding section replaced, or appended at its end."""
    if SECTION_HEADING in text:
        head, rest = text.split(SECTION_HEADING, 1)
        tail = rest.split("\n## ", 1)
        return head + section_text + ("\n## " + tail[1] if len(tail) > 1 else "")
    return text.rstrip("\n") + "\n\n" + section_text


def pass_prices(requests: list[dict], limit: int | None, k: int = 3) -> list[dict]:
    """Per dataset and batch size: the roofline's plain decode pass, its verification pass with ``k``
    proposals per sequence as the replay prices it (each sequence's KV read once for its k + 1 query
    rows), and the same pass with each proposal a decode row reading its sequence's KV again (the
    ``table``/``aic`` rule), ms.

    A diagnostic of the table's misses (docs/speculative.md, Timing), not used in the replay.
    """
    from simcore.models import catalogue
    from simcore.timing import nb, roofline

    spec, gpu = catalogue.model_spec(MODEL), catalogue.gpu(GPU)
    params, table = roofline.roofline_params(spec, gpu, 1, (1.0, 1.0, 1.0, 1.0))
    out = []
    for dataset in DATASETS:
        rows = [r for r in requests if r["dataset"] == dataset][:limit]
        context = int(round(np.mean([int(r["prompt_tokens"]) + int(r["output_tokens"]) / 2 for r in rows])))
        for batch in BATCH_SIZES:
            rows_v = batch * (k + 1)
            plain = nb.roofline_pass_ms_nb(params, table, 0, 0, 0, batch, batch * context, batch)
            priced = nb.roofline_pass_ms_nb(params, table, 0, 0, 0, batch, batch * context, rows_v, batch * k)
            reread = nb.roofline_pass_ms_nb(params, table, 0, 0, 0, rows_v, rows_v * context, rows_v)
            out.append({"dataset": dataset, "context": context, "batch_size": batch, "plain": plain,
                        "priced": priced, "reread": reread})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    derive = sub.add_parser("derive", help="write bench/data/specdecode_bench/ from the study's published files")
    derive.add_argument("--simulator", required=True, help="SpecDecode-Bench/simulator: a checkout or its git directory")
    derive.add_argument("--figure", default=None,
                        help="the study's Figure 1 (specdecode-bench.github.io assets/img/fig1.pdf); "
                             "without it measured_speedup.csv is kept")
    parser.add_argument("--requests", type=int, default=REQUESTS,
                        help=f"first N requests of each dataset's file (default {REQUESTS}, as the study averages; 0: all)")
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "accuracy.md"))
    parser.add_argument("--predictions", default=None, metavar="JSON",
                        help="keep the replay's predictions in this file, and reuse those it already holds")
    args = parser.parse_args(argv)
    if args.command == "derive":
        os.makedirs(DATA, exist_ok=True)
        write_csv(os.path.join(DATA, "requests.csv"), derive_requests(args.simulator))
        if args.figure:
            write_csv(os.path.join(DATA, "measured_speedup.csv"), derive_speedups(args.figure))
        print(f"wrote {DATA}/requests.csv" + (" and measured_speedup.csv" if args.figure else ""))
        return 0
    requests = read_csv(os.path.join(DATA, "requests.csv"))
    measured = read_csv(os.path.join(DATA, "measured_speedup.csv"))
    args.requests = args.requests or None
    predicted = replay(requests, args.requests, cache=args.predictions)
    text = section(measured, predicted, args.requests, pass_prices(requests, args.requests))
    with open(args.out, encoding="utf-8") as handle:
        old = handle.read()
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write(splice(old, text))
    print(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
