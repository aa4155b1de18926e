"""The shipped model and GPU catalogue, usable offline by name (docs/timing.md, "Model catalogue").

``data/models.json`` holds the architecture fields of the published
``config.json`` of about twenty widely deployed models, each with its Hugging
Face id, the URL of its config, its licence and the copy the fields were taken
from; ``data/gpus.json`` holds ten GPUs' memory, bandwidth, dense tensor-core
peaks per precision (and the with-sparsity factor) and interconnect, each citing its vendor datasheet
(``data/README.md`` lists both).  A name is matched without regard to case; an
unknown one is an error listing the valid names; a path to a ``config.json``
(or a directory holding one) describes the user's own model.

Memory (``num_blocks: auto`` and the fit check): one rank holds ``weights /
tp`` and, at vLLM's ``gpu_memory_utilization`` (``timing.memory_fraction``),
``memory x fraction - weights / tp - activations`` of KV cache, with the
activations taken at the pool's largest pass: ``tokens x (2 x hidden + 2 x
widest MLP / tp) x dtype bytes`` (the layer's input, output and gated
intermediate) plus ``sequences x vocab x 4`` (fp32 logits).  GPU memory is read
in GiB (2^30 bytes: HBM and GDDR capacities are powers of two).
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from importlib import resources
from typing import Any

from simcore.errors import ConfigError
from simcore.models.describe import DTYPE_BYTES, PRECISION, ModelSpec, describe, load_config

GIB = 2**30
#: Tensor-core precisions a GPU row may give (TFLOPS, dense).
PRECISIONS = ("bf16", "fp8", "fp4")
#: Bytes per logit of the sampler's input (fp32).
LOGIT_BYTES = 4


@functools.lru_cache(maxsize=1)
def _models() -> dict[str, dict[str, Any]]:
    with resources.files("simcore.models").joinpath("data/models.json").open(encoding="utf-8") as handle:
        return json.load(handle)


@functools.lru_cache(maxsize=1)
def _gpus() -> dict[str, dict[str, Any]]:
    with resources.files("simcore.models").joinpath("data/gpus.json").open(encoding="utf-8") as handle:
        return json.load(handle)


def model_names() -> tuple[str, ...]:
    """The catalogue's model names, in catalogue order."""
    return tuple(_models())


def gpu_names() -> tuple[str, ...]:
    """The catalogue's GPU names, in catalogue order."""
    return tuple(_gpus())


def model_entry(name: str) -> dict[str, Any]:
    """A catalogue model's entry.

    Parameters
    ----------
    name : str
        A catalogue model name (any case).

    Returns
    -------
    dict
        ``hf_id``, ``config_url``, ``licence``, ``copied_from`` and ``config`` (the fields read).

    Raises
    ------
    KeyError
        ``name`` is not in the catalogue.
    """
    return _models()[_canonical(name, _models())]


def _canonical(name: str, table: dict[str, Any]) -> str | None:
    lowered = str(name).lower()
    return next((key for key in table if key.lower() == lowered), None)


def model_spec(model: str, *, kv_dtype: str | None = None, key: str = "timing.model") -> ModelSpec:
    """The architecture of a catalogue model, or of a ``config.json`` path.

    Parameters
    ----------
    model : str
        A catalogue name (:func:`model_names`, any case), or a path to a
        ``config.json`` or to a directory holding one.
    kv_dtype : str, optional
        The KV cache's dtype; None: the model's serving dtype.
    key : str
        The configuration key named in errors.

    Returns
    -------
    ModelSpec

    Raises
    ------
    ConfigError
        Neither a catalogue name nor a readable config (listing the names), or
        the config is refused (:func:`simcore.models.describe.describe`).
    """
    return _spec(str(model), kv_dtype, key)


@functools.lru_cache(maxsize=64)
def _spec(model: str, kv_dtype: str | None, key: str) -> ModelSpec:
    name = _canonical(model, _models())
    if name is not None:
        return describe(_models()[name]["config"], f"catalogue model {name}", kv_dtype=kv_dtype)
    if os.path.isfile(model) or os.path.isfile(os.path.join(model, "config.json")):
        path = model if os.path.isfile(model) else os.path.join(model, "config.json")
        return describe(load_config(path), path, kv_dtype=kv_dtype)
    raise ConfigError(
        f"{key}={model} is neither a catalogue model nor a path to a config.json; "
        f"catalogue models: {', '.join(model_names())}"
    )


@dataclass(frozen=True)
class Gpu:
    """One GPU's datasheet figures."""

    name: str
    memory_gib: float
    bandwidth_gb_per_s: float
    tflops: dict[str, float | None]
    link: str
    link_gb_per_s: float  # the vendor's figure: both directions, all links
    sparse_factor: float = 2.0  # 2:4 structured sparsity's rate over the dense one (the datasheets' footnote)

    def sparse_tflops(self, precision: str) -> float | None:
        """The datasheet's with-sparsity TFLOPS of ``precision`` (None: no such tensor cores)."""
        value = self.tflops.get(precision)
        return None if not value else value * self.sparse_factor

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB

    def peak_tflops(self, dtype: str) -> float:
        """Dense tensor-core TFLOPS for GEMMs whose weights are ``dtype``.

        The weights' precision where the GPU has it, else the next wider one it
        has (fp4 on Hopper runs at the fp8 rate, fp8 on Ampere at bf16: the
        weights are widened before the tensor cores).
        """
        order = PRECISIONS[: PRECISIONS.index(PRECISION[dtype]) + 1]
        for precision in reversed(order):
            value = self.tflops.get(precision)
            if value:
                return float(value)
        return float(self.tflops["bf16"])

    @property
    def ring_gb_per_s(self) -> float:
        """A ring all-reduce's bandwidth: one direction of the vendor's bidirectional figure."""
        return self.link_gb_per_s / 2


