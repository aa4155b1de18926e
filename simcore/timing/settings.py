"""The timing model's settings (docs/timing.md).

Each key is declared once, as a field of :class:`TimingConfig`
(:func:`simcore.checks.key`).  :func:`parse` checks the keys without reading
any profile or database: the model dimensions a profile's ``meta.yaml`` or the
aic model config gives, the aic table ranges and vLLM's default CUDA-graph
sizes are filled in by :func:`simcore.derive.derive`.  This module imports no
timing model, so that the models can import it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from simcore.checks import choice, count, default_of, is_number, key, number, optional_count, optional_number, optional_str, shown
from simcore.errors import ConfigError
from simcore.scheduler.policies import policy as policy_spec
from simcore.scheduler.policies import supporting, supports

TIMING_TYPES = ("fixed", "linear", "aic", "table", "roofline")
#: The timing keys of each table-driven model (set with another timing.type: an error).
AIC_KEYS = ("model", "gpu", "backend", "backend_version", "memory_fraction")
#: The keys aic and roofline share (a model and a GPU); the aic-only ones.
MODEL_KEYS = ("model", "gpu")
AIC_ONLY_KEYS = ("backend", "backend_version")
#: roofline's own keys (timing.roofline.*): efficiency factors and the KV cache's dtype.
ROOFLINE_EFFICIENCIES = ("flops_efficiency", "bandwidth_efficiency", "attention_flops_efficiency",
                         "attention_bandwidth_efficiency")
ROOFLINE_KEYS = ROOFLINE_EFFICIENCIES + ("kv_dtype",)
#: timing.roofline.kv_dtype values (null: the model's serving dtype; vLLM --kv-cache-dtype).
KV_DTYPES = ("bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
#: aiconfigurator-core's backends (timing.backend); null takes the policy's (``Policy.aic_backend``).
AIC_BACKENDS = ("vllm", "sglang", "trtllm")
TABLE_KEYS = ("profile",)
#: Timing types that can add a TP all-reduce term (timing.allreduce; for aic it
#: replaces the database's own per-layer all-reduces).
ALLREDUCE_TYPES = ("linear", "table", "aic", "roofline")
#: The coefficients of the two closed-form timing models.
FIXED_KEYS = ("prefill_ms", "decode_ms")
LINEAR_KEYS = ("base_ms", "per_prefill_token_us", "per_decode_seq_us", "per_kv_token_ns")
#: Fraction of GPU memory given to weights plus KV cache for ``num_blocks: auto``
#: when timing.memory_fraction is null: vLLM's gpu_memory_utilization and
#: TensorRT-LLM's free_gpu_memory_fraction default to 0.9 (SGLang derives its
#: mem_fraction_static from the GPU; 0.9 stands in for it).
AIC_MEMORY_FRACTION = 0.9
#: The operator scales (declared calibration parameters; 1: the model's time unchanged).
OPERATOR_SCALES = ("prefill_token_scale", "decode_attention_scale", "decode_base_scale")
#: timing.cuda_graph_sizes value that asks for vLLM's own default capture sizes.
VLLM_DEFAULT_GRAPHS = "vllm_default"


@dataclass(frozen=True)
class TimingConfig:
    """The timing model: its type and the keys each type reads (docs/timing.md).

    The linear coefficients are for an H100-class GPU serving an 8B dense model:
    a pass reads the 16 GB of weights (~5 ms at 3.35 TB/s), a prompt token costs
    ~2 x 8e9 FLOP (~30 us at ~550 dense TFLOP/s), a KV token read of 128 KiB
    costs ~40 ns, and each decoding sequence adds sampling/bookkeeping overhead.
    """

    type: str = key(
        "linear",
        doc="How a pass's duration is computed: fixed, linear (closed form), table (a per-operator profile), aic (the aiconfigurator-core database) or roofline (FLOPs and bytes against a catalogue GPU's peaks).",
        values="fixed | linear | aic | table | roofline",
    )
    prefill_ms: float = key(30.0, doc="fixed: duration of a pass with a prefill entry.", values="number >= 0")
    decode_ms: float = key(8.0, doc="fixed: added when the pass has a decode entry.", values="number >= 0")
    base_ms: float = key(5.0, doc="linear: fixed cost of a pass (reading the weights).", values="number >= 0")
    per_prefill_token_us: float = key(30.0, doc="linear: cost per prompt token in the pass.", values="number >= 0")
    per_decode_seq_us: float = key(20.0, doc="linear: cost per decoding sequence in the pass.", values="number >= 0")
    per_kv_token_ns: float = key(
        40.0,
        doc="linear: cost per KV token read by the pass's attention.",
        values="number >= 0",
    )
    # aic keys after parsing: resolved (backend from engine.policy's registry entry, tp 1,
    # memory_fraction 0.9); None for the other types.
    model: str | None = key(
        None, optional=True,
        doc="aic: a bundled Hugging Face model id, or a local directory holding config.json; roofline: a catalogue model (replaysim-models) or a config.json path.",
        values="string or null",
    )
    gpu: str | None = key(
        None, optional=True,
        doc="aic: the GPU system name (for example h200_sxm); roofline: a catalogue GPU (for example H200).",
        values="string or null",
    )
    backend: str | None = key(
        None, optional=True,
        doc="aic: whose kernels the database measured; null: engine.policy's.",
        values="vllm | sglang | trtllm | null",
    )
    backend_version: str | None = key(
        None, optional=True,
        doc="aic: the database version; null: its current one.",
        values="string or null",
    )
    tp: int | None = key(
        None, optional=True,
        doc="Tensor parallelism of one rank (its all-reduce term); null: 1.",
        unit="GPUs",
        values="integer >= 1 or null",
    )
    memory_fraction: float | None = key(
        None, optional=True,
        doc="num_blocks=auto (and roofline's fit check): fraction of GPU memory for weights plus KV cache; null: 0.9 (vLLM's gpu_memory_utilization).",
        values="number > 0 or null",
    )
    roofline_flops_efficiency: float = key(
        1.0, at=("roofline", "flops_efficiency"), optional=True,
        doc="roofline: share of the datasheet dense TFLOPS the GEMMs and experts reach (1: the bound itself).",
        values="number in (0, 1]",
    )
    roofline_bandwidth_efficiency: float = key(
        1.0, at=("roofline", "bandwidth_efficiency"), optional=True,
        doc="roofline: share of the datasheet memory bandwidth the GEMMs and experts reach (1: the bound itself).",
        values="number in (0, 1]",
    )
    roofline_attention_flops_efficiency: float = key(
        1.0, at=("roofline", "attention_flops_efficiency"), optional=True,
        doc="roofline: share of the 16-bit TFLOPS attention reaches (1: the bound itself).",
        values="number in (0, 1]",
    )
    roofline_attention_bandwidth_efficiency: float = key(
        1.0, at=("roofline", "attention_bandwidth_efficiency"), optional=True,
        doc="roofline: share of the memory bandwidth attention reaches (1: the bound itself).",
        values="number in (0, 1]",
    )
    roofline_kv_dtype: str | None = key(
        None, at=("roofline", "kv_dtype"), optional=True,
        doc="roofline: the KV cache's dtype (vLLM --kv-cache-dtype); null: the model's.",
        values="bfloat16 | float16 | fp8 | fp8_e4m3 | fp8_e5m2 | null",
    )
    profile: str | None = key(
        None, optional=True,
        doc="table: a directory with dense.csv, attention.csv and per_sequence.csv (µs per layer).",
        values="string or null",
    )
    num_layers: int | None = key(
        None, optional=True,
        doc="table: layers per pass; null: the profile's meta.yaml.",
        unit="layers",
        values="integer >= 1 or null",
    )
    hidden_size: int | None = key(
        None, optional=True,
        doc="TP all-reduce: the model's hidden size; null: the profile's meta.yaml (table) or the model config (aic, roofline).",
        values="integer >= 1 or null",
    )
    dtype_bytes: int = key(
        2, optional=True,
        doc="TP all-reduce: bytes per activation element (2: bf16).",
        unit="bytes",
        values="integer >= 1",
    )
    allreduce_latency_us: float | None = key(
        None, at=("allreduce", "latency_us"), optional=True,
        doc="TP all-reduce, ring model: latency per all-reduce.",
        values="number >= 0 or null",
    )
    allreduce_bandwidth_gb_per_second: float | None = key(
        None, at=("allreduce", "bandwidth_gb_per_second"), optional=True,
        doc="TP all-reduce, ring model: link bandwidth; with latency_us, latency + 2(n-1)/n x bytes / bandwidth.",
        values="number > 0 or null",
    )
    allreduce_curve: str | None = key(
        None, at=("allreduce", "curve"), optional=True,
        doc="TP all-reduce: a measured curve file (bytes, µs) instead of the ring model.",
        values="string or null",
    )
    prefill_scale: float = key(
        1.0, optional=True,
        doc="linear, table, aic, roofline: multiplies the model's time of passes with a prefill entry.",
        values="number > 0",
        calibration=(0.5, 2.0),
    )
    decode_scale: float = key(
        1.0, optional=True,
        doc="linear, table, aic, roofline: multiplies the model's time of decode-only passes.",
        values="number > 0",
        calibration=(0.5, 2.0),
    )
    pass_overhead_us: float = key(
        0.0, optional=True,
        doc="linear, table, aic, roofline: host time added to every pass.",
        values="number >= 0",
        calibration=(0.0, 5000.0),
    )
    # operator scales (nb.operator_scaled_ms_nb; docs/timing.md): declared calibration parameters
    prefill_token_scale: float = key(
        1.0, optional=True,
        doc="linear, table, aic, roofline: multiplies the time a pass's prefill entries add to it (the whole of a prefill-only pass); a calibration parameter.",
        values="number > 0",
        calibration=(0.5, 2.0),
    )
    decode_attention_scale: float = key(
        1.0, optional=True,
        doc="linear, table, aic, roofline: multiplies the decode entries' time beyond their time at one token of context (decode attention); a calibration parameter.",
        values="number > 0",
        calibration=(0.5, 2.0),
    )
    decode_base_scale: float = key(
        1.0, optional=True,
        doc="linear, table, aic, roofline: multiplies the decode entries' time at one token of context each (GEMMs, per-sequence operators); a calibration parameter.",
        values="number > 0",
        calibration=(0.5, 2.0),
    )
    cuda_graph_sizes: tuple[int, ...] | str | None = key(
        None, optional=True,
        doc="linear, table, aic, roofline: passes of at most max(sizes) tokens run at the smallest size >= their tokens (CUDA-graph padding); vllm_default: vLLM's sizes; null: no padding.",
        unit="tokens",
        values="list of integers >= 1, vllm_default or null",
    )
    attention_skew_alpha: float = key(
        0.0, optional=True,
        doc="linear, table: decode attention + alpha x (its time at the longest context - at the mean).",
        values="number >= 0",
    )
    # mixture of experts (docs/timing.md): table prices its MoE layers from the profile's moe.csv;
    # under expert parallelism (engine.<pool>.expert_parallel) linear and table add the all-to-all.
    moe_num_experts: int | None = key(
        None, at=("moe", "num_experts"), optional=True,
        doc="table (moe.csv), linear (the all-to-all): the model's routed experts (config.json num_experts).",
        values="integer >= 1 or null",
    )
    moe_top_k: int | None = key(
        None, at=("moe", "top_k"), optional=True,
        doc="table, linear: experts per token (config.json num_experts_per_tok); set with moe.num_experts.",
        values="integer >= 1 or null",
    )
    moe_num_layers: int | None = key(
        None, at=("moe", "num_layers"), optional=True,
        doc="MoE layers of the model; null: timing.num_layers (every layer).",
        unit="layers",
        values="integer >= 1 or null",
    )
    moe_imbalance: float = key(
        1.0, at=("moe", "imbalance"), optional=True,
        doc="table: the busiest GPU's expert load over the mean (moe.csv queried at that many tokens).",
        values="number in [1, num_experts]",
    )
    moe_alltoall_latency_us: float | None = key(
        None, at=("moe", "alltoall", "latency_us"), optional=True,
        doc="expert parallelism: fixed cost of each MoE layer's dispatch and combine collective.",
        values="number >= 0 or null",
    )
    moe_alltoall_bandwidth_gb_per_second: float | None = key(
        None, at=("moe", "alltoall", "bandwidth_gb_per_second"), optional=True,
        doc="expert parallelism: link bandwidth of the dispatch and combine (needs engine.<pool>.expert_parallel).",
        values="number > 0 or null",
    )

    @property
    def allreduce(self) -> bool:
        """Whether timing.allreduce adds (or, for aic, replaces) the TP all-reduce time."""
        return self.allreduce_bandwidth_gb_per_second is not None or self.allreduce_curve is not None

    @property
    def moe(self) -> bool:
        """Whether the model's MoE layers are described (timing.moe.num_experts and top_k)."""
        return self.moe_num_experts is not None

    @property
    def alltoall(self) -> bool:
        """Whether expert parallelism adds its dispatch and combine over the link (timing.moe.alltoall)."""
        return self.moe_alltoall_bandwidth_gb_per_second is not None
    # aic: the largest pass the tables must cover, from the engine pools (not user keys):
    # tokens per pass (budget + sequences), sequences per pass, tokens per sequence.
    pass_tokens_limit: int | None = field(default=None)
    # aic: whether the pools run expert parallelism (engine.<pool>.expert_parallel; the MoE layout)
    expert_parallel: bool = field(default=False)
    pass_sequences_limit: int | None = field(default=None)
    context_limit: int | None = field(default=None)
    # Where the keys were given, for messages: ``timing``, or ``engine.<pool>.timing`` for a pool's own
    path: str = field(default="timing")


