"""A model's architecture from its Hugging Face ``config.json`` (docs/timing.md, "Model catalogue").

:func:`describe` reads the fields that size a decoder-only transformer and
returns a :class:`ModelSpec`: the dimensions, the attention kind (multi-head or
grouped-query, or multi-head latent attention, MLA), each layer's attention
span (full, or a sliding window / attention chunk) and whether its MLP is a
mixture of experts, and the bytes per element of each weight component and of
the KV cache.  Weight bytes, KV bytes per token and FLOPs per token follow from
it (:mod:`simcore.models.catalogue` adds the GPU side).

Rules, each from the config fields as the model's Hugging Face ``transformers``
class reads them:

- ``head_dim`` defaults to ``hidden_size // num_attention_heads``;
  ``num_key_value_heads`` to ``num_attention_heads``.
- Every MLP is gated (three matrices: gate, up, down), as in every family
  listed in :data:`FAMILIES`.
- Mixture of experts: the routed experts (``num_local_experts``,
  ``num_experts`` or ``n_routed_experts``), the experts per token
  (``num_experts_per_tok``), their width (``moe_intermediate_size``, else
  ``intermediate_size``), shared experts (``n_shared_experts x
  moe_intermediate_size``, ``shared_expert_intermediate_size``; Llama 4: one of
  ``intermediate_size``) and which layers are MoE layers (DeepSeek/Kimi:
  ``layer >= first_k_dense_replace`` and ``layer % moe_layer_freq == 0``; Qwen:
  not in ``mlp_only_layers`` and ``(layer + 1) % decoder_sparse_step == 0``;
  Llama 4: ``(layer + 1) % interleave_moe_layer_step == 0``, its dense layers
  ``intermediate_size_mlp`` wide); the others are dense (``intermediate_size``).
- MLA (``kv_lora_rank`` set): the cache holds ``kv_lora_rank +
  qk_rope_head_dim`` elements per token and layer, the same on every TP rank.
- Attention span: ``layer_types`` (``sliding_attention`` /
  ``full_attention``) with ``sliding_window``; Gemma 2: even layers slide;
  Mistral: every layer slides when ``sliding_window`` is set; Qwen 2/3 with
  ``use_sliding_window``: layers from ``max_window_layers`` on; Llama 4: the
  layers that use RoPE (three in four, ``no_rope_layers``) attend within
  ``attention_chunk_size`` chunks, taken as a window of that size (an upper
  bound: a chunked layer reads between 1 and ``attention_chunk_size`` tokens).
- Dtypes: ``torch_dtype`` (or ``dtype``; absent: bfloat16); a float32
  checkpoint is served in 16 bits (vLLM's ``dtype=auto``).  ``quantization_config``:
  ``fp8`` makes every linear layer of the decoder 1 byte (embedding and
  ``lm_head`` stay); ``mxfp4`` makes the experts 4.25 bits (4-bit values and
  one 8-bit scale per 32) unless ``modules_to_not_convert`` names them.  The
  KV cache is in the serving dtype unless ``kv_dtype`` says otherwise.
- Not read: multi-token-prediction layers (``num_nextn_predict_layers``, used
  only by speculative decoding), biases and norms (under 0.1% of the weights).

A field of the wrong type, an unknown ``model_type``, quantisation method,
dtype or layer type, or values that contradict each other raise one
:class:`~simcore.errors.ConfigError` naming the file and the field.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

from simcore.errors import ConfigError

#: model_type values read (multimodal wrappers: their ``text_config``).
FAMILIES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3",
    "kimi_k2", "gpt_oss", "llama4_text", "gemma", "gemma2",
)
#: tie_word_embeddings when the config leaves it out (each family's transformers default).
TIED_BY_DEFAULT = ("gemma", "gemma2")
#: Bytes per element of each dtype name a config or ``kv_dtype`` may give.
DTYPE_BYTES = {
    "float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0,
    "mxfp4": 4.25 / 8, "nvfp4": 4.5 / 8,
}
#: The dtype a float32 checkpoint is served in (vLLM dtype=auto runs it in 16 bits).
SERVED_FLOAT32 = "bfloat16"
#: Tensor-core precision class of each dtype (the GPU peak a GEMM in it can use).
PRECISION = {"float32": "bf16", "float16": "bf16", "bfloat16": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8",
             "fp8_e5m2": "fp8", "mxfp4": "fp4", "nvfp4": "fp4"}
LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")
#: Llama 4: every this many layers one attends globally without RoPE (transformers Llama4TextConfig).
LLAMA4_NOPE_INTERVAL = 4


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only model's architecture, as :func:`describe` reads it.

    Per-layer facts are tuples of ``num_layers`` entries.  Dtypes are names of
    :data:`DTYPE_BYTES`.
    """

    source: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP width (Llama 4: intermediate_size_mlp)
    vocab_size: int
    tie_embeddings: bool
    # MLA (0: none)
    kv_lora_rank: int
    q_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    # mixture of experts (num_experts 0: dense)
    num_experts: int
    experts_per_token: int
    moe_intermediate_size: int
    shared_intermediate_size: int
    moe_layers: tuple[bool, ...]
    # attention span per layer, tokens (0: the whole context)
    windows: tuple[int, ...]
    # dtypes
    dtype: str  # activations and unquantised weights, as served
    linear_dtype: str  # attention projections, dense and shared MLPs
    expert_dtype: str  # routed experts
    kv_dtype: str

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layers)

    # ------------------------------------------------------------ parameters (elements)

    def attention_params(self) -> int:
        """Weights of one layer's attention projections (q, k, v, o; MLA: its low-rank ones)."""
        h = self.hidden_size
        if self.mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank * self.num_heads * qk
            else:
                q = h * self.num_heads * qk
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv_a + kv_b + self.num_heads * self.v_head_dim * h
        q_width = self.num_heads * self.head_dim
        return h * q_width + 2 * h * self.num_kv_heads * self.head_dim + q_width * h

    def expert_params(self) -> int:
        """Weights of one routed expert (gate, up, down)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    def layer_mlp_params(self) -> tuple[int, int, int]:
        """Weights of all layers' dense MLPs, shared experts and routers."""
        dense = shared = router = 0
        for moe in self.moe_layers:
            if moe:
                shared += 3 * self.hidden_size * self.shared_intermediate_size
                router += self.hidden_size * self.num_experts
            else:
                dense += 3 * self.hidden_size * self.intermediate_size
        return dense, shared, router

    def embedding_params(self) -> tuple[int, int]:
        """The input embedding's and ``lm_head``'s weights (``lm_head`` 0 when tied)."""
        table = self.vocab_size * self.hidden_size
        return table, 0 if self.tie_embeddings else table

    def weight_bytes(self) -> float:
        """Bytes of all weights (one copy, no parallelism)."""
        dense, shared, router = self.layer_mlp_params()
        embed, head = self.embedding_params()
        linear = self.num_layers * self.attention_params() + dense + shared
        experts = self.num_moe_layers * self.num_experts * self.expert_params()
        return (
            linear * DTYPE_BYTES[self.linear_dtype]
            + experts * DTYPE_BYTES[self.expert_dtype]
            + (router + embed + head) * DTYPE_BYTES[self.dtype]
        )

    def num_params(self) -> int:
        """Weights counted in elements (all experts)."""
        dense, shared, router = self.layer_mlp_params()
        embed, head = self.embedding_params()
        experts = self.num_moe_layers * self.num_experts * self.expert_params()
        return self.num_layers * self.attention_params() + dense + shared + router + experts + embed + head

    # ------------------------------------------------------------ KV cache

    def kv_elements_per_token_layer(self, tp: int = 1) -> int:
        """KV-cache elements one layer holds per token on one of ``tp`` ranks.

        MLA: ``kv_lora_rank + qk_rope_head_dim`` (replicated on every rank);
        otherwise ``2 x ceil-shared KV heads x head_dim``, the KV heads split over
        the ranks and replicated when ``tp`` exceeds them (vLLM keeps at least one
        KV head per rank).
        """
        if self.mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        heads = self.num_kv_heads // tp if self.num_kv_heads >= tp else 1
        return 2 * heads * self.head_dim

    def kv_bytes_per_token(self, tp: int = 1) -> float:
        """KV-cache bytes per token over all layers on one rank (sliding layers counted in full)."""
        return self.num_layers * self.kv_elements_per_token_layer(tp) * DTYPE_BYTES[self.kv_dtype]

    def active_params_per_token(self) -> int:
        """Weights a token passes through (experts: ``experts_per_token`` of them), elements."""
        dense, shared, router = self.layer_mlp_params()
        embed, head = self.embedding_params()
        experts = self.num_moe_layers * self.experts_per_token * self.expert_params()
        return self.num_layers * self.attention_params() + dense + shared + router + experts + (head or embed)