def gpu(name: str, key: str = "timing.gpu") -> Gpu:
    """A catalogue GPU by name (any case).

    Parameters
    ----------
    name : str
        A catalogue GPU name.
    key : str
        The configuration key named in errors.

    Returns
    -------
    Gpu

    Raises
    ------
    ConfigError
        An unknown name (listing the valid ones).
    """
    found = _canonical(name, _gpus())
    if found is None:
        raise ConfigError(f"{key}={name} is not a catalogue GPU; valid names: {', '.join(gpu_names())}")
    row = _gpus()[found]
    return Gpu(found, float(row["memory_gib"]), float(row["bandwidth_gb_per_s"]), dict(row["tflops"]), row["link"],
               float(row["link_gb_per_s"]), float(row["sparse_factor"]))


def check_tp(spec: ModelSpec, tp: int, key: str = "timing.tp") -> None:
    """vLLM's tensor-parallel rule: ``tp`` divides the attention heads, and the KV heads
    divide or are divided by it (MLA: the heads only).

    Parameters
    ----------
    spec : ModelSpec
    tp : int
        Tensor-parallel degree.
    key : str
        The configuration key named in errors.

    Raises
    ------
    ConfigError
        Naming ``key`` and the model's heads.
    """
    if spec.num_heads % tp:
        raise ConfigError(f"{key}={tp} must divide the {spec.num_heads} attention heads of {spec.source}")
    if not spec.mla and spec.num_kv_heads % tp and tp % spec.num_kv_heads:
        raise ConfigError(
            f"{key}={tp} and the {spec.num_kv_heads} KV heads of {spec.source} must divide one another"
        )


@dataclass(frozen=True)
class MemoryPlan:
    """One rank's memory under :func:`memory_plan`, bytes."""

    total: float
    usable: float  # total x memory fraction
    weights: float  # per rank
    activations: float
    kv_per_token: float  # per rank, all layers

    @property
    def kv(self) -> float:
        return self.usable - self.weights - self.activations

    @property
    def fits(self) -> bool:
        return self.kv >= self.kv_per_token  # room for one token's KV at least

    def describe(self) -> str:
        return (
            f"weights {self.weights / GIB:.2f} GiB + activations {self.activations / GIB:.2f} GiB per GPU "
            f"against {self.usable / GIB:.2f} GiB usable ({self.total / GIB:.0f} GiB x memory fraction "
            f"{self.usable / self.total:g})"
        )


def memory_plan(spec: ModelSpec, device: Gpu, tp: int, fraction: float, max_tokens: int, max_sequences: int) -> MemoryPlan:
    """One rank's memory: the GPU at ``fraction`` less weights and activations (module docstring).

    Parameters
    ----------
    spec : ModelSpec
    device : Gpu
    tp : int
        Tensor-parallel degree (weights and the MLP width split over it).
    fraction : float
        Share of the GPU's memory given to the engine (vLLM's gpu_memory_utilization).
    max_tokens, max_sequences : int
        The pool's largest pass: tokens and sequences.

    Returns
    -------
    MemoryPlan
    """
    width = max(spec.intermediate_size, spec.experts_per_token * spec.moe_intermediate_size)
    act = DTYPE_BYTES[spec.dtype]
    activations = max_tokens * (2 * spec.hidden_size + 2 * width / tp) * act + max_sequences * spec.vocab_size * LOGIT_BYTES
    total = device.memory_bytes
    return MemoryPlan(total, total * fraction, spec.weight_bytes() / tp, activations, spec.kv_bytes_per_token(tp))


def kv_blocks(plan: MemoryPlan, block_size: int) -> int:
    """KV blocks of ``block_size`` tokens that fit in ``plan``'s KV memory.

    Parameters
    ----------
    plan : MemoryPlan
    block_size : int
        Tokens per block.

    Returns
    -------
    int
        Blocks, 0 when none fits.
    """
    return max(0, int(plan.kv // (plan.kv_per_token * block_size)))


def fit_error(model: str, spec: ModelSpec, device: Gpu, tp: int, plan: MemoryPlan, path: str = "timing") -> str:
    """The one-line message of a model that does not fit (``timing.model``/``gpu``/``tp`` named).

    Parameters
    ----------
    model : str
        ``timing.model`` as given.
    spec : ModelSpec
    device : Gpu
    tp : int
    plan : MemoryPlan
        The rank's memory, which does not fit.
    path : str
        Where the keys were given (``timing``, or a pool's ``engine.<pool>.timing``).

    Returns
    -------
    str
    """
    return (
        f"{path}.model={model} does not fit {path}.gpu={device.name} at {path}.tp={tp}: {plan.describe()}; "
        f"a larger {path}.tp or GPU is needed"
    )
