"""Derived settings: what the checked keys imply, computed in one step after parsing.

:func:`derive` takes a :class:`~simcore.settings.SimConfig` whose keys are
checked (:func:`simcore.config.load_config`) and fills in what files, the timing
models and the pools determine:

1. the model dimensions: a table profile's ``num_layers`` (and, for the TP
   all-reduce, ``hidden_size``) from its ``meta.yaml``, an aic model's from its
   config, a roofline model's from the catalogue (with TP and no
   ``timing.allreduce``: a ring at the GPU's link bandwidth);
2. ``num_blocks: auto`` of each active pool, from aiconfigurator-core's memory
   model (aic) or the catalogue's (roofline, which also refuses a model that
   does not fit the GPU);
3. the aic tables' ranges (the largest pass of the active pools) and vLLM's
   default CUDA-graph capture sizes;
4. the worst-case instants and buffer sizes (:func:`simcore.bounds.check_run`).

This is the only settings module that imports the timing models, so that they
(and :mod:`simcore.bounds`) can import the settings without a cycle.
"""

from __future__ import annotations

from dataclasses import replace

from simcore import bounds
from simcore.engine.settings import POOLS, KVTransferConfig
from simcore.errors import ConfigError
from simcore.scheduler.settings import (
    AUTO_BLOCKS,
    TOKEN_BUDGETS,
    PoolConfig,
    check_whole_prompt_budget,
    checked_num_blocks,
)
from simcore.settings import SimConfig
from simcore.models import catalogue
from simcore.timing import aic, roofline
from simcore.timing.profile import MOE_FILE, moe_path, read_meta_count, read_num_layers
from simcore.timing.settings import VLLM_DEFAULT_GRAPHS, TimingConfig


def derive(cfg: SimConfig) -> SimConfig:
    """Fill in the derived settings of a checked configuration, then check its bounds.

    Parameters
    ----------
    cfg : SimConfig
        Keys checked, derived values not yet set (an active pool's
        ``num_blocks`` may be ``"auto"``, ``timing.cuda_graph_sizes`` may be
        ``"vllm_default"``).

    Returns
    -------
    SimConfig
        The configuration the stages run.

    Raises
    ------
    ConfigError
        A file or the aic database does not give a needed value, the pools
        disagree on vLLM's graph sizes, or the run's worst case overflows.
    """
    engine = cfg.engine
    names = POOLS[engine.mode]
    given = list(cfg.pool_timing) or [cfg.timing] * len(names)
    sections = []  # each distinct timing section in use: the timing section first, then the pools' own
    for timing in given:
        if not any(timing is seen for seen in sections):
            sections.append(timing)
    derived = []
    for timing in sections:
        users = [i for i, t in enumerate(given) if t is timing]
        timing = model_dimensions(timing)
        if timing.type == "aic":  # the MoE layout of the tables and of num_blocks: auto
            timing = replace(timing, expert_parallel=any(engine.pools[i].expert_parallel for i in users))
        for i in users:
            name = names[i]
            pool = getattr(engine, name)
            if timing.type == "roofline":
                engine = replace(engine, **{name: _roofline_memory(f"engine.{name}", pool, timing)})
            elif isinstance(pool.num_blocks, str) and pool.num_blocks == AUTO_BLOCKS:
                engine = replace(engine, **{name: _auto_num_blocks(f"engine.{name}", pool, timing)})
        pools = [engine.pools[i] for i in users]
        if timing.type == "aic":
            timing = replace(timing, **_aic_limits(pools))
        if timing.cuda_graph_sizes == VLLM_DEFAULT_GRAPHS:
            timing = replace(timing, cuda_graph_sizes=vllm_graph_sizes(pools, timing.path))
        derived.append(timing)
    pool_timing = tuple(derived[next(j for j, t in enumerate(sections) if t is timing)] for timing in given)
    main = derived[0] if sections[0] is cfg.timing else cfg.timing
    if engine.mode == "disaggregated":
        engine = replace(engine, kv_transfer=_kv_transfer(engine.kv_transfer, pool_timing))
    cfg = replace(cfg, engine=engine, timing=main, pool_timing=pool_timing)
    bounds.check_run(cfg, bounds.configured_size(cfg))
    return cfg


def _named_model(timing: TimingConfig) -> str | None:
    """The model a pool's timing names (aic, roofline), lower case (catalogue names are case-free)."""
    return str(timing.model).lower() if timing.type in ("aic", "roofline") and timing.model is not None else None