# ---------------------------------------------------------------- reading


def load_config(path: str) -> dict:
    """The JSON object of a ``config.json`` (or of a directory holding one).

    Parameters
    ----------
    path : str
        A file, or a directory holding ``config.json``.

    Returns
    -------
    dict

    Raises
    ------
    ConfigError
        The file is missing, not JSON, or not an object.
    """
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the model config ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config.json holds a JSON object, got {type(data).__name__}")
    return data


class _Fields:
    """Typed reads of one config object, errors naming ``<source>: field``."""

    def __init__(self, config: Mapping[str, Any], source: str):
        self.config = config
        self.source = source

    def fail(self, name: str, what: str) -> ConfigError:
        return ConfigError(f"{self.source}: {name} {what}")

    def count(self, name: str, default: Any = None, *, minimum: int = 1) -> int:
        value = self.config.get(name, default)
        if value is None:
            if default is None:
                raise self.fail(name, "is missing (needed to size the model)")
            value = default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum or value > 2**40:
            raise self.fail(name, f"must be an integer in [{minimum}, 2^40], got {value!r}")
        return value

    def optional_count(self, name: str, *, minimum: int = 0) -> int:
        if self.config.get(name) is None:
            return 0
        return self.count(name, minimum=minimum)

    def flag(self, name: str, default: bool) -> bool:
        value = self.config.get(name, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.fail(name, f"must be true or false, got {value!r}")
        return value


def describe(config: Mapping[str, Any], source: str, *, kv_dtype: str | None = None) -> ModelSpec:
    """The architecture of a Hugging Face ``config.json`` object.

    Parameters
    ----------
    config : Mapping
        The parsed ``config.json`` (a multimodal one: its ``text_config`` is read).
    source : str
        Where it came from (a path or a catalogue name), for messages.
    kv_dtype : str, optional
        The KV cache's dtype (a :data:`DTYPE_BYTES` name); None: the serving dtype.

    Returns
    -------
    ModelSpec

    Raises
    ------
    ConfigError
        One line naming ``source`` and the field.
    """
    if isinstance(config.get("text_config"), Mapping):
        outer = config
        config = dict(config["text_config"])
        for name in ("torch_dtype", "dtype", "quantization_config"):
            if name not in config and name in outer:
                config[name] = outer[name]
    f = _Fields(config, source)
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise f.fail("model_type", f"{model_type!r} is not a family read here; known: {', '.join(FAMILIES)}")
    layers = f.count("num_hidden_layers")
    hidden = f.count("hidden_size")
    heads = f.count("num_attention_heads")
    kv_heads = f.count("num_key_value_heads", heads)
    if heads % kv_heads:
        raise f.fail("num_key_value_heads", f"={kv_heads} must divide num_attention_heads={heads}")
    head_dim = f.count("head_dim", hidden // heads if hidden % heads == 0 else None)
    vocab = f.count("vocab_size")
    tie = f.flag("tie_word_embeddings", model_type in TIED_BY_DEFAULT)

    # MLA
    kv_lora = f.optional_count("kv_lora_rank")
    q_lora = rope = nope = v_dim = 0
    if kv_lora:
        rope = f.count("qk_rope_head_dim")
        nope = f.count("qk_nope_head_dim")
        v_dim = f.count("v_head_dim")
        q_lora = f.optional_count("q_lora_rank")

    experts, top_k, moe_width, shared_width, moe_layers, dense_width = _experts(f, model_type, layers)
    windows = _windows(f, model_type, layers)
    dtype, linear_dtype, expert_dtype = _dtypes(f, experts > 0)
    if kv_dtype is None:
        kv_dtype = dtype
    elif kv_dtype not in DTYPE_BYTES or PRECISION[kv_dtype] == "fp4":
        raise ConfigError(f"{source}: kv_dtype {kv_dtype!r} is not a KV-cache dtype; known: "
                          f"{', '.join(k for k in DTYPE_BYTES if PRECISION[k] != 'fp4')}")
    return ModelSpec(
        source=source, model_type=model_type, num_layers=layers, hidden_size=hidden, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=dense_width, vocab_size=vocab,
        tie_embeddings=tie, kv_lora_rank=kv_lora, q_lora_rank=q_lora, qk_rope_head_dim=rope,
        qk_nope_head_dim=nope, v_head_dim=v_dim, num_experts=experts, experts_per_token=top_k,
        moe_intermediate_size=moe_width, shared_intermediate_size=shared_width, moe_layers=moe_layers,
        windows=windows, dtype=dtype, linear_dtype=linear_dtype, expert_dtype=expert_dtype, kv_dtype=kv_dtype,
    )


def _experts(f: _Fields, model_type: str, layers: int):
    """(experts, top-k, expert width, shared width, MoE layer flags, dense width)."""
    config = f.config
    names = [n for n in ("num_local_experts", "num_experts", "n_routed_experts") if config.get(n)]
    if len(names) > 1:
        raise f.fail(names[1], f"and {names[0]} both give the routed experts; a config has one")
    experts = f.count(names[0]) if names else 0
    if model_type == "llama4_text":
        dense_width = f.count("intermediate_size_mlp", f.config.get("intermediate_size"))
    else:
        dense_width = f.count("intermediate_size")
    if experts == 0:
        return 0, 0, 0, 0, (False,) * layers, dense_width
    top_k = f.count("num_experts_per_tok", config.get("experts_per_token"))
    if top_k > experts:
        raise f.fail("num_experts_per_tok", f"={top_k} exceeds the {experts} routed experts ({names[0]})")
    if model_type == "llama4_text":
        width = f.count("intermediate_size")
        step = f.count("interleave_moe_layer_step", 1)
        moe = tuple((i + 1) % step == 0 for i in range(layers))
        return experts, top_k, width, width, moe, dense_width
    width = f.count("moe_intermediate_size", config.get("intermediate_size"))
    shared = 0
    if config.get("n_shared_experts"):
        shared = f.count("n_shared_experts") * width
    elif config.get("shared_expert_intermediate_size"):
        shared = f.count("shared_expert_intermediate_size")
    first_dense = f.optional_count("first_k_dense_replace")
    if first_dense > layers:
        raise f.fail("first_k_dense_replace", f"={first_dense} exceeds num_hidden_layers={layers}")
    freq = f.count("moe_layer_freq", 1)
    step = f.count("decoder_sparse_step", 1)
    only_dense = config.get("mlp_only_layers") or []
    if not isinstance(only_dense, list) or any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers
                                               for i in only_dense):
        raise f.fail("mlp_only_layers", f"must list layer indices in [0, {layers}), got {only_dense!r}")
    moe = tuple(
        i >= first_dense and i % freq == 0 and (i + 1) % step == 0 and i not in only_dense for i in range(layers)
    )
    if not any(moe):
        raise f.fail("num_hidden_layers", f"={layers} leaves no MoE layer for the {experts} experts")
    return experts, top_k, width, shared, moe, dense_width


def _windows(f: _Fields, model_type: str, layers: int) -> tuple[int, ...]:
    """Each layer's attention span, tokens (0: full)."""
    config = f.config
    window = config.get("sliding_window")
    types = config.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise f.fail("layer_types", f"must list one type per layer ({layers}), got {len(types) if isinstance(types, list) else types!r}")
        unknown = sorted({t for t in types if t not in LAYER_TYPES}, key=str)
        if unknown:
            raise f.fail("layer_types", f"has {unknown[0]!r}, not an attention type read here; known: {', '.join(LAYER_TYPES)}")
        out = []
        for t in types:
            if t == "full_attention":
                out.append(0)
            else:
                name = "sliding_window" if t == "sliding_attention" else "attention_chunk_size"
                out.append(f.count(name))
        return tuple(out)
    if model_type == "gemma2":
        w = f.count("sliding_window")
        return tuple(w if i % 2 == 0 else 0 for i in range(layers))
    if model_type == "llama4_text" and config.get("attention_chunk_size"):
        chunk = f.count("attention_chunk_size")
        nope = config.get("no_rope_layers")
        if nope is None:
            nope = [int((i + 1) % LLAMA4_NOPE_INTERVAL != 0) for i in range(layers)]
        elif not isinstance(nope, list) or len(nope) != layers:
            raise f.fail("no_rope_layers", f"must list one flag per layer ({layers})")
        return tuple(chunk if uses_rope else 0 for uses_rope in nope)
    if model_type == "mistral" and window is not None:
        w = f.count("sliding_window")
        return (w,) * layers
    if model_type in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe") and f.flag("use_sliding_window", False):
        w = f.count("sliding_window")
        first = f.count("max_window_layers", layers, minimum=0)
        return tuple(w if i >= first else 0 for i in range(layers))
    return (0,) * layers


def _dtypes(f: _Fields, has_experts: bool) -> tuple[str, str, str]:
    """(serving dtype, linear layers' dtype, experts' dtype)."""
    config = f.config
    name = "torch_dtype" if config.get("torch_dtype") is not None else "dtype"
    dtype = config.get(name) or "bfloat16"
    if dtype not in ("float32", "float16", "bfloat16"):
        raise f.fail(name, f"{dtype!r} is not a checkpoint dtype read here; known: float32, float16, bfloat16")
    if dtype == "float32":
        dtype = SERVED_FLOAT32
    quant = config.get("quantization_config")
    if quant is None:
        return dtype, dtype, dtype
    if not isinstance(quant, Mapping):
        raise f.fail("quantization_config", f"must be an object, got {quant!r}")
    method = quant.get("quant_method")
    if method == "fp8":
        return dtype, "fp8", "fp8"
    if method == "mxfp4":
        skipped = quant.get("modules_to_not_convert") or []
        if not isinstance(skipped, list):
            raise f.fail("quantization_config.modules_to_not_convert", f"must be a list, got {skipped!r}")
        if any(".experts" in str(m) for m in skipped) or not has_experts:
            raise f.fail("quantization_config.quant_method", "mxfp4 is read for the routed experts only")
        return dtype, dtype, "mxfp4"
    raise f.fail("quantization_config.quant_method", f"{method!r} is not a method read here; known: fp8, mxfp4")