def parse(raw: Mapping[str, Any], path: str, policy: str) -> TimingConfig:
    """Check the ``timing`` section; the model dimensions stay None where a file gives them.

    Parameters
    ----------
    raw : Mapping[str, Any]
        The merged ``timing`` tree.
    path : str
        Its dotted path (``timing``), for messages.
    policy : str
        engine.policy (already checked): aic's default backend (the registry's
        ``aic_backend``), and whether it takes vLLM's graph sizes.

    Returns
    -------
    TimingConfig
        Before :func:`simcore.derive.derive`: ``num_layers`` None for a table
        profile that leaves it to ``meta.yaml``, ``hidden_size``/``num_layers`` None
        where the all-reduce reads them from a file, no aic table ranges, and
        ``cuda_graph_sizes`` possibly :data:`VLLM_DEFAULT_GRAPHS`.

    Raises
    ------
    ConfigError
        A key's value is refused (its dotted path named).
    """
    kind = choice(f"{path}.type", raw["type"], TIMING_TYPES)
    extra: dict[str, Any] = {}
    if kind == "roofline":
        extra = _roofline(raw, path)
    if kind == "aic":
        for name, example in (("model", "meta-llama/Meta-Llama-3.1-8B"), ("gpu", "h200_sxm")):
            if raw[name] is None:
                raise ConfigError(
                    f"{path}.{name} must be set for {path}.type=aic (e.g. {path}.{name}={example}; "
                    "see docs/timing.md)"
                )
        version = raw["backend_version"]
        if version is not None and not isinstance(version, str):
            if not is_number(version):
                raise ConfigError(f"{path}.backend_version must be a version string, got {version!r}")
            version = str(version)
        fraction = _memory_fraction(raw, path)
        extra = dict(
            model=optional_str(f"{path}.model", raw["model"]),
            gpu=optional_str(f"{path}.gpu", raw["gpu"]),
            backend=choice(f"{path}.backend", policy_spec(policy).aic_backend if raw["backend"] is None else raw["backend"],
                           AIC_BACKENDS),
            backend_version=optional_str(f"{path}.backend_version", version),
            memory_fraction=fraction,
        )
    if kind == "table":
        if raw["profile"] is None:
            raise ConfigError(
                f"{path}.profile must be set for {path}.type=table (a directory holding dense.csv, "
                "attention.csv and per_sequence.csv; see docs/timing.md)"
            )
        profile = optional_str(f"{path}.profile", raw["profile"])
        if not os.path.isdir(profile):
            raise ConfigError(f"{path}.profile must be an existing directory, got {profile!r}")
        # None: meta.yaml's num_layers (simcore.derive)
        extra = dict(profile=profile, num_layers=optional_count(f"{path}.num_layers", raw["num_layers"]))
    moe = _moe(raw, path, kind)
    extra.update(_pass_terms(raw, path, kind, extra, policy, moe))
    extra.update(moe)
    return TimingConfig(
        type=kind,
        **{name: number(f"{path}.{name}", raw[name]) for name in FIXED_KEYS + LINEAR_KEYS},
        **extra,
        path=path,
    )


