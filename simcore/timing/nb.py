"""Timing-model kernels.

Contract: ``rank_time_ms_nb`` is ``@njit(cache=True)``; it reads a model code,
a float64 parameter vector and the SPEC §8 batch summary (int64 counts) and
returns the rank's time in float64 ms, evaluated left to right exactly as SPEC
§8 writes the formula.  An empty batch takes 0.  Models that need lookup tables
receive them in one flat float64 array, ``table``, laid out by their wrapper
(``simcore.timing.profile`` for ``table``, ``simcore.timing.aic`` for ``aic``);
``params`` then holds the offsets and sizes of the pieces of ``table`` (as
float64, at the ``P_*`` / ``A_*`` indices below).  Every jitted function the
kernel calls lives in this module (numba's cache does not see changes in
jitted callees of other modules).

Interpolation (both table models): piecewise linear on each axis between the
two bracketing knots, written ``(1 - t) * lo + t * hi`` so that a query on a
knot returns the stored value exactly; beyond the last knot (or before the
first) the end segment is extended linearly.  ``table`` alone never lets a
cost fall beyond the last knot: where the end segment slopes down the value
stays at the last knot's (``lerp_rising_nb``; docs/timing.md).
"""

from __future__ import annotations

import numpy as np
from numba import njit

TIMING_FIXED = 0
TIMING_LINEAR = 1
TIMING_TABLE = 2
TIMING_AIC = 3
TIMING_ROOFLINE = 4

# ``table`` (per-operator profile) parameter layout: params[P_*].
P_NUM_LAYERS = 0
P_DENSE_X = 1  # offset of the dense token knots (float64, ascending)
P_DENSE_N = 2  # number of dense knots
P_DENSE_LAYER = 3  # offset of the per-layer dense time at each knot, us
P_DENSE_PASS = 4  # offset of the once-per-pass dense time at each knot, us
P_SEQ_X = 5  # offset of the per-sequence knots (sequences)
P_SEQ_N = 6
P_SEQ_Y = 7  # offset of the per-sequence time (lm_head + sampler), us
P_PC_X = 8  # attention axes: prefill chunk, kv prefill, n decode, kv decode
P_PC_N = 9
P_KVP_X = 10
P_KVP_N = 11
P_ND_X = 12
P_ND_N = 13
P_KVD_X = 14
P_KVD_N = 15
P_ATTN = 16  # offset of the attention grid, us, C order [pc, kvp, nd, kvd]
P_PC_MIN = 17  # smallest positive prefill-chunk knot
P_KVD_MIN = 18  # smallest positive kv-decode knot
# moe.csv (MoE models; docs/timing.md): one MoE layer by tokens and activated experts
P_MOE_T_N = 19  # number of tokens knots (0: no MoE term)
P_MOE_T_X = 20  # offset of the tokens knots
P_MOE_A_N = 21  # number of activated-experts knots
P_MOE_A_X = 22  # offset of the activated-experts knots
P_MOE = 23  # offset of the grid, us, C order [tokens, experts]
P_MOE_LAYERS = 24  # MoE layers of the model
P_MOE_EXPERTS = 25  # routed experts E
P_MOE_TOP_K = 26  # experts per token k
P_MOE_IMBALANCE = 27  # the busiest GPU's expert load over the mean (>= 1)
P_MOE_TP = 28  # GPUs of one attention-DP rank (timing.tp); the expert-parallel group is attention_dp x tp
TABLE_NUM_PARAMS = 29

# ``aic`` component tables: params[A_*].  NA, LG, NG are indexed by an integer
# knot 1..n; GA by an integer batch 1..n and a kv knot axis; CA by three axes.
A_NA = 0  # non-attention context ops (logits excluded) at T tokens, ms
A_NA_N = 1
A_LG = 2  # logits GEMM at x rows, ms
A_LG_N = 3
A_NG = 4  # generation ops except attention (logits included) at batch B, ms
A_NG_N = 5
A_GA_B_N = 6  # decode attention: number of batch rows
A_GA_START = 7  # offset of the n + 1 row starts (cumulative knot counts)
A_GA_K = 8  # offset of the rows' kv knots (row r: starts[r]:starts[r + 1])
A_GA = 9  # offset of the rows' values, same indexing as the knots
A_CA_N = 10  # context attention: batch knots
A_CA_N_N = 11
A_CA_S = 12  # new tokens per request knots
A_CA_S_N = 13
A_CA_P = 14  # cached (prefix) tokens per request knots
A_CA_P_N = 15
A_CA = 16  # offset of the grid, C order [n, s, p]
A_GA_B = 17  # offset of the batch knots of the decode-attention rows (ascending)
A_AR_CTX = 18  # the database's per-layer all-reduces inside NA, at T tokens (A_NA_N knots), ms
A_AR_GEN = 19  # the same inside NG, at batch B (A_NG_N knots), ms
AIC_NUM_PARAMS = 20

# ``roofline`` parameter layout: params[RF_*] (simcore.timing.roofline builds it).
RF_NUM_GEMM = 0  # GEMM groups (attention projections, dense MLP, shared experts, lm_head)
RF_GEMM = 1  # offset in ``table`` of the groups, RF_GEMM_WIDTH each
RF_MOE_LAYERS = 2  # MoE layers (0: none)
RF_EXPERTS = 3  # routed experts E
RF_TOPK = 4  # experts per token k
RF_EXPERT_FLOPS = 5  # FLOPs of one expert for one token (one rank)
RF_EXPERT_BYTES = 6  # weight bytes of one expert (one rank)
RF_EXPERT_IO = 7  # activation bytes per routed token
RF_MOE_FLOPS_PER_MS = 8  # effective peak of the experts' GEMMs, FLOP/ms
RF_MOE_BYTES_PER_MS = 9  # effective memory bandwidth, bytes/ms
RF_NUM_ATTN = 10  # attention layer groups (one per distinct span)
RF_ATTN = 11  # offset in ``table`` of the groups, RF_ATTN_WIDTH each
RF_ATTN_FLOPS_PER_MS = 12  # effective peak of attention, FLOP/ms
RF_ATTN_BYTES_PER_MS = 13  # effective memory bandwidth of attention, bytes/ms
ROOFLINE_NUM_PARAMS = 14
# One GEMM group in ``table``: [rows (0: the pass's tokens, 1: its sequences), FLOPs per row,
# weight bytes, activation bytes per row, effective FLOP/ms, effective bytes/ms].
RF_GEMM_WIDTH = 6
# One attention group: [layers, span (0: full), prefill FLOPs per query-key pair, decode FLOPs per
# pair, prefill FLOPs per cached key, KV bytes per token, q/o bytes per prefill token, per decode].
RF_ATTN_WIDTH = 8

LINEAR_NUM_PARAMS = 4
# Pass-terms block (linear, table, aic), stored right after the model's own
# parameters (at LINEAR_NUM_PARAMS, TABLE_NUM_PARAMS or AIC_NUM_PARAMS): time
# scales, a per-pass overhead and the TP all-reduce.  A params vector without
# it gives the model's own time.
R_PREFILL_SCALE = 0  # factor on the model time of a pass with a prefill entry
R_DECODE_SCALE = 1  # factor on the model time of a decode-only pass
R_OVERHEAD_US = 2  # added to every non-empty pass, us
R_COUNT = 3  # all-reduces per pass (2 x layers); 0: none
R_BYTES_PER_TOKEN = 4  # hidden_size x dtype_bytes
R_GPUS = 5  # TP degree n
R_LATENCY_US = 6  # ring: fixed cost per all-reduce, us
R_BANDWIDTH = 7  # ring: link bandwidth, GB/s
R_CURVE_N = 8  # measured curve: number of knots (0: ring)
R_CURVE_X = 9  # offset of the curve's message sizes in ``table`` (bytes, ascending)
R_CURVE_Y = 10  # offset of the curve's times (us)
R_GRAPH_N = 11  # CUDA-graph capture sizes: how many (0: no padding)
R_GRAPH_X = 12  # offset of the sizes in ``table`` (tokens, ascending)
R_SKEW_ALPHA = 13  # decode-attention skew: share of (attention at the longest - at the mean) added
# Operator scales (declared calibration parameters; all 1: the model time unchanged, bit for bit):
# a pass's model time split into its decodes' time at one token of context, the growth of their
# time with context, and what its prefill entries add (``operator_scaled_ms_nb``).
R_DECODE_BASE_SCALE = 14  # factor on the decodes' time at one token of context (GEMMs, per-sequence ops)
R_DECODE_ATTENTION_SCALE = 15  # factor on the decodes' time beyond that (attention over their context)
R_PREFILL_TOKEN_SCALE = 16  # factor on the time the prefill entries add to the pass
PASS_TERMS_NUM_PARAMS = 17
# Expert-parallel all-to-all block (linear, table), right after the pass-terms block:
# every MoE layer's dispatch (all-gather) and combine (reduce-scatter) over the
# attention-DP ranks (``lockstep_times_nb``).
X_LAYERS = 0  # MoE layers
X_BYTES_PER_TOKEN = 1  # dispatch + combine bytes per gathered token
X_LATENCY_US = 2  # fixed cost of each collective, us
X_BANDWIDTH = 3  # link bandwidth, GB/s (0: no all-to-all)
ALLTOALL_NUM_PARAMS = 4


