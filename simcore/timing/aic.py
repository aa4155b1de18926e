"""``timing.type=aic``: component tables from aiconfigurator-core, cached on disk.

aiconfigurator-core 0.12 (the optional extra ``replaysim[aic]``) estimates a
forward pass from its per-GPU operator database
(``RustForwardPassPerfModel.estimate_forward_pass_time_ms``), but a call costs
about 9 µs (70 times the kernel's table lookup) and cannot run inside the numba
kernel.  So, once per
configuration, :func:`build_tables` evaluates the model's compiled op list
(``EngineHandle.evaluate_context_ops`` / ``evaluate_generation_ops``) on five
grids that mirror the estimator's own composition (docs/timing.md):

========  =====================================================  ==================================
table     what                                                   knots
========  =====================================================  ==================================
``NA``    context ops except attention and logits, batch 1       every integer T <= tokens limit
``LG``    logits GEMM at x rows                                  every integer x <= sequences limit
``NG``    generation ops except attention (logits included)      every integer B <= sequences limit
``GA``    decode attention, B requests at K tokens               every integer B x K (16 per octave
                                                                 plus 2^j - 1, 2^j)
``CA``    context attention, n requests of s new, p cached       n 1..16 then x1.5; s 8 per octave;
                                                                 p 0 then 8 per octave from 16
========  =====================================================  ==================================

``simcore.timing.nb.aic_pass_ms_nb`` interpolates them.  A build-time
self-check compares the tables with direct ``estimate_forward_pass_time_ms``
calls on random passes and refuses tables whose worst error exceeds
:data:`MAX_REL_ERROR`.  Tables are cached in
``$REPLAYSIM_CACHE_DIR/aic/<key>.npz`` (default ``~/.cache/replaysim/aic``;
an entry carries the SHA-256 of its arrays and is checked on load, see
:func:`load_or_build`),
``key`` = a hash of the configuration, the table layout and the package version.

aiconfigurator-core is imported lazily: the rest of the simulator works without it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from simcore.errors import ConfigError
from simcore.timing import nb

if TYPE_CHECKING:  # annotations only
    from simcore.timing.settings import TimingConfig

PACKAGE = "aiconfigurator-core"
EXTRA_HINT = "pip install 'replaysim[aic]' (aiconfigurator-core>=0.12,<0.13)"
#: Bump when the table layout or the knots change (invalidates the disk cache).
LAYOUT_VERSION = 3
#: The self-check refuses tables whose worst relative error over the random passes exceeds this.
MAX_REL_ERROR = 0.01
#: Random passes of the self-check.
NUM_CHECKS = 300
#: Knots per octave of the decode-attention kv axis and of the context-attention s and p axes.
KV_PER_OCTAVE = 16
CTX_PER_OCTAVE = 12
#: Name ending of the database's two all-reduces per layer (context_ar_1, generation_ar_2, ...;
#: the embedding's ``*_embedding_ar`` is once per pass and stays).
PER_LAYER_ALLREDUCE = ("_ar_1", "_ar_2")
#: Relative chord error that makes the decode-attention rows bisect an interval.
GA_REFINE_TOL = 2e-4
#: Decode-attention rows exist for every batch up to this one (the database's
#: attention is not linear in the batch between its measured powers of two).
DECODE_INTEGER_BATCH = 256

_MEMO: dict[str, tuple[np.ndarray, np.ndarray, dict]] = {}
#: The one rule that prices decode attention beyond the database's KV heads (docs/timing.md,
#: "Decode attention beyond the database"); it enters the cache key of the specs it applies to.
GA_FOLD_RULE = "fold-kv-heads-into-batch/1"


@dataclass(frozen=True)
class AicSpec:
    """What identifies one set of tables."""

    model: str
    gpu: str
    backend: str
    backend_version: str | None
    tp: int
    tokens: int  # NA knots 1..tokens
    sequences: int  # LG, NG, GA batch knots 1..sequences
    context: int  # GA kv and CA prefix knots up to this
    # the MoE layers' layout (moe_tp x moe_ep = tp, aiconfigurator-core's width rule): experts split
    # by tensor parallelism (moe_tp = tp), or whole experts over the GPUs with expert parallelism
    # (moe_ep = tp); :func:`moe_layout`.  A dense model ignores them.
    moe_tp: int = 1
    moe_ep: int = 1

    @classmethod
    def from_config(cls, cfg: TimingConfig) -> "AicSpec":
        moe_tp, moe_ep = moe_layout(cfg.tp, cfg.expert_parallel)
        return cls(
            cfg.model,
            cfg.gpu,
            cfg.backend,
            cfg.backend_version,
            cfg.tp,
            int(cfg.pass_tokens_limit),
            int(cfg.pass_sequences_limit),
            int(cfg.context_limit),
            moe_tp,
            moe_ep,
        )


def moe_layout(tp: int, expert_parallel: bool) -> tuple[int, int]:
    """aiconfigurator-core's ``(moe_tp_size, moe_ep_size)`` for a rank of ``tp`` GPUs.

    The core requires ``moe_tp_size x moe_ep_size = tp_size x attention_dp_size x
    cp_size`` (its ``Parallelism width mismatch`` error; unset, both count 1, so an
    MoE model at TP 2 failed).  The tables time one attention-DP rank
    (``attention_dp_size = 1``), so the product is ``tp``.  vLLM splits every
    expert over the tensor-parallel GPUs (``moe_tp = tp``) unless
    ``--enable-expert-parallel`` gives each GPU whole experts (``moe_ep = tp``;
    ``engine.<pool>.expert_parallel``).

    Parameters
    ----------
    tp : int
        timing.tp.
    expert_parallel : bool
        Whether the pools run expert parallelism.

    Returns
    -------
    (int, int)
        ``moe_tp_size``, ``moe_ep_size``.
    """
    return (1, tp) if expert_parallel else (tp, 1)


# ---------------------------------------------------------------- package access


def package_version(gpu: str | None = None) -> str:
    """The installed aiconfigurator-core version, after checking that it knows ``gpu``.

    Parameters
    ----------
    gpu : str, optional
        A ``timing.gpu`` value to check against :func:`system_names`.

    Returns
    -------
    str
        The package version (``0.12.x``).

    Raises
    ------
    ConfigError
        The package is missing (naming the extra), of another minor version,
        or has no database for the system ``gpu`` (listing the ones it has).
    """
    from importlib import metadata

    try:
        version = metadata.version(PACKAGE)
        import aiconfigurator_core  # noqa: F401
    except (metadata.PackageNotFoundError, ImportError):
        raise ConfigError(f"timing.type=aic needs the optional extra: {EXTRA_HINT}") from None
    if not version.startswith("0.12."):
        raise ConfigError(f"timing.type=aic is built for aiconfigurator-core 0.12.x, found {version}: {EXTRA_HINT}")
    names = system_names() if gpu is not None else ()
    if names and gpu not in names:
        raise ConfigError(
            f"timing.gpu={gpu} is not a system of aiconfigurator-core {version}; "
            f"valid names: {', '.join(names)}"
        )
    return version


@functools.lru_cache(maxsize=1)
def system_names() -> tuple[str, ...]:
    """The systems (``timing.gpu`` values) aiconfigurator-core ships a database for.

    Read from the installed distribution's file list (its
    ``systems/data/<system>/`` directories), which neither imports the package
    nor loads a database; empty when the list is unavailable.
    """
    from importlib import metadata

    try:
        files = metadata.files(PACKAGE) or ()
    except metadata.PackageNotFoundError:
        return ()
    names = set()
    for path in files:
        parts = path.parts
        if len(parts) > 4 and parts[:3] == ("aiconfigurator_core", "systems", "data"):
            names.add(parts[3])
    return tuple(sorted(names))


@contextlib.contextmanager
def _quiet_stderr():
    """Silence the Rust core's "Loading low-fidelity fallback rows" lines (fd 2) while building."""
    try:
        fd = os.dup(2)
    except OSError:
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(fd, 2)
            os.close(fd)