def _memory_fraction(raw: Mapping[str, Any], path: str) -> float:
    fraction = raw["memory_fraction"]
    fraction = AIC_MEMORY_FRACTION if fraction is None else number(f"{path}.memory_fraction", fraction, strict=True)
    if fraction > 1:
        raise ConfigError(f"{path}.memory_fraction must be in (0, 1], got {raw['memory_fraction']!r}")
    return fraction


def _roofline(raw: Mapping[str, Any], path: str) -> dict[str, Any]:
    """timing.model, timing.gpu (required; checked against the catalogue by simcore.derive),
    timing.memory_fraction and timing.roofline.*."""
    for name, example in (("model", "llama-3.1-8b"), ("gpu", "H100-SXM")):
        if raw[name] is None:
            raise ConfigError(
                f"{path}.{name} must be set for {path}.type=roofline (e.g. {path}.{name}={example}; "
                "replaysim-models lists the catalogue)"
            )
    for name in ("num_layers", "hidden_size"):
        if raw[name] is not None:
            raise ConfigError(
                f"{path}.{name} is the model's own with {path}.type=roofline (read from {path}.model), "
                f"got {shown(raw[name])}"
            )
    sub = raw["roofline"]
    out: dict[str, Any] = dict(
        model=optional_str(f"{path}.model", raw["model"]),
        gpu=optional_str(f"{path}.gpu", raw["gpu"]),
        memory_fraction=_memory_fraction(raw, path),
    )
    for name in ROOFLINE_EFFICIENCIES:
        value = number(f"{path}.roofline.{name}", sub[name], strict=True)
        if value > 1:
            raise ConfigError(
                f"{path}.roofline.{name} must be in (0, 1] (a share of the datasheet peak), got {shown(sub[name])}"
            )
        out[f"roofline_{name}"] = value
    if sub["kv_dtype"] is not None:
        out["roofline_kv_dtype"] = choice(f"{path}.roofline.kv_dtype", sub["kv_dtype"], KV_DTYPES)
    return out