@njit(cache=True)
def rank_time_ms_nb(
    model, params, table, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens,
    decode_kv_max=0, draft_tokens=0,
):
    """Time of one rank's batch, ms.

    Parameters
    ----------
    model : int
        ``TIMING_FIXED``, ``TIMING_LINEAR``, ``TIMING_TABLE``, ``TIMING_AIC`` or ``TIMING_ROOFLINE``.
    params : ndarray(float64, ndim=1)
        fixed: ``[prefill_ms, decode_ms]``; linear: ``[base_ms,
        per_prefill_token_us, per_decode_seq_us, per_kv_token_ns]``; table and
        aic: the layout of ``table`` (``P_*`` / ``A_*`` indices).
    table : ndarray(float64, ndim=1)
        Flat lookup tables of table-driven models (empty for fixed, linear).
    num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens : int
        The batch summary of SPEC §8 (tokens, sequences).
    decode_kv_max : int
        The largest ``computed + 1`` of a decode entry (0: not known, no skew term).
    draft_tokens : int
        Speculative proposals verified by the decode entries (docs/speculative.md):
        each decode entry's query is ``1 +`` its proposals.  ``linear`` prices them
        as prefill tokens (query rows; the entry's KV is read once); ``table``,
        ``aic`` and ``roofline`` as decode rows at the decodes' mean context.

    Returns
    -------
    float
        The rank's time, ms (0.0 for an empty batch).
    """
    if num_prefill == 0 and num_decode == 0:
        return 0.0
    if model == TIMING_FIXED:
        ms = 0.0
        if num_prefill > 0:
            ms += params[0]
        if num_decode > 0:
            ms += params[1]
        return ms
    ms, padded = model_time_ms_nb(
        model, params, table, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens,
        decode_kv_max, draft_tokens,
    )
    base = model_base_nb(model)
    ms = operator_scaled_ms_nb(
        model, params, table, base, ms, num_prefill, num_decode, decode_kv_tokens, decode_kv_max, draft_tokens
    )
    return pass_terms_ms_nb(params, table, base, ms, num_prefill, padded)


