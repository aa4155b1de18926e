"""``timing.type=roofline``: a pass's time from its FLOPs and bytes against the GPU's peaks.

:func:`roofline_arrays` turns a model (``timing.model``: a catalogue name or a
``config.json``), a GPU (``timing.gpu``), the TP degree and the efficiency
factors (``timing.roofline.*``) into the parameters that
``simcore.timing.nb.roofline_pass_ms_nb`` reads (docs/timing.md).  Everything is
per rank: the weights, heads and MLP widths are split over ``timing.tp`` ranks.

Operator groups, each ``max(FLOPs / (peak x flops efficiency), bytes /
(bandwidth x bandwidth efficiency))``:

- GEMMs at the pass's ``T`` tokens: the attention projections of every layer,
  the dense MLPs, the shared experts with the routers; ``lm_head`` at its ``S``
  sequences.  FLOPs are ``2 x weights`` per row; bytes are the weights once
  plus the group's input and output rows (``hidden_size`` wide per layer;
  ``lm_head`` writes ``vocab / tp``).  The peak is the GPU's for the weights'
  precision (``Gpu.peak_tflops``).
- Routed experts, per MoE layer: ``T k`` routed tokens at ``2 x expert
  weights`` FLOPs each; the weights of the ``A(T) = E (1 - (1 - k / E)^T)``
  experts the pass is expected to activate (tokens routed independently and
  uniformly), plus each routed token's input and output rows.
- Attention, per group of layers with one span: query-key pairs x ``2 heads
  (qk + v)`` FLOPs (MLA decode in vLLM's absorbed form: ``qk = kv_lora_rank +
  qk_rope_head_dim``, ``v = kv_lora_rank``; MLA prefill expands the cached
  keys with ``kv_b``: ``2 kv_lora_rank heads (nope + v)`` FLOPs per cached
  key), against the 16-bit peak; bytes: the KV read and written and the
  queries and outputs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simcore.models import catalogue
from simcore.models.describe import DTYPE_BYTES
from simcore.timing import nb

if TYPE_CHECKING:  # annotations only
    from simcore.models.catalogue import Gpu
    from simcore.models.describe import ModelSpec
    from simcore.timing.settings import TimingConfig

#: TFLOPS -> FLOP per ms; GB/s -> bytes per ms.
FLOPS_PER_MS = 1e9
BYTES_PER_MS = 1e6


def resolve(cfg: TimingConfig) -> tuple[ModelSpec, Gpu]:
    """The model and GPU a ``roofline`` section names.

    Parameters
    ----------
    cfg : TimingConfig
        A ``timing.type=roofline`` section.

    Returns
    -------
    (ModelSpec, Gpu)

    Raises
    ------
    ConfigError
        An unknown name, a refused config or a TP the heads refuse (naming the key).
    """
    spec = catalogue.model_spec(cfg.model, kv_dtype=cfg.roofline_kv_dtype, key=f"{cfg.path}.model")
    device = catalogue.gpu(cfg.gpu, key=f"{cfg.path}.gpu")
    catalogue.check_tp(spec, cfg.tp, key=f"{cfg.path}.tp")
    return spec, device


def roofline_params(spec: ModelSpec, device: Gpu, tp: int, efficiencies: tuple[float, float, float, float]
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's ``RF_*`` parameters and its table of GEMM and attention groups.

    Parameters
    ----------
    spec : ModelSpec
    device : Gpu
    tp : int
        Tensor-parallel degree.
    efficiencies : (float, float, float, float)
        Shares of the peak FLOPs and bandwidth for GEMMs, then for attention.

    Returns
    -------
    params : ndarray(float64, shape (nb.ROOFLINE_NUM_PARAMS,))
    table : ndarray(float64, ndim=1)
    """
    flops_eff, bytes_eff, attn_flops_eff, attn_bytes_eff = efficiencies
    act = DTYPE_BYTES[spec.dtype]
    linear = DTYPE_BYTES[spec.linear_dtype]
    bandwidth = device.bandwidth_gb_per_s * BYTES_PER_MS * bytes_eff
    linear_peak = device.peak_tflops(spec.linear_dtype) * FLOPS_PER_MS * flops_eff
    row_io = 2 * spec.hidden_size * act  # one layer group's input and output row
    dense, shared, router = spec.layer_mlp_params()
    embed, head = spec.embedding_params()
    n_moe = spec.num_moe_layers
    n_dense = spec.num_layers - n_moe
    groups = []
    attn = spec.num_layers * spec.attention_params()
    groups.append((0.0, 2 * attn / tp, attn * linear / tp, spec.num_layers * row_io, linear_peak, bandwidth))
    if n_dense:
        groups.append((0.0, 2 * dense / tp, dense * linear / tp, n_dense * row_io, linear_peak, bandwidth))
    if n_moe:
        weights = shared * linear + router * act
        groups.append((0.0, 2 * (shared + router) / tp, weights / tp, n_moe * row_io, linear_peak, bandwidth))
    lm_head = head or embed
    head_peak = device.peak_tflops(spec.dtype) * FLOPS_PER_MS * flops_eff
    groups.append((1.0, 2 * lm_head / tp, lm_head * act / tp, (spec.hidden_size + spec.vocab_size / tp) * act,
                   head_peak, bandwidth))

    attention = _attention_groups(spec, tp)
    params = np.zeros(nb.ROOFLINE_NUM_PARAMS, dtype=np.float64)
    params[nb.RF_NUM_GEMM] = len(groups)
    params[nb.RF_GEMM] = 0
    params[nb.RF_NUM_ATTN] = len(attention)
    params[nb.RF_ATTN] = len(groups) * nb.RF_GEMM_WIDTH
    params[nb.RF_ATTN_FLOPS_PER_MS] = device.tflops["bf16"] * FLOPS_PER_MS * attn_flops_eff
    params[nb.RF_ATTN_BYTES_PER_MS] = device.bandwidth_gb_per_s * BYTES_PER_MS * attn_bytes_eff
    if n_moe:
        expert = spec.expert_params()
        params[nb.RF_MOE_LAYERS] = n_moe
        params[nb.RF_EXPERTS] = spec.num_experts
        params[nb.RF_TOPK] = spec.experts_per_token
        params[nb.RF_EXPERT_FLOPS] = 2 * expert / tp
        params[nb.RF_EXPERT_BYTES] = expert * DTYPE_BYTES[spec.expert_dtype] / tp
        params[nb.RF_EXPERT_IO] = row_io
        params[nb.RF_MOE_FLOPS_PER_MS] = device.peak_tflops(spec.expert_dtype) * FLOPS_PER_MS * flops_eff
        params[nb.RF_MOE_BYTES_PER_MS] = bandwidth
    table = np.array([v for g in groups for v in g] + [v for g in attention for v in g], dtype=np.float64)
    return params, table