def _moe(raw: Mapping[str, Any], path: str, kind: str) -> dict[str, Any]:
    """timing.moe.*: the routed experts, top-k, MoE layers, the load imbalance and the all-to-all link
    (docs/timing.md)."""
    moe = raw["moe"]
    experts = optional_count(f"{path}.moe.num_experts", moe["num_experts"])
    top_k = optional_count(f"{path}.moe.top_k", moe["top_k"])
    layers = optional_count(f"{path}.moe.num_layers", moe["num_layers"])
    imbalance = number(f"{path}.moe.imbalance", moe["imbalance"], strict=True)
    a2a = moe["alltoall"]
    latency = optional_number(f"{path}.moe.alltoall.latency_us", a2a["latency_us"])
    bandwidth = optional_number(
        f"{path}.moe.alltoall.bandwidth_gb_per_second", a2a["bandwidth_gb_per_second"], strict=True
    )
    if (experts is None) != (top_k is None):
        raise ConfigError(
            f"{path}.moe.num_experts and {path}.moe.top_k are set together (the model's config.json "
            f"num_experts and num_experts_per_tok), got {shown(moe['num_experts'])} and {shown(moe['top_k'])}"
        )
    if experts is None:
        for name, value, default in (("num_layers", layers, None), ("imbalance", imbalance, 1.0),
                                     ("alltoall.latency_us", latency, None),
                                     ("alltoall.bandwidth_gb_per_second", bandwidth, None)):
            if value != default:
                raise ConfigError(
                    f"{path}.moe.{name} needs {path}.moe.num_experts and {path}.moe.top_k (an MoE model), "
                    f"got {shown(value)}"
                )
        return {}
    if kind not in ("linear", "table"):
        raise ConfigError(
            f"{path}.moe is only used by {path}.type=table (moe.csv) or linear (the all-to-all), got {path}.type={kind}"
        )
    if top_k > experts:
        raise ConfigError(f"{path}.moe.top_k must be <= {path}.moe.num_experts = {experts}, got {top_k}")
    if not 1.0 <= imbalance <= float(experts):
        raise ConfigError(
            f"{path}.moe.imbalance must be in [1, num_experts = {experts}] (the busiest rank's expert load over "
            f"the mean), got {shown(moe['imbalance'])}"
        )
    if imbalance != 1.0 and kind != "table":
        raise ConfigError(f"{path}.moe.imbalance scales moe.csv's expert time: {path}.type=table only, got {kind}")
    if latency is not None and bandwidth is None:
        raise ConfigError(f"{path}.moe.alltoall.latency_us needs {path}.moe.alltoall.bandwidth_gb_per_second")
    if kind == "linear" and bandwidth is None:
        raise ConfigError(
            f"{path}.moe with {path}.type=linear prices only the all-to-all: set "
            f"{path}.moe.alltoall.bandwidth_gb_per_second (or use {path}.type=table with moe.csv)"
        )
    return dict(
        moe_num_experts=experts,
        moe_top_k=top_k,
        moe_num_layers=layers,
        moe_imbalance=imbalance,
        moe_alltoall_latency_us=(0.0 if latency is None else latency) if bandwidth is not None else None,
        moe_alltoall_bandwidth_gb_per_second=bandwidth,
    )