def _kv_transfer(transfer: KVTransferConfig, pool_timing: tuple[TimingConfig, ...]) -> KVTransferConfig:
    """P/D: the pools must serve the same model (their KV is handed over); with the link set and no
    ``bytes_per_token``, the bytes are the model's KV per token, all layers, one copy (docs/semantics.md,
    KV transfer between pools of different layouts)."""
    prefill, decode = pool_timing
    if prefill is not decode:
        # names from one namespace only: aic's Hugging Face ids or the roofline catalogue's (and config paths)
        models = (_named_model(prefill), _named_model(decode))
        if prefill.type == decode.type and None not in models and models[0] != models[1]:
            raise ConfigError(
                f"{prefill.path}.model={prefill.model} and {decode.path}.model={decode.model} differ: the decode "
                "pool continues the prefill pool's KV cache, so both pools serve the same model"
            )
        if prefill.type == decode.type == "roofline" and prefill.roofline_kv_dtype != decode.roofline_kv_dtype:
            raise ConfigError(
                f"{prefill.path}.roofline.kv_dtype={prefill.roofline_kv_dtype} and {decode.path}.roofline.kv_dtype="
                f"{decode.roofline_kv_dtype} differ: the decode pool reads the KV cache the prefill pool wrote"
            )
    if transfer.bandwidth_gb_per_second is None or transfer.bytes_per_token is not None:
        return transfer
    source = next(t for t in (prefill, decode) if t.type == "roofline")  # simcore.config checked there is one
    spec, _ = roofline.resolve(source)
    return replace(transfer, bytes_per_token=float(spec.kv_bytes_per_token(1)))


def model_dimensions(timing: TimingConfig) -> TimingConfig:
    """A table profile's layer count, and the dimensions the TP all-reduce needs (docs/timing.md).

    Parameters
    ----------
    timing : TimingConfig
        The checked timing settings.

    Returns
    -------
    TimingConfig
        ``num_layers`` (table; and with timing.allreduce) and ``hidden_size``
        (with timing.allreduce) set.

    Raises
    ------
    ConfigError
        Neither the keys nor the profile (or model config) give a dimension.
    """
    kind, num_layers, hidden = timing.type, timing.num_layers, timing.hidden_size
    if kind == "roofline":
        return _roofline_dimensions(timing)
    if kind == "table" and num_layers is None:
        num_layers = read_num_layers(timing.profile)
        if num_layers is None:
            raise ConfigError(
                f"{timing.path}.num_layers must be set: {timing.profile} has no meta.yaml with a top-level "
                "num_layers (profiles are per layer; meta.yaml's hf_overrides.num_hidden_layers is "
                "the profiled count, not the model's)"
            )
    if timing.allreduce or timing.alltoall:
        if kind == "table" and hidden is None:
            hidden = read_meta_count(timing.profile, "hidden_size")
        if kind == "aic" and (hidden is None or num_layers is None):
            layers_cfg, hidden_cfg = aic.model_dimensions(timing.model)
            num_layers = num_layers or layers_cfg
            hidden = hidden or hidden_cfg
        for name, value in (("num_layers", num_layers), ("hidden_size", hidden)):
            if value is None:
                term = f"{timing.path}.allreduce" if timing.allreduce else f"{timing.path}.moe.alltoall"
                raise ConfigError(f"{timing.path}.{name} must be set for {term} with {timing.path}.type={kind}")
    if kind == "table":
        has_moe = moe_path(timing.profile) is not None  # its own, or the tp1 sibling's
        if has_moe and not timing.moe:
            raise ConfigError(
                f"{timing.path}.moe.num_experts must be set: {timing.profile} holds {MOE_FILE} (an MoE model; set "
                f"{timing.path}.moe.num_experts and {timing.path}.moe.top_k from its config.json, docs/timing.md)"
            )
        if timing.moe and not has_moe:
            raise ConfigError(
                f"{timing.path}.moe.num_experts is set but {timing.profile} has no {MOE_FILE} to price the MoE layers"
            )
    moe_layers = timing.moe_num_layers
    if timing.moe and moe_layers is None:
        moe_layers = num_layers  # every decoder layer an MoE layer (Qwen3-MoE, Mixtral)
    if moe_layers is not None and num_layers is not None and moe_layers > num_layers:
        raise ConfigError(f"{timing.path}.moe.num_layers must be <= {timing.path}.num_layers = {num_layers}, got {moe_layers}")
    return replace(timing, num_layers=num_layers, hidden_size=hidden, moe_num_layers=moe_layers)


def _roofline_dimensions(timing: TimingConfig) -> TimingConfig:
    """The catalogue checks timing.model, gpu and tp; the all-reduce takes the model's dimensions, and
    with ``timing.tp >= 2`` and no ``timing.allreduce`` a ring at one direction of the GPU's link."""
    spec, device = roofline.resolve(timing)
    dims = dict(num_layers=spec.num_layers, hidden_size=spec.hidden_size)
    if timing.allreduce:
        return replace(timing, **dims)
    if timing.tp >= 2:
        return replace(timing, **dims, allreduce_latency_us=0.0, allreduce_bandwidth_gb_per_second=device.ring_gb_per_s)
    return timing


