"""Codes shared by the engine kernel and the stages after it, below both.

The engine kernel writes them (``simcore.engine.nb`` imports them from here)
and ``simcore.metrics`` reads them, so neither stage imports the other for
them.  numba freezes these globals into the compiled kernels, so this module
is part of the kernel cache's fingerprint (``simcore.jit_cache``).
"""

from typing import NamedTuple

# Worker roles (``worker_role``), and the pool names they index.
ROLE_AGGREGATED = 0
ROLE_PREFILL = 1
ROLE_DECODE = 2
POOL_NAMES = ("aggregated", "prefill", "decode")

# Columns of the int64 pass log (one row per rank per pass).
PASS_WORKER = 0
PASS_RANK = 1
PASS_START = 2
PASS_END = 3
PASS_NUM_PREFILL = 4
PASS_PREFILL_TOKENS = 5
PASS_PREFILL_KV_TOKENS = 6
PASS_NUM_DECODE = 7
PASS_DECODE_KV_TOKENS = 8
PASS_BLOCKS_IN_USE = 9
PASS_LOG_COLUMNS = 10

# Where receipts are computed (``Client.detok_mode``): none (receipt = emission),
# in the engine kernel at every pass end, or after the run (simcore.client.api).
DETOK_OFF = 0
DETOK_IN_KERNEL = 1

# Flags of a pass output, for the detokenizer's per-job costs.
OUT_FIRST = 1  # the request's first token
OUT_FINAL = 2  # the token that finished the request

# Routing (docs/routing.md): the policy that picks a request's worker
# (``engine.router.policy``, ``engine.decode_router.policy``) and its rank
# inside the worker (``engine.<pool>.rank_policy``).  Each policy is declared
# once, as a field: its name is the field's name and its code the field's
# position (vectorbt-style enum), so names and codes cannot drift apart.  The
# kernels read the codes as constants (``RouterPolicy.least_tokens``) and raise
# on a code that is not declared here.


class RouterPolicyT(NamedTuple):
    """Codes of the worker routing policies, by name."""

    round_robin: int
    random: int
    least_outstanding: int
    least_tokens: int
    power_of_two: int
    prefix_aware: int


class RankPolicyT(NamedTuple):
    """Codes of the rank policies inside a worker, by name."""

    round_robin: int
    least_loaded: int


RouterPolicy = RouterPolicyT(*range(len(RouterPolicyT._fields)))
RankPolicy = RankPolicyT(*range(len(RankPolicyT._fields)))
#: Policy names in code order: ``ROUTER_POLICIES.index(name)`` is the code.
ROUTER_POLICIES = RouterPolicyT._fields
RANK_POLICIES = RankPolicyT._fields
# The round-robin codes under their former names, for ``simcore.engine.nb``.
ROUTE_ROUND_ROBIN = RouterPolicy.round_robin
RANK_ROUND_ROBIN = RankPolicy.round_robin