def _pass_terms(
    raw: Mapping[str, Any], path: str, kind: str, extra: Mapping[str, Any], policy: str,
    moe: Mapping[str, Any],
) -> dict[str, Any]:
    """timing.tp, scales, overhead, CUDA-graph sizes, the model dimensions and timing.allreduce.*
    (docs/timing.md)."""
    alltoall = moe.get("moe_alltoall_bandwidth_gb_per_second") is not None
    for name in ("tp", "num_layers", "hidden_size"):
        optional_count(f"{path}.{name}", raw[name])  # the type first, whichever rule reads it
        if raw[name] is not None and kind not in ALLREDUCE_TYPES:
            raise ConfigError(
                f"{path}.{name} is only used by {path}.type=linear, table, aic or roofline, got {raw[name]!r} "
                f"with {path}.type={kind}"
            )
    ar = raw["allreduce"]
    latency = optional_number(f"{path}.allreduce.latency_us", ar["latency_us"])
    bandwidth = optional_number(f"{path}.allreduce.bandwidth_gb_per_second", ar["bandwidth_gb_per_second"], strict=True)
    curve = optional_str(f"{path}.allreduce.curve", ar["curve"])
    out: dict[str, Any] = dict(
        tp=1 if raw["tp"] is None else count(f"{path}.tp", raw["tp"]),
        dtype_bytes=count(f"{path}.dtype_bytes", raw["dtype_bytes"]),
        prefill_scale=number(f"{path}.prefill_scale", raw["prefill_scale"], strict=True),
        decode_scale=number(f"{path}.decode_scale", raw["decode_scale"], strict=True),
        **{name: number(f"{path}.{name}", raw[name], strict=True) for name in OPERATOR_SCALES},
        pass_overhead_us=number(f"{path}.pass_overhead_us", raw["pass_overhead_us"]),
        attention_skew_alpha=number(f"{path}.attention_skew_alpha", raw["attention_skew_alpha"]),
    )
    if out["attention_skew_alpha"] != 0.0 and kind not in ("linear", "table"):
        raise ConfigError(
            f"{path}.attention_skew_alpha is only used by {path}.type=linear or table, got "
            f"{shown(raw['attention_skew_alpha'])} with {path}.type={kind}"
        )
    out["cuda_graph_sizes"] = _graph_sizes(f"{path}.cuda_graph_sizes", raw["cuda_graph_sizes"], policy)
    for name in ("prefill_scale", "decode_scale", *OPERATOR_SCALES, "pass_overhead_us", "cuda_graph_sizes"):
        if raw[name] != default_of(TimingConfig, name) and kind == "fixed":
            raise ConfigError(f"{path}.{name} is only used by {path}.type=linear, table, aic or roofline, got {raw[name]!r}")
    if bandwidth is None and curve is None:
        if latency is not None:
            raise ConfigError(
                f"{path}.allreduce.latency_us needs {path}.allreduce.bandwidth_gb_per_second (ring model)"
            )
        if alltoall:  # the all-to-all's bytes and count: set here or read by simcore.derive
            out.update(
                num_layers=extra.get("num_layers") or optional_count(f"{path}.num_layers", raw["num_layers"]),
                hidden_size=optional_count(f"{path}.hidden_size", raw["hidden_size"]),
            )
            return out
        if kind == "linear" and raw["num_layers"] is not None:
            raise ConfigError(
                f"{path}.num_layers is only used by {path}.type=linear with {path}.allreduce or "
                f"{path}.moe.alltoall set"
            )
        if raw["hidden_size"] is not None:
            raise ConfigError(
                f"{path}.hidden_size is only used with {path}.allreduce or {path}.moe.alltoall set (the "
                f"message size), got {shown(raw['hidden_size'])}"
            )
        return out
    if curve is not None and (bandwidth is not None or latency is not None):
        raise ConfigError(
            f"{path}.allreduce.curve replaces the ring model: set it or "
            f"{path}.allreduce.{{latency_us,bandwidth_gb_per_second}}, not both"
        )
    if kind not in ALLREDUCE_TYPES:
        raise ConfigError(f"{path}.allreduce is only used by {path}.type=linear, table, aic or roofline, got {kind}")
    if out["tp"] < 2:
        raise ConfigError(f"{path}.allreduce needs {path}.tp >= 2 (one GPU does no all-reduce), got {path}.tp=1")
    if curve is not None and not os.path.isfile(curve):
        raise ConfigError(f"{path}.allreduce.curve must be an existing CSV file, got {curve!r}")
    out.update(
        # None: read by simcore.derive (table: meta.yaml; aic: the model config), else an error there
        num_layers=extra.get("num_layers") or optional_count(f"{path}.num_layers", raw["num_layers"]),
        hidden_size=optional_count(f"{path}.hidden_size", raw["hidden_size"]),
        allreduce_latency_us=0.0 if latency is None and curve is None else latency,
        allreduce_bandwidth_gb_per_second=bandwidth,
        allreduce_curve=curve,
    )
    return out


def _graph_sizes(path: str, value: Any, policy: str) -> tuple[int, ...] | str | None:
    """timing.cuda_graph_sizes: None, VLLM_DEFAULT_GRAPHS (resolved from the pools) or sorted unique sizes."""
    if value is None:
        return None
    if value == VLLM_DEFAULT_GRAPHS:
        if not supports(policy, "vllm_graph_sizes"):
            raise ConfigError(
                f"{path}={VLLM_DEFAULT_GRAPHS} is vLLM's rule (engine.policy={supporting('vllm_graph_sizes')}); "
                f"give a list of sizes with engine.policy={policy}"
            )
        return VLLM_DEFAULT_GRAPHS
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__") or len(value) == 0:
        raise ConfigError(
            f"{path} must be null, {VLLM_DEFAULT_GRAPHS} or a non-empty list of token "
            f"counts, got {shown(value)}"
        )
    # vLLM de-duplicates and sorts the capture sizes it is given (VllmConfig._set_cudagraph_sizes)
    return tuple(sorted({count(path, size) for size in value}))