def _native_config(spec: AicSpec) -> dict:
    return dict(
        schema_version=1,
        model_name=spec.model,
        system_name=spec.gpu,
        backend=spec.backend,
        backend_version=spec.backend_version,
        tp_size=spec.tp,
        pp_size=1,
        attention_dp_size=1,
        moe_tp_size=spec.moe_tp,
        moe_ep_size=spec.moe_ep,
        cp_size=1,
        weight_dtype=None,
        moe_dtype=None,
        activation_dtype=None,
        kv_cache_dtype=None,
        nextn=0,
        kv_block_size=None,
        extra={},
    )


def _what(spec: AicSpec) -> str:
    version = spec.backend_version or "current"
    layout = " (expert parallel)" if spec.moe_ep > 1 else ""
    return (
        f"timing.model={spec.model} timing.gpu={spec.gpu} timing.backend={spec.backend} ({version}) "
        f"timing.tp={spec.tp}{layout}"
    )


def model_dimensions(model: str) -> tuple[int | None, int | None]:
    """``(num_hidden_layers, hidden_size)`` of ``timing.model`` from its config.json: the one
    bundled with aiconfigurator-core (``model_configs/<org>--<name>_config.json``) or a
    local directory's; ``(None, None)`` when there is none.

    Parameters
    ----------
    model : str
        A bundled Hugging Face id or a local directory.

    Returns
    -------
    (int or None, int or None)
    """
    if os.path.isdir(model):
        path = os.path.join(model, "config.json")
    else:
        import aiconfigurator_core

        root = os.path.dirname(aiconfigurator_core.__file__)
        path = os.path.join(root, "model_configs", model.replace("/", "--") + "_config.json")
    if not os.path.isfile(path):
        return None, None
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    config = config.get("text_config", config)  # multimodal wrappers keep the LLM's inside
    return config.get("num_hidden_layers"), config.get("hidden_size")