def _attention_groups(spec: ModelSpec, tp: int) -> list[tuple[float, ...]]:
    """One row per distinct span: layers, span, FLOPs per pair (prefill, decode), per cached key, bytes."""
    heads = spec.num_heads // tp
    act = DTYPE_BYTES[spec.dtype]
    kv_bytes = spec.kv_elements_per_token_layer(tp) * DTYPE_BYTES[spec.kv_dtype]
    if spec.mla:
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        prefill_pair = 2 * heads * (qk + spec.v_head_dim)
        decode_pair = 2 * heads * (spec.kv_lora_rank + spec.qk_rope_head_dim + spec.kv_lora_rank)
        per_key = 2 * spec.kv_lora_rank * heads * (spec.qk_nope_head_dim + spec.v_head_dim)
        prefill_qo = heads * (qk + spec.v_head_dim) * act
        decode_qo = heads * (spec.kv_lora_rank + spec.qk_rope_head_dim + spec.kv_lora_rank) * act
    else:
        prefill_pair = decode_pair = 4 * heads * spec.head_dim
        per_key = 0
        prefill_qo = decode_qo = 2 * heads * spec.head_dim * act
    rows = []
    for span in sorted(set(spec.windows)):
        layers = sum(1 for w in spec.windows if w == span)
        rows.append((float(layers), float(span), prefill_pair, decode_pair, per_key, kv_bytes, prefill_qo, decode_qo))
    return rows


def roofline_arrays(cfg: TimingConfig) -> tuple[np.ndarray, np.ndarray]:
    """:func:`roofline_params` for a ``timing.type=roofline`` section.

    Parameters
    ----------
    cfg : TimingConfig

    Returns
    -------
    params, table : ndarray(float64, ndim=1)
    """
    spec, device = resolve(cfg)
    return roofline_params(spec, device, cfg.tp, (
        cfg.roofline_flops_efficiency, cfg.roofline_bandwidth_efficiency,
        cfg.roofline_attention_flops_efficiency, cfg.roofline_attention_bandwidth_efficiency,
    ))