def _roofline_memory(path: str, pool: PoolConfig, timing: TimingConfig) -> PoolConfig:
    """roofline: refuse a model that does not fit the GPU; ``num_blocks: auto`` from the catalogue's memory plan."""
    spec, device = roofline.resolve(timing)
    budgets = [getattr(pool, name) for name in TOKEN_BUDGETS]
    max_tokens = max([b for b in budgets if b is not None], default=pool.max_sequences)
    plan = catalogue.memory_plan(spec, device, timing.tp, timing.memory_fraction, max_tokens, pool.max_sequences)
    if not plan.fits:
        raise ConfigError(catalogue.fit_error(timing.model, spec, device, timing.tp, plan, timing.path))
    if not (isinstance(pool.num_blocks, str) and pool.num_blocks == AUTO_BLOCKS):
        return pool
    num_blocks = catalogue.kv_blocks(plan, pool.block_size)
    if num_blocks < 1:
        raise ConfigError(
            f"{path}.num_blocks=auto: {plan.describe()} leaves {max(plan.kv, 0) / catalogue.GIB:.3f} GiB of KV cache, "
            f"less than one block of {pool.block_size} tokens x {plan.kv_per_token:.0f} bytes"
        )
    pool = replace(pool, num_blocks=checked_num_blocks(path, num_blocks, pool.block_size))
    check_whole_prompt_budget(path, pool)
    return pool


def _auto_num_blocks(path: str, pool: PoolConfig, timing: TimingConfig) -> PoolConfig:
    """``num_blocks: auto``: the KV blocks aiconfigurator-core's memory model gives one rank."""
    budgets = [getattr(pool, name) for name in TOKEN_BUDGETS]
    max_tokens = max([b for b in budgets if b is not None], default=pool.max_sequences)
    field = f"{path}.num_blocks"
    num_blocks = aic.auto_num_blocks(timing, pool.block_size, max_tokens, pool.max_sequences, field=field)
    pool = replace(pool, num_blocks=checked_num_blocks(path, num_blocks, pool.block_size))
    check_whole_prompt_budget(path, pool)
    return pool


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _query_rows(pool: PoolConfig) -> int:
    """Most decode rows of a pass: one per sequence, ``1 + k`` with speculative decoding (docs/speculative.md)."""
    return pool.max_sequences * (1 + (0 if pool.speculative is None else pool.speculative.draft_tokens))


def _aic_limits(pools: list[PoolConfig]) -> dict[str, int]:
    """The largest pass of the active pools, rounded up to powers of two (table ranges)."""
    tokens = max(
        max(p.max_batched_tokens or 0, p.chunked_prefill_size or 0, p.max_prefill_tokens or 0) + _query_rows(p)
        for p in pools
    )
    return dict(
        pass_tokens_limit=_next_pow2(tokens),
        pass_sequences_limit=_next_pow2(max(_query_rows(p) for p in pools)),
        context_limit=_next_pow2(max(p.sequence_limit for p in pools)),
    )


def vllm_graph_sizes(pools: list[PoolConfig], path: str = "timing") -> tuple[int, ...]:
    """vLLM's default CUDA-graph capture sizes for the active pools (docs/timing.md).

    vLLM 0.12+ (``VllmConfig._set_cudagraph_sizes``): the largest size is
    ``min(2 x max_num_seqs x (1 + num_speculative_tokens), 512, max_num_batched_tokens)``;
    the sizes are 1, 2, 4, then every multiple of 8 below 256, then every
    multiple of 16 from 256, up to the largest.

    Parameters
    ----------
    pools : list of PoolConfig
        The active engine pools that use the timing section (vllm policy: ``max_batched_tokens`` set).
    path : str
        The timing section's path, for the message.

    Returns
    -------
    tuple of int
        Ascending capture sizes.

    Raises
    ------
    ConfigError
        The pools give different sizes.
    """
    found = set()
    for pool in pools:
        largest = min(2 * _query_rows(pool), 512, pool.max_batched_tokens)
        sizes = [s for s in (1, 2, 4) if s <= largest]
        sizes += list(range(8, min(largest + 1, 256), 8)) + list(range(256, largest + 1, 16))
        found.add(tuple(sizes))
    if len(found) > 1:
        raise ConfigError(
            f"{path}.cuda_graph_sizes={VLLM_DEFAULT_GRAPHS} differs between the engine pools "
            "(max_sequences, max_batched_tokens); give the sizes as a list"
        )
    return found.pop()