def attention_shape(model: str) -> tuple[int, int, int, int] | None:
    """``(num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim)`` of ``timing.model``
    from its config.json (as :func:`model_dimensions` finds it); None when it lacks one of them.

    ``num_key_value_heads`` defaults to the attention heads (multi-head attention) and
    ``head_dim`` to ``hidden_size / num_attention_heads``, as Hugging Face's Llama config does.

    Parameters
    ----------
    model : str
        ``timing.model``: a directory holding config.json, or a model the database names.

    Returns
    -------
    tuple of int, or None
    """
    if os.path.isdir(model):
        path = os.path.join(model, "config.json")
    else:
        import aiconfigurator_core

        root = os.path.dirname(aiconfigurator_core.__file__)
        path = os.path.join(root, "model_configs", model.replace("/", "--") + "_config.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        config = json.load(handle)
    config = config.get("text_config", config)
    layers, heads, hidden = config.get("num_hidden_layers"), config.get("num_attention_heads"), config.get("hidden_size")
    if not all(isinstance(v, int) and v > 0 for v in (layers, heads)):
        return None
    kv = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or (hidden // heads if isinstance(hidden, int) else None)
    if not (isinstance(kv, int) and kv > 0 and isinstance(head_dim, int) and head_dim > 0):
        return None
    return layers, heads, kv, head_dim


def covered_kv_heads(spec: AicSpec, head_dim: int) -> tuple[int, ...]:
    """The KV-head counts of the database's decode-attention rows at ``head_dim`` (all head sizes if
    it has none at that one): ``generation_attention_perf.parquet`` of the spec's GPU, backend and
    (resolved) version; () when the file is not there.

    Parameters
    ----------
    spec : AicSpec
        The GPU, backend and version.
    head_dim : int
        The model's head size.

    Returns
    -------
    tuple of int
    """
    return _covered_kv_heads(spec.gpu, spec.backend, spec.backend_version, head_dim)


@functools.lru_cache(maxsize=None)
def _covered_kv_heads(gpu: str, backend: str, backend_version: str | None, head_dim: int) -> tuple[int, ...]:
    import aiconfigurator_core
    import pyarrow.parquet as pq
    from aiconfigurator_core.sdk import perf_database

    try:
        version = perf_database.resolve_query_version(gpu, backend, backend_version or "current")
    except Exception:
        version = backend_version
    if not version:
        return ()
    root = os.path.dirname(aiconfigurator_core.__file__)
    path = os.path.join(root, "systems", "data", gpu, "attention", backend, str(version),
                        "generation_attention_perf.parquet")
    if not os.path.isfile(path):
        return ()
    table = pq.read_table(path, columns=["num_key_value_heads", "head_dim"]).to_pydict()
    pairs = list(zip(table["num_key_value_heads"], table["head_dim"]))
    at_size = sorted({kv for kv, size in pairs if size == head_dim})
    return tuple(at_size or sorted({kv for kv, _ in pairs}))


@dataclass(frozen=True)
class FoldRule:
    """Decode attention of a model with more KV heads per GPU than the database measured
    (docs/timing.md, "Decode attention beyond the database"): ``B`` sequences of
    ``model_kv_heads`` heads are priced as ``fold x B`` sequences of ``kv_heads`` (the largest
    measured count dividing the model's) with the same query heads per KV head, at the same
    context: the same KV bytes read and the same (sequence, KV head) work items of the kernel."""

    model_kv_heads: int  # per GPU
    model_q_heads: int  # per GPU
    kv_heads: int  # the covered count used
    q_heads: int
    fold: int  # model_kv_heads / kv_heads
    head_dim: int
    layers: int
    covered: tuple[int, ...]

    def op_json(self) -> str:
        """The ad-hoc decode-attention op (aiconfigurator-core's OpSpec JSON) of the covered shape."""
        return json.dumps([{"GenerationAttention": {
            "name": "generation_attention", "scale_factor": float(self.layers), "n": self.q_heads,
            "n_kv": self.kv_heads, "head_size": self.head_dim, "window_size": 0,
            "kv_cache_dtype": "bfloat16", "lane_order": ["default"],
        }}])

    def note(self) -> str:
        """The summary's warning: the operator extrapolated and how."""
        return (
            f"timing.type=aic: decode attention (generation_attention) extrapolated: the model has "
            f"{self.model_kv_heads} KV heads per GPU, the database measured "
            f"{', '.join(str(k) for k in self.covered)}; priced as {self.fold} x the batch at "
            f"{self.kv_heads} KV heads ({self.q_heads} query heads), the same context: the same KV bytes "
            f"and (sequence, KV head) work items (docs/timing.md)"
        )


def fold_rule(spec: AicSpec) -> FoldRule | None:
    """The decode-attention rule of ``spec`` when its model's KV heads per GPU exceed the database's
    largest measured count, else None (the database's own rows price it).

    Per GPU: ``max(1, heads // tp)`` query and ``max(1, kv_heads // tp)`` KV heads (tensor
    parallelism splits the heads).  Rows within the measured range are never changed.

    Parameters
    ----------
    spec : AicSpec
        The model, GPU, backend, version and tensor parallelism.

    Returns
    -------
    FoldRule or None
    """
    shape = attention_shape(spec.model)
    if shape is None:
        return None
    layers, heads, kv, head_dim = shape
    kv_gpu, q_gpu = max(1, kv // spec.tp), max(1, heads // spec.tp)
    covered = covered_kv_heads(spec, head_dim)
    if not covered or kv_gpu <= max(covered):
        return None
    dividing = [k for k in covered if kv_gpu % k == 0]
    if not dividing:
        return None
    kv_used = max(dividing)
    per_kv = max(1, q_gpu // kv_gpu)
    return FoldRule(kv_gpu, q_gpu, kv_used, per_kv * kv_used, kv_gpu // kv_used, head_dim, layers, covered)


def direct_model(spec: AicSpec):
    """aiconfigurator-core's own forward-pass model (the reference of the self-check).

    Parameters
    ----------
    spec : AicSpec
        Model, GPU, backend (version), TP and the table limits.

    Returns
    -------
    RustForwardPassPerfModel

    Raises
    ------
    ConfigError
        The package is missing or cannot model ``spec``.
    """
    package_version(spec.gpu)
    from aiconfigurator_core.sdk import RustForwardPassPerfModel

    try:
        with _quiet_stderr():
            return RustForwardPassPerfModel.from_native(_native_config(spec))
    except Exception as exc:  # the Rust core raises ValueError/RuntimeError with its reason
        raise ConfigError(f"aiconfigurator-core cannot model {_what(spec)}: {exc}") from None


def direct_pass_ms(model, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens) -> float:
    """One direct estimate for a SPEC §8 batch summary, ms.

    The FPM counts cached tokens (vLLM's ``num_computed_tokens``), so
    ``sum_prefill_kv_tokens = prefill_kv_tokens - prefill_tokens`` and
    ``sum_decode_kv_tokens = decode_kv_tokens - num_decode``.

    Parameters
    ----------
    model : RustForwardPassPerfModel
        From :func:`direct_model`.
    num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens : int
        The batch summary (entries, tokens).

    Returns
    -------
    float
        Pass time, ms.
    """
    fpm = {
        "version": 1,
        "scheduled_requests": {
            "num_prefill_requests": int(num_prefill),
            "sum_prefill_tokens": int(prefill_tokens),
            "sum_prefill_kv_tokens": int(prefill_kv_tokens - prefill_tokens),
            "num_decode_requests": int(num_decode),
            "sum_decode_kv_tokens": int(decode_kv_tokens - num_decode),
        },
    }
    return float(model.estimate_forward_pass_time_ms(fpm))


# ---------------------------------------------------------------- knots


def log_knots(start: int, stop: int, per_octave: int) -> np.ndarray:
    """Integers ``round(start x 2^(i / per_octave))`` up to ``stop`` (both included), unique.

    Parameters
    ----------
    start, stop : int
        First and last knot.
    per_octave : int
        Knots per doubling.

    Returns
    -------
    ndarray(int64, ndim=1)
        Ascending knots in ``[start, stop]`` (``[start]`` when ``stop <= start``).
    """
    if stop <= start:
        return np.array([start], dtype=np.int64)
    count = int(math.ceil(per_octave * math.log2(stop / start)))
    knots = np.rint(start * np.exp2(np.arange(count + 1) / per_octave)).astype(np.int64)
    return np.unique(np.clip(np.append(knots, stop), start, stop))


def kv_knots(context: int) -> np.ndarray:
    """Decode kv knots: 1..16, 16 per octave beyond, every 2^j - 1 and 2^j, up to ``context``.

    Parameters
    ----------
    context : int
        Largest kv length, tokens.

    Returns
    -------
    ndarray(int64, ndim=1)
        Ascending kv knots, tokens.
    """
    knots = [np.arange(1, 17), log_knots(16, max(context, 16), KV_PER_OCTAVE)]
    j = 1
    while (1 << j) <= context:
        knots.append(np.array([(1 << j) - 1, 1 << j]))
        j += 1
    knots.append(np.array([context]))
    out = np.unique(np.concatenate(knots))
    return out[(out >= 1) & (out <= max(context, 1))]


def decode_batch_knots(sequences: int) -> np.ndarray:
    """Decode-attention batch rows: every integer up to 256, then 32 per octave, up to ``sequences``.

    Parameters
    ----------
    sequences : int
        Largest batch, sequences.

    Returns
    -------
    ndarray(int64, ndim=1)
        Ascending batch knots, sequences.
    """
    knots = np.arange(1, min(sequences, DECODE_INTEGER_BATCH) + 1)
    if sequences > DECODE_INTEGER_BATCH:
        knots = np.concatenate([knots, log_knots(DECODE_INTEGER_BATCH, sequences, 32)])
    return np.unique(knots)


def batch_knots(sequences: int) -> np.ndarray:
    """Context-attention batch knots: 1..16, then x1.5 steps (24, 32, 48, ...), up to ``sequences``.

    Parameters
    ----------
    sequences : int
        Largest batch, sequences.

    Returns
    -------
    ndarray(int64, ndim=1)
        Ascending batch knots ending at ``sequences``.
    """
    knots = list(range(1, 17))
    v = 16
    while v < sequences:
        v = int(v * 1.5) if (v & (v - 1)) == 0 else 1 << v.bit_length()
        knots.append(v)
    out = np.unique(np.array(knots, dtype=np.int64))
    out = out[out <= sequences]
    return np.unique(np.append(out, sequences)) if sequences > 1 else np.array([1], dtype=np.int64)


# ---------------------------------------------------------------- build


def _refined_row(f, base: np.ndarray, tol: float = GA_REFINE_TOL) -> tuple[np.ndarray, np.ndarray]:
    """Knots and values of ``f`` on the integer ``base`` knots, bisected where linear interpolation fails.

    Each interval is checked at its integer midpoint; where the value there is
    more than ``tol`` (relative) off the chord, both halves are checked again,
    down to adjacent integers.  So the steps of the database's decode-attention
    model (its kernel-split heuristics) are bracketed by adjacent knots.
    """
    values = {int(k): f(int(k)) for k in base}
    stack = [(int(a), int(b)) for a, b in zip(base[:-1], base[1:])]
    while stack:
        a, b = stack.pop()
        if b - a < 2:
            continue
        m = (a + b) // 2
        fm = f(m)
        chord = values[a] + (values[b] - values[a]) * (m - a) / (b - a)
        if abs(fm - chord) > tol * max(abs(fm), 1e-12):
            values[m] = fm
            stack.append((a, m))
            stack.append((m, b))
    knots = np.array(sorted(values), dtype=np.int64)
    return knots, np.array([values[int(k)] for k in knots], dtype=np.float64)


def _op_indices(handle) -> tuple[list[int], int, int, list[int], int, list[int], list[int]]:
    """Indices of (non-attention non-logits context ops, context attention, context logits,
    non-attention generation ops, generation attention, and the per-layer all-reduces among
    the context and among the generation ops) in the compiled op lists."""

    def names(evaluate) -> list[str]:
        out = []
        while True:
            try:
                row = evaluate([len(out)], batch_size=1, s=8)
            except Exception:
                return out
            out.append(row[0][0] if row else "")

    ctx = names(handle.evaluate_context_ops)
    gen = names(handle.evaluate_generation_ops)
    try:
        ca = ctx.index("context_attention")
        lg = ctx.index("context_logits_gemm")
        ga = gen.index("generation_attention")
    except ValueError:
        raise ConfigError(
            "timing.type=aic supports models whose aiconfigurator-core op lists hold "
            "context_attention, context_logits_gemm and generation_attention (GQA/MHA decoders); "
            f"got context ops {ctx} and generation ops {gen}"
        ) from None
    na = [i for i in range(len(ctx)) if i not in (ca, lg)]
    ng = [i for i in range(len(gen)) if i != ga]
    # the two all-reduces of every layer (after attention and after the MLP)
    ar_ctx = [i for i in na if ctx[i].endswith(PER_LAYER_ALLREDUCE)]
    ar_gen = [i for i in ng if gen[i].endswith(PER_LAYER_ALLREDUCE)]
    return na, ca, lg, ng, ga, ar_ctx, ar_gen


def _compile(spec: AicSpec):
    """aiconfigurator-core's compiled engine of ``spec`` (``EngineHandle``); ConfigError if it cannot."""
    package_version(spec.gpu)
    from aiconfigurator_core.sdk import EngineHandle

    try:
        with _quiet_stderr():
            return EngineHandle.compile(
                spec.model, spec.gpu, spec.backend, backend_version=spec.backend_version, tp_size=spec.tp,
                moe_tp_size=spec.moe_tp, moe_ep_size=spec.moe_ep,
            )
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"aiconfigurator-core cannot model {_what(spec)}: {exc}") from None


def _ga_function(handle, ga: int, rule: FoldRule | None):
    """Decode attention of B sequences at K tokens, ms: the compiled op, or under ``rule`` the covered
    shape at ``fold x B`` sequences (:class:`FoldRule`)."""
    if rule is None:
        return lambda b, k: float(sum(r[1] for r in handle.evaluate_generation_ops([ga], batch_size=b, s=k)))
    ops = rule.op_json()
    return lambda b, k: float(sum(r[1] for r in handle.evaluate_ops_json(
        ops, is_context=False, batch_size=rule.fold * b, s=k)))


def _check_op_json(handle, ga: int, rule: FoldRule) -> None:
    """The ad-hoc op at the model's own shape must price what the compiled op does (same JSON form)."""
    own = FoldRule(rule.model_kv_heads, rule.model_q_heads, rule.model_kv_heads, rule.model_q_heads, 1,
                   rule.head_dim, rule.layers, rule.covered)
    for b, k in ((1, 1024), (8, 4096)):
        want = _ga_function(handle, ga, None)(b, k)
        got = _ga_function(handle, ga, own)(b, k)
        if not abs(got - want) <= 1e-9 * max(abs(want), 1e-12):
            raise ConfigError(
                f"timing.type=aic: cannot apply the decode-attention rule beyond the database's KV heads: "
                f"the ad-hoc op at the model's shape gives {got:.6f} ms, the compiled op {want:.6f} ms "
                f"(B={b}, K={k})"
            )


def build_tables(spec: AicSpec, rule: FoldRule | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Evaluate the component tables of ``spec``; returns the kernel's ``(params, table)``.

    Parameters
    ----------
    spec : AicSpec
        Model, GPU, backend (version), TP and the table limits.
    rule : FoldRule or None
        Decode attention beyond the database's KV heads (:func:`fold_rule`); None: the
        database's own rows.

    Returns
    -------
    params : ndarray(float64, shape (AIC_NUM_PARAMS,))
        Offsets and sizes of the pieces of ``table`` (``nb.A_*`` indices).
    table : ndarray(float64, ndim=1)
        Flat NA, LG, NG, GA and CA tables (times in ms) and their knots.

    Raises
    ------
    ConfigError
        aiconfigurator-core cannot model ``spec``.
    """
    handle = _compile(spec)
    na, ca, lg, ng, ga, ar_ctx, ar_gen = _op_indices(handle)
    if rule is not None:
        with _quiet_stderr():
            _check_op_json(handle, ga, rule)
    ctx_ops = handle.evaluate_context_ops
    gen_ops = handle.evaluate_generation_ops

    def total(rows) -> float:
        return float(sum(r[1] for r in rows))

    def zero_if_none(indices, evaluate, **kwargs) -> float:
        return total(evaluate(indices, **kwargs)) if indices else 0.0

    with _quiet_stderr():
        na_tab = np.array([total(ctx_ops(na, batch_size=1, s=t)) for t in range(1, spec.tokens + 1)])
        lg_tab = np.array([total(ctx_ops([lg], batch_size=x, s=1)) for x in range(1, spec.sequences + 1)])
        ng_tab = np.array([total(gen_ops(ng, batch_size=b, s=1)) for b in range(1, spec.sequences + 1)])
        arc_tab = np.array([zero_if_none(ar_ctx, ctx_ops, batch_size=1, s=t) for t in range(1, spec.tokens + 1)])
        arg_tab = np.array([zero_if_none(ar_gen, gen_ops, batch_size=b, s=1) for b in range(1, spec.sequences + 1)])
        base = kv_knots(spec.context)
        b_knots = decode_batch_knots(spec.sequences)
        ga_ms = _ga_function(handle, ga, rule)
        rows = [_refined_row(lambda k, b=int(b): ga_ms(b, k), base) for b in b_knots]
        ga_starts = np.cumsum([0] + [r[0].size for r in rows])
        ga_knots = np.concatenate([r[0] for r in rows])
        ga_tab = np.concatenate([r[1] for r in rows])
        n_knots = batch_knots(spec.sequences)
        s_knots = log_knots(1, spec.tokens, CTX_PER_OCTAVE)
        p_knots = np.concatenate([[0], log_knots(16, max(spec.context, 16), CTX_PER_OCTAVE)])
        ca_tab = np.array(
            [
                [[total(ctx_ops([ca], batch_size=int(n), s=int(s), prefix=int(p))) for p in p_knots] for s in s_knots]
                for n in n_knots
            ]
        )
    pieces = [na_tab, lg_tab, ng_tab, ga_starts, ga_knots, ga_tab, n_knots, s_knots, p_knots, ca_tab, b_knots, arc_tab, arg_tab]
    offsets = np.cumsum([0] + [p.size for p in pieces])
    params = np.zeros(nb.AIC_NUM_PARAMS, dtype=np.float64)
    params[nb.A_NA], params[nb.A_NA_N] = offsets[0], na_tab.size
    params[nb.A_LG], params[nb.A_LG_N] = offsets[1], lg_tab.size
    params[nb.A_NG], params[nb.A_NG_N] = offsets[2], ng_tab.size
    params[nb.A_GA_START], params[nb.A_GA_B_N] = offsets[3], b_knots.size
    params[nb.A_GA_B] = offsets[10]
    params[nb.A_GA_K], params[nb.A_GA] = offsets[4], offsets[5]
    params[nb.A_CA_N], params[nb.A_CA_N_N] = offsets[6], n_knots.size
    params[nb.A_CA_S], params[nb.A_CA_S_N] = offsets[7], s_knots.size
    params[nb.A_CA_P], params[nb.A_CA_P_N] = offsets[8], p_knots.size
    params[nb.A_CA] = offsets[9]
    params[nb.A_AR_CTX], params[nb.A_AR_GEN] = offsets[11], offsets[12]
    table = np.concatenate([np.asarray(p, dtype=np.float64).ravel() for p in pieces])
    return params, table


# ---------------------------------------------------------------- self-check


def random_passes(spec: AicSpec, count: int, seed: int = 0) -> np.ndarray:
    """``count`` random vLLM-like SPEC §8 summaries within the spec's limits, int64 (count, 5).

    A third each: decode-only (1..sequences decodes, log-uniform per-request
    context 64..min(32k, context)), mixed (those decodes plus 1-3 prefill
    entries filling up to the token budget, half of them with a log-uniform
    prefix up to 16k) and prefill-only.

    Parameters
    ----------
    spec : AicSpec
        Model, GPU, backend (version), TP and the table limits.
    count : int
        Number of summaries.
    seed : int
        Seed of the generator.

    Returns
    -------
    ndarray(int64, shape (count, 5))
        Rows ``[num_prefill, prefill_tokens, prefill_kv_tokens, num_decode,
        decode_kv_tokens]`` (entries, tokens).
    """
    rng = np.random.default_rng(seed)
    out = np.zeros((count, 5), dtype=np.int64)
    budget = max(spec.tokens - spec.sequences, 16)
    kv_hi = max(min(32768, spec.context - 1), 65)
    for r in range(count):
        kind = r % 3
        b = 0 if kind == 2 else int(np.exp(rng.uniform(0.0, math.log(spec.sequences + 0.999))))
        b = min(max(b, 0 if kind == 2 else 1), spec.sequences)
        if b:
            ctx = np.exp(rng.uniform(math.log(64), math.log(kv_hi), size=b)).astype(np.int64)
            out[r, 3] = b
            out[r, 4] = int(ctx.sum()) + b  # Σ (cached + 1)
        if kind == 0:
            continue
        n = int(rng.integers(1, 4))
        room = max(budget - b, n)
        tokens = int(rng.integers(n, room + 1))
        prefix = 0
        if rng.random() < 0.5:
            prefix = int(np.exp(rng.uniform(math.log(16), math.log(max(min(16384, spec.context - 1), 17))))) * n
        out[r, 0] = n
        out[r, 1] = tokens
        out[r, 2] = tokens + prefix
    return out


def self_check(spec: AicSpec, params: np.ndarray, table: np.ndarray, count: int = NUM_CHECKS,
               rule: FoldRule | None = None) -> dict:
    """Compare the tables with direct calls on ``count`` random passes; ConfigError above 1%.

    Under ``rule`` (:func:`fold_rule`) the direct estimate's decode attention at ``(B, K)`` is
    replaced by the rule's, both evaluated as the tables are (``K = (decode_kv_tokens - B) // B``).

    Parameters
    ----------
    spec : AicSpec
        Model, GPU, backend (version), TP and the table limits.
    params, table : ndarray(float64, ndim=1)
        The tables of :func:`build_tables`.
    count : int
        Random passes to compare.

    Returns
    -------
    dict
        ``passes``, ``mean_rel_error``, ``p99_rel_error``, ``max_rel_error`` (fractions).

    Raises
    ------
    ConfigError
        A relative error above ``MAX_REL_ERROR``.
    """
    model = direct_model(spec)
    passes = random_passes(spec, count)
    got = np.zeros(count, dtype=np.float64)
    nb.pass_times_nb(nb.TIMING_AIC, params, table, passes, got)
    with _quiet_stderr():
        want = np.array([direct_pass_ms(model, *row) for row in passes])
        if rule is not None:
            handle = _compile(spec)
            ga = _op_indices(handle)[4]
            native, folded = _ga_function(handle, ga, None), _ga_function(handle, ga, rule)
            for i, row in enumerate(passes):
                b = int(row[3])
                if b:
                    k = int((row[4] - b) // b)
                    want[i] += folded(b, k) - native(b, k)
    err = np.abs(got - want) / np.maximum(want, 1e-12)
    worst = int(np.argmax(err))
    stats = {
        "passes": int(count),
        "mean_rel_error": float(err.mean()),
        "p99_rel_error": float(np.percentile(err, 99)),
        "max_rel_error": float(err.max()),
    }
    if not err.max() <= MAX_REL_ERROR:
        row = passes[worst]
        raise ConfigError(
            f"timing.type=aic: the precomputed tables for {_what(spec)} differ from direct "
            f"aiconfigurator-core calls by up to {100 * err.max():.2f}% (> {100 * MAX_REL_ERROR:g}%), "
            f"worst at num_prefill={row[0]}, prefill_tokens={row[1]}, prefill_kv_tokens={row[2]}, "
            f"num_decode={row[3]}, decode_kv_tokens={row[4]}: {got[worst]:.4f} ms vs {want[worst]:.4f} ms; "
            "this model/GPU combination is not supported by the table layout"
        )
    return stats


# ---------------------------------------------------------------- cache


def cache_dir() -> str:
    """``$REPLAYSIM_CACHE_DIR/aic``, else ``~/.cache/replaysim/aic``."""
    root = os.environ.get("REPLAYSIM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "replaysim")
    return os.path.join(root, "aic")


def cache_key(spec: AicSpec, version: str, rule: FoldRule | None = None) -> str:
    """Hex key of the disk-cache entry of ``spec`` (24 characters of a SHA-256).

    Parameters
    ----------
    spec : AicSpec
        Model, GPU, backend (version), TP and the table limits.
    version : str
        The installed aiconfigurator-core version.
    rule : FoldRule or None
        Decode attention beyond the database (:func:`fold_rule`); it enters the key only when
        it applies, so the keys of every other spec are unchanged.

    Returns
    -------
    str
    """
    content = {"spec": spec.__dict__, "package": version, "layout": LAYOUT_VERSION}
    if rule is not None:
        content["decode_attention"] = {"rule": GA_FOLD_RULE, **rule.__dict__}
    blob = json.dumps(content, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def aic_arrays(cfg: TimingConfig) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's ``(params, table)`` for ``cfg``: from memory, the disk cache, or a checked build.

    Parameters
    ----------
    cfg : TimingConfig
        A ``timing.type=aic`` section.

    Returns
    -------
    params, table : ndarray(float64, ndim=1)
        As :func:`build_tables`.
    """
    params, table, _ = load_or_build(AicSpec.from_config(cfg))
    return params, table


def extrapolation_notes(cfg: TimingConfig) -> list[str]:
    """The warnings of ``cfg``'s aic tables: each operator priced beyond the database and how
    (the summary's ``timing_warnings``); [] for other timing types or covered models.

    Parameters
    ----------
    cfg : TimingConfig
        The run's timing settings.

    Returns
    -------
    list of str
    """
    if cfg.type != "aic":
        return []
    rule = fold_rule(AicSpec.from_config(cfg))
    return [] if rule is None else [rule.note()]


def load_or_build(spec: AicSpec) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(params, table, info)``; ``info`` holds the self-check errors and the build time.

    Parameters
    ----------
    spec : AicSpec
        Model, GPU, backend (version), TP and the table limits.

    Returns
    -------
    params, table : ndarray(float64, ndim=1)
        As :func:`build_tables`.
    info : dict
        :func:`self_check` statistics, ``build_seconds`` (s), package, spec, key.
    """
    version = package_version(spec.gpu)
    rule = fold_rule(spec)
    key = cache_key(spec, version, rule)
    if key in _MEMO:
        return _MEMO[key]
    path = os.path.join(cache_dir(), f"{key}.npz")
    found = load_entry(path, spec, rule)
    if found is not None:
        _MEMO[key] = found
        return found
    start = time.perf_counter()
    params, table = build_tables(spec, rule)
    built = time.perf_counter() - start
    info = self_check(spec, params, table, rule=rule)
    info.update(build_seconds=built, package=version, spec=spec.__dict__, key=key)
    if rule is not None:
        info.update(extrapolated=[rule.note()])
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".npz.tmp")
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, params=params, table=table, info=np.array(json.dumps(info)),
                     sha256=np.array(tables_digest(params, table)))
        os.replace(tmp, path)
    except OSError:
        pass  # an unwritable cache only costs a rebuild next time
    _MEMO[key] = (params, table, info)
    return _MEMO[key]


#: Passes compared with direct aiconfigurator-core calls when a cache entry is loaded.
LOAD_CHECKS = 8


def tables_digest(params: np.ndarray, table: np.ndarray) -> str:
    """SHA-256 of the two arrays' dtypes, shapes and bytes: stored in a cache entry, checked on load.

    Parameters
    ----------
    params, table : ndarray
        As :func:`build_tables`.

    Returns
    -------
    str
        64 hex digits.
    """
    digest = hashlib.sha256()
    for array in (params, table):
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def layout_problem(spec: AicSpec, params: np.ndarray, table: np.ndarray) -> str | None:
    """What in ``(params, table)`` contradicts the layout of :func:`build_tables` for ``spec``, or None.

    Shapes and dtypes, offsets that are integers inside ``table``, the table
    sizes ``spec`` fixes (``tokens``, ``sequences``), finite non-negative
    times: what the kernel indexes without bounds checks.

    Parameters
    ----------
    spec : AicSpec
        The spec the tables were built for.
    params, table : ndarray
        As :func:`build_tables`.

    Returns
    -------
    str or None
        The first contradiction found.
    """
    if params.dtype != np.float64 or params.shape != (nb.AIC_NUM_PARAMS,):
        return f"params has dtype {params.dtype} and shape {params.shape}"
    if table.dtype != np.float64 or table.ndim != 1 or table.size == 0:
        return f"table has dtype {table.dtype} and shape {table.shape}"
    if not (np.isfinite(table).all() and (table >= 0).all()):
        return "table holds a negative or non-finite value"
    if not (np.isfinite(params).all() and (params >= 0).all() and (params == np.round(params)).all()):
        return "params holds an offset that is not a non-negative integer"
    p = params.astype(np.int64)
    if (p[nb.A_NA_N], p[nb.A_LG_N], p[nb.A_NG_N]) != (spec.tokens, spec.sequences, spec.sequences):
        return "a table size differs from the spec's tokens and sequences"
    b_n = int(p[nb.A_GA_B_N])
    pieces = [(nb.A_NA, p[nb.A_NA_N]), (nb.A_LG, p[nb.A_LG_N]), (nb.A_NG, p[nb.A_NG_N]),
              (nb.A_GA_START, b_n + 1), (nb.A_GA_B, b_n), (nb.A_CA_N, p[nb.A_CA_N_N]),
              (nb.A_CA_S, p[nb.A_CA_S_N]), (nb.A_CA_P, p[nb.A_CA_P_N]),
              (nb.A_CA, p[nb.A_CA_N_N] * p[nb.A_CA_S_N] * p[nb.A_CA_P_N])]
    for offset, size in pieces:
        if p[offset] + size > table.size:
            return f"a piece at offset {p[offset]} of size {size} ends past the table ({table.size})"
    starts = table[p[nb.A_GA_START] : p[nb.A_GA_START] + b_n + 1]
    if starts[0] != 0 or (np.diff(starts) < 1).any():
        return "the decode-attention row starts are not increasing from 0"
    knots = int(starts[-1])
    if p[nb.A_GA_K] + knots > table.size or p[nb.A_GA] + knots > table.size:
        return "the decode-attention rows end past the table"
    return None


def load_entry(path: str, spec: AicSpec, rule: FoldRule | None = None) -> tuple[np.ndarray, np.ndarray, dict] | None:
    """The cache entry at ``path`` if it is sound, else None (the caller rebuilds and replaces it).

    Sound: readable, its stored SHA-256 matches its arrays, its layout fits
    ``spec`` (:func:`layout_problem`), and :data:`LOAD_CHECKS` passes agree
    with direct aiconfigurator-core calls within :data:`MAX_REL_ERROR` (a
    table scaled or written by another build fails there).

    Parameters
    ----------
    path : str
        The ``.npz`` entry.
    spec : AicSpec
        The spec of its key.
    rule : FoldRule or None
        Its decode-attention rule (:func:`fold_rule`).

    Returns
    -------
    tuple or None
        ``(params, table, info)`` as :func:`load_or_build`.
    """
    if not os.path.isfile(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            params, table = data["params"].copy(), data["table"].copy()
            info, stored = json.loads(str(data["info"])), str(data["sha256"])
    except (OSError, ValueError, KeyError, EOFError):
        return None
    if stored != tables_digest(params, table) or layout_problem(spec, params, table) is not None:
        return None
    try:
        self_check(spec, params, table, count=LOAD_CHECKS, rule=rule)
    except ConfigError:
        return None
    return params, table, info


# ---------------------------------------------------------------- KV capacity


def auto_num_blocks(cfg: TimingConfig, block_size: int, max_tokens: int, max_sequences: int, *, field: str) -> int:
    """``num_blocks: auto``: KV blocks of one rank from aiconfigurator-core's memory model.

    ``estimate_num_gpu_blocks`` with the model, GPU, backend, TP, the pool's
    token and sequence limits and ``timing.memory_fraction`` (a fraction of total
    memory for vLLM/SGLang, of free memory for TensorRT-LLM).

    Parameters
    ----------
    cfg : TimingConfig
        A ``timing.type=aic`` section.
    block_size : int
        Tokens per block.
    max_tokens : int
        The pool's per-pass token limit, tokens.
    max_sequences : int
        The pool's sequence limit, sequences.
    field : str
        The configuration key named in errors (``engine.<pool>.num_blocks``).

    Returns
    -------
    int
        KV blocks per rank, >= 1 (memoised and cached on disk).

    Raises
    ------
    ConfigError
        aiconfigurator-core cannot derive the capacity, or leaves no KV memory.
    """
    version = package_version(cfg.gpu)
    blob = json.dumps(
        [cfg.model, cfg.gpu, cfg.backend, cfg.backend_version, cfg.tp, cfg.memory_fraction, block_size, max_tokens, max_sequences, version]
        + ([cfg.expert_parallel] if cfg.expert_parallel else [])  # older entries keep their keys
    )
    moe_tp, moe_ep = moe_layout(int(cfg.tp), cfg.expert_parallel)
    key = "kv-" + hashlib.sha256(blob.encode()).hexdigest()[:24]
    if key in _MEMO:
        return int(_MEMO[key])
    path = os.path.join(cache_dir(), f"{key}.json")
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as handle:
                blocks = int(json.load(handle)["num_blocks"])
            _MEMO[key] = blocks
            return blocks
        except (OSError, ValueError, KeyError, TypeError):
            pass
    from aiconfigurator_core.sdk import estimate_num_gpu_blocks

    try:
        with _quiet_stderr():
            blocks = int(
                estimate_num_gpu_blocks(
                    cfg.model,
                    cfg.gpu,
                    cfg.backend,
                    cfg.backend_version or "current",  # None finds no database here
                    scheduler_block_size=int(block_size),
                    max_num_tokens=int(max_tokens),
                    max_batch_size=int(max_sequences),
                    memory_fraction_kind="of_free" if cfg.backend == "trtllm" else "of_total",
                    memory_fraction_value=float(cfg.memory_fraction),
                    tp_size=int(cfg.tp),
                    moe_tp_size=moe_tp,
                    moe_ep_size=moe_ep,
                )
            )
    except Exception as exc:
        raise ConfigError(
            f"{field}=auto: aiconfigurator-core cannot derive the KV capacity of timing.model={cfg.model} "
            f"on timing.gpu={cfg.gpu} (timing.backend={cfg.backend}): {exc}; set {field} to a number"
        ) from None
    if blocks < 1:
        raise ConfigError(
            f"{field}=auto: aiconfigurator-core leaves no KV memory for timing.model={cfg.model} on "
            f"timing.gpu={cfg.gpu} at timing.memory_fraction={cfg.memory_fraction} (tp={cfg.tp})"
        )
    _MEMO[key] = blocks
    try:
        os.makedirs(cache_dir(), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir(), suffix=".json.tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"num_blocks": blocks, "inputs": json.loads(blob)}, handle)
        os.replace(tmp, path)
    except OSError:
        pass
    return blocks
