"""Worst-case instants and buffer sizes of a run, checked before anything is allocated.

Every simulated instant is an int64 ns count (SPEC §0), so a run must end
before ``2**63`` ns, about 292 years; and every buffer the run allocates must
fit in the machine's memory.  :func:`check_run` bounds both from the
configuration and the size of the workload and raises a one-line
:class:`~simcore.config.ConfigError` naming the key that dominates the excess.
It runs twice: in :func:`simcore.load_config` with the configured synthetic
lengths (before the request table is drawn), and at the API boundary with the
actual request table and send instants (before the engine buffers exist).

The time bound is the sum of every service the run can contain: the open-loop
send span, the think times, every tokenizer, transfer and detokenizer job, and
``passes x longest pass`` per pool, where a pass either emits a token or takes
a full token budget of prompt (``passes <= outputs + requests + inputs /
budget``).  Recomputation after a preemption is not counted (the fuzz test
checks the bound against runs that preempt).  Instants are kept below half the
int64 range, so that the kernel can add one more duration to any instant
without wrapping.  ``aic``, ``table`` and ``roofline`` passes are counted at the model's
time for the pool's largest batches (:func:`model_pass_ms`) at the API
boundary, and at their 1 ns floor in ``load_config`` (no tables loaded there).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from simcore.errors import ConfigError
from simcore.units import INT64_MAX, MAX_INSTANT_MS, MAX_INSTANT_NS

if TYPE_CHECKING:  # annotations only
    from simcore.settings import SimConfig

#: Bytes held per request over the kernel's inputs, state and outputs, the
#: request table and the result tables (about 60 eight-byte columns, rounded up).
REQUEST_BYTES = 512
#: Bytes per output token in the detailed mode: the emission and receipt
#: instants, the deferred detokenizer's log and flags, and the tokens table.
TOKEN_BYTES = 64
#: Bytes per pass-log row (10 int64 columns and the float64 pass time, rounded up).
PASS_ROW_BYTES = 128
#: Bytes per rank and running-sequence slot: the running table and the
#: detokenizer's per-pass job arrays of each of its servers.
SLOT_BYTES = 24
#: Bytes per prefix-cache slot: its six fields, its place in the free stack and
#: its share of the hash map (under 4 buckets of 16 bytes).
CACHE_SLOT_BYTES = 120
#: The CPU tier (simcore.scheduler.offload_nb): per CPU block 6 fields, a free-stack
#: entry and up to 4 map words; per request 6 fields and 2 heap words.
OFFLOAD_SLOT_BYTES = 88
OFFLOAD_REQUEST_BYTES = 64
#: Bytes per prompt block with prefix caching: its identity and the slot backing it.
PREFIX_BLOCK_BYTES = 16
#: The largest z-score a float64 normal draw reaches in any realistic run
#: (P(z > 9) is about 1e-19 per draw); lengths are drawn in float64 then cast to int64.
DRAW_Z = 9.0


@dataclass(frozen=True)
class WorkloadSize:
    """What the bounds need to know of a workload, and the keys it comes from.

    ``*_label`` names the keys (or the table columns) and values that set a
    size, for the message when a term of that size is the one that overflows.
    """

    num_requests: int
    total_input: int
    total_output: int
    last_send_ms: float
    count_label: str
    input_label: str
    output_label: str
    origin: str  # the keys (or the table) behind all three sizes

    @property
    def context(self) -> str:
        return f"{self.num_requests} requests, {self.total_input} input and {self.total_output} output tokens"


def configured_size(cfg: SimConfig) -> WorkloadSize:
    """The workload as configured: synthetic lengths at their nominal value, shared_prefix
    lengths exactly, else one 1-token request.

    Normal and lognormal lengths are counted at their mean; the drawn table is
    checked again at the API boundary.  A file workload is only known once read.

    Parameters
    ----------
    cfg : SimConfig

    Returns
    -------
    WorkloadSize
    """
    w, ld = cfg.workload, cfg.load
    if w.source == "sessions":
        return _sessions_size(cfg)
    if w.source not in ("synthetic", "shared_prefix"):
        label = f"workload.path={w.path!r}"
        return WorkloadSize(1, 1, 1, 0.0, label, label, label, label)
    n = w.num_requests
    last_send_ms = 0.0
    if ld.type in ("constant_rate", "poisson", "gamma"):
        last_send_ms = (n - 1) * 1000 / ld.request_rate
    count = f"workload.num_requests={n}"
    if w.source == "shared_prefix":  # every prompt has the same lengths
        sp = w.shared_prefix
        lengths = f"workload.shared_prefix.system_prompt_len={sp.system_prompt_len} + question_len={sp.question_len}"
        return WorkloadSize(
            n, n * sp.input_tokens, n * sp.output_len, last_send_ms, count, f"{count} x ({lengths})",
            f"{count} x workload.shared_prefix.output_len={sp.output_len}",
            f"{count}, {lengths}, output_len={sp.output_len}",
        )
    labels = []
    for column in ("input", "output"):
        label = f"{count} x workload.{column}_tokens={getattr(w, f'{column}_tokens')}"
        if getattr(w, f"{column}_dist") in ("normal", "lognormal"):
            label += f" (workload.{column}_std={getattr(w, f'{column}_std')!r})"
        labels.append(label)
    origin = f"{count}, input_tokens={w.input_tokens}, output_tokens={w.output_tokens}"
    return WorkloadSize(n, n * w.input_tokens, n * w.output_tokens, last_send_ms, count, *labels, origin)


def _sessions_size(cfg: SimConfig) -> WorkloadSize:
    """Generated sessions at ``turns`` turns each (the most for uniform, the mean for geometric)."""
    se, ld = cfg.workload.sessions, cfg.load
    n = se.num_sessions * se.turns
    # turn t's prompt: system + new + t (output + new), summed over t < turns
    per_session = se.turns * (se.system_prompt_tokens + se.new_input_tokens) + (
        se.output_tokens + se.new_input_tokens) * se.turns * (se.turns - 1) // 2
    last_send_ms = 0.0
    if ld.type in ("constant_rate", "poisson", "gamma"):
        last_send_ms = (se.num_sessions - 1) * 1000 / ld.request_rate
    count = f"workload.sessions.num_sessions={se.num_sessions} x turns={se.turns}"
    origin = (f"{count}, new_input_tokens={se.new_input_tokens}, output_tokens={se.output_tokens}, "
              f"system_prompt_tokens={se.system_prompt_tokens}")
    return WorkloadSize(n, se.num_sessions * per_session, n * se.output_tokens, last_send_ms, count,
                        f"{origin} (prompts grow by turn)", f"{count} x output_tokens={se.output_tokens}", origin)


def table_size(
    cfg: SimConfig, input_tokens: np.ndarray, output_tokens: np.ndarray, send_ns: np.ndarray | None, where: str
) -> WorkloadSize:
    """The size of the actual request table and its send instants.

    Parameters
    ----------
    cfg : SimConfig
    input_tokens, output_tokens : ndarray(int64, ndim=1)
        The table's lengths.
    send_ns : ndarray(int64, ndim=1) or None
        Open-loop send instants (None: closed loop).
    where : str
        Names the table in messages: ``requests`` (the API argument), a path,
        or ``workload`` (drawn synthetic lengths, charged to their keys).

    Returns
    -------
    WorkloadSize

    Raises
    ------
    ConfigError
        A length below 1, or lengths whose sum exceeds int64.
    """
    n = int(input_tokens.shape[0])
    nominal = configured_size(cfg) if where == "workload" else None
    totals = []
    for column, lengths in (("input_tokens", input_tokens), ("output_tokens", output_tokens)):
        name = f"workload.{column}" if nominal else f"{where} ({column})"
        if n and int(lengths.min()) < 1:
            raise ConfigError(f"{name}: every length must be an integer >= 1, got {int(lengths.min())}")
        totals.append(checked_total(lengths, name))
    last_send_ms = 0.0 if send_ns is None or n == 0 else float(send_ns.max()) / 1e6  # sessions: first turns only
    if nominal:  # drawn synthetic lengths: charge them to the keys that drew them
        labels = (nominal.count_label, f"{nominal.input_label}, drawn", f"{nominal.output_label}, drawn",
                  f"{nominal.origin}, drawn")
    else:
        labels = (f"{where}: {n} rows", f"{where}: {n} rows of input_tokens", f"{where}: {n} rows of output_tokens",
                  f"{where}: {n} rows")
    return WorkloadSize(n, totals[0], totals[1], last_send_ms, *labels)


def checked_total(values: np.ndarray, field: str) -> int:
    """``sum(values)`` of an int64 array of values >= 0, exactly, without wrapping.

    Parameters
    ----------
    values : ndarray(int64, ndim=1)
    field : str
        Named in the error.

    Returns
    -------
    int

    Raises
    ------
    ConfigError
        The sum exceeds int64.
    """
    if values.shape[0] == 0:
        return 0
    if int(values.max()) <= INT64_MAX // values.shape[0]:  # no partial sum can wrap
        return int(values.sum())
    total = sum(int(v) for v in values.tolist())
    if total > INT64_MAX:
        raise ConfigError(f"{field}: the lengths sum to {total} tokens, beyond int64 ({INT64_MAX})")
    return total


def memory_bytes() -> int | None:
    """Memory this process may use, bytes: physical memory, or a smaller cgroup limit (Slurm, containers).

    Returns
    -------
    int or None
        None where the OS says neither.
    """
    limits = []
    try:
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, encoding="ascii") as f:
                limits.append(int(f.read().strip()))  # "max": no limit (ValueError)
        except (OSError, ValueError):
            pass
    return min(limits, default=None)


def check_run(cfg: SimConfig, size: WorkloadSize, model_ms: list[float] | None = None) -> None:
    """Reject a run whose buffers exceed memory or whose worst-case instants exceed int64 ns.

    Parameters
    ----------
    cfg : SimConfig
    size : WorkloadSize
        :func:`configured_size` or :func:`table_size`.
    model_ms : list of float, optional
        ``aic``/``table`` timing: each pool's longest pass (:func:`model_pass_ms`);
        None counts those passes at their 1 ns floor.

    Raises
    ------
    ConfigError
        One line that starts with the keys and values of the largest term.
    """
    _check_draws(cfg)
    terms = _memory_terms(cfg, size)
    total = sum(b for _, b in terms)
    available = memory_bytes()
    if available is not None and total > available:
        raise ConfigError(
            f"{max(terms, key=lambda t: t[1])[0]}: the run needs about {total / 2**30:.4g} GiB of "
            f"simulation buffers ({size.context}), more than the {available / 2**30:.4g} GiB of memory here"
        )
    terms = _time_terms(cfg, size, model_ms)
    total = sum(ms for _, ms in terms)  # not math.fsum: it raises where the float sum is inf
    if not total < MAX_INSTANT_MS:  # every term is >= 0, finite or inf
        raise ConfigError(
            f"{max(terms, key=lambda t: t[1])[0]}: the run could last up to {total:.4g} ms "
            f"({size.context}); simulated instants are int64 ns and must stay below "
            f"{MAX_INSTANT_MS:.4g} ms (about 146 years)"
        )


def worst_case_ms(cfg: SimConfig, size: WorkloadSize, model_ms: list[float] | None = None) -> float:
    """The bound on the run's last instant that :func:`check_run` holds below ``MAX_INSTANT_MS``.

    Parameters
    ----------
    cfg : SimConfig
    size : WorkloadSize
    model_ms : list of float, optional
        As :func:`check_run`.

    Returns
    -------
    float
        ms (inf when the terms overflow float64).
    """
    return sum(ms for _, ms in _time_terms(cfg, size, model_ms))


def model_pass_ms(cfg: SimConfig) -> list[float] | None:
    """``aic``, ``table`` and ``roofline`` timing: each pool's pass time at its largest batches, from the model itself.

    The tables extend their end segments, so a pass is not bounded by the
    largest entry; the model is evaluated, as the kernel does, at the pool's
    extreme batches: one prompt of the largest token budget over a full KV
    cache, ``max_sequences`` decodes over a full KV cache, and both at once.

    Parameters
    ----------
    cfg : SimConfig

    Returns
    -------
    list of float or None
        ms per pool (inf where the model gives a non-finite time); None for
        ``fixed`` and ``linear``, which :func:`check_run` bounds term by term.
    """
    if cfg.timing.type not in ("aic", "table", "roofline"):
        return None
    from simcore.timing.api import timing_arrays  # lazy: aic needs the optional extra
    from simcore.timing.nb import rank_time_ms_nb

    model, params, table = timing_arrays(cfg.timing)
    out = []
    for pool in cfg.engine.pools:
        capacity = pool.num_blocks * pool.block_size
        tokens = min(capacity, _largest_budget(pool) or capacity)
        seqs = pool.max_sequences
        # (the longest decode context at the whole cache: the largest skew term too)
        batches = [(1, tokens, capacity, 0, 0, 0), (0, 0, 0, seqs, capacity, capacity)]
        if seqs > 1:
            batches.append((1, tokens, capacity // 2, seqs - 1, capacity // 2, capacity // 2))
        if pool.speculative is not None:  # every decode verifying its proposals (docs/speculative.md)
            batches.append((0, 0, 0, seqs, capacity, capacity, seqs * pool.speculative.draft_tokens))
        if pool.expert_parallel:  # every rank at the extreme batch: the MoE layers and all-to-all at their most
            times = [_lockstep_ms(model, params, table, batch, pool.attention_dp) for batch in batches]
        else:
            times = [rank_time_ms_nb(model, params, table, *batch) for batch in batches]
        out.append(max(t if math.isfinite(t) else math.inf for t in times))
    return out


def _lockstep_ms(model: int, params: np.ndarray, table: np.ndarray, batch: tuple, ranks: int) -> float:
    """The pass of ``ranks`` ranks stepping together (expert parallelism), each at ``batch``, ms."""
    from simcore.timing.nb import lockstep_times_nb

    summary = np.zeros((ranks, 7), dtype=np.int64)
    summary[:, :5] = batch[:5]
    summary[:, 6] = batch[5]
    with np.errstate(all="ignore"):
        return float(lockstep_times_nb(model, params, table, summary, ranks, np.zeros(ranks)))


def _memory_terms(cfg: SimConfig, size: WorkloadSize) -> list[tuple[str, int]]:
    """(keys, bytes) of each buffer group the run allocates (Python ints: no wrap)."""
    tok, detok = cfg.tokenization, cfg.detokenization
    terms = [(size.count_label, size.num_requests * REQUEST_BYTES)]
    if cfg.output.mode == "detailed":
        terms.append((size.output_label, size.total_output * TOKEN_BYTES))
    for name, pool in zip(_pool_names(cfg), cfg.engine.pools):
        ranks = f"engine.{name}.replicas={pool.replicas} x attention_dp={pool.attention_dp}"
        slots = pool.num_ranks * pool.max_sequences * (1 + detok.workers)
        terms += [
            (f"{ranks} x max_sequences={pool.max_sequences} x (1 + detokenization.workers={detok.workers})",
             slots * SLOT_BYTES),
            (ranks, pool.num_ranks * REQUEST_BYTES),
            (f"engine.{name}.replicas={pool.replicas} x tokenization.workers={tok.workers}",
             pool.replicas * tok.workers * 8),
            (f"engine.{name}.replicas={pool.replicas} x detokenization.workers={detok.workers}",
             pool.replicas * detok.workers * 8),
        ]
        if pool.prefix_caching:
            cache_slots = pool.num_blocks * pool.num_ranks
            prompt_blocks = size.num_requests + size.total_input // pool.block_size  # identities, offsets
            terms.append((f"{ranks} x num_blocks={pool.num_blocks}", cache_slots * CACHE_SLOT_BYTES))
            terms.append((f"{size.input_label} (prefix blocks)", prompt_blocks * PREFIX_BLOCK_BYTES))
        if pool.kv_offload is not None:  # the CPU tier's slots and map, its per-request records
            terms.append((f"{ranks} x kv_offload.num_blocks={pool.kv_offload.num_blocks}",
                          pool.kv_offload.num_blocks * pool.num_ranks * OFFLOAD_SLOT_BYTES))
            terms.append((size.count_label + " (CPU-tier records)", size.num_requests * OFFLOAD_REQUEST_BYTES))
    if cfg.workload.source == "shared_prefix":
        sp = cfg.workload.shared_prefix
        terms.append((f"workload.shared_prefix.num_groups={sp.num_groups} x num_prompts_per_group="
                      f"{sp.num_prompts_per_group} (the prompt cycle)", sp.num_prompts * 8))
        terms.append((f"{size.count_label} x {sp.hash_blocks} hash_ids per prompt (workload.shared_prefix."
                      f"system_prompt_len={sp.system_prompt_len}, question_len={sp.question_len})",
                      size.num_requests * (sp.hash_blocks + 1) * 8))
    if cfg.output.passes:
        rows = sum(_passes(pool, size) * pool.num_ranks for pool in cfg.engine.pools)
        terms.append((f"output.passes=true ({rows} pass rows)", rows * PASS_ROW_BYTES))
    return terms


def _time_terms(cfg: SimConfig, size: WorkloadSize, model_ms: list[float] | None) -> list[tuple[str, float]]:
    """(keys, ms) of each sum of services the run can contain (float64; inf when huge)."""
    from simcore.timing.settings import OPERATOR_SCALES  # lazy: no import cycle through the stages
    n, total_in, total_out = size.num_requests, float(size.total_input), float(size.total_output)
    ld, tok, detok, t = cfg.load, cfg.tokenization, cfg.detokenization, cfg.timing
    send_key = "speedup" if ld.type == "trace" else "request_rate"
    requests, inputs = f" x {n} requests", f" x {size.total_input} input tokens"
    outputs = f" x {size.total_output} outputs"
    terms = [
        (f"load.{send_key}={getattr(ld, send_key)!r} (the last send)", size.last_send_ms),
        (f"load.think_time_ms={ld.think_time_ms!r}{requests}", ld.think_time_ms * n if ld.closed_loop else 0.0),
        # sessions: a think time before every turn but the first, bounded by one per request
        (f"workload.sessions.think_time_ms={cfg.workload.sessions.think_time_ms!r}{requests}",
         cfg.workload.sessions.think_time_ms * n),
        (f"tokenization.base_ms={tok.base_ms!r}{requests}", tok.base_ms * n),
        (f"tokenization.per_input_us={tok.per_input_us!r}{inputs}", tok.per_input_us * total_in / 1000),
        (f"detokenization.base_ms={detok.base_ms!r}{outputs}", detok.base_ms * total_out),
        (f"detokenization.per_output_us={detok.per_output_us!r}{outputs}", detok.per_output_us * total_out / 1000),
        (f"detokenization.first_output_us={detok.first_output_us!r}{requests}", detok.first_output_us * n / 1000),
        (f"detokenization.final_output_us={detok.final_output_us!r}{requests}", detok.final_output_us * n / 1000),
    ]
    transfer = cfg.engine.kv_transfer
    if cfg.engine.mode == "disaggregated" and transfer.bytes_per_token is not None:
        ms = float(transfer.transfer_ms(np.array([total_in]))[0])
        terms.append((f"engine.kv_transfer.bytes_per_token={transfer.bytes_per_token!r}{inputs}", ms))
    for index, pool in enumerate(cfg.engine.pools):
        passes = float(_passes(pool, size))
        each = f" x {passes:.4g} passes ({size.origin})"
        terms.append((f"{passes:.4g} passes of >= 1 ns ({size.origin})", passes * 1e-6))
        if pool.kv_offload is not None:  # loads: each admission loads at most every prompt block
            offload = pool.kv_offload
            block_ms = offload.block_ns(pool.block_size) / 1e6
            terms.append((f"engine.{_pool_names(cfg)[index]}.kv_offload.bandwidth_gb_per_second={offload.bandwidth_gb_per_second!r}"
                          f" x (requests + passes) x {size.total_input} input tokens",
                          (size.num_requests + passes) * (total_in / pool.block_size) * max(block_ms, 1e-6)))
        capacity = float(pool.num_blocks) * pool.block_size
        prefill_tokens = min(capacity, float(_largest_budget(pool) or capacity))
        if t.type == "fixed":
            terms += [(f"timing.prefill_ms={t.prefill_ms!r}{each}", passes * t.prefill_ms),
                      (f"timing.decode_ms={t.decode_ms!r}{each}", passes * t.decode_ms)]
        elif t.type == "linear":  # every term of SPEC §8 at its per-rank maximum, at the larger scale
            scale_key = "prefill_scale" if t.prefill_scale >= t.decode_scale else "decode_scale"
            scale = getattr(t, scale_key)
            scaled = f"{each} x timing.{scale_key}={scale!r}" if scale != 1 else each
            # the operator scales weigh non-negative parts of the model time: at most their largest
            operator_key = max(OPERATOR_SCALES, key=lambda name: getattr(t, name))
            if getattr(t, operator_key) != 1.0:
                scale *= getattr(t, operator_key)
                scaled += f" x timing.{operator_key}={getattr(t, operator_key)!r}"
            terms += [
                (f"timing.base_ms={t.base_ms!r}{scaled}", passes * t.base_ms * scale),
                (f"timing.per_prefill_token_us={t.per_prefill_token_us!r}{scaled} of {prefill_tokens:.4g} tokens",
                 passes * t.per_prefill_token_us * prefill_tokens / 1000 * scale),
                (f"timing.per_decode_seq_us={t.per_decode_seq_us!r}{scaled} of {pool.max_sequences} sequences",
                 passes * t.per_decode_seq_us * pool.max_sequences / 1000 * scale),
                (f"timing.per_kv_token_ns={t.per_kv_token_ns!r}{scaled} of {capacity:.4g} KV tokens",
                 passes * t.per_kv_token_ns * capacity / 1e6 * scale),
                (f"timing.attention_skew_alpha={t.attention_skew_alpha!r} x timing.per_kv_token_ns{scaled} "
                 f"of {pool.max_sequences} x {capacity:.4g} KV tokens",
                 passes * t.attention_skew_alpha * t.per_kv_token_ns * pool.max_sequences * capacity / 1e6 * scale),
                (f"timing.pass_overhead_us={t.pass_overhead_us!r}{_allreduce_label(t)}{each}",
                 passes * _linear_pass_terms_ms(cfg, prefill_tokens + pool.max_sequences)),
            ]
            if t.alltoall and pool.expert_parallel:  # the MoE layers' dispatch and combine of every rank's tokens
                d = float(pool.attention_dp)
                gathered = d * (prefill_tokens + pool.max_sequences)
                per_token = 2.0 * t.hidden_size * t.dtype_bytes + 8.0 * t.moe_top_k
                one_us = 2.0 * t.moe_alltoall_latency_us + (d - 1.0) / d * gathered * per_token / (
                    t.moe_alltoall_bandwidth_gb_per_second * 1e3)
                terms.append((f"timing.moe.alltoall.bandwidth_gb_per_second={t.moe_alltoall_bandwidth_gb_per_second!r}"
                              f" (latency_us={t.moe_alltoall_latency_us!r}) x {t.moe_num_layers} MoE layers"
                              f" of {gathered:.4g} tokens{each}", passes * t.moe_num_layers * one_us / 1000))
        spec = pool.speculative
        if spec is not None:  # docs/speculative.md: the proposals (linear) and the proposer, every pass
            key = f"engine.{_pool_names(cfg)[index]}.speculative"
            if t.type == "linear":
                scale = max(t.prefill_scale, t.decode_scale) * max(getattr(t, name) for name in OPERATOR_SCALES)
                terms.append((f"timing.per_prefill_token_us={t.per_prefill_token_us!r}{each} of {pool.max_sequences}"
                              f" x {spec.draft_tokens} proposals ({key})",
                              passes * t.per_prefill_token_us * pool.max_sequences * spec.draft_tokens / 1000 * scale))
            terms.append((f"{key}.proposer_step_ms={spec.proposer_step_ms!r} and proposer_per_seq_us="
                          f"{spec.proposer_per_seq_us!r} x {spec.proposer_steps} proposer passes of {pool.max_sequences}"
                          f" sequences{each}",
                          passes * spec.proposer_steps
                          * (spec.proposer_step_ms + spec.proposer_per_seq_us * pool.max_sequences / 1000)))
        if t.type not in ("fixed", "linear") and model_ms is not None:
            layers = f", timing.num_layers={t.num_layers}" if t.type == "table" else ""
            terms.append((f"timing.type={t.type}{layers}: a largest batch of {model_ms[index]:.4g} ms{each}",
                          passes * model_ms[index]))
    return terms


def _linear_pass_terms_ms(cfg: SimConfig, tokens: float) -> float:
    """What ``linear`` timing adds to a pass of ``tokens`` tokens beyond its scaled model time, ms.

    The pass overhead and the TP all-reduce of the kernel's own
    ``pass_terms_ms_nb``, run as plain Python (no compilation in ``load_config``).
    """
    from simcore.timing.api import timing_arrays  # lazy: aic needs the optional extra
    from simcore.timing.nb import LINEAR_NUM_PARAMS, pass_terms_ms_nb

    _, params, table = timing_arrays(cfg.timing)
    pass_terms = getattr(pass_terms_ms_nb, "py_func", pass_terms_ms_nb)  # NUMBA_DISABLE_JIT: the function itself
    with np.errstate(all="ignore"):  # an overflow is the inf this check reports, not a warning line
        ms = pass_terms(params, table, LINEAR_NUM_PARAMS, 0.0, 1, min(tokens, float(INT64_MAX)))
    return float(ms) if math.isfinite(ms) else math.inf  # a Python float: products overflow to inf silently


def _allreduce_label(t) -> str:
    if not t.allreduce:
        return ""
    link = (f"allreduce.curve={t.allreduce_curve}" if t.allreduce_curve else
            f"allreduce.latency_us={t.allreduce_latency_us!r}, "
            f"allreduce.bandwidth_gb_per_second={t.allreduce_bandwidth_gb_per_second!r}")
    return f" and the TP all-reduce (timing.tp={t.tp}, hidden_size={t.hidden_size}, {link})"


def _pool_names(cfg: SimConfig) -> tuple[str, ...]:
    return ("aggregated",) if cfg.engine.mode == "aggregated" else ("prefill", "decode")


def _largest_budget(pool) -> int | None:
    """The largest per-pass token budget a pool sets (None: no budget key)."""
    return max((b for b in (pool.max_batched_tokens, pool.chunked_prefill_size, pool.max_prefill_tokens) if b),
               default=None)


def _passes(pool, size: WorkloadSize) -> int:
    """Passes of one worker pool without preemption: outputs, plus prompt chunks of a full budget."""
    budget = pool.max_batched_tokens or max(pool.chunked_prefill_size // pool.attention_dp, 1)
    return size.total_output + size.num_requests + size.total_input // budget


def _check_draws(cfg: SimConfig) -> None:
    """Normal and lognormal lengths are float64 draws cast to int64: keep mean + DRAW_Z std in range."""
    w = cfg.workload
    if w.source != "synthetic":
        return
    for column in ("input", "output"):
        dist, mean, std = getattr(w, f"{column}_dist"), getattr(w, f"{column}_tokens"), getattr(w, f"{column}_std")
        if dist == "normal":
            high = mean + DRAW_Z * std
        elif dist == "lognormal":  # exp(mu + z sigma) with mu = ln(mean) - sigma^2 / 2
            sigma2 = math.log1p((std / mean) * (std / mean))
            sigma = math.sqrt(sigma2)
            log_high = math.log(mean) + sigma * (DRAW_Z - sigma / 2) if math.isfinite(sigma2) else math.inf
            high = math.exp(min(log_high, 700.0))  # e^700 is past int64 and below float64's limit
        else:
            continue
        if not high < MAX_INSTANT_NS:
            raise ConfigError(
                f"workload.{column}_std={std!r} lets {dist} draws reach {high:.4g} tokens "
                f"(z = {DRAW_Z:g}); lengths must stay below {MAX_INSTANT_NS} (int64)"
            )