@njit(cache=True)
def model_time_ms_nb(
    model, params, table, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens,
    decode_kv_max, draft_tokens,
):
    """A non-empty batch's model time before the operator scales and pass terms, ms, and its padded tokens.

    Parameters
    ----------
    model : int
        ``TIMING_LINEAR``, ``TIMING_TABLE``, ``TIMING_AIC`` or ``TIMING_ROOFLINE``.
    params, table : ndarray(float64, ndim=1)
        As ``rank_time_ms_nb``.
    num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens, decode_kv_max, draft_tokens : int
        As ``rank_time_ms_nb`` (not all zero).

    Returns
    -------
    (float, int)
        The model time, ms, and the tokens the pass runs at (CUDA-graph padding).
    """
    if draft_tokens > 0 and model != TIMING_LINEAR and model != TIMING_ROOFLINE:
        # table, aic: q rows per verification, each at the mean context (as aiconfigurator prices MTP)
        decode_kv_tokens += draft_tokens * (decode_kv_tokens // num_decode)
        num_decode += draft_tokens
        draft_tokens = 0
    tokens = prefill_tokens + num_decode + draft_tokens
    if model == TIMING_TABLE:
        padded = graph_tokens_nb(params, table, TABLE_NUM_PARAMS, tokens)
        ms = table_pass_ms_nb(
            params, table, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens, padded
        )
        ms += table_moe_ms_nb(params, table, padded, 1)
        alpha = skew_alpha_nb(params, TABLE_NUM_PARAMS, num_decode, decode_kv_tokens, decode_kv_max)
        if alpha != 0.0:
            ms += alpha * table_skew_gap_ms_nb(
                params, table, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens,
                decode_kv_max,
            )
        return ms, padded
    if model == TIMING_ROOFLINE:
        padded = graph_tokens_nb(params, table, ROOFLINE_NUM_PARAMS, tokens)
        ms = roofline_pass_ms_nb(
            params, table, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens, padded,
            draft_tokens,
        )
        return ms, padded
    if model == TIMING_AIC:
        # timing.allreduce replaces the database's own per-layer all-reduces
        replaced = params.shape[0] >= AIC_NUM_PARAMS + PASS_TERMS_NUM_PARAMS and params[AIC_NUM_PARAMS + R_COUNT] != 0.0
        padded = graph_tokens_nb(params, table, AIC_NUM_PARAMS, tokens)
        ms = aic_pass_ms_nb(
            params,
            table,
            num_prefill,
            prefill_tokens,
            prefill_kv_tokens,
            num_decode,
            decode_kv_tokens,
            replaced,
            padded - tokens,
        )
        return ms, padded
    # linear: the padding tokens are priced as tokens of the pass's own kind
    # (prefill tokens beside a prefill entry, decode entries without cache otherwise)
    padded = graph_tokens_nb(params, table, LINEAR_NUM_PARAMS, tokens)
    ms = linear_pass_ms_nb(
        params, num_prefill, prefill_tokens + draft_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens,
        decode_kv_max, padded - tokens,
    )
    return ms, padded


@njit(cache=True)
def operator_scaled_ms_nb(
    model, params, table, base, model_ms, num_prefill, num_decode, decode_kv_tokens, decode_kv_max, draft_tokens
):
    """The model time with the operator scales (``R_DECODE_BASE_SCALE``, ``R_DECODE_ATTENTION_SCALE``,
    ``R_PREFILL_TOKEN_SCALE``), ms; unchanged, bit for bit, where all three are 1 or the block is absent.

    With ``F`` the pass's model time, ``D`` that of its decode entries alone (0
    without decodes) and ``D1`` that of the same decodes at one token of context
    each: ``base x D1 + attention x (D - D1) + prefill x (F - D)``, at least 0.
    ``D1`` holds the decodes' GEMMs and per-sequence operators (and attention's
    floor), ``D - D1`` the time that grows with their context (decode
    attention), ``F - D`` what the prefill entries add (their rows in the GEMMs,
    context attention; a prefill-only pass's whole time).  Each is the model's
    own time of a batch, so every timing model splits alike (docs/timing.md).

    Parameters
    ----------
    model : int
        ``TIMING_*`` (not ``fixed``).
    params, table : ndarray(float64, ndim=1)
        The model's parameters (the pass-terms block at ``base``) and tables.
    base : int
        Offset of the pass-terms block.
    model_ms : float
        ``F``, ms.
    num_prefill, num_decode, decode_kv_tokens, decode_kv_max, draft_tokens : int
        The batch (``rank_time_ms_nb``).

    Returns
    -------
    float
        ms.
    """
    if params.shape[0] < base + PASS_TERMS_NUM_PARAMS:
        return model_ms
    base_scale = params[base + R_DECODE_BASE_SCALE]
    attention_scale = params[base + R_DECODE_ATTENTION_SCALE]
    prefill_scale = params[base + R_PREFILL_TOKEN_SCALE]
    if base_scale == 1.0 and attention_scale == 1.0 and prefill_scale == 1.0:
        return model_ms
    decodes = 0.0
    floor = 0.0
    if num_decode > 0:
        decodes = model_ms
        if num_prefill > 0:
            decodes, _ = model_time_ms_nb(
                model, params, table, 0, 0, 0, num_decode, decode_kv_tokens, decode_kv_max, draft_tokens
            )
        floor, _ = model_time_ms_nb(model, params, table, 0, 0, 0, num_decode, num_decode, 1, draft_tokens)
    ms = base_scale * floor + attention_scale * (decodes - floor) + prefill_scale * (model_ms - decodes)
    return ms if ms > 0.0 else 0.0


@njit(cache=True)
def linear_pass_ms_nb(params, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens,
                      decode_kv_max, padding):
    """The linear model's time of one rank's pass, ms, before the pass terms.

    The ``padding`` tokens (CUDA-graph) are priced as tokens of the pass's own
    kind: prefill tokens beside a prefill entry, cache-less decode entries
    otherwise; the skew term (``timing.attention_skew_alpha``) adds the KV term
    of the scheduled decodes at the longest context less that at their mean.

    Parameters
    ----------
    params : ndarray(float64, ndim=1)
        ``[base_ms, per_prefill_token_us, per_decode_seq_us, per_kv_token_ns]``, then the pass terms.
    num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens : int
        The rank's SPEC §8 batch summary (prefill tokens with any proposals priced as such).
    decode_kv_max : int
        The longest decode context (the skew term's).
    padding : int
        CUDA-graph padding tokens.

    Returns
    -------
    float
        ms.
    """
    decodes = num_decode
    if num_prefill > 0:
        prefill_tokens += padding
    else:
        num_decode += padding
    ms = (
        params[0]
        + params[1] * prefill_tokens / 1000
        + params[2] * num_decode / 1000
        + params[3] * (prefill_kv_tokens + decode_kv_tokens) / 1e6
    )
    alpha = skew_alpha_nb(params, LINEAR_NUM_PARAMS, decodes, decode_kv_tokens, decode_kv_max)
    if alpha != 0.0:
        ms += alpha * (params[3] * (decode_kv_max * decodes - decode_kv_tokens) / 1e6)
    return ms


@njit(cache=True)
def graph_tokens_nb(params, table, base, tokens):
    """Tokens the pass runs at: CUDA-graph padding (``timing.cuda_graph_sizes``).

    The smallest capture size ``>= tokens``; ``tokens`` itself beyond the largest
    size (vLLM runs such a batch eagerly) or without sizes.

    Parameters
    ----------
    params : ndarray(float64, ndim=1)
        The model's parameters, the pass-terms block at ``base`` (``R_GRAPH_*``).
    table : ndarray(float64, ndim=1)
        The flat lookup tables (holds the ascending capture sizes).
    base : int
        Offset of the pass-terms block in ``params``.
    tokens : int
        Tokens scheduled in the pass (prefill tokens + decodes).

    Returns
    -------
    int
        Padded tokens.
    """
    if params.shape[0] < base + PASS_TERMS_NUM_PARAMS:
        return tokens
    n = int(params[base + R_GRAPH_N])
    off = int(params[base + R_GRAPH_X])
    if n == 0 or tokens > table[off + n - 1]:
        return tokens
    lo = 0
    hi = n - 1
    while lo < hi:  # the first size >= tokens
        mid = (lo + hi) // 2
        if table[off + mid] >= tokens:
            hi = mid
        else:
            lo = mid + 1
    return int(table[off + lo])


@njit(cache=True)
def skew_alpha_nb(params, base, num_decode, decode_kv_tokens, decode_kv_max):
    """``timing.attention_skew_alpha`` where the batch has decodes of different lengths, else 0.

    Parameters
    ----------
    params : ndarray(float64, ndim=1)
        The model's parameters, the pass-terms block at ``base`` (``R_SKEW_ALPHA``).
    base : int
        Offset of the pass-terms block in ``params``.
    num_decode, decode_kv_tokens : int
        Decode entries and their sum of ``computed + 1``, tokens.
    decode_kv_max : int
        Their largest ``computed + 1`` (0: not known).

    Returns
    -------
    float
        Alpha (0 without the block, with fewer than two decodes, or decodes of one length).
    """
    if params.shape[0] < base + PASS_TERMS_NUM_PARAMS or num_decode < 2:
        return 0.0
    if decode_kv_max * num_decode <= decode_kv_tokens:  # not known (0), or all of one length
        return 0.0
    return params[base + R_SKEW_ALPHA]


@njit(cache=True)
def pass_terms_ms_nb(params, table, base, model_ms, num_prefill, tokens):
    """A non-empty pass's time from its model time, ms: scaled, plus overhead and TP all-reduce.

    ``model_ms x (R_PREFILL_SCALE if num_prefill > 0 else R_DECODE_SCALE)
    + all-reduce + R_OVERHEAD_US / 1000``; the all-reduce is ``R_COUNT``
    all-reduces of ``tokens x R_BYTES_PER_TOKEN`` bytes each: ring ``latency +
    2 (n - 1) / n x bytes / bandwidth``, or the measured curve interpolated at
    the message size (below its first knot: the first knot's time; beyond its
    last: the last segment extended).  With the defaults (scales 1, no
    overhead, no all-reduce) the model time is returned unchanged, bit for bit.

    Parameters
    ----------
    params : ndarray(float64, ndim=1)
        The model's parameters, the pass-terms block at ``base`` (``R_*``).
    table : ndarray(float64, ndim=1)
        The flat lookup tables (holds the curve).
    base : int
        Offset of the block in ``params``.
    model_ms : float
        The timing model's time of the pass, ms.
    num_prefill : int
        Prefill entries of the pass.
    tokens : int
        Tokens the pass runs at (prefill tokens + decodes, padded to a CUDA-graph size).

    Returns
    -------
    float
        Time, ms.
    """
    if params.shape[0] < base + PASS_TERMS_NUM_PARAMS:
        return model_ms
    scale = params[base + R_PREFILL_SCALE] if num_prefill > 0 else params[base + R_DECODE_SCALE]
    ms = model_ms * scale
    if params[base + R_COUNT] != 0.0:
        size = tokens * params[base + R_BYTES_PER_TOKEN]
        knots = int(params[base + R_CURVE_N])
        if knots == 0:
            n = params[base + R_GPUS]
            one_us = params[base + R_LATENCY_US] + 2.0 * (n - 1.0) / n * size / (params[base + R_BANDWIDTH] * 1e3)
        else:
            xoff = int(params[base + R_CURVE_X])
            yoff = int(params[base + R_CURVE_Y])
            if size <= table[xoff]:
                one_us = table[yoff]
            else:
                one_us = interp1_nb(table, xoff, yoff, knots, size)
        ms += params[base + R_COUNT] * one_us / 1000.0
    return ms + params[base + R_OVERHEAD_US] / 1000.0


# ---------------------------------------------------------------- interpolation


@njit(cache=True)
def bracket_nb(table, off, n, x):
    """Bracketing knot and weight of ``x`` on the ascending knots ``table[off:off + n]``.

    Parameters
    ----------
    table : ndarray(float64, ndim=1)
        Holds the knots.
    off, n : int
        Offset and number (>= 1) of the knots.
    x : float
        The query, in the axis' unit.

    Returns
    -------
    (int, float)
        ``i`` in ``[0, n - 2]`` (0 when n == 1) and ``t`` so that the value is
        ``(1 - t) * v[i] + t * v[i + 1]``; ``t`` is 0 on a knot (1 on the last
        knot) and falls outside [0, 1] beyond the knots (linear extension).
    """
    if n == 1:
        return 0, 0.0
    lo = 0
    hi = n - 1
    if x <= table[off]:
        lo = 0
    elif x >= table[off + n - 1]:
        lo = n - 2
    else:
        # table[off + lo] <= x < table[off + hi]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if table[off + mid] <= x:
                lo = mid
            else:
                hi = mid
    x0 = table[off + lo]
    x1 = table[off + lo + 1]
    return lo, (x - x0) / (x1 - x0)


@njit(cache=True)
def interp1_nb(table, xoff, yoff, n, x):
    """Piecewise-linear value at ``x`` of the knots ``table[xoff:xoff + n]`` -> ``table[yoff:...]``.

    Parameters
    ----------
    table : ndarray(float64, ndim=1)
        The flat lookup tables.
    xoff, yoff : int
        Offsets of the ascending knots and of their values.
    n : int
        Number of knots, >= 1.
    x : float
        Query point (knot units).

    Returns
    -------
    float
        Interpolated value (value units; end segments extended).
    """
    i, t = bracket_nb(table, xoff, n, x)
    if n == 1:
        return table[yoff]
    return (1.0 - t) * table[yoff + i] + t * table[yoff + i + 1]


@njit(cache=True)
def interp_int_nb(table, yoff, n, k):
    """Value at integer ``k >= 1`` of a table holding knots 1..n at ``table[yoff:yoff + n]``.

    Below 1 the value at 1 is used; beyond n the last segment is extended.

    Parameters
    ----------
    table : ndarray(float64, ndim=1)
        The flat lookup tables.
    yoff : int
        Offset of the values.
    n : int
        Number of knots, >= 1.
    k : int
        Query knot.

    Returns
    -------
    float
        Value (ms for the AIC tables).
    """
    if k <= 1 or n == 1:
        return table[yoff]
    if k <= n:
        return table[yoff + k - 1]
    t = float(k - (n - 1))
    return (1.0 - t) * table[yoff + n - 2] + t * table[yoff + n - 1]


@njit(cache=True)
def lerp_rising_nb(lo, hi, t):
    """``(1 - t) * lo + t * hi``, except past ``hi`` (``t > 1``) on a falling segment: ``hi``.

    The ``table`` model's extension beyond the last knot: a measured end
    segment that slopes down is taken as noise: extending it would reach negative
    costs; its slope is floored at 0 there.  Inside the knots (``t <= 1``) and
    on rising segments this is the plain linear formula, bit for bit.

    Parameters
    ----------
    lo, hi : float
        Values at the segment's two knots.
    t : float
        Weight of ``hi`` (``bracket_nb``).

    Returns
    -------
    float
        The value.
    """
    if t > 1.0 and hi < lo:
        return hi
    return (1.0 - t) * lo + t * hi


@njit(cache=True)
def interp1_rising_nb(table, xoff, yoff, n, x):
    """``interp1_nb`` with the extension beyond the last knot by ``lerp_rising_nb``.

    Parameters
    ----------
    table : ndarray(float64, ndim=1)
        The flat lookup tables.
    xoff, yoff : int
        Offsets of the ascending knots and of their values.
    n : int
        Number of knots, >= 1.
    x : float
        Query point (knot units).

    Returns
    -------
    float
        Interpolated value (value units).
    """
    i, t = bracket_nb(table, xoff, n, x)
    if n == 1:
        return table[yoff]
    return lerp_rising_nb(table[yoff + i], table[yoff + i + 1], t)


@njit(cache=True)
def extend4_rising_nb(table, params, i0, t0, i1, t1, i2, t2, i3, t3):
    """The attention grid beyond its last knot on some axis, reduced axis by axis (``interp4_nb``), us.

    Parameters
    ----------
    table : ndarray(float64, ndim=1)
        The flat lookup tables.
    params : ndarray(float64, ndim=1)
        Offsets and sizes into ``table`` (``P_*`` indices).
    i0, t0, i1, t1, i2, t2, i3, t3 : int, float
        ``bracket_nb`` of the query on the pc, kvp, nd and kvd axes.

    Returns
    -------
    float
        Attention time of one layer, us.
    """
    s2 = int(params[P_KVD_N])
    s1 = int(params[P_ND_N]) * s2
    s0 = int(params[P_KVP_N]) * s1
    base = int(params[P_ATTN])
    # on a knot (t == 0, also every one-knot axis) the "hi" corner is not read: hi = lo
    up0 = 1 if t0 != 0.0 else 0
    up1 = 1 if t1 != 0.0 else 0
    up2 = 1 if t2 != 0.0 else 0
    up3 = 1 if t3 != 0.0 else 0
    pc_lo = pc_hi = 0.0
    for a in range(1 + up0):
        kvp_lo = kvp_hi = 0.0
        for b in range(1 + up1):
            nd_lo = nd_hi = 0.0
            for c in range(1 + up2):
                cell = base + (i0 + a) * s0 + (i1 + b) * s1 + (i2 + c) * s2 + i3
                value = lerp_rising_nb(table[cell], table[cell + up3], t3)
                if c == 0:
                    nd_lo = nd_hi = value
                else:
                    nd_hi = value
            value = lerp_rising_nb(nd_lo, nd_hi, t2)
            if b == 0:
                kvp_lo = kvp_hi = value
            else:
                kvp_hi = value
        value = lerp_rising_nb(kvp_lo, kvp_hi, t1)
        if a == 0:
            pc_lo = pc_hi = value
        else:
            pc_hi = value
    return lerp_rising_nb(pc_lo, pc_hi, t0)


@njit(cache=True)
def interp4_nb(table, params, x0, x1, x2, x3):
    """The profile attention grid at ``(pc, kvp, nd, kvd)``, us: multilinear, rising extensions.

    Inside the grid, the multilinear sum over the 16 corners.  A query beyond
    the last knot of some axis is reduced one axis at a time instead, kv_decode
    first, then n_decode, kv_prefill, prefill_chunk, each step by
    ``lerp_rising_nb`` (the plain multilinear value where no end segment
    falls, up to rounding); with a non-negative grid the value is then
    non-negative.

    Parameters
    ----------
    table : ndarray(float64, ndim=1)
        The flat lookup tables.
    params : ndarray(float64, ndim=1)
        Offsets and sizes into ``table`` (``P_*`` indices).
    x0, x1, x2, x3 : float
        Prefill chunk (tokens), kv prefill (tokens), decodes (sequences), kv decode (tokens).

    Returns
    -------
    float
        Attention time of one layer, us.
    """
    n0 = int(params[P_PC_N])
    n1 = int(params[P_KVP_N])
    n2 = int(params[P_ND_N])
    n3 = int(params[P_KVD_N])
    i0, t0 = bracket_nb(table, int(params[P_PC_X]), n0, x0)
    i1, t1 = bracket_nb(table, int(params[P_KVP_X]), n1, x1)
    i2, t2 = bracket_nb(table, int(params[P_ND_X]), n2, x2)
    i3, t3 = bracket_nb(table, int(params[P_KVD_X]), n3, x3)
    if t0 > 1.0 or t1 > 1.0 or t2 > 1.0 or t3 > 1.0:
        return extend4_rising_nb(table, params, i0, t0, i1, t1, i2, t2, i3, t3)
    base = int(params[P_ATTN])
    s2 = n3
    s1 = n2 * s2
    s0 = n1 * s1
    total = 0.0
    for a in range(2):
        w0 = t0 if a == 1 else 1.0 - t0
        if w0 == 0.0 or (a == 1 and n0 == 1):
            continue
        for b in range(2):
            w1 = t1 if b == 1 else 1.0 - t1
            if w1 == 0.0 or (b == 1 and n1 == 1):
                continue
            for c in range(2):
                w2 = t2 if c == 1 else 1.0 - t2
                if w2 == 0.0 or (c == 1 and n2 == 1):
                    continue
                for d in range(2):
                    w3 = t3 if d == 1 else 1.0 - t3
                    if w3 == 0.0 or (d == 1 and n3 == 1):
                        continue
                    idx = base + (i0 + a) * s0 + (i1 + b) * s1 + (i2 + c) * s2 + (i3 + d)
                    total += w0 * w1 * w2 * w3 * table[idx]
    return total


@njit(cache=True)
def interp3_nb(table, n_off, n_n, s_off, s_n, p_off, p_n, grid, xn, xs, xp):
    """Trilinear value of a ``[n, s, p]`` grid stored at ``table[grid:]`` (C order).

    Parameters
    ----------
    table : ndarray(float64, ndim=1)
        The flat lookup tables.
    n_off, n_n, s_off, s_n, p_off, p_n : int
        Offset and count of the knots of each axis.
    grid : int
        Offset of the grid values.
    xn, xs, xp : float
        Query point on the three axes.

    Returns
    -------
    float
        Interpolated value (ms for the AIC CA table).
    """
    i0, t0 = bracket_nb(table, n_off, n_n, xn)
    i1, t1 = bracket_nb(table, s_off, s_n, xs)
    i2, t2 = bracket_nb(table, p_off, p_n, xp)
    s1 = p_n
    s0 = s_n * s1
    total = 0.0
    for a in range(2):
        w0 = t0 if a == 1 else 1.0 - t0
        if w0 == 0.0 or (a == 1 and n_n == 1):
            continue
        for b in range(2):
            w1 = t1 if b == 1 else 1.0 - t1
            if w1 == 0.0 or (b == 1 and s_n == 1):
                continue
            for c in range(2):
                w2 = t2 if c == 1 else 1.0 - t2
                if w2 == 0.0 or (c == 1 and p_n == 1):
                    continue
                total += w0 * w1 * w2 * table[grid + (i0 + a) * s0 + (i1 + b) * s1 + (i2 + c)]
    return total


# ---------------------------------------------------------------- table (profile)


@njit(cache=True)
def table_attention_us_nb(params, table, chunk, kv_prefill, n_decode, kv_decode):
    """Attention time of one layer for one grid query, us.

    ``chunk`` and ``kv_decode`` are clamped up to the smallest positive knot
    when there is a prefill / a decode (a chunk or context below the first
    measured one costs what that one costs); 0 means "none".

    Parameters
    ----------
    params : ndarray(float64, ndim=1)
        Offsets and sizes into ``table`` (``P_*`` indices).
    table : ndarray(float64, ndim=1)
        The flat lookup tables.
    chunk : float
        Mean prefill chunk, tokens (0: no prefill).
    kv_prefill : float
        Mean cached tokens of a prefill entry, tokens.
    n_decode : int
        Decode entries, sequences.
    kv_decode : float
        Mean cached tokens of a decode entry, tokens.

    Returns
    -------
    float
        Time, us.
    """
    pc = chunk
    if pc > 0.0 and pc < params[P_PC_MIN]:
        pc = params[P_PC_MIN]
    kvd = kv_decode
    if n_decode > 0 and kvd < params[P_KVD_MIN]:
        kvd = params[P_KVD_MIN]
    if n_decode == 0:
        kvd = 0.0
    return interp4_nb(table, params, pc, kv_prefill, float(n_decode), kvd)


@njit(cache=True)
def table_pass_ms_nb(
    params, table, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens, dense_tokens
):
    """Pass time from a per-operator profile, ms (see docs/timing.md).

    ``num_layers x (dense per-layer ops at T + attention) + once-per-pass dense
    ops at T + per-sequence ops at S``, with ``T = dense_tokens`` (``prefill_tokens
    + num_decode``, padded to a CUDA-graph size) and ``S = num_prefill +
    num_decode``.  Attention: the mean prefill entry (chunk ``prefill_tokens /
    num_prefill``, cached ``(prefill_kv_tokens - prefill_tokens) / num_prefill``)
    shares the grid query with the decodes (``num_decode``, cached
    ``decode_kv_tokens / num_decode - 1`` each), and each further prefill entry
    adds a prefill-only query at the same mean shape.

    Parameters
    ----------
    params : ndarray(float64, ndim=1)
        Offsets and sizes into ``table`` (``P_*`` indices).
    table : ndarray(float64, ndim=1)
        The flat lookup tables.
    num_prefill : int
        Prefill entries.
    prefill_tokens, prefill_kv_tokens : int
        Prefill tokens scheduled, and their total with the cached ones, tokens.
    num_decode : int
        Decode entries.
    decode_kv_tokens : int
        Sum of ``computed + 1`` over decode entries, tokens.
    dense_tokens : int
        Tokens the dense ops run at (the padded pass; attention and the
        per-sequence ops see the scheduled entries only).

    Returns
    -------
    float
        The rank's time, ms.
    """
    tokens = float(dense_tokens)
    seqs = float(num_prefill + num_decode)
    n_dense = int(params[P_DENSE_N])
    dense_layer = interp1_rising_nb(table, int(params[P_DENSE_X]), int(params[P_DENSE_LAYER]), n_dense, tokens)
    dense_pass = interp1_rising_nb(table, int(params[P_DENSE_X]), int(params[P_DENSE_PASS]), n_dense, tokens)
    per_seq = interp1_rising_nb(table, int(params[P_SEQ_X]), int(params[P_SEQ_Y]), int(params[P_SEQ_N]), seqs)
    chunk, cached = mean_prefill_nb(num_prefill, prefill_tokens, prefill_kv_tokens)
    kv_decode = 0.0
    if num_decode > 0:
        kv_decode = decode_kv_tokens / num_decode - 1.0
    attn = table_attention_us_nb(params, table, chunk, cached, num_decode, kv_decode)
    if num_prefill > 1:
        attn += (num_prefill - 1) * table_attention_us_nb(params, table, chunk, cached, 0, 0.0)
    return (params[P_NUM_LAYERS] * (dense_layer + attn) + dense_pass + per_seq) / 1000.0


@njit(cache=True)
def mean_prefill_nb(num_prefill, prefill_tokens, prefill_kv_tokens):
    """The mean prefill entry's chunk and cached tokens.

    Parameters
    ----------
    num_prefill : int
        Prefill entries.
    prefill_tokens, prefill_kv_tokens : int
        Prefill tokens scheduled, and their total with the cached ones, tokens.

    Returns
    -------
    chunk, cached : float
        Tokens (0, 0 without prefill).
    """
    if num_prefill == 0:
        return 0.0, 0.0
    return prefill_tokens / num_prefill, (prefill_kv_tokens - prefill_tokens) / num_prefill


@njit(cache=True)
def table_skew_gap_ms_nb(
    params, table, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens, decode_kv_max
):
    """``num_layers x (A(.., n_decode, longest) - A(.., n_decode, mean))``, ms, at least 0.

    The profile measures decodes of one context length; the attention of a
    batch of mixed lengths is taken at their mean (``table_pass_ms_nb``), and
    ``timing.attention_skew_alpha`` adds this share of the gap to the same
    query at the longest context (LLMServingSim's profiler fits it as
    ``t = t_mean + alpha (t_max - t_mean)``; docs/timing.md).  A gap the grid
    gives below 0 counts 0.

    Parameters
    ----------
    params : ndarray(float64, ndim=1)
        Offsets and sizes into ``table`` (``P_*`` indices).
    table : ndarray(float64, ndim=1)
        The flat lookup tables.
    num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens : int
        The batch summary of SPEC §8 (at least two decodes).
    decode_kv_max : int
        The largest ``computed + 1`` of a decode entry, tokens.

    Returns
    -------
    float
        The gap, ms.
    """
    chunk, cached = mean_prefill_nb(num_prefill, prefill_tokens, prefill_kv_tokens)
    mean_us = table_attention_us_nb(params, table, chunk, cached, num_decode, decode_kv_tokens / num_decode - 1.0)
    longest_us = table_attention_us_nb(params, table, chunk, cached, num_decode, decode_kv_max - 1.0)
    if longest_us <= mean_us:
        return 0.0
    return params[P_NUM_LAYERS] * (longest_us - mean_us) / 1000.0


# ---------------------------------------------------------------- aic


@njit(cache=True)
def aic_ga_row_nb(params, table, r, kv):
    """Decode attention on batch row ``r`` (0-based) at ``kv`` tokens, ms.

    Parameters
    ----------
    params : ndarray(float64, ndim=1)
        Offsets and sizes into ``table`` (``A_*`` indices).
    table : ndarray(float64, ndim=1)
        The flat lookup tables.
    r : int
        Batch row, 0-based.
    kv : float
        Kv length, tokens.

    Returns
    -------
    float
        Time, ms.
    """
    starts = int(params[A_GA_START])
    first = int(table[starts + r])
    n = int(table[starts + r + 1]) - first
    i, t = bracket_nb(table, int(params[A_GA_K]) + first, n, kv)
    values = int(params[A_GA]) + first
    if n == 1:
        return table[values]
    return (1.0 - t) * table[values + i] + t * table[values + i + 1]


@njit(cache=True)
def aic_ga_nb(params, table, batch, kv):
    """Decode attention of ``batch`` requests at ``kv`` tokens each (AIC query units), ms.

    Each batch row has its own kv knots (refined around the steps of the
    database's attention model); between batch rows (every integer up to 256,
    coarser beyond) and beyond the last one the rows are combined linearly.

    Parameters
    ----------
    params : ndarray(float64, ndim=1)
        Offsets and sizes into ``table`` (``A_*`` indices).
    table : ndarray(float64, ndim=1)
        The flat lookup tables.
    batch : int
        Decode requests, sequences.
    kv : int
        Kv length per request, tokens.

    Returns
    -------
    float
        Time, ms.
    """
    rows = int(params[A_GA_B_N])
    x = float(kv)
    if rows == 1:
        return aic_ga_row_nb(params, table, 0, x)
    i, t = bracket_nb(table, int(params[A_GA_B]), rows, float(batch))
    if t == 0.0:
        return aic_ga_row_nb(params, table, i, x)
    v0 = aic_ga_row_nb(params, table, i, x)
    v1 = aic_ga_row_nb(params, table, i + 1, x)
    return (1.0 - t) * v0 + t * v1


@njit(cache=True)
def aic_ca_nb(params, table, batch, s, p):
    """Context attention of ``batch`` requests of ``s`` new and ``p`` cached tokens, ms.

    Parameters
    ----------
    params : ndarray(float64, ndim=1)
        Offsets and sizes into ``table`` (``A_*`` indices).
    table : ndarray(float64, ndim=1)
        The flat lookup tables.
    batch : int
        Prefill requests, sequences.
    s, p : int
        New and cached tokens per request, tokens.

    Returns
    -------
    float
        Time, ms.
    """
    return interp3_nb(
        table,
        int(params[A_CA_N]),
        int(params[A_CA_N_N]),
        int(params[A_CA_S]),
        int(params[A_CA_S_N]),
        int(params[A_CA_P]),
        int(params[A_CA_P_N]),
        int(params[A_CA]),
        float(batch),
        float(s),
        float(p),
    )


@njit(cache=True)
def aic_pass_ms_nb(
    params, table, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens, without_allreduce, pad
):
    """Pass time from the AIC component tables, ms (aiconfigurator-core's FPM composition).

    With ``n = num_prefill``, ``P = prefill_tokens``, ``H = prefill_kv_tokens -
    P`` (cached tokens), ``B = num_decode``, ``K = (decode_kv_tokens - B) // B``,
    ``s = P // n``, ``p = H // n``:
    mixed ``NA[P + B] + LG[1] + CA(ceil(P / s), s, p) + GA(B, K)``;
    prefill-only ``NA[n s] + LG[n] + CA(n, s, p)``; decode-only ``NG[B] + GA(B, K)``.
    ``without_allreduce``: ``NA`` and ``NG`` less the database's per-layer
    all-reduces at the same knot (``timing.allreduce`` prices them instead).
    ``pad``: CUDA-graph padding tokens, added to the ``NA`` / ``NG`` knot.

    Parameters
    ----------
    params : ndarray(float64, ndim=1)
        Offsets and sizes into ``table`` (``A_*`` indices).
    table : ndarray(float64, ndim=1)
        The flat lookup tables.
    num_prefill : int
        Prefill entries.
    prefill_tokens, prefill_kv_tokens : int
        Prefill tokens scheduled, and their total with the cached ones, tokens.
    num_decode : int
        Decode entries.
    decode_kv_tokens : int
        Sum of ``computed + 1`` over decode entries, tokens.
    without_allreduce : bool
        Leave out the database's own per-layer all-reduces.
    pad : int
        Padding tokens of the pass (0: none).

    Returns
    -------
    float
        The rank's time, ms.
    """
    if num_prefill > 0:
        s = prefill_tokens // num_prefill
        p = (prefill_kv_tokens - prefill_tokens) // num_prefill
        if s < 1:
            s = 1
        if num_decode > 0:
            k = (decode_kv_tokens - num_decode) // num_decode
            ctx_batch = (prefill_tokens + s - 1) // s
            return (
                aic_context_ops_nb(params, table, prefill_tokens + num_decode + pad, without_allreduce)
                + interp_int_nb(table, int(params[A_LG]), int(params[A_LG_N]), 1)
                + aic_ca_nb(params, table, ctx_batch, s, p)
                + aic_ga_nb(params, table, num_decode, k)
            )
        return (
            aic_context_ops_nb(params, table, num_prefill * s + pad, without_allreduce)
            + interp_int_nb(table, int(params[A_LG]), int(params[A_LG_N]), num_prefill)
            + aic_ca_nb(params, table, num_prefill, s, p)
        )
    k = (decode_kv_tokens - num_decode) // num_decode
    ng = interp_int_nb(table, int(params[A_NG]), int(params[A_NG_N]), num_decode + pad)
    if without_allreduce:
        ng -= interp_int_nb(table, int(params[A_AR_GEN]), int(params[A_NG_N]), num_decode + pad)
    return ng + aic_ga_nb(params, table, num_decode, k)


@njit(cache=True)
def aic_context_ops_nb(params, table, tokens, without_allreduce):
    """``NA[tokens]``, less the database's per-layer all-reduces at ``tokens`` if asked, ms.

    Parameters
    ----------
    params : ndarray(float64, ndim=1)
        Offsets and sizes into ``table`` (``A_*`` indices).
    table : ndarray(float64, ndim=1)
        The flat lookup tables.
    tokens : int
        The NA knot (tokens).
    without_allreduce : bool
        Subtract ``AR_CTX[tokens]``.

    Returns
    -------
    float
        Time, ms.
    """
    na_n = int(params[A_NA_N])
    ms = interp_int_nb(table, int(params[A_NA]), na_n, tokens)
    if without_allreduce:
        ms -= interp_int_nb(table, int(params[A_AR_CTX]), na_n, tokens)
    return ms


# ---------------------------------------------------------------- roofline


@njit(cache=True)
def roofline_ms_nb(flops, nbytes, flops_per_ms, bytes_per_ms):
    """``max(flops / flops_per_ms, bytes / bytes_per_ms)``: the slower of compute and memory, ms.

    Parameters
    ----------
    flops, nbytes : float
        Work and memory traffic of the operator group.
    flops_per_ms, bytes_per_ms : float
        Effective peaks.

    Returns
    -------
    float
        Time, ms.
    """
    compute = flops / flops_per_ms
    memory = nbytes / bytes_per_ms
    return compute if compute > memory else memory


@njit(cache=True)
def span_sum_nb(first, last, span):
    """``sum(min(x, span) for x in first..last)`` (``span`` 0: no cap), in float64.

    The keys the queries at positions ``first - 1 .. last - 1`` attend to under
    causal attention limited to the last ``span`` tokens.

    Parameters
    ----------
    first, last : float
        Keys visible to the first and the last query without a span.
    span : float
        The attention span, tokens (0: none).

    Returns
    -------
    float
        Query-key pairs.
    """
    if last < first:
        return 0.0
    a = float(first)
    b = float(last)
    if span <= 0.0 or b <= span:
        return (a + b) * (b - a + 1.0) / 2.0
    if a >= span:
        return span * (b - a + 1.0)
    return (a + span) * (span - a + 1.0) / 2.0 + span * (b - span)


@njit(cache=True)
def roofline_attention_ms_nb(params, table, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode,
                             decode_kv_tokens, draft_tokens=0):
    """Attention of all layers, ms: per layer group, one roofline of the pass's attention work.

    The mean prefill entry (chunk ``c``, cached ``h``) attends ``span_sum(h + 1,
    h + c, span)`` query-key pairs and reads ``min(h + c, span)`` tokens' KV
    plus writes ``c``; a decode reads ``min(context, span)`` tokens' KV (the
    decodes' mean context where a span caps it, their exact sum otherwise).
    A verification's ``1 + d`` query rows (``draft_tokens = sum d``) read their
    sequence's KV once, attend it each and write one KV row each.

    Parameters
    ----------
    params : ndarray(float64, ndim=1)
        The ``RF_*`` layout.
    table : ndarray(float64, ndim=1)
        Holds the attention groups.
    num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens : int
        The batch summary of SPEC §8.
    draft_tokens : int
        Speculative proposals the decode entries verify.

    Returns
    -------
    float
        Time, ms.
    """
    chunk, cached = mean_prefill_nb(num_prefill, prefill_tokens, prefill_kv_tokens)
    mean_ctx = 0.0
    if num_decode > 0:
        mean_ctx = decode_kv_tokens / num_decode
    groups = int(params[RF_NUM_ATTN])
    off = int(params[RF_ATTN])
    ms = 0.0
    for g in range(groups):
        row = off + g * RF_ATTN_WIDTH
        span = table[row + 1]
        kv_bytes = table[row + 5]
        flops = 0.0
        nbytes = 0.0
        if num_prefill > 0:
            pairs = span_sum_nb(cached + 1.0, cached + chunk, span)
            read = cached + chunk
            if span > 0.0 and read > span:
                read = span
            flops += num_prefill * (pairs * table[row + 2] + cached * table[row + 4])
            nbytes += num_prefill * ((read + chunk) * kv_bytes + chunk * table[row + 6])
        if num_decode > 0:
            if span > 0.0 and mean_ctx > span:
                reads = num_decode * span
            else:
                reads = float(decode_kv_tokens)
            flops += reads * table[row + 3] * (1.0 + draft_tokens / num_decode)  # every query row attends
            nbytes += reads * kv_bytes + (num_decode + draft_tokens) * (kv_bytes + table[row + 7])
        ms += table[row] * roofline_ms_nb(flops, nbytes, params[RF_ATTN_FLOPS_PER_MS], params[RF_ATTN_BYTES_PER_MS])
    return ms


@njit(cache=True)
def roofline_pass_ms_nb(
    params, table, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens, dense_tokens,
    draft_tokens=0,
):
    """Pass time from FLOPs and bytes against the GPU's peaks, ms (docs/timing.md, ``roofline``).

    ``sum over GEMM groups of max(rows x FLOPs per row / F, (weights + rows x
    io) / B) + MoE layers x max(T k x expert FLOPs / F, (A(T) x expert bytes +
    T k x io) / B) + attention``, with rows = ``T = dense_tokens`` (the padded
    pass) or ``S = num_prefill + num_decode`` (``lm_head``), and ``A(T) = E (1 -
    (1 - k / E)^T)`` the expected number of experts the pass's tokens activate.

    Parameters
    ----------
    params : ndarray(float64, ndim=1)
        The ``RF_*`` layout.
    table : ndarray(float64, ndim=1)
        The GEMM and attention groups.
    num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens : int
        The batch summary of SPEC §8.
    dense_tokens : int
        Tokens the GEMMs run at (prefill tokens + decodes + proposals, padded to a CUDA-graph size).
    draft_tokens : int
        Speculative proposals the decode entries verify: GEMM and ``lm_head``
        rows, and query rows of their sequences' attention (KV read once).

    Returns
    -------
    float
        The rank's time, ms.
    """
    tokens = float(dense_tokens)
    seqs = float(num_prefill + num_decode + draft_tokens)  # lm_head: every verified position's logits
    ms = 0.0
    off = int(params[RF_GEMM])
    for g in range(int(params[RF_NUM_GEMM])):
        row = off + g * RF_GEMM_WIDTH
        rows = tokens if table[row] == 0.0 else seqs
        ms += roofline_ms_nb(rows * table[row + 1], table[row + 2] + rows * table[row + 3], table[row + 4],
                             table[row + 5])
    layers = params[RF_MOE_LAYERS]
    if layers > 0.0:
        experts = params[RF_EXPERTS]
        k = params[RF_TOPK]
        routed = tokens * k
        active = experts * (1.0 - (1.0 - k / experts) ** tokens)
        ms += layers * roofline_ms_nb(
            routed * params[RF_EXPERT_FLOPS],
            active * params[RF_EXPERT_BYTES] + routed * params[RF_EXPERT_IO],
            params[RF_MOE_FLOPS_PER_MS],
            params[RF_MOE_BYTES_PER_MS],
        )
    return ms + roofline_attention_ms_nb(
        params, table, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens, draft_tokens
    )


@njit(cache=True)
def pass_times_nb(model, params, table, summaries, out):
    """``rank_time_ms_nb`` over rows ``[num_prefill, prefill_tokens, prefill_kv_tokens,
    num_decode, decode_kv_tokens]`` (and optionally ``decode_kv_max``) of ``summaries``
    (int64, shape (n, 5) or (n, 6)) into ``out`` (ms).

    Parameters
    ----------
    model : int
        Timing-model code (``TIMING_*``).
    params : ndarray(float64, ndim=1)
        The model's parameters.
    table : ndarray(float64, ndim=1)
        Its flat lookup tables (may be empty).
    summaries : ndarray(int64, shape (n, 5) or (n, 6))
        SPEC §8 batch summaries (entries, tokens), then the longest decode context.
    out : ndarray(float64, ndim=1)
        Out, (n,): pass time of each row, ms.
    """
    for r in range(summaries.shape[0]):
        out[r] = rank_time_ms_nb(
            model,
            params,
            table,
            summaries[r, 0],
            summaries[r, 1],
            summaries[r, 2],
            summaries[r, 3],
            summaries[r, 4],
            summaries[r, 5] if summaries.shape[1] > 5 else 0,
        )



# ---------------------------------------------------------------- MoE and expert parallelism


@njit(cache=True)
def interp2_rising_nb(table, params, tokens, experts):
    """moe.csv's grid at ``(tokens, experts)``, us.

    Below an axis' first knot the first knot's value (the profile starts at one
    token and at ``top_k`` experts); between knots bilinear; beyond the last knot
    the end segment extended with its slope floored at 0 (``lerp_rising_nb``),
    the experts axis first.

    Parameters
    ----------
    table : ndarray(float64, ndim=1)
        The flat lookup tables.
    params : ndarray(float64, ndim=1)
        Offsets and sizes (``P_MOE_*``).
    tokens, experts : float
        Tokens on the GPU and its distinct activated experts.

    Returns
    -------
    float
        One MoE layer, us.
    """
    n_t = int(params[P_MOE_T_N])
    n_a = int(params[P_MOE_A_N])
    t_off = int(params[P_MOE_T_X])
    a_off = int(params[P_MOE_A_X])
    grid = int(params[P_MOE])
    tokens = max(tokens, table[t_off])
    experts = max(experts, table[a_off])
    i, ti = bracket_nb(table, t_off, n_t, tokens)
    j, tj = bracket_nb(table, a_off, n_a, experts)
    if n_a == 1:
        lo = table[grid + i * n_a]
        hi = table[grid + (i + 1) * n_a] if n_t > 1 else lo
    else:
        lo = lerp_rising_nb(table[grid + i * n_a + j], table[grid + i * n_a + j + 1], tj)
        if n_t == 1:
            return lo
        hi = lerp_rising_nb(table[grid + (i + 1) * n_a + j], table[grid + (i + 1) * n_a + j + 1], tj)
    if n_t == 1:
        return lo
    return lerp_rising_nb(lo, hi, ti)


@njit(cache=True)
def table_moe_ms_nb(params, table, gathered, group):
    """The MoE layers of one pass on one GPU of an expert-parallel group, ms (0 without moe.csv).

    The GPU holds ``E / group`` of the ``E`` routed experts and computes the
    ``gathered x k`` (token, expert) pairs that reach them: ``gathered x k / group``
    on average, ``P_MOE_IMBALANCE`` times that on the busiest GPU, which the
    others wait for.  The profile measures ``tokens x k`` pairs over a given
    number of distinct experts, so the query is ``tokens = imbalance x gathered /
    group`` and the expected distinct experts of the GPU under uniform routing,
    ``E / group x (1 - (1 - k / E) ^ gathered)`` (a token picks k of E experts, so
    misses a given one with probability ``1 - k / E``).

    Parameters
    ----------
    params : ndarray(float64, ndim=1)
        ``P_*`` layout (``P_MOE_T_N`` 0: no MoE layers).
    table : ndarray(float64, ndim=1)
        The flat lookup tables.
    gathered : int
        Tokens every GPU of the group sees in each MoE layer (the pass's, or
        under expert parallelism the sum over the attention-DP ranks).
    group : int
        GPUs the experts are split over.

    Returns
    -------
    float
        ms.
    """
    if params.shape[0] < TABLE_NUM_PARAMS or params[P_MOE_T_N] == 0.0 or gathered <= 0:
        return 0.0
    experts = params[P_MOE_EXPERTS]
    top_k = params[P_MOE_TOP_K]
    tokens = params[P_MOE_IMBALANCE] * gathered / group
    activated = experts / group * (1.0 - (1.0 - top_k / experts) ** gathered)
    return params[P_MOE_LAYERS] * interp2_rising_nb(table, params, tokens, activated) / 1000.0


@njit(cache=True)
def model_base_nb(model):
    """Offset of the pass-terms block in ``params`` (0 for ``fixed``, which has none).

    Parameters
    ----------
    model : int
        ``TIMING_*``.

    Returns
    -------
    int
        The model's own parameter count.
    """
    if model == TIMING_LINEAR:
        return LINEAR_NUM_PARAMS
    if model == TIMING_TABLE:
        return TABLE_NUM_PARAMS
    if model == TIMING_AIC:
        return AIC_NUM_PARAMS
    if model == TIMING_ROOFLINE:
        return ROOFLINE_NUM_PARAMS
    return 0


@njit(cache=True)
def alltoall_ms_nb(params, base, gathered, num_dp):
    """Dispatch and combine of every MoE layer over the attention-DP ranks, ms.

    vLLM's default ``allgather_reducescatter`` backend gathers each rank's hidden
    states with their top-k weights and ids from every DP rank, and
    reduce-scatters the experts' outputs back: per MoE layer two ring
    collectives of ``gathered`` tokens, ``2 x latency + (D - 1) / D x gathered x
    bytes_per_token / bandwidth`` (``X_BYTES_PER_TOKEN`` counts both directions).

    Parameters
    ----------
    params : ndarray(float64, ndim=1)
        The model's parameters; the block at ``base + PASS_TERMS_NUM_PARAMS`` (``X_*``).
    base : int
        Offset of the pass-terms block.
    gathered : int
        Tokens over all DP ranks (each rank's as it runs, padding included).
    num_dp : int
        Attention-DP ranks D.

    Returns
    -------
    float
        ms (0 without the block, without bandwidth or with one rank).
    """
    at = base + PASS_TERMS_NUM_PARAMS
    if num_dp < 2 or params.shape[0] < at + ALLTOALL_NUM_PARAMS or params[at + X_BANDWIDTH] == 0.0:
        return 0.0
    d = float(num_dp)
    one_us = 2.0 * params[at + X_LATENCY_US] + (d - 1.0) / d * gathered * params[at + X_BYTES_PER_TOKEN] / (
        params[at + X_BANDWIDTH] * 1e3
    )
    return params[at + X_LAYERS] * one_us / 1000.0


@njit(cache=True)
def graph_largest_nb(params, table, base):
    """The largest CUDA-graph capture size (0: no padding).

    Parameters
    ----------
    params, table : ndarray(float64, ndim=1)
        The model's parameters (the pass-terms block at ``base``) and tables.
    base : int
        Offset of the pass-terms block.

    Returns
    -------
    int
        Tokens.
    """
    if params.shape[0] < base + PASS_TERMS_NUM_PARAMS or params[base + R_GRAPH_N] == 0.0:
        return 0
    return int(table[int(params[base + R_GRAPH_X]) + int(params[base + R_GRAPH_N]) - 1])


@njit(cache=True)
def lockstep_shape_nb(params, table, base, summary, num_dp, rank, rank_tokens):
    """The tokens ``rank`` runs at and the tokens every MoE layer gathers in a lock-step pass, with
    ``rank``'s own tokens taken as ``rank_tokens`` (>= 1; the others' from ``summary``, an empty
    rank's the dummy token): each rank pads to a CUDA-graph size, all to the largest of them
    when every rank's tokens are within the capture sizes (``lockstep_times_nb``).

    Parameters
    ----------
    params, table : ndarray(float64, ndim=1)
        The timing's parameters and table.
    base : int
        Offset of the pass terms in ``params`` (the CUDA-graph sizes' place).
    summary : ndarray(int64, ndim=2)
        The ranks' SPEC §8 summaries (columns 1 and 3: prefill tokens and decode entries).
    num_dp, rank : int
        The worker's attention-DP ranks, and the rank priced.
    rank_tokens : int
        The tokens ``rank`` is taken to run, >= 1.

    Returns
    -------
    (int, int)
        ``rank``'s tokens (padded) and the gathered tokens.
    """
    largest = graph_largest_nb(params, table, base)
    all_graphs = largest > 0
    most = 0
    for r in range(num_dp):
        tokens = rank_tokens if r == rank else max(summary[r, 1] + summary[r, 3], 1)
        if tokens > largest:
            all_graphs = False
        most = max(most, graph_tokens_nb(params, table, base, tokens))
    gathered = 0
    for r in range(num_dp):
        tokens = rank_tokens if r == rank else max(summary[r, 1] + summary[r, 3], 1)
        gathered += most if all_graphs else graph_tokens_nb(params, table, base, tokens)
    run = most if all_graphs else graph_tokens_nb(params, table, base, rank_tokens)
    return run, gathered


@njit(cache=True)
def lockstep_model_ms_nb(
    model, params, table, base, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens,
    decode_kv_max, run, gathered, gpus,
):
    """One rank's model time in a lock-step pass (``table``, ``linear``), ms, before the operator
    scales and the pass terms: ``table`` its dense operators at ``run`` tokens, its MoE layers at
    ``gathered`` tokens over ``gpus`` GPUs and the skew term; ``linear`` the ``run - tokens``
    padding tokens priced as in ``rank_time_ms_nb``.

    Parameters
    ----------
    model : int
        ``TIMING_TABLE`` or ``TIMING_LINEAR``.
    params, table : ndarray(float64, ndim=1)
        The timing's parameters and table.
    base : int
        Offset of the pass terms in ``params``.
    num_prefill, prefill_tokens, prefill_kv_tokens : int
        The rank's prefill entries, their new tokens and their context tokens.
    num_decode, decode_kv_tokens, decode_kv_max : int
        Its decode entries, their context tokens summed and the largest.
    run, gathered : int
        The tokens the rank runs (padded) and those every MoE layer gathers (``lockstep_shape_nb``).
    gpus : int
        GPUs the MoE layers' experts are spread over.

    Returns
    -------
    float
        ms.
    """
    if model == TIMING_TABLE:
        ms = table_pass_ms_nb(
            params, table, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens, run
        )
        ms += table_moe_ms_nb(params, table, gathered, gpus)
        alpha = skew_alpha_nb(params, base, num_decode, decode_kv_tokens, decode_kv_max)
        if alpha != 0.0:
            ms += alpha * table_skew_gap_ms_nb(
                params, table, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens,
                decode_kv_max,
            )
        return ms
    return linear_pass_ms_nb(
        params, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens, decode_kv_max,
        run - (prefill_tokens + num_decode),
    )


@njit(cache=True)
def lockstep_times_nb(model, params, table, summary, num_dp, rank_ms):
    """Every rank's time when a worker's attention-DP ranks step together through the MoE layers, ms.

    vLLM (``--enable-expert-parallel`` with ``--data-parallel-size``; docs/semantics.md,
    "Expert parallelism"): a rank with nothing scheduled runs a one-token dummy
    batch, priced as one decode entry of one token; each rank runs its tokens
    padded to a CUDA-graph size, and when every rank's batch runs a graph
    (``timing.cuda_graph_sizes``) all run the largest of them; every MoE layer
    sees the tokens of all ranks (``gathered``) and adds the all-to-all
    (``alltoall_ms_nb``).  ``linear`` prices padding tokens as in
    ``rank_time_ms_nb``; ``table`` prices the dense ops at the padded tokens and
    its MoE layers at ``gathered`` over ``num_dp x P_MOE_TP`` GPUs.

    The operator scales split each rank's model time as ``operator_scaled_ms_nb``
    does a single rank's, within this lock-step pass: ``F`` the rank's time,
    ``D`` its time with its decode entries alone (the padding and the gathered
    tokens taken again with its tokens those of its decodes; the other ranks as
    they are; 0 without decodes), ``D1`` that of the same decodes at one token of
    context each; ``base x D1 + attention x (D - D1) + prefill x (F - D)``, at
    least 0, before the pass terms, the all-to-all and the slowest rank.

    Parameters
    ----------
    model : int
        ``TIMING_*`` (``aic`` is refused by the settings).
    params, table : ndarray(float64, ndim=1)
        The model's parameters and tables.
    summary : ndarray(int64, shape (>= num_dp, >= 7))
        The ranks' SPEC §8 summaries (columns 0-4) and longest decode context (column 6).
    num_dp : int
        The worker's ranks.
    rank_ms : ndarray(float64, ndim=1)
        Out: each rank's time, ms.

    Returns
    -------
    float
        The worker's pass time (the largest), ms; NaN if a rank's is not a finite number >= 0.
    """
    base = model_base_nb(model)
    tp = 1
    if model == TIMING_TABLE and params[P_MOE_TP] > 0.0:
        tp = int(params[P_MOE_TP])
    scaled = False
    if (model == TIMING_TABLE or model == TIMING_LINEAR) and params.shape[0] >= base + PASS_TERMS_NUM_PARAMS:
        scaled = not (
            params[base + R_DECODE_BASE_SCALE] == 1.0
            and params[base + R_DECODE_ATTENTION_SCALE] == 1.0
            and params[base + R_PREFILL_TOKEN_SCALE] == 1.0
        )
    largest = graph_largest_nb(params, table, base)
    all_graphs = largest > 0
    most = 0
    for r in range(num_dp):
        tokens = max(summary[r, 1] + summary[r, 3], 1)  # an empty rank: the dummy token
        if tokens > largest:
            all_graphs = False
        most = max(most, graph_tokens_nb(params, table, base, tokens))
    gathered = 0
    for r in range(num_dp):
        tokens = max(summary[r, 1] + summary[r, 3], 1)
        gathered += most if all_graphs else graph_tokens_nb(params, table, base, tokens)
    worst = 0.0
    for r in range(num_dp):
        num_prefill = summary[r, 0]
        prefill_tokens = summary[r, 1]
        prefill_kv_tokens = summary[r, 2]
        num_decode = summary[r, 3]
        decode_kv_tokens = summary[r, 4]
        decode_kv_max = summary[r, 6]
        if num_prefill + num_decode == 0:  # the dummy batch
            num_decode = 1
            decode_kv_tokens = 1
            decode_kv_max = 0
        if model == TIMING_TABLE or model == TIMING_LINEAR:
            tokens = prefill_tokens + num_decode
            run = most if all_graphs else graph_tokens_nb(params, table, base, tokens)
            ms = lockstep_model_ms_nb(
                model, params, table, base, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode,
                decode_kv_tokens, decode_kv_max, run, gathered, num_dp * tp,
            )
            if scaled:
                decodes = 0.0
                floor = 0.0
                if num_decode > 0:
                    decodes = ms
                    alone_run, alone_gathered = run, gathered
                    if num_prefill > 0:
                        alone_run, alone_gathered = lockstep_shape_nb(
                            params, table, base, summary, num_dp, r, num_decode
                        )
                        decodes = lockstep_model_ms_nb(
                            model, params, table, base, 0, 0, 0, num_decode, decode_kv_tokens, decode_kv_max,
                            alone_run, alone_gathered, num_dp * tp,
                        )
                    floor = lockstep_model_ms_nb(
                        model, params, table, base, 0, 0, 0, num_decode, num_decode, 1, alone_run, alone_gathered,
                        num_dp * tp,
                    )
                ms = (
                    params[base + R_DECODE_BASE_SCALE] * floor
                    + params[base + R_DECODE_ATTENTION_SCALE] * (decodes - floor)
                    + params[base + R_PREFILL_TOKEN_SCALE] * (ms - decodes)
                )
                if not ms > 0.0:
                    ms = 0.0
            ms = pass_terms_ms_nb(params, table, base, ms, num_prefill, run) + alltoall_ms_nb(
                params, base, gathered, num_dp
            )
        else:
            ms = rank_time_ms_nb(
                model, params, table, num_prefill, prefill_tokens, prefill_kv_tokens, num_decode, decode_kv_tokens,
                decode_kv_max,
            )
        if not (ms >= 0.0 and ms < np.inf):
            return np.nan
        rank_ms[r] = ms
        if ms > worst:
            worst = ms
    return worst
