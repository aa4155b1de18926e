"""Slow, obviously-correct reference simulator (SPEC.md §0-§9; policies vllm, sglang
and trtllm of docs/policies.md).

Everything here is plain Python on int nanoseconds (SPEC §0).  Clarity is preferred
over speed: one Python object per request, per rank and per worker, and an explicit
event loop that processes one instant at a time in the SPEC §5 equal-time order.

Modes: ``engine.mode = "aggregated"`` (one pool) and ``"disaggregated"`` (SPEC §6: a
prefill pool, then a decode pool; global worker indices 0..Wp-1 are prefill workers,
Wp..Wp+Wd-1 decode workers).  P/D decisions where SPEC is silent:

- A prefill rank schedules by the §5 rules.  At a prefill pass end a request whose
  ``computed == known`` (= input_tokens, generated 0) is handed off: no token is
  emitted, it leaves ``running`` at once (with the finished requests), its prefill
  blocks stay used (not preemptible) until its transfer ends.  Handoffs are numbered
  h = 0, 1, ... in pass-end order (global worker index, rank, running order).
- Transfer: 0 ns when ``kv_transfer`` is off, else
  ``ms = ((input * bytes_per_token) / (bandwidth_gb_per_second * 1e9)) * 1e3``,
  ``ns = rint(ms * 1e6)``; start = the handing-off pass end.
- Transfer ends run in phase (d) after engine arrivals, in handoff order.  At a
  transfer end the prefill blocks are freed; the decode placement is worker
  ``Wp + h mod Wd``, rank ``(h div Wd) mod Rd``; ``input >= L_decode`` rejects it
  there (it ends at the client at once); otherwise it joins the BACK of the decode
  rank's ``waiting`` with computed = input - 1, generated = 0, holding 0 blocks.
- ``first_admit`` stays the prefill admission.  Tokenizer servers belong to prefill
  workers, detokenizer servers to decode workers.  Transfer ends after the time cap
  never happen (the request stays incomplete; decode_worker/decode_rank and
  transfer_end are None).

Scheduling policies (``engine.policy``, docs/policies.md) change only batch building
(``build_batch``); the policy applies to every pool.  Pool keys left None take the
policy's defaults (``POLICY_POOL_DEFAULTS``, the table of docs/policies.md, read off
simcore's registry ``simcore.scheduler.policies`` with the features each policy
supports; a policy runs its entry's ``kernel`` behaviour: vllm, sglang or trtllm; num_blocks
None -> DEFAULT_KV_TOKENS // block_size).  Decisions where the text is silent:

- Pass end processes each rank's scheduled requests in ``running`` order (in sglang
  not every running request is scheduled, and the scheduled ones need not be a
  prefix of ``running``).
- trtllm: the vllm builder plus the no-evict admission check in step 2 (footprint
  ``ceil(min(input + output, L) / block_size)``, ``ceil(input / block_size)`` on a
  P/D prefill-role rank; P taken after step 1; FIFO stop).
- sglang, per rank and per pass attempt: ``new_token_ratio`` floats init =
  min(0.7 * c, 1), min = min(init * 0.14, 1), decay = (init - min) / 600; every
  rank of a worker is reset to init when the worker idles (at a pass end that leaves
  none of its ranks a running or waiting request, before same-instant arrivals; at a
  pass-start attempt that schedules nothing; at phase (e) of any instant while it has
  no work), unless a KV transfer from or to one of its ranks is in flight or, on a
  decode worker, a request waits.  Each rank keeps its
  "chunked request" (``rank.chunked``, at most one): a running request admitted with
  a truncated chunk, until the pass that schedules its last chunk; every other
  running request is decoding.  offset = the float sum, in running order, of
  min(output - generated, 4096) * ratio over the decoders; rem_total = free tokens
  (free_blocks * block_size, an int) - offset, evaluated each time it is used; each
  admission adds ``ceil_page(n) + reserve`` (the int sum) to offset.  rem_input =
  max_prefill_tokens, rem_chunk = max(chunked_prefill_size // attention_dp, 1), both
  lowered by ceil_page(n).  The chunked request first: limit = min(rem_chunk,
  int(rem_total)), or rem_chunk if that is <= 0; n = min(need, limit) if its new
  blocks fit (else skipped); reserve = min(output, 4096) when n == need (then it is
  no longer the chunked request), else 0.  Waiting FIFO while len(running) <
  max_sequences: stop if need + min(output - generated, 4096) >= rem_total (not for
  the first request of a batch on a rank whose running list was empty at the start),
  or if ceil_page(need) >= rem_input and the batch is not empty; whole if
  ceil_page(need) <= rem_chunk (reserve min(output, 4096)), else a page-aligned chunk
  floor(rem_chunk / bs) * bs (stop if 0, or if the rank still has a chunked request)
  with reserve 0, which becomes the chunked request and closes the batch; stop if its
  blocks do not fit; after a whole admission stop if rem_total <= 0, rem_input <= 0
  or rem_chunk <= 0.  Every entry of an extend batch is a prefill entry, except the
  first step of a P/D decode-rank entrant (generated 0 on a decode rank), a decode
  entry.  Decode (no extend entry): retract (fewest generated, then largest input,
  then latest in running) while the step's new blocks exceed the free blocks and more
  than one decoder remains; the victim goes to the BACK of waiting (computed 0,
  blocks freed, num_preemptions + 1).  If the step still does not fit with one
  decoder left, the chunked request (skipped because its chunk did not fit) is
  retracted too; then the step fits (asserted).  Every remaining decoder is
  scheduled with n = 1.
- sglang needs ``chunked_prefill_size // attention_dp >= block_size`` (config
  validation rejects less: a zero-page chunk would block the rank's queue).

Queue orders (``engine.<pool>.queue_order``, docs/semantics.md "Queue orders"): under a
keyed order every request has a key (priority column, -output, prompt or predicted
output) and the instant it entered its current rank; a request put into waiting goes
at the back and the queue is then sorted stably, by key (sglang) or by (key, entry
instant) (vllm).  vLLM ``priority``: a step-1 preemption takes ``max`` of running by
(key, entry instant), the first such; one already scheduled in this pass leaves the
batch and its tokens return to B.  sglang ``random``: FCFS insertion, and the queue is
shuffled (``shuffle``) at the start of each build on a rank with a waiting request and
fewer than max_sequences running.  sglang ``lpm``: FCFS insertion, and at the same moment,
with at most 128 waiting, ``sort_lpm`` matches every waiting request in queue order
(``radix_match``, touching its path) and sorts the list stably by minus the matched
tokens, a request put last (key infinity) when its match is at most 32 tokens and it
shares at least 32 tokens of whole equal blocks with an earlier such request not put
last.  sglang ``dfs-weight``: FCFS insertion, and at the same moment, whatever the queue's
length, ``sort_dfs_weight`` matches every waiting request in queue order on all the whole
blocks of its known tokens (touching the path) and rebuilds the list by a depth-first walk
of the tree of matched blocks from the root: a block's weight is the number of requests
whose match ends in its subtree, children are visited by decreasing weight then by the
clock value at which they took their identity (``Block.birth``: the order SGLang's
``children`` dict received them), and a block's own requests follow its subtrees.

Prefix caching (``engine.<pool>.prefix_caching``, docs/prefix-caching.md; every policy,
aggregated or P/D prefill pool).  Per rank every physical block (a ``Block``: identity or
None, reference count) is in use (ref > 0; counted once in ``used_blocks``, which also
covers the blocks of P/D transfers since the handed-off request keeps its references),
cached (ref 0, has an identity, in the rank's LRU ``OrderedDict``) or truly free
(``num_blocks - used_blocks - len(lru)``, not materialised).  ``resident`` maps an
identity to the one block that bears it (in use or cached).  Decisions beyond the text:

- Identity of complete prompt block j of row k (engine block size bs of the receiving
  pool): with ``hash_ids`` (not None): e = (j+1)*bs, m = (e-1) // T (T =
  workload.block_size, None -> 512), ``("h", hash_ids[k][m], e - m*T)``, or ``("u", k,
  j)`` when m is past the end of hash_ids[k] (an inconsistent trace row); else with
  workload.prefix_tokens P > 0: ``("p", j)`` if (j+1)*bs <= P else ``("u", k, j)``; else
  ``("u", k, j)``.  hash_ids win over prefix_tokens if both are given.
- Admission (SPEC §5 step 2, every admission from waiting): h = the longest run of
  leading complete prompt blocks whose identities are resident, h*bs <= known - 1;
  computed = h*bs, n = min(known - computed, B), new = ceil((computed+n)/bs) - h; it is
  admitted iff new + #(hit entries whose block has ref 0 now) <= num_blocks -
  used_blocks (an identity repeated inside one request, only possible with hash_ids
  that are not prefix-chained, is a hit entry per occurrence, as vLLM counts it).  Then
  the hit blocks are touched in block order (ref 0 -> leaves the LRU, used + 1; ref +=
  1), ``computed = h*bs`` BEFORE the entry is classified (so a hit admission computing
  one token at the prompt end is a decode entry by SPEC §5's rule, and the §8 summary
  counts computed + n in the kv tokens), then the new blocks are allocated (truly free
  first, then the LRU head, which loses its identity) and registration runs.
  ``cached_tokens = h*bs`` at the first admission only (0 on pools without caching and
  for the sglang/trtllm policies; None if never admitted; in P/D: the prefill pool).
- Registration, after every allocation by a scheduling decision (steps 1 and 2): prompt
  blocks ``reg .. min((computed+n)//bs, input//bs) - 1`` (reg = hit blocks at admission,
  0 after a preemption), in block order: a non-resident identity is taken by the
  request's block, a resident one leaves the block anonymous.
- Freeing (step 1 preemption, finish, P/D transfer end): references dropped from the
  last block to the first; ref 0 -> LRU tail if identity-bearing, else truly free.  A
  handed-off request keeps its references (its blocks stay resident and can be hit)
  until its transfer ends.
- Step 1 (running requests) has no hit lookup; its capacity check is the usual
  ``used_blocks + extra <= num_blocks`` (cached blocks count as free).
- trtllm: the same, but registration runs only when a decision reaches the end of the
  prompt, for ``input - 1`` tokens, and at a finish (P/D: transfer end) for the
  computed tokens, before the references are dropped; the no-evict check of a
  caching admission follows the capacity check, with the whole footprint, and
  ``P += footprint - held`` after the allocation.
- vllm with ``cache_generated_blocks`` (docs/prefix-caching.md): identities for the
  generated blocks too, as sglang's below; registration (the rule above, blocks past the
  prompt included) covers at most the known tokens (vLLM's ``allocate_slots`` caps at
  ``num_tokens``), and under async scheduling also runs at each output of a running
  request for ``computed - placeholders`` tokens.  A readmitted request's hits then run
  into its generated blocks (h*bs <= known - 1).
- sglang (radix cache): identities also for the blocks past the complete prompt ones,
  ``("u", k, j)`` up to ``ceil((input + output) / bs)``.  ``self.clock`` counts
  accesses; an access gives a path's blocks ``stamp = clock`` and ``depth = j``,
  written from the deepest block up (a repeated block keeps the smaller j).  The
  eviction victim is the cached block with the least ``(stamp, -depth)``.  Admission
  (each waiting candidate visited): match the resident leading blocks of the first
  known - 1 tokens (whole blocks) and touch them; need = known - h*bs; free tokens
  for the rem_total check lowered by bs per hit entry whose block has ref 0 (and kept
  lowered once admitted); fits iff new + those entries <= num_blocks - used_blocks.
  No registration at scheduling; ``radix_insert`` (blocks ``reg .. tokens//bs - 1``:
  identity taken if not resident, else the request's block is freed and the resident
  one referenced; then the path 0 .. reg-1 touched) runs at the start of a build for
  the rank's chunked request (its computed tokens), at a pass end for each entry
  that reaches its known tokens if the batch was an extend batch or the token is its
  last (computed tokens; running order), and at a P/D transfer end (input tokens).
  Retraction drops the references without an insert.

CPU offload tier (``engine.<pool>.kv_offload``, with prefix caching): its own methods and
decisions in ``tests/reference/offload.py``, called from short hooks here.

Timing: fixed and linear; linear's pass time is ``model x (prefill_scale if the
pass has a prefill entry else decode_scale) + all-reduce + pass_overhead_us / 1000``,
``model`` split by the operator scales where one is not 1 (``operator_scaled_ms``),
the all-reduce (``timing.allreduce``) being ``2 x num_layers`` all-reduces of
``tokens x hidden_size x dtype_bytes`` bytes, each ``latency_us + 2 (n - 1) / n x
bytes / (bandwidth x 1e3)`` us (ring) or the measured curve's time at that size
(piecewise linear; the first time below the first size, the last segment extended
beyond the last; a size listed twice takes the mean of its times).
CUDA-graph padding (``timing.cuda_graph_sizes``): with ``T = prefill_tokens +
num_decode`` no larger than the largest size, the pass runs at ``T'`` = the smallest
size >= T; the model prices the ``T' - T`` extra tokens as prefill tokens when the pass
has a prefill entry, else as decode entries (the kv term unchanged), and the
all-reduce is at ``T'`` tokens.
Not covered: the aic/table timing models.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque

import numpy as np

from simcore.scheduler.policies import SCHEDULING_POLICIES
from simcore.scheduler.speculative import acceptance_rates, geometric_alpha, read_engine_form
from tests.reference.autoscale import ReferenceAutoscaler
from tests.reference.failures import ReferenceFailures
from tests.reference.routing import ReferenceRouter
from tests.reference.offload import OffloadMixin

#: Pool-key defaults per policy, read off simcore's policy registry (its table is
#: docs/policies.md's, tests/test_reference_selfcheck.py).  A key with no entry for a
#: policy is not used by it (and must be left None).
POLICY_POOL_DEFAULTS = {
    name: {key: value for key, value in spec.defaults.items() if value is not None}
    for name, spec in SCHEDULING_POLICIES.items()
}
POLICY_KEYS = ("max_batched_tokens", "max_sequences", "block_size", "chunked_prefill_size",
               "max_prefill_tokens", "schedule_conservativeness", "chunked_prefill")
#: num_blocks None -> DEFAULT_KV_TOKENS // block_size (docs/policies.md: 416,000 tokens).
DEFAULT_KV_TOKENS = 416_000
SGLANG_RESERVE_CAP = 4096  # docs/policies.md: min(output - generated, 4096)
SGLANG_RETRACT_DECODE_STEPS = 20  # (sum generated + 20 * n) / sum output after retraction
SGLANG_DECAY_STEPS = 600  # decay = (init - min) / 600

FNV_OFFSET_BASIS = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK64 = (1 << 64) - 1


# ---------------------------------------------------------------- helpers


def read_allreduce_curve(path, tp):
    """[(bytes, us)] ascending by size from a Vidur all_reduce.csv (rows of num_workers == tp;
    size in fp16 elements, median in ms) or an nccl-tests output (size in bytes, column 6 the
    out-of-place time in us); a size listed more than once takes the mean of its times."""
    with open(path, encoding="utf-8") as handle:
        lines = [line for line in handle.read().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    times = {}
    if "size" in lines[0].split(","):
        header = lines[0].split(",")
        for line in lines[1:]:
            row = dict(zip(header, line.split(",")))
            if int(row["num_workers"]) == tp:
                size = float(row["size"]) * 2
                times.setdefault(size, []).append(float(row["time_stats.all_reduce.median"]) * 1000.0)
    else:
        for line in lines:
            fields = line.split()
            times.setdefault(float(fields[0]), []).append(float(fields[5]))
    return [(size, sum(times[size]) / len(times[size])) for size in sorted(times)]


def curve_time_us(curve, size):
    """Piecewise-linear time at ``size`` bytes: the first time below the first knot, the
    last segment extended beyond the last knot."""
    if size <= curve[0][0] or len(curve) == 1:
        return curve[0][1]
    i = len(curve) - 2
    for k in range(len(curve) - 1):
        if size < curve[k + 1][0]:
            i = k
            break
    (x0, y0), (x1, y1) = curve[i], curve[i + 1]
    t = (size - x0) / (x1 - x0)
    return (1.0 - t) * y0 + t * y1


def graph_sizes(value, pool):
    """CUDA-graph capture sizes, ascending (None: no padding).  ``vllm_default``: vLLM's
    rule from the pool's limits (every active pool must give the same): largest =
    min(2 x max_sequences x (1 + speculative proposals), 512, max_batched_tokens); 1, 2, 4,
    the multiples of 8 below 256, the multiples of 16 from 256, up to the largest."""
    if value is None:
        return None
    if value != "vllm_default":
        return sorted(set(int(size) for size in value))
    largest = min(2 * pool.max_sequences * (1 + pool.spec_drafts), 512, pool.max_batched_tokens)
    candidates = [1, 2, 4] + [8 * k for k in range(1, 32)] + [256 + 16 * k for k in range(17)]
    return [size for size in candidates if size <= largest]


def fnv1a64(text: str) -> int:
    """64-bit FNV-1a of the UTF-8 bytes of ``text`` (SPEC §4, §7)."""
    h = FNV_OFFSET_BASIS
    for byte in text.encode("utf-8"):
        h ^= byte
        h = (h * FNV_PRIME) & MASK64
    return h


def ms_to_ns(ms: float) -> int:
    """SPEC §0: ``int(numpy.rint(ms * 1e6))``; Python's round() is also half-to-even."""
    return int(round(float(ms) * 1e6))


# ---------------------------------------------------------------- state objects


class Request:
    """One row of the request table and its engine/client state."""

    def __init__(self, row, request_id, input_tokens, output_tokens, worker, rank,
                 tok_server, detok_server):
        self.row = row
        self.request_id = request_id
        self.input_tokens = int(input_tokens)
        self.output_tokens = int(output_tokens)
        self.worker = worker          # SPEC §3: k mod W (P/D: over the prefill pool)
        self.rank = rank              # SPEC §3: (k div W) mod R
        self.tok_server = tok_server  # SPEC §4
        self.detok_server = detok_server  # SPEC §7
        # engine state (SPEC §5), on the rank the request is on now
        self.computed = 0
        self.generated = 0
        self.held_blocks = 0
        self.num_preemptions = 0
        # asynchronous scheduling (vLLM's AsyncScheduler, docs/semantics.md)
        self.placeholders = 0         # outputs scheduled but not yet returned
        self.drafts = 0               # speculative proposals verified in the pass it is in
        self.spec_alpha = None        # its own acceptance per proposal (None: the pool's rates)
        self.spec_stream = None       # draws=prompt: its prompt id, its draws' stream (None: its own)
        self.token_offset = 0         # index of its first token in the run's token order (by row)
        self.epoch = 0                # +1 per preemption: older in-flight outputs are stale
        # queue orders (docs/semantics.md): the order's key, lower first, and the instant it
        # entered its current rank (vLLM's arrival_time on that engine)
        self.queue_key = 0
        self.entered_ns = None
        # prefix caching (docs/prefix-caching.md), on a rank whose pool caches
        self.idents = None            # identities of its complete prompt blocks (recv pool bs)
        self.blocks = []              # the Block objects it references, block order
        self.reg = 0                  # leading prompt blocks already hit or registered
        self.hit_tokens = 0           # h * bs of its latest admission
        self.cached_tokens = None     # h * bs at its first admission (None: never admitted)
        # P/D state (SPEC §6)
        self.handoff = None           # h, assigned at the prefill pass end
        self.transfer_blocks = 0      # prefill blocks held while transferring
        self.decode_worker = None     # global worker index, set at the transfer end
        self.decode_rank = None
        self.failures = 0             # attempts lost to worker failures (tests/reference/failures.py)
        self.retry_wait = False       # lost, waiting for its client's retry
        # outcome
        self.rejected = False
        self.completed = False  # final token received by the client
        # instants (int ns, None = did not happen by the cap)
        self.send_ns = None
        self.arrival_ns = None
        self.first_admit_ns = None
        self.prompt_done_ns = None
        self.transfer_start_ns = None
        self.transfer_end_ns = None
        self.first_emit_ns = None
        self.first_recv_ns = None
        self.last_recv_ns = None
        self.end_ns = None
        # tokens: [emit_ns, recv_ns or None, is_final]
        self.tokens = []

    @property
    def known(self):
        """SPEC §5: known = input_tokens + generated."""
        return self.input_tokens + self.generated


class Pool:
    """A pool of identical workers (aggregated, prefill or decode), SPEC §3, under one
    scheduling policy (docs/policies.md); None pool keys take the policy's defaults."""

    def __init__(self, name, params, first_worker, policy):
        if policy not in SCHEDULING_POLICIES:
            raise NotImplementedError(f"reference has no scheduling policy {policy!r}")
        # Read at construction, so that a policy registered later (a test's variant) is known.
        spec = SCHEDULING_POLICIES[policy]
        defaults = {key: value for key, value in spec.defaults.items() if value is not None}
        resolved = {}
        for key in POLICY_KEYS:
            value = params.get(key)
            if key not in defaults:
                if value is not None:
                    raise ValueError(f"engine.{name}.{key} is not used by policy {policy}, "
                                     f"got {value!r}")
                resolved[key] = None
            else:
                resolved[key] = defaults[key] if value is None else value
        self.name = name
        self.params = params
        self.policy = spec.kernel  # the behaviour it runs: vllm, sglang or trtllm (a variant: its base's)
        self.first_worker = first_worker  # global index of its worker 0
        replicas = params.get("replicas")
        attention_dp = params.get("attention_dp")
        self.W = 1 if replicas is None else int(replicas)
        self.R = 1 if attention_dp is None else int(attention_dp)
        self.expert_parallel = bool(params.get("expert_parallel"))
        self.max_sequences = int(resolved["max_sequences"])
        self.block_size = int(resolved["block_size"])
        num_blocks = params.get("num_blocks")
        self.num_blocks = (DEFAULT_KV_TOKENS // self.block_size if num_blocks is None
                           else int(num_blocks))
        capacity = self.num_blocks * self.block_size
        ctx = params.get("context_length")
        self.L = capacity if ctx is None else min(int(ctx), capacity)  # SPEC §5
        self.prefix_caching = bool(params.get("prefix_caching") or False)
        self.async_scheduling = bool(params.get("async_scheduling") or False)
        if self.async_scheduling and (not spec.async_scheduling or name == "prefill"):
            raise ValueError(f"engine.{name}.async_scheduling: vllm policy, aggregated or decode pool only")
        self.reserve_full_isl = bool(params.get("reserve_full_isl") or False)
        if self.reserve_full_isl and not spec.reserve_full_isl:
            raise ValueError(f"engine.{name}.reserve_full_isl is modelled for policy vllm only")
        if self.prefix_caching and name == "decode":
            raise ValueError("engine.decode.prefix_caching: a decode pool receives its KV "
                             "by transfer")
        self.cache_generated_blocks = bool(params.get("cache_generated_blocks") or False)
        if self.cache_generated_blocks and (not spec.cache_generated_blocks or not self.prefix_caching):
            raise ValueError(f"engine.{name}.cache_generated_blocks: vllm policy with prefix caching only")
        # vllm, trtllm
        mbt = resolved["max_batched_tokens"]
        self.max_batched_tokens = None if mbt is None else int(mbt)
        # vLLM's enable_chunked_prefill (docs/semantics.md); a policy without the key chunks its own way
        self.chunked_prefill = resolved["chunked_prefill"] is not False
        if not self.chunked_prefill:
            if not spec.chunked_prefill:
                raise ValueError(f"engine.{name}.chunked_prefill=false: policy vllm only")
            if self.max_batched_tokens < self.L:
                raise ValueError(f"engine.{name}.max_batched_tokens must be >= L with chunked_prefill=false")
        # queue orders (docs/semantics.md, "Queue orders")
        self.queue_order = params.get("queue_order") or "fcfs"
        if self.queue_order not in spec.queue_orders:
            raise ValueError(f"engine.{name}.queue_order={self.queue_order}: not modelled for policy {policy}")
        # sglang
        if self.policy == "sglang":
            self.max_prefill_tokens = int(resolved["max_prefill_tokens"])
            self.rem_chunk_init = max(int(resolved["chunked_prefill_size"]) // self.R, 1)
            conservativeness = float(resolved["schedule_conservativeness"])
            self.ratio_init = min(0.7 * conservativeness, 1.0)
            self.ratio_min = min(self.ratio_init * 0.14, 1.0)
            self.ratio_decay = (self.ratio_init - self.ratio_min) / SGLANG_DECAY_STEPS

        # speculative decoding (docs/speculative.md): the engine form read by the config layer
        speculative = params.get("speculative") or {}
        self.spec_drafts = 0
        self.spec_lookahead = 0
        if speculative.get("config") is not None:
            method, self.spec_drafts, positions, self.spec_lookahead, steps = read_engine_form(
                f"engine.{name}.speculative.config", speculative["config"], spec.speculative_form)
            self.spec_rates = acceptance_rates(f"engine.{name}.speculative", speculative.get("acceptance_rates"),
                                               speculative.get("mean_acceptance_length"), positions)
            self.spec_steps = float(steps)
            self.spec_step_ms = float(speculative.get("proposer_step_ms") or 0.0)
            self.spec_per_seq_us = float(speculative.get("proposer_per_seq_us") or 0.0)
            rate = speculative.get("proposal_rate")
            self.spec_proposal_rate = 1.0 if rate is None else float(rate)
            self.spec_draws = speculative.get("draws") or "request"  # the draws' stream: request or prompt

    def blocks_for(self, tokens):
        return -(-tokens // self.block_size)  # ceil

    def footprint(self, req):
        """trtllm no-evict footprint in blocks (docs/policies.md); with speculation the
        last step also holds its proposals."""
        if self.name == "prefill":  # P/D prefill role: it leaves once its prompt is computed
            return self.blocks_for(req.input_tokens)
        extra = max(self.spec_drafts + self.spec_lookahead - 1, 0)
        return self.blocks_for(min(req.input_tokens + req.output_tokens + extra, self.L))

    def spec_query(self, req):
        """Tokens a decode step schedules: 1 + the proposals once the request sampled a
        token on this rank, up to the sequence limit (vLLM: max_model_len - 1 - computed)."""
        if self.spec_drafts and req.generated >= 1 and req.computed == req.known - 1:
            return min(1 + self.spec_drafts, self.L - req.known)
        return 1

    def proposer_ms(self, num_decode):
        if not self.spec_drafts or num_decode == 0:
            return 0.0
        return self.spec_steps * (self.spec_step_ms + self.spec_per_seq_us * num_decode / 1000)


class Block:
    """A physical KV block of a prefix-caching rank (docs/prefix-caching.md)."""

    __slots__ = ("ident", "ref", "stamp", "depth", "birth")

    def __init__(self):
        self.ident = None  # identity tuple, or None (anonymous)
        self.ref = 0       # references by requests (a handed-off request keeps its own)
        self.stamp = 0     # sglang: the access that touched it last (radix_touch)
        self.depth = 0     # sglang: its block index in that access's path
        self.birth = 0     # sglang: the access clock when it took its identity (dfs-weight's ties)


class Rank:
    """One attention-DP rank: its own scheduler queues and KV cache (SPEC §3, §5)."""

    def __init__(self, index):
        self.index = index
        self.running = []        # admission order
        self.waiting = deque()   # FIFO
        self.used_blocks = 0     # in-use blocks (prefix caching: distinct, ref > 0)
        self.new_token_ratio = None  # sglang: set to the pool's init at construction
        self.chunked = None      # sglang: the request whose prompt is being chunked
        self.extend = False      # sglang: the batch built last is an extend batch
        self.shuffles = 0        # sglang random: waiting-queue shuffles so far
        self.global_index = None  # its index over every worker's ranks
        self.inflight = 0        # P/D: KV transfers in flight from or to this rank
        # prefix caching: identity -> its block (in use or cached); LRU of cached blocks
        self.resident = {}
        self.lru = OrderedDict()  # Block -> None, head = least recently used

    def has_work(self):
        return bool(self.running) or bool(self.waiting)


class Pass:
    """A pass in progress on one worker."""

    def __init__(self, start_ns, end_ns, batches, summaries, times_ms, blocks):
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.batches = batches      # per rank: list of (request, n, is_decode) in running order
        self.summaries = summaries  # per rank: §8 batch summary dict
        self.times_ms = times_ms    # per rank: float ms
        self.blocks = blocks        # per rank: blocks in use right after batching


class Worker:
    def __init__(self, index, pool, tok_servers, detok_servers):
        self.index = index                     # global worker index
        self.pool = pool
        self.ranks = [Rank(r) for r in range(pool.R)]
        if pool.policy == "sglang":
            for rank in self.ranks:
                rank.new_token_ratio = pool.ratio_init
        self.tok_free = [0] * tok_servers      # tokenizer server free instants (SPEC §4)
        self.detok_free = [0] * detok_servers  # detokenizer server free instants (SPEC §7)
        self.current = None                    # Pass or None (idle)
        self.queued = None                     # async: the Pass built when current started

    def has_work(self):
        return any(rank.has_work() for rank in self.ranks)


def merged_timing(timing, override):
    """The timing section with a pool's own keys (``engine.<pool>.timing``) merged over it, nested."""
    out = dict(timing)
    for key, value in (override or {}).items():
        out[key] = merged_timing(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


class PoolTiming:
    """One pool's timing model (fixed or linear, SPEC §8) and its pass terms."""

    def __init__(self, timing, pool):
        self.timing_type = timing["type"]
        if self.timing_type not in ("fixed", "linear"):
            raise NotImplementedError(f"reference has no timing model {self.timing_type!r}")
        self.t_prefill_ms = float(timing["prefill_ms"])
        self.t_decode_ms = float(timing["decode_ms"])
        self.t_base_ms = float(timing["base_ms"])
        self.t_per_prefill_token_us = float(timing["per_prefill_token_us"])
        self.t_per_decode_seq_us = float(timing["per_decode_seq_us"])
        self.t_per_kv_token_ns = float(timing["per_kv_token_ns"])
        # Linear timing's pass terms: scales by pass kind, overhead, TP all-reduce
        # (ring model only: 2 per layer).
        self.t_prefill_scale = float(timing.get("prefill_scale", 1.0))
        self.t_decode_scale = float(timing.get("decode_scale", 1.0))
        self.t_prefill_token_scale = float(timing.get("prefill_token_scale", 1.0))
        self.t_decode_attention_scale = float(timing.get("decode_attention_scale", 1.0))
        self.t_decode_base_scale = float(timing.get("decode_base_scale", 1.0))
        self.t_overhead_us = float(timing.get("pass_overhead_us", 0.0))
        self.t_skew_alpha = float(timing.get("attention_skew_alpha") or 0.0)
        ring = timing.get("allreduce") or {}
        self.ar_bandwidth = ring.get("bandwidth_gb_per_second")
        self.ar_curve = None
        if ring.get("curve") is not None:
            self.ar_curve = read_allreduce_curve(ring["curve"], int(timing["tp"]))
        self.ar_on = self.ar_bandwidth is not None or self.ar_curve is not None
        if self.ar_on:
            self.ar_latency_us = float(ring.get("latency_us") or 0.0)
            self.ar_gpus = int(timing["tp"])
            self.ar_count = 2 * int(timing["num_layers"])
            self.ar_bytes_per_token = int(timing["hidden_size"]) * int(timing["dtype_bytes"])
        self.graph_sizes = graph_sizes(timing.get("cuda_graph_sizes"), pool)
        moe = timing.get("moe") or {}
        a2a = moe.get("alltoall") or {}
        self.a2a_bandwidth = a2a.get("bandwidth_gb_per_second")
        if self.a2a_bandwidth is not None:
            self.a2a_latency_us = float(a2a.get("latency_us") or 0.0)
            layers = moe.get("num_layers")
            self.a2a_layers = int(timing["num_layers"] if layers is None else layers)
            self.a2a_bytes_per_token = (2 * int(timing["hidden_size"]) * int(timing["dtype_bytes"])
                                        + 8 * int(moe["top_k"]))

    def graph_tokens(self, tokens):
        """CUDA-graph padding: the smallest capture size >= tokens (tokens beyond the largest)."""
        if self.graph_sizes and tokens <= self.graph_sizes[-1]:
            return min(size for size in self.graph_sizes if size >= tokens)
        return tokens

    def lockstep_times_ms(self, summaries):
        """docs/semantics.md "Expert parallelism": the ranks of a worker step together through
        the MoE layers.  An empty rank runs a one-token dummy batch (one decode entry of one
        token); every rank runs its tokens padded to a CUDA-graph size, all of them the largest
        of those when every rank's batch is within the capture sizes; the all-to-all of every
        MoE layer moves the tokens of all ranks."""
        dummy = dict(num_prefill=0, prefill_tokens=0, prefill_kv_tokens=0,
                     num_decode=1, decode_kv_tokens=1, decode_kv_max=0, draft_tokens=0)
        batches = [s if s["num_prefill"] + s["num_decode"] > 0 else dummy for s in summaries]
        tokens = [s["prefill_tokens"] + s["num_decode"] for s in batches]

        def padding(tokens):
            padded = [self.graph_tokens(t) for t in tokens]
            if self.timing_type != "fixed" and self.graph_sizes and all(t <= self.graph_sizes[-1] for t in tokens):
                padded = [max(padded)] * len(padded)
            return padded

        padded = padding(tokens)
        gathered = sum(padded)
        times = []
        for i, (s, run_at) in enumerate(zip(batches, padded)):
            # the operator scales' decodes alone: this pass with the rank's tokens those of its decodes
            decodes_at = padding(tokens[:i] + [s["num_decode"]] + tokens[i + 1:])[i]
            ms = self.rank_time_ms(s, run_at, decodes_at)
            if self.timing_type != "fixed" and self.a2a_bandwidth is not None and len(batches) > 1:
                d = float(len(batches))
                one_us = (2.0 * self.a2a_latency_us
                          + (d - 1.0) / d * gathered * self.a2a_bytes_per_token / (self.a2a_bandwidth * 1e3))
                ms += self.a2a_layers * one_us / 1000.0
            times.append(ms)
        return times

    def rank_time_ms(self, s, run_at=None, decodes_at=None):
        """SPEC §8 timing model for one rank's batch; an empty batch takes 0.  ``run_at``: the
        tokens the pass runs at (None: CUDA-graph padding of its own tokens); ``decodes_at``:
        those its decode entries alone run at (None: the padding of their own tokens)."""
        if s["num_prefill"] == 0 and s["num_decode"] == 0:
            return 0.0
        if self.timing_type == "fixed":
            return ((self.t_prefill_ms if s["num_prefill"] > 0 else 0.0)
                    + (self.t_decode_ms if s["num_decode"] > 0 else 0.0))
        tokens = s["prefill_tokens"] + s["num_decode"] + s["draft_tokens"]
        if run_at is None:
            run_at = self.graph_tokens(tokens)
        ms = self.linear_ms(s, run_at)
        if (self.t_prefill_token_scale, self.t_decode_attention_scale, self.t_decode_base_scale) != (1.0, 1.0, 1.0):
            ms = self.operator_scaled_ms(s, ms, decodes_at)
        ms *= self.t_prefill_scale if s["num_prefill"] > 0 else self.t_decode_scale
        if self.ar_on:
            size = run_at * float(self.ar_bytes_per_token)
            if self.ar_curve is None:
                n = float(self.ar_gpus)
                one_us = self.ar_latency_us + 2.0 * (n - 1.0) / n * size / (self.ar_bandwidth * 1e3)
            else:
                one_us = curve_time_us(self.ar_curve, size)
            ms += self.ar_count * one_us / 1000.0
        ms += self.t_overhead_us / 1000.0
        if not math.isfinite(ms) or ms < 0:
            raise ValueError(f"timing model {self.timing_type} gave {ms!r} for batch {s}")
        return ms

    def operator_scaled_ms(self, s, ms, decodes_at=None):
        """docs/timing.md operator scales: with F the pass's linear time, D that of its decode
        entries alone (0 without decodes) and D1 that of the same decodes at one token of context
        each, ``base x D1 + attention x (D - D1) + prefill x (F - D)``, at least 0.  The decodes
        alone run at ``decodes_at`` tokens (None: their own CUDA-graph padding; under expert
        parallelism the lock-step's padding with the rank's tokens those of its decodes)."""
        decodes = floor = 0.0
        if s["num_decode"] > 0:
            alone = dict(s, num_prefill=0, prefill_tokens=0, prefill_kv_tokens=0)
            one = dict(alone, decode_kv_tokens=s["num_decode"], decode_kv_max=1)
            if decodes_at is None:
                decodes_at = self.graph_tokens(s["num_decode"] + s["draft_tokens"])
            decodes = self.linear_ms(alone, decodes_at)
            floor = self.linear_ms(one, decodes_at)
        out = (self.t_decode_base_scale * floor + self.t_decode_attention_scale * (decodes - floor)
               + self.t_prefill_token_scale * (ms - decodes))
        return max(out, 0.0)

    def linear_ms(self, s, run_at):
        """SPEC §8 linear model time of a non-empty batch run at ``run_at`` tokens, skew included."""
        kv = s["prefill_kv_tokens"] + s["decode_kv_tokens"]  # integer sum first
        tokens = s["prefill_tokens"] + s["num_decode"] + s["draft_tokens"]
        # proposals are priced as prefill (query) tokens (docs/speculative.md)
        prefill_tokens, num_decode = s["prefill_tokens"] + s["draft_tokens"], s["num_decode"]
        if s["num_prefill"] > 0:
            prefill_tokens += run_at - tokens
        else:
            num_decode += run_at - tokens
        ms = (self.t_base_ms
              + self.t_per_prefill_token_us * prefill_tokens / 1000
              + self.t_per_decode_seq_us * num_decode / 1000
              + self.t_per_kv_token_ns * kv / 1e6)
        ms += self.skew_ms(s)
        return ms

    def skew_ms(self, s):
        """docs/timing.md attention skew (linear): alpha x the decodes' kv term at their
        longest context less that at their mean."""
        d = s["num_decode"]
        gap = s["decode_kv_max"] * d - s["decode_kv_tokens"]
        if self.t_skew_alpha == 0.0 or d < 2 or gap <= 0:
            return 0.0
        return self.t_skew_alpha * (self.t_per_kv_token_ns * gap / 1e6)


# ---------------------------------------------------------------- simulator


class ReferenceSim(OffloadMixin):
    def __init__(self, config, request_ids, input_tokens, output_tokens, send_ns,
                 hash_ids=None, sessions=None, acceptance_length=None, priority=None,
                 predicted_output_tokens=None, prompt_id=None):
        n_rows = len(request_ids)
        assert len(input_tokens) == n_rows and len(output_tokens) == n_rows
        load = config["load"]
        engine = config["engine"]
        self.closed_loop = load["type"] == "closed_loop"
        if not self.closed_loop:
            assert send_ns is not None and len(send_ns) == n_rows
        self.concurrency = int(load["concurrency"])
        self.think_ns = ms_to_ns(load["think_time_ms"])

        policy = engine.get("policy") or "vllm"
        self.policy = SCHEDULING_POLICIES[policy].kernel if policy in SCHEDULING_POLICIES else policy
        self.mode = engine.get("mode", "aggregated")
        if self.mode == "aggregated":
            self.recv_pool = Pool("aggregated", engine["aggregated"], 0, policy)
            self.emit_pool = self.recv_pool
            pools = [self.recv_pool]
        elif self.mode == "disaggregated":
            self.recv_pool = Pool("prefill", engine["prefill"], 0, policy)
            self.emit_pool = Pool("decode", engine["decode"], self.recv_pool.W, policy)
            pools = [self.recv_pool, self.emit_pool]
        else:
            raise ValueError(f"unknown engine.mode {self.mode!r}")
        self.disaggregated = self.mode == "disaggregated"
        kv = engine.get("kv_transfer") or {}
        self.kv_bandwidth = kv.get("bandwidth_gb_per_second")
        self.kv_bytes_per_token = kv.get("bytes_per_token")
        assert (self.kv_bandwidth is None) == (self.kv_bytes_per_token is None)

        # Per-pool timing (docs/timing.md, Per-pool timing): engine.<pool>.timing merged over timing.
        for pool in pools:
            pool.timing = PoolTiming(merged_timing(config["timing"], engine[pool.name].get("timing")), pool)
        self.timing_type = pools[0].timing.timing_type

        tok = config["tokenization"]
        self.tok_workers = int(tok["workers"])
        self.tok_base_ms = float(tok["base_ms"])
        self.tok_per_input_us = float(tok["per_input_us"])

        det = config["detokenization"]
        self.detok_workers = int(det["workers"])
        self.detok_base_ms = float(det["base_ms"])
        self.detok_per_output_us = float(det["per_output_us"])
        self.detok_first_us = float(det["first_output_us"])
        self.detok_final_us = float(det["final_output_us"])
        self.detok_chunk = None if det["chunk_size"] is None else int(det["chunk_size"])
        # SPEC §7: the stage is off when all four costs are 0 (receipt = emission).
        self.detok_on = (self.detok_base_ms != 0.0 or self.detok_per_output_us != 0.0
                         or self.detok_first_us != 0.0 or self.detok_final_us != 0.0)

        cap = config["max_time_ms"]
        self.cap_ns = None if cap is None else ms_to_ns(cap)  # SPEC §9

        # Workers in global index order: aggregated; or prefill, then decode (SPEC §3).
        self.workers = []
        for pool in pools:
            for _ in range(pool.W):
                self.workers.append(Worker(len(self.workers), pool, self.tok_workers,
                                           self.detok_workers))
        g = 0
        for worker in self.workers:
            for rank in worker.ranks:
                rank.global_index = g
                g += 1
        # sglang random's shuffle key: stream 5 of the run seed
        state = np.random.SeedSequence(int(config["seed"]), spawn_key=(5,)).generate_state(1, dtype=np.uint64)
        self.shuffle_key = int(state[0]) & ((1 << 63) - 1)
        rp = self.recv_pool
        self.requests = []
        for k in range(n_rows):
            h = fnv1a64(str(request_ids[k]))
            self.requests.append(Request(
                row=k, request_id=request_ids[k],
                input_tokens=input_tokens[k], output_tokens=output_tokens[k],
                worker=rp.first_worker + k % rp.W, rank=(k // rp.W) % rp.R,
                tok_server=h % self.tok_workers, detok_server=h % self.detok_workers,
            ))

        offset = 0
        for req in self.requests:  # token order by row (the per-token arrays')
            req.token_offset = offset
            offset += req.output_tokens
        # Speculative decoding: the acceptance draws' key, stream 3 of the run seed;
        # verifications, proposals, accepted per position.
        state = np.random.SeedSequence(int(config["seed"]), spawn_key=(3,)).generate_state(1, dtype=np.uint64)
        self.spec_key = int(state[0]) & ((1 << 63) - 1)
        self.spec_counts = [0] * (2 + 32)
        # Per-request acceptance (the table's acceptance_length): alpha of the geometric model, the
        # config layer's derivation; None or NaN: the pool's rates.
        if acceptance_length is not None:
            alphas = geometric_alpha(np.array(acceptance_length, dtype=np.float64), len(self.emit_pool.spec_rates))
            for req, alpha in zip(self.requests, alphas):
                req.spec_alpha = None if math.isnan(alpha) else float(alpha)
        # draws=prompt: a request's draws come from its prompt id's stream (the table's prompt_id;
        # without it, its row), keyed on its own output position.
        if self.emit_pool.spec_drafts and self.emit_pool.spec_draws == "prompt":
            for req in self.requests:
                req.spec_stream = req.row if prompt_id is None else int(prompt_id[req.row])

        # Queue orders: every request's key under the (one) keyed order of the pools.
        keyed = {p.queue_order for p in pools} - {"fcfs", "random", "lpm", "dfs-weight"}
        assert len(keyed) <= 1
        for req in self.requests:
            if "priority" in keyed:
                req.queue_key = 0 if priority is None else int(priority[req.row])
            elif "lof" in keyed:  # SGLang: -max_new_tokens
                req.queue_key = -req.output_tokens
            elif "shortest_prompt" in keyed:
                req.queue_key = req.input_tokens
            elif "shortest_output" in keyed:
                req.queue_key = int(predicted_output_tokens[req.row])

        # Routing (tests/reference/routing.py): a policy other than round robin
        # places each request when it is sent (-1: not yet).
        self.router = ReferenceRouter(self, config)
        # Autoscaling (tests/reference/autoscale.py): the router sends to ready workers only.
        engine_cfg = config["engine"]
        self.scaler = None
        if any((engine_cfg.get(section) or {}).get("metric", "none") != "none"
               for section in ("autoscale", "decode_autoscale")):
            self.scaler = ReferenceAutoscaler(self, config)
            self.router.active = True
            self.router.eligible = self.scaler.ready
        # Failures (tests/reference/failures.py): the router sends to the workers up.
        fail = config["engine"].get("failures") or {}
        self.failures = None
        if fail.get("at") or fail.get("mtbf_ms") is not None:
            self.failures = ReferenceFailures(self, config)
            self.router.active = True
            self.router.eligible = self.failures.ready
        if self.router.active:
            for req in self.requests:
                req.worker = req.rank = -1

        # Prefix caching: identities of every complete prompt block at the receiving
        # pool's block size (only that pool can cache: aggregated or P/D prefill).
        if rp.prefix_caching:
            workload = config.get("workload") or {}
            trace_bs = workload.get("block_size")
            trace_bs = 512 if trace_bs is None else int(trace_bs)
            prefix_tokens = int(workload.get("prefix_tokens") or 0)
            if hash_ids is not None:
                assert len(hash_ids) == n_rows
            for req in self.requests:
                req.idents = self.block_identities(
                    req.row if sessions is None else ("session", sessions["session"][req.row]),
                    req.input_tokens, rp.block_size,
                    None if hash_ids is None else hash_ids[req.row], trace_bs,
                    prefix_tokens if sessions is None else sessions["shared_prefix_tokens"])
                if self.policy == "sglang" or rp.cache_generated_blocks:  # generated blocks too: their own identities
                    owner = req.row if sessions is None or hash_ids is not None else ("session", sessions["session"][req.row])
                    req.idents += [("u", owner, j) for j in range(
                        len(req.idents), rp.blocks_for(req.input_tokens + req.output_tokens))]
        self.clock = 0  # sglang: access counter of the radix cache

        self.offload_setup(rp)  # the CPU tier (tests/reference/offload.py)

        # Pending events.
        #  sends: deque of (t, row), rows in table order with non-decreasing t (SPEC §2)
        #  arrivals: heap of (t, row)  -- tokenization job ends / engine arrivals
        #  transfers: heap of (t, h, row) -- KV-transfer ends (P/D), in handoff order
        #  receipts: heap of (t, seq, [(request, token_index), ...]) -- detok job ends
        self.sends = deque()
        self.arrivals = []
        self.transfers = []
        self.receipts = []
        self.receipt_seq = 0
        self.last_receipt = -1  # the latest receipt instant so far (autoscaling, failures: a pending receipt)
        self.next_handoff = 0  # P/D: the next handoff number h
        self.next_unsent = 0  # closed loop: next row to send
        if self.closed_loop:
            first = min(self.concurrency, n_rows)
            for k in range(first):
                self.sends.append((0, k))
            self.next_unsent = first
        else:
            prev = None
            for k in range(n_rows if sessions is None else 0):
                t = int(send_ns[k])
                assert prev is None or t >= prev, "send_ns must be non-decreasing"
                prev = t
                self.sends.append((t, k))
        self.pass_records = []
        self.sessions = None
        if sessions is not None:
            self.init_sessions(sessions, config, send_ns)

    @staticmethod
    def block_identities(k, input_tokens, bs, hashes, trace_bs, prefix_tokens):
        """docs/prefix-caching.md: identities of the complete prompt blocks of row k."""
        idents = []
        for j in range(input_tokens // bs):  # complete: (j + 1) * bs <= input_tokens
            e = (j + 1) * bs
            if hashes is not None:
                m = (e - 1) // trace_bs
                if m < len(hashes):
                    idents.append(("h", int(hashes[m]), e - m * trace_bs))
                else:
                    idents.append(("u", k, j))  # hash_ids too short: unique to the row
            elif prefix_tokens > 0 and e <= prefix_tokens:
                idents.append(("p", j))
            else:
                idents.append(("u", k, j))
        return idents

    # ------------------------------------------------------------ event loop

    def in_cap(self, t):
        return self.cap_ns is None or t <= self.cap_ns

    def next_time(self):
        candidates = []
        for w in self.workers:
            if w.current is not None:
                candidates.append(w.current.end_ns)
        if self.sends:
            candidates.append(self.sends[0][0])
        if self.sessions is not None and self.session_sends:
            candidates.append(self.session_sends[0][0])
        if self.arrivals:
            candidates.append(self.arrivals[0][0])
        if self.transfers:
            candidates.append(self.transfers[0][0])
        if self.loads:
            candidates.append(self.offload_next_time())
        if self.failures is not None and self.failures.retries:
            candidates.append(self.failures.retries[0][0])
        # Scaling and failure instants while another event is pending at or after
        # them: an engine event, or a receipt (the latest so far).
        horizon = None if candidates else self.last_receipt
        if self.receipts:
            candidates.append(self.receipts[0][0])
        t = min(candidates) if candidates else None
        if self.scaler is not None:
            t = self.scaler.next_time(t, horizon)
        if self.failures is not None:
            t = self.failures.next_time(t, horizon)
        return t

    def run(self):
        last_t = -1
        while True:
            t = self.next_time()
            if t is None or not self.in_cap(t):  # SPEC §9: events after the cap never happen
                break
            assert t > last_t, "time must advance"
            last_t = t
            self.process_instant(t)
        return self.result()

    def process_instant(self, t):
        """SPEC §5 equal-time order: repeat (a)-(d) until nothing is left at t, then (e)."""
        self.now = t
        if self.failures is not None:  # repairs and failures, before the phases
            self.failures.step(t)
        if self.scaler is not None:  # ready instants and decisions, before the phases
            self.scaler.step(t)
        while True:
            progressed = False
            # (a) pass ends, by global worker index
            for w in self.workers:
                if w.current is not None and w.current.end_ns == t:
                    self.end_pass(w, t)
                    progressed = True
            # (b) detokenization job ends and client receipts
            while self.receipts and self.receipts[0][0] == t:
                _, _, items = heapq.heappop(self.receipts)
                self.receive(items, t)
                progressed = True
            # (c) sends at t, in table order
            while self.sends and self.sends[0][0] == t:
                _, row = self.sends.popleft()
                self.send(self.requests[row], t)
                progressed = True
            if self.failures is not None:  # the clients' retries at t, by row
                while self.failures.retries and self.failures.retries[0][0] == t:
                    _, row = heapq.heappop(self.failures.retries)
                    self.dispatch(self.requests[row], t)
                    progressed = True
            if self.sessions is not None:
                while self.session_sends and self.session_sends[0][0] == t:
                    _, row = heapq.heappop(self.session_sends)
                    self.send(self.requests[row], t)
                    progressed = True
            # (d) tokenization job ends = engine arrivals, in send order ...
            while self.arrivals and self.arrivals[0][0] == t:
                _, _, row = heapq.heappop(self.arrivals)
                self.arrive(self.requests[row], t)
                progressed = True
            # ... then KV-transfer ends, in handoff order (P/D)
            while self.transfers and self.transfers[0][0] == t:
                _, _, row = heapq.heappop(self.transfers)
                self.transfer_end(self.requests[row], t)
                progressed = True
            # ... then CPU -> GPU KV loads ending at t (tests/reference/offload.py)
            if self.offload_loads_end(t):
                progressed = True
            if not progressed:
                break
        if self.scaler is not None:  # drained workers are off, before (e)
            self.scaler.drained(t)
        # (e) idle workers with work try to start a pass, by global worker index (an
        # idle worker without work is idle at t: sglang's idle ratio reset)
        for w in self.workers:
            if w.current is None:
                if w.has_work():
                    self.try_start(w, t)
                else:
                    self.reset_ratio_when_idle(w)
            # async scheduling: the step that launched a pass at t schedules the next one
            # at once, before that pass's outputs (vllm/v1/engine/core.py, step_with_batch_queue)
            if (w.pool.async_scheduling and w.current is not None and w.current.start_ns == t
                    and w.queued is None and w.has_work()):
                w.queued = self.build_pass(w, t)

    # ------------------------------------------------------------ client side

    def client_end(self, t, req):
        """SPEC §2: a request ended at the client at t -> closed loop sends the next row."""
        if self.sessions is not None:
            self.session_end(req, t)
            return
        if self.closed_loop and self.next_unsent < len(self.requests):
            send_t = t + self.think_ns
            assert not self.sends or self.sends[-1][0] <= send_t
            self.sends.append((send_t, self.next_unsent))
            self.next_unsent += 1

    def send(self, req, t):
        """SPEC §4: the request becomes one FIFO job on its tokenizer server."""
        req.send_ns = t
        self.dispatch(req, t)

    def dispatch(self, req, t):
        """A send at t (a client's retry keeps its first send instant): routing, then the tokenizer job."""
        if self.sessions is not None and req.send_seq is None:  # a retry keeps its send sequence number
            self.place_at_send(req)
            if self.failures is not None:  # routed below: placed only if a worker takes it
                req.worker = req.rank = -1
        if self.failures is not None:
            req.retry_wait = False
            if not any(self.failures.up):  # no worker takes it: the client's retry rule
                self.failures.lose(req, t)
                return
        if self.router.active:
            self.router.on_send(req)
        w = self.workers[req.worker]
        service_ms = self.tok_base_ms + self.tok_per_input_us * req.input_tokens / 1000
        service_ns = ms_to_ns(service_ms)
        start = max(t, w.tok_free[req.tok_server])
        end = start + service_ns
        w.tok_free[req.tok_server] = end
        # SPEC §5 (d): arrivals at one instant in send order (the row, without sessions)
        heapq.heappush(self.arrivals, (end, req.row if self.sessions is None else req.send_seq, req.row))

    def reject(self, req, t):
        """SPEC §5: a rejection carries no output and reaches the client at once."""
        req.rejected = True
        req.end_ns = t
        self.client_end(t, req)

    def arrive(self, req, t):
        """SPEC §5: engine arrival on the (prefill) rank; rejection if input_tokens >= L."""
        req.arrival_ns = t
        if self.router.active:
            self.router.on_arrival(req)
        if req.input_tokens >= self.recv_pool.L:
            self.reject(req, t)
            return
        req.entered_ns = t
        self.enqueue(self.recv_pool, self.workers[req.worker].ranks[req.rank], req)

    @staticmethod
    def enqueue(pool, rank, req, front=False):
        """Put a request into a rank's waiting queue.  FCFS: at the back, or at the FRONT
        (a vLLM preemption victim).  A keyed order (docs/semantics.md): at the back, then
        the whole queue is sorted, stably, by key (SGLang's calc_priority sorts its list),
        and for vLLM's builder by (key, entry instant) (its heap of requests)."""
        if pool.queue_order in ("fcfs", "random", "lpm", "dfs-weight"):  # the last three: reordered before each extend batch
            if front:
                rank.waiting.appendleft(req)
            else:
                rank.waiting.append(req)
            return
        rank.waiting.append(req)
        if pool.policy == "sglang":
            ordered = sorted(rank.waiting, key=lambda r: r.queue_key)
        else:
            ordered = sorted(rank.waiting, key=lambda r: (r.queue_key, r.entered_ns))
        rank.waiting.clear()
        rank.waiting.extend(ordered)

    def transfer_ns(self, req):
        """SPEC §6: ((input * bytes_per_token) / (bandwidth * 1e9)) * 1e3 ms, 0 when off."""
        if self.kv_bandwidth is None:
            return 0
        ms = ((float(req.input_tokens) * float(self.kv_bytes_per_token))
              / (float(self.kv_bandwidth) * 1e9)) * 1e3
        return ms_to_ns(ms)

    def hand_off(self, req, rank, t):
        """SPEC §6: prompt computed on the prefill rank -> it leaves running (the caller
        removes it), keeps its prefill blocks, and its KV transfer starts at t."""
        h = self.next_handoff
        self.next_handoff += 1
        req.handoff = h
        req.transfer_blocks = req.held_blocks  # still counted in rank.used_blocks
        req.held_blocks = 0  # prefix caching: req.blocks keeps its references until then
        req.transfer_start_ns = t
        heapq.heappush(self.transfers, (t + self.transfer_ns(req), h, req.row))
        rank.inflight += 1
        if self.router.active:
            self.router.on_handoff(req, h)
        self.decode_placement(h)[2].inflight += 1

    def decode_placement(self, h):
        """SPEC §3: handoff h goes to decode worker h mod Wd (a global worker index),
        rank (h div Wd) mod Rd; returns (worker index, rank index, Rank)."""
        dp = self.emit_pool
        w, r = dp.first_worker + h % dp.W, (h // dp.W) % dp.R
        if self.router.active:  # routed at the handoff
            w, r = self.router.decode_choice[h]
        return w, r, self.workers[w].ranks[r]

    def transfer_end(self, req, t):
        """SPEC §6: free the prefill blocks; enter the decode rank (or be rejected there)."""
        req.transfer_end_ns = t
        prefill_rank = self.workers[req.worker].ranks[req.rank]
        if self.recv_pool.prefix_caching:
            if self.policy == "sglang":
                self.radix_insert(self.recv_pool, prefill_rank, req, req.input_tokens)  # cache_finished_req
            elif self.policy == "trtllm":
                self.register(self.recv_pool, prefill_rank, req, req.input_tokens)  # storeBlocksForReuse
            self.drop_refs(prefill_rank, req)  # the references it kept since its handoff
        else:
            prefill_rank.used_blocks -= req.transfer_blocks
        req.transfer_blocks = 0
        dp = self.emit_pool
        req.decode_worker, req.decode_rank, decode_rank = self.decode_placement(req.handoff)
        prefill_rank.inflight -= 1
        decode_rank.inflight -= 1
        if req.input_tokens >= dp.L:
            self.reject(req, t)
            return
        req.computed = req.input_tokens - 1
        req.generated = 0
        req.held_blocks = 0
        req.entered_ns = t
        self.enqueue(dp, decode_rank, req)  # BACK (FCFS)

    def receive(self, items, t):
        """SPEC §7: the client receives every token of a detokenization job at t."""
        for req, idx in items:
            token = req.tokens[idx]
            token[1] = t
            req.last_recv_ns = t
            if idx == 0:
                req.first_recv_ns = t
            if token[2]:  # the final token: the request ends at the client
                req.completed = True
                req.end_ns = t
                self.client_end(t, req)

    # ------------------------------------------------------------ engine side

    def build_batch(self, pool, rank):
        """Batch building of one rank under the pool's policy.
        Returns (batch, preempted, admitted); batch entries are (request, n, is_decode)."""
        if pool.policy == "sglang":
            return self.build_batch_sglang(pool, rank)
        return self.build_batch_vllm(pool, rank, no_evict=pool.policy == "trtllm")

    @staticmethod
    def fits(pool, rank, req, n, lookahead=0):
        """The blocks for computed + n (+ lookahead slots, at most L) fit in the rank's free blocks."""
        slots = req.computed + n if not lookahead else min(req.computed + n + lookahead, pool.L)
        extra = pool.blocks_for(slots) - req.held_blocks
        return rank.used_blocks + extra <= pool.num_blocks

    def schedule(self, pool, rank, batch, req, n, is_decode=None, lookahead=0):
        """Allocate the blocks for computed + n (+ lookahead slots, at most L) and add the
        entry (SPEC §5, §8, unless ``is_decode`` is given); with prefix caching, register
        the prompt blocks this decision completes."""
        if is_decode is None:
            is_decode = n == 1 and req.computed >= req.input_tokens - 1
        slots = req.computed + n if not lookahead else min(req.computed + n + lookahead, pool.L)
        new_held = max(pool.blocks_for(slots), req.held_blocks)
        if pool.prefix_caching:
            for _ in range(new_held - req.held_blocks):
                req.blocks.append(self.alloc_block(pool, rank))
            if pool.policy == "vllm":  # vLLM caches known tokens only (allocate_slots: min(.., num_tokens))
                self.register(pool, rank, req, min(req.computed + n, req.known))
            elif pool.policy == "trtllm" and req.computed + n >= req.input_tokens:
                self.register(pool, rank, req, req.input_tokens - 1)  # storeContextBlocks
        else:
            rank.used_blocks += new_held - req.held_blocks
        req.held_blocks = new_held
        batch.append((req, n, is_decode))

    # -------------------------------------------------- prefix caching (per rank)

    @staticmethod
    def alloc_block(pool, rank):
        """One new block: a truly free one, else the LRU head (it loses its identity);
        sglang: the cached block of the oldest access, the deeper one of a path first."""
        if pool.num_blocks - rank.used_blocks - len(rank.lru) > 0:
            block = Block()
        else:
            if pool.policy == "sglang":
                block = min(rank.lru, key=lambda b: (b.stamp, -b.depth))
            else:
                block = next(iter(rank.lru))  # head: least recently used
            del rank.lru[block]
            del rank.resident[block.ident]
            block.ident = None
        assert block.ref == 0
        block.ref = 1
        rank.used_blocks += 1
        assert rank.used_blocks + len(rank.lru) <= pool.num_blocks
        return block

    def register(self, pool, rank, req, tokens):
        """Register, in block order, the complete prompt blocks covered by ``tokens``
        that are not yet hit/registered for this request: a non-resident identity is
        taken by the request's block; a resident one leaves it anonymous."""
        upto = min(tokens // pool.block_size, len(req.idents))
        for j in range(req.reg, upto):
            ident = req.idents[j]
            if ident not in rank.resident:
                block = req.blocks[j]
                assert block.ident is None
                block.ident = ident
                block.birth = self.clock
                rank.resident[ident] = block
        req.reg = max(req.reg, upto)

    def cache_generated_at_output(self, pool, rank, req):
        """Asynchronous scheduling with generated-block caching: an output's arrival
        caches the full blocks of the computed tokens less those still in flight
        (vLLM AsyncScheduler._update_request_with_output, for a running request)."""
        if pool.cache_generated_blocks and pool.async_scheduling:
            self.register(pool, rank, req, req.computed - req.placeholders)

    @staticmethod
    def drop_refs(rank, req):
        """Free a request's blocks: last block first; ref 0 -> LRU tail (identity) or
        truly free (anonymous)."""
        for block in reversed(req.blocks):
            block.ref -= 1
            assert block.ref >= 0
            if block.ref == 0:
                rank.used_blocks -= 1
                if block.ident is not None:
                    rank.lru[block] = None  # tail: most recently used
        req.blocks = []
        req.reg = 0

    def release(self, pool, rank, req):
        """Free the blocks a request holds on its rank (preemption, finish)."""
        if pool.prefix_caching:
            self.drop_refs(rank, req)
        else:
            rank.used_blocks -= req.held_blocks
        req.held_blocks = 0

    @staticmethod
    def lock_hits(pool, rank, req, hits):
        """Admission with hits: the request references them in block order (cached
        ones leave the LRU queue) and its computed tokens start after them."""
        for block in hits:
            if block.ref == 0:
                del rank.lru[block]
                rank.used_blocks += 1
            block.ref += 1
        req.blocks = list(hits)
        req.held_blocks = len(hits)
        req.reg = len(hits)
        req.computed = len(hits) * pool.block_size
        req.hit_tokens = req.computed

    @staticmethod
    def lookup_hits(pool, rank, req):
        """The resident blocks of the longest run of leading complete prompt blocks,
        h * block_size <= known - 1 (vLLM always computes the last token)."""
        max_h = min(len(req.idents), (req.known - 1) // pool.block_size)
        hits = []
        for j in range(max_h):
            block = rank.resident.get(req.idents[j])
            if block is None:
                break
            hits.append(block)
        return hits

    # ------------------------------------------- sglang radix cache (per rank)

    def radix_touch(self, blocks):
        """A new access of a path (SGLang's last_access_time), deepest block first."""
        self.clock += 1
        for j in reversed(range(len(blocks))):
            blocks[j].stamp = self.clock
            blocks[j].depth = j

    def radix_match(self, pool, rank, req):
        """match_prefix: the resident leading blocks of the first known - 1 tokens
        (whole blocks); the path is touched even if the request is not admitted."""
        hits = self.lookup_hits(pool, rank, req)
        self.radix_touch(hits)
        return hits

    def radix_insert(self, pool, rank, req, tokens):
        """insert of the request's first ``tokens`` tokens (whole blocks): a block
        past its tree blocks takes its identity if not resident, else it is a
        duplicate, freed, and the resident block is referenced instead; then the
        request's whole tree path is touched."""
        for j in range(req.reg, min(tokens // pool.block_size, len(req.idents))):
            ident = req.idents[j]
            own = req.blocks[j]
            tree = rank.resident.get(ident)
            if tree is None:
                assert own.ident is None
                own.ident = ident
                own.birth = self.clock
                rank.resident[ident] = own
            else:
                own.ref -= 1
                assert own.ref == 0 and own.ident is None
                rank.used_blocks -= 1
                if tree.ref == 0:
                    del rank.lru[tree]
                    rank.used_blocks += 1
                tree.ref += 1
                req.blocks[j] = tree
            req.reg = j + 1
        self.radix_touch(req.blocks[:req.reg])

    def radix_pass_end(self, pool, rank, req):
        """A prompt computed in an extend batch joins the tree (cache_unfinished_req),
        and so does a request about to emit its final token (cache_finished_req)."""
        final = (req.generated + 1 == req.output_tokens
                 or req.input_tokens + req.generated + 1 >= pool.L)
        if rank.extend or final:
            self.radix_insert(pool, rank, req, req.computed)

    @staticmethod
    def admission_tokens(pool, req, computed, n):
        """Tokens whose blocks must fit to admit a waiting request: computed + n, or
        with vLLM's scheduler_reserve_full_isl all its known tokens."""
        return req.known if pool.reserve_full_isl else computed + n

    def build_batch_vllm(self, pool, rank, no_evict):
        """SPEC §5 pass start for one rank (policy vllm); with ``no_evict`` the trtllm
        GUARANTEED_NO_EVICT admission rule of docs/policies.md is added to step 2."""
        B = pool.max_batched_tokens
        batch = []
        admitted = []
        preempted = False
        fits = lambda req, n: self.fits(pool, rank, req, n)  # noqa: E731

        # Step 1: running requests, in running order.
        i = 0
        while i < len(rank.running):
            req = rank.running[i]
            # vLLM (AsyncScheduler): a request with outputs in flight whose every token is
            # already scheduled (max_tokens or the length limit) is skipped
            planned = req.generated + req.placeholders
            if req.placeholders and (planned >= req.output_tokens or req.input_tokens + planned >= pool.L):
                i += 1
                continue
            n = min(req.known + req.placeholders - req.computed, B)
            if n == 0:
                break
            look = pool.spec_lookahead
            spec_entry = False
            if pool.spec_drafts and n == 1:
                n = min(pool.spec_query(req), B)
                if n > 1 and not self.spec_proposes(pool, req):
                    n = 1  # vLLM n-gram: the lookup found no match this step (docs/speculative.md)
                spec_entry = n > 1
            self_victim = False
            while not self.fits(pool, rank, req, n, look):
                if pool.queue_order == "priority":
                    # vLLM priority: max(running, key=(priority, arrival_time)), the first such
                    victim = max(rank.running, key=lambda r: (r.queue_key, r.entered_ns))
                    at = next(j for j, r in enumerate(rank.running) if r is victim)
                    del rank.running[at]
                    if at < i:  # already in this batch: out of it, its tokens back to B
                        entry = next(e for e in batch if e[0] is victim)
                        batch.remove(entry)
                        B += entry[1]
                        victim.drafts = 0
                        i -= 1
                else:
                    victim = rank.running.pop()  # the LAST running request
                self.release(pool, rank, victim)
                victim.computed = 0
                victim.placeholders = 0  # its in-flight output is dropped (vLLM 0.33)
                victim.epoch += 1
                victim.num_preemptions += 1
                self.enqueue(pool, rank, victim, front=True)  # FRONT of waiting (FCFS)
                preempted = True
                if victim is req:
                    self_victim = True
                    break
            if self_victim:
                break
            if spec_entry:
                req.drafts = n - 1
                self.schedule(pool, rank, batch, req, n, is_decode=True, lookahead=look)
            else:
                self.schedule(pool, rank, batch, req, n, lookahead=look)
            B -= n
            i += 1

        # trtllm: blocks still promised to running requests, after step 1's allocations.
        promised = 0
        if no_evict:
            promised = sum(pool.footprint(r) - r.held_blocks for r in rank.running)

        # Step 2: waiting requests, FIFO, with head-of-line blocking.
        if self.offload_on(pool):
            if not preempted:
                self.offload_admit(pool, rank, batch, admitted, B)
            self.offload_store_batch(pool, rank, batch, admitted)
            return batch, preempted, admitted
        # Chunked prefill off (vLLM's --no-enable-chunked-prefill): a request whose whole
        # need exceeds B is set aside and the next one tried; the set-aside requests go
        # back to the head of waiting, in their order, when the loop ends.
        while (rank.waiting and len(rank.running) < pool.max_sequences and B > 0
               and not preempted):
            req = rank.waiting[0]
            if pool.prefix_caching:
                # docs/prefix-caching.md admission: hits, then the capacity check with
                # the hit blocks that are cached now; no change of state if it fails
                assert req.held_blocks == 0 and not req.blocks and req.computed == 0
                hits = self.lookup_hits(pool, rank, req)
                h = len(hits)
                computed = h * pool.block_size
                if not pool.chunked_prefill and req.known - computed > B:
                    break  # vLLM stops the waiting loop: no chunk, no overtaking
                n = min(req.known - computed, B)
                new = pool.blocks_for(self.admission_tokens(pool, req, computed, n)) - h
                evictable = sum(1 for block in hits if block.ref == 0)
                if new + evictable > pool.num_blocks - rank.used_blocks:
                    break  # head of line
                if no_evict:  # TensorRT-LLM 1.0: no reuse credit, the whole footprint
                    footprint = pool.footprint(req)
                    if footprint > pool.num_blocks - rank.used_blocks - promised:
                        break
                rank.waiting.popleft()
                rank.running.append(req)
                self.lock_hits(pool, rank, req, hits)
                self.schedule(pool, rank, batch, req, n)
                admitted.append(req)
                B -= n
                if no_evict:
                    promised += footprint - req.held_blocks
                continue
            if not pool.chunked_prefill and req.known - req.computed > B:
                break  # vLLM stops the waiting loop: no chunk, no overtaking
            n = min(req.known - req.computed, B)
            if no_evict:
                footprint = pool.footprint(req)
                if footprint > pool.num_blocks - rank.used_blocks - promised:
                    break  # FIFO, no skipping
            look = pool.spec_lookahead if req.computed > 0 else 0  # vLLM: none when num_computed_tokens == 0
            if not fits(req, self.admission_tokens(pool, req, req.computed, n) - req.computed):
                break
            if look and not self.fits(pool, rank, req, n, look):
                break
            rank.waiting.popleft()
            rank.running.append(req)
            held_before = req.held_blocks  # 0: a waiting request holds no blocks
            self.schedule(pool, rank, batch, req, n, lookahead=look)
            admitted.append(req)
            B -= n
            if no_evict:
                promised += footprint - (req.held_blocks - held_before)
        return batch, preempted, admitted

    def shuffle(self, rank):
        """sglang random (docs/semantics.md): Python's random.shuffle algorithm (Fisher-Yates
        from the last position down) on the waiting queue, the uniform of position i of the
        rank's c-th shuffle a SplitMix64 hash of (key, global rank, c, i)."""
        mask = (1 << 64) - 1
        golden = 0x9E3779B97F4A7C15

        def mix(x):
            x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
            x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
            return x ^ (x >> 31)

        items = list(rank.waiting)
        c = rank.shuffles
        rank.shuffles += 1
        for i in range(len(items) - 1, 0, -1):
            x = mix((self.shuffle_key + rank.global_index * golden) & mask)
            x = mix((x + c * golden) & mask)
            x = mix((x + i * golden) & mask)
            j = int((x >> 11) * 2.0 ** -53 * (i + 1))
            items[i], items[j] = items[j], items[i]
        rank.waiting.clear()
        rank.waiting.extend(items)

    lpm_deferred = 0  # requests sort_lpm put last, over every simulation

    def sort_lpm(self, pool, rank):
        """sglang lpm (docs/semantics.md): SchedulePolicy.calc_priority with the in-batch
        prefix check of _compute_prefix_matches; FCFS (untouched) above 128 waiting."""
        if len(rank.waiting) > 128:
            return
        tree = []  # the waiting-queue radix tree: the requests inserted into it
        keys = {}
        for req in rank.waiting:
            matched = len(self.radix_match(pool, rank, req)) * pool.block_size
            keys[id(req)] = -matched
            if matched > 32:
                continue
            longest = 0
            for other in tree:
                common = 0
                for a, b in zip(req.idents, other.idents):
                    if a != b:
                        break
                    common += 1
                longest = max(longest, common * pool.block_size)
            if longest >= 32:
                keys[id(req)] = math.inf
                ReferenceSim.lpm_deferred += 1  # a count for the scenarios' coverage test
            else:
                tree.append(req)
        ordered = sorted(rank.waiting, key=lambda r: keys[id(r)])
        rank.waiting.clear()
        rank.waiting.extend(ordered)

    dfs_reordered = 0  # sort_dfs_weight calls that changed a queue's order, over every simulation
    dfs_birth_ties = 0  # equal-weight siblings it ordered by birth

    def sort_dfs_weight(self, pool, rank):
        """sglang dfs-weight (docs/semantics.md): SchedulePolicy.calc_priority's match of every
        waiting request, then _sort_by_dfs_weight's walk; no cut-off by queue length."""
        bs = pool.block_size
        own = {None: []}  # block (None: the root) -> the requests whose match ends there, in queue order
        children = {None: []}  # block -> its children that some match passes, as first met
        weight = {None: 0}
        for req in rank.waiting:
            # origin_input_ids + output_ids, whole blocks: not capped at known - 1 tokens
            hits = []
            for ident in req.idents[:req.known // bs]:
                block = rank.resident.get(ident)
                if block is None:
                    break
                hits.append(block)
            self.radix_touch(hits)
            parent = None
            weight[None] += 1
            for block in hits:
                if block not in weight:
                    weight[block] = 0
                    own[block] = []
                    children[block] = []
                    children[parent].append(block)
                weight[block] += 1
                parent = block
            own[parent].append(req)
        order = []
        stack = [(None, False)]
        while stack:
            node, done = stack.pop()
            if done:
                order.extend(own[node])
                continue
            stack.append((node, True))
            kids = sorted(children[node], key=lambda b: (-weight[b], b.birth))
            for b, c in zip(kids, kids[1:]):
                assert (weight[b], b.birth) != (weight[c], c.birth)  # siblings never share a birth
                ReferenceSim.dfs_birth_ties += weight[b] == weight[c]
            stack.extend((kid, False) for kid in reversed(kids))
        assert len(order) == len(rank.waiting)
        if order != list(rank.waiting):
            ReferenceSim.dfs_reordered += 1  # a count for the scenarios' coverage test
        rank.waiting.clear()
        rank.waiting.extend(order)

    def build_batch_sglang(self, pool, rank):
        """docs/policies.md sglang: an extend batch (chunked request, then waiting FIFO)
        or, if that is empty, a decode batch with retraction."""
        bs = pool.block_size
        batch = []
        admitted = []
        fits = lambda req, n: self.fits(pool, rank, req, n)  # noqa: E731
        ceil_page = lambda tokens: pool.blocks_for(tokens) * bs  # noqa: E731
        entrant_rank = pool.name == "decode"

        def extend(req, n):
            # a decode rank's request that has generated nothing there is an entrant
            self.schedule(pool, rank, batch, req, n,
                          is_decode=entrant_rank and req.generated == 0)

        # 1. the ratio (reset when the worker idles: end_pass, try_start)
        empty_rank = not rank.running
        ratio = rank.new_token_ratio
        chunked = rank.chunked
        decoders = [req for req in rank.running if req is not chunked]
        caching = pool.prefix_caching
        if caching and chunked is not None:  # cache_unfinished_req at the round's start
            self.radix_insert(pool, rank, chunked, chunked.computed)

        # 2. budgets: rem_total = free tokens - offset, evaluated at each use
        free_tokens = (pool.num_blocks - rank.used_blocks) * bs
        offset = 0.0
        for req in decoders:  # running order, summed first
            offset += min(req.output_tokens - req.generated, SGLANG_RESERVE_CAP) * ratio
        rem_input = pool.max_prefill_tokens
        rem_chunk = pool.rem_chunk_init
        if pool.queue_order == "random" and rank.waiting and len(rank.running) < pool.max_sequences:
            self.shuffle(rank)
        if pool.queue_order == "lpm" and rank.waiting and len(rank.running) < pool.max_sequences:
            self.sort_lpm(pool, rank)
        if pool.queue_order == "dfs-weight" and rank.waiting and len(rank.running) < pool.max_sequences:
            self.sort_dfs_weight(pool, rank)

        # 3. the chunked request first, if its blocks fit
        if chunked is not None:
            need = chunked.known - chunked.computed
            limit = min(rem_chunk, int(free_tokens - offset))
            if limit <= 0:
                limit = rem_chunk
            n = min(need, limit)
            if fits(chunked, n):
                extend(chunked, n)
                reserve = 0
                if n == need:
                    reserve = min(chunked.output_tokens, SGLANG_RESERVE_CAP)
                    rank.chunked = None
                offset += ceil_page(n) + reserve
                rem_input -= ceil_page(n)
                rem_chunk -= ceil_page(n)

        # 4. waiting requests FIFO
        while rank.waiting and len(rank.running) < pool.max_sequences:
            req = rank.waiting[0]
            start, hits, evictable = req.computed, [], 0
            if caching:  # match_prefix (touches the path), then the checks under its lock
                hits = self.radix_match(pool, rank, req)
                start = len(hits) * bs
                evictable = sum(1 for block in hits if block.ref == 0)
            locked_free = free_tokens - evictable * bs
            need = req.known - start
            total = need + min(req.output_tokens - req.generated, SGLANG_RESERVE_CAP)
            first_on_empty_rank = empty_rank and not batch
            if not first_on_empty_rank and total >= locked_free - offset:
                break
            if batch and ceil_page(need) >= rem_input:
                break
            if ceil_page(need) <= rem_chunk:
                n, reserve = need, min(req.output_tokens, SGLANG_RESERVE_CAP)
            else:
                n, reserve = (rem_chunk // bs) * bs, 0  # page-aligned chunk
                if n <= 0 or rank.chunked is not None:
                    break
            new = pool.blocks_for(start + n) - req.held_blocks - len(hits)
            if rank.used_blocks + new + evictable > pool.num_blocks:
                break
            rank.waiting.popleft()
            rank.running.append(req)
            if caching:
                self.lock_hits(pool, rank, req, hits)
                free_tokens = locked_free
            extend(req, n)
            admitted.append(req)
            offset += ceil_page(n) + reserve
            rem_input -= ceil_page(n)
            rem_chunk -= ceil_page(n)
            if n < need:
                rank.chunked = req
                break  # a chunked admission closes the batch
            if free_tokens - offset <= 0 or rem_input <= 0 or rem_chunk <= 0:
                break
        rank.extend = bool(batch)
        if batch:
            return batch, False, admitted

        # 5. decode batch: every decoding request, one token each, after retraction
        if not decoders:
            return batch, False, admitted

        def new_blocks():
            return sum(pool.blocks_for(d.computed + pool.spec_query(d)) - d.held_blocks for d in decoders)

        def retract(victim):
            rank.running.remove(victim)  # the others keep their order
            self.release(pool, rank, victim)  # its radix-tree blocks stay cached, untouched
            victim.computed = 0
            victim.num_preemptions += 1
            self.enqueue(pool, rank, victim)  # BACK of waiting (FCFS)

        retracted = False
        while new_blocks() > pool.num_blocks - rank.used_blocks and len(decoders) > 1:
            # fewest generated, then longest prompt, then latest in running order
            best = 0
            for j in range(1, len(decoders)):
                d, b = decoders[j], decoders[best]
                if (d.generated, -d.input_tokens) <= (b.generated, -b.input_tokens):
                    best = j  # ties go to the later one
            retract(decoders.pop(best))
            retracted = True
        if new_blocks() > pool.num_blocks - rank.used_blocks and chunked is not None:
            # still short with one decoder left: the skipped chunked request holds the
            # missing blocks
            retract(chunked)
            rank.chunked = None
            retracted = True
        assert new_blocks() <= pool.num_blocks - rank.used_blocks, "a lone decoder always fits"
        if retracted:
            total_generated = sum(d.generated for d in decoders)
            total_output = sum(d.output_tokens for d in decoders)
            rank.new_token_ratio = min(
                1.0, (total_generated + SGLANG_RETRACT_DECODE_STEPS * len(decoders))
                / total_output)
        else:
            rank.new_token_ratio = max(ratio - pool.ratio_decay, pool.ratio_min)
        for d in decoders:
            q = pool.spec_query(d)
            d.drafts = q - 1
            self.schedule(pool, rank, batch, d, q, is_decode=True)
        return batch, retracted, admitted

    def summarize_batch(self, batch):
        """SPEC §8 batch summary (computed is still the value before the pass)."""
        s = dict(num_prefill=0, prefill_tokens=0, prefill_kv_tokens=0,
                 num_decode=0, decode_kv_tokens=0, decode_kv_max=0, draft_tokens=0)
        for req, n, is_decode in batch:
            if is_decode:
                s["draft_tokens"] += req.drafts
                s["num_decode"] += 1
                s["decode_kv_tokens"] += req.computed + 1
                s["decode_kv_max"] = max(s["decode_kv_max"], req.computed + 1)
            else:
                s["num_prefill"] += 1
                s["prefill_tokens"] += n
                s["prefill_kv_tokens"] += req.computed + n
        return s

    def try_start(self, w, t):
        """SPEC §5 pass start on an idle worker with work (retried after preempt-only)."""
        p = self.build_pass(w, t)
        if p is not None:
            self.start(w, p, t)

    def start(self, w, p, t):
        p.start_ns = t
        p.end_ns = t + max(1, ms_to_ns(max(p.times_ms)))  # §0: max over ranks, converted once
        w.current = p

    def build_pass(self, w, t):
        """Every rank's batch of worker w at t (None: all empty); preempt-only retries at once.
        Under async scheduling the scheduled tokens count as computed at once and a chunk
        that reaches the request's known tokens adds an output placeholder."""
        while True:
            batches, summaries, times, blocks = [], [], [], []
            any_preempted = False
            for rank in w.ranks:
                batch, preempted, admitted = self.build_batch(w.pool, rank)
                any_preempted = any_preempted or preempted
                for req in admitted:
                    if req.first_admit_ns is None:
                        req.first_admit_ns = t  # first admission only (P/D: on prefill)
                        req.cached_tokens = req.hit_tokens  # 0 without prefix caching
                s = self.summarize_batch(batch)
                if w.pool.async_scheduling:
                    entries = []
                    for req, n, is_decode in batch:
                        req.computed += n
                        samples = req.computed == req.known + req.placeholders
                        if samples:
                            req.placeholders += 1
                        entries.append((req, n, samples, req.epoch))
                    batch = entries
                batches.append(batch)
                summaries.append(s)
                ms = w.pool.timing.rank_time_ms(s)
                if w.pool.spec_drafts:
                    ms += w.pool.proposer_ms(s["num_decode"])
                times.append(ms)
                blocks.append(rank.used_blocks)
            if any(batches):
                if w.pool.expert_parallel:
                    times = w.pool.timing.lockstep_times_ms(summaries)
                return Pass(None, None, batches, summaries, times, blocks)
            if not any_preempted:
                self.reset_ratio_when_idle(w)
                return None  # all batches empty: the worker stays idle
            # only preemptions happened: try again at once

    @staticmethod
    def reset_ratio_when_idle(w):
        """sglang: the worker found nothing to run (SGLang's idle loop iteration): every
        rank's new_token_ratio goes back to init, unless a KV transfer from or to one of
        its ranks is in flight, or (decode pool) a request waits."""
        if w.pool.policy != "sglang":
            return
        if any(r.inflight or (w.pool.name == "decode" and r.waiting) for r in w.ranks):
            return
        for rank in w.ranks:
            rank.new_token_ratio = w.pool.ratio_init

    def end_pass(self, w, t):
        """SPEC §5 pass end (§6 handoffs on a prefill worker), then §7 detokenization.
        Under async scheduling the entries that sampled emit (in batch order, the running
        order when the pass was built) unless preempted since; then the queued pass starts."""
        p = w.current
        w.current = None
        pool = w.pool
        hands_off = pool.name == "prefill"
        outputs = []  # (request, token_index), in rank then running order
        for rank, batch in zip(w.ranks, p.batches):
            if pool.async_scheduling:  # computed advanced when the pass was built
                order = [(req, n) for req, n, samples, epoch in batch if samples and epoch == req.epoch]
            else:
                # the scheduled requests, in running order (sglang: not a prefix of running)
                n_of = {id(req): n for req, n, _ in batch}
                order = [(req, n_of[id(req)]) for req in rank.running if id(req) in n_of]
                assert len(order) == len(batch)
            for req, n in order:
                emits = 1
                if pool.async_scheduling:
                    req.placeholders -= 1
                else:
                    req.computed += n
                    if req.drafts:  # a verification: 1 + accepted tokens, rejected slots computed again
                        d, req.drafts = req.drafts, 0
                        accepted = self.spec_accepted(pool, req, d)
                        self.spec_counts[0] += 1
                        self.spec_counts[1] += d
                        for a in range(accepted):
                            self.spec_counts[2 + a] += 1
                        req.computed -= d - accepted
                        assert req.computed == req.known + accepted
                        emits = 1 + accepted
                    elif req.computed != req.known:
                        continue
                for _ in range(emits):
                    if not pool.async_scheduling:
                        req.computed = req.known  # a verification's token: computed when it is sampled
                    if self.emit_one(pool, rank, req, t, hands_off, outputs):
                        break
        if not w.has_work():
            self.reset_ratio_when_idle(w)
        self.record_pass(w, p, pool, t, outputs)

    def spec_uniform(self, key, req):
        """The uniform of req's step: a SplitMix64 hash of (key, row, index of the step's first token);
        draws=prompt: of (key, prompt id, the request's own index of that token)."""
        mask = (1 << 64) - 1
        golden = 0x9E3779B97F4A7C15

        def mix(x):
            x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
            x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & mask
            return x ^ (x >> 31)

        if req.spec_stream is None:
            who, at = req.row, req.token_offset + req.generated
        else:
            who, at = req.spec_stream, req.generated
        x = mix((key + who * golden) & mask)
        x = mix((x + at * golden) & mask)
        return (x >> 11) * 2.0 ** -53

    def spec_proposes(self, pool, req):
        """Whether this decode step has proposals: vLLM's n-gram lookup matches with the pool's
        proposal_rate, drawn from the same hash under the key XOR 0x2545F4914F6CDD1D."""
        if pool.spec_proposal_rate >= 1.0:
            return True
        return self.spec_uniform(self.spec_key ^ 0x2545F4914F6CDD1D, req) < pool.spec_proposal_rate

    def spec_accepted(self, pool, req, drafts):
        """Accepted proposals of this verification: the positions whose rate exceeds the
        step's uniform, a SplitMix64 hash of (key, row, index of the step's first token)."""
        u = self.spec_uniform(self.spec_key, req)
        accepted = 0
        limit = min(drafts, len(pool.spec_rates))
        if req.spec_alpha is not None:  # alpha, alpha^2, ... by repeated products
            rate = req.spec_alpha
            while accepted < limit and u < rate:
                accepted += 1
                rate *= req.spec_alpha
            return accepted
        while accepted < limit and u < pool.spec_rates[accepted]:
            accepted += 1
        return accepted

    def emit_one(self, pool, rank, req, t, hands_off, outputs):
        """One sampled token of ``req`` at the pass end t (SPEC §5, §6); returns whether
        it left the rank (finished, or handed off)."""
        if pool.prefix_caching and pool.policy == "sglang":
            self.radix_pass_end(pool, rank, req)
        if req.prompt_done_ns is None:
            req.prompt_done_ns = t  # the prompt is computed (first time)
        if hands_off:  # SPEC §6: hidden token, hand off, leave running
            assert req.generated == 0 and req.computed == req.input_tokens
            self.hand_off(req, rank, t)
            rank.running.remove(req)
            return True
        idx = req.generated
        req.generated += 1
        final = (req.generated == req.output_tokens
                 or req.input_tokens + req.generated >= pool.L)
        if self.scaler is not None:  # latency samples (tests/reference/autoscale.py)
            self.scaler.emitted(req, t, idx, req.tokens[-1][0] if idx > 0 else None)
        req.tokens.append([t, None, final])
        if idx == 0:
            req.first_emit_ns = t
        self.cache_generated_at_output(pool, rank, req)
        outputs.append((req, idx))
        if final:  # finish: free blocks, leave running
            if pool.prefix_caching and pool.policy == "trtllm":
                self.register(pool, rank, req, req.computed)  # storeBlocksForReuse
            self.release(pool, rank, req)
            rank.running.remove(req)
            return True
        return False

    def record_pass(self, w, p, pool, t, outputs):
        # the pass record (only passes ending by the cap get here)
        for r in range(pool.R):
            rec = dict(worker=w.index, rank=r, start_ns=p.start_ns, end_ns=p.end_ns)
            rec.update((key, value) for key, value in p.summaries[r].items()
                       if key not in ("decode_kv_max", "draft_tokens"))  # not logged
            rec["rank_time_ms"] = p.times_ms[r]
            rec["blocks_in_use"] = p.blocks[r]
            rec["pool"] = pool.name
            self.pass_records.append(rec)
        self.make_detok_jobs(w, t, outputs)
        if w.queued is not None:
            self.start(w, w.queued, t)
            w.queued = None

    def make_detok_jobs(self, w, t, outputs):
        if not outputs:
            return
        if not self.detok_on:
            self.push_receipt(t, outputs)  # receipt = emission
            return
        for server in range(self.detok_workers):  # jobs created in server-index order
            mine = [o for o in outputs if o[0].detok_server == server]
            if not mine:
                continue  # no outputs: no job
            size = len(mine) if self.detok_chunk is None else self.detok_chunk
            for lo in range(0, len(mine), size):
                job = mine[lo:lo + size]
                k = len(job)
                n_first = sum(1 for req, idx in job if idx == 0)
                n_final = sum(1 for req, idx in job if req.tokens[idx][2])
                service_ms = (self.detok_base_ms
                              + self.detok_per_output_us * k / 1000
                              + self.detok_first_us * n_first / 1000
                              + self.detok_final_us * n_final / 1000)
                start = max(t, w.detok_free[server])
                end = start + ms_to_ns(service_ms)
                w.detok_free[server] = end
                self.push_receipt(end, job)

    # ------------------------------------------------------------ sessions

    def init_sessions(self, sessions, config, send_ns):
        """docs/semantics.md, Sessions: rows are turns; a session's turns go in row order."""
        self.sessions = sessions
        self.turn_think_ns = ms_to_ns(config["workload"]["sessions"]["think_time_ms"])
        self.session_rows = {}  # session -> its rows, turn order
        for row, session in enumerate(sessions["session"]):
            self.session_rows.setdefault(session, []).append(row)
        self.session_order = sorted(self.session_rows, key=lambda s: self.session_rows[s][0])
        self.sends.clear()  # the table-order sends are not used
        self.session_sends = []  # heap of (t, row): ties in row order
        self.num_sent = 0
        for req in self.requests:  # placed when sent
            req.worker = req.rank = None
            req.send_seq = None
        if self.closed_loop:
            self.sessions_started = min(self.concurrency, len(self.session_order))
            for s in self.session_order[:self.sessions_started]:
                heapq.heappush(self.session_sends, (0, self.session_rows[s][0]))
        else:
            self.sessions_started = len(self.session_order)
            for s in self.session_order:
                row = self.session_rows[s][0]
                heapq.heappush(self.session_sends, (int(send_ns[row]), row))

    def session_end(self, req, t):
        """Turn req ended at the client at t: its session's next turn follows the think
        time; after the last turn a closed loop starts the next session."""
        rows = self.session_rows[self.sessions["session"][req.row]]
        turn = rows.index(req.row)
        if turn + 1 < len(rows):
            heapq.heappush(self.session_sends, (t + self.turn_think_ns, rows[turn + 1]))
        elif self.closed_loop and self.sessions_started < len(self.session_order):
            s = self.session_order[self.sessions_started]
            self.sessions_started += 1
            heapq.heappush(self.session_sends, (t + self.think_ns, self.session_rows[s][0]))

    def place_at_send(self, req):
        """SPEC §3 with sessions: placement by send sequence number, given at the send."""
        k = self.num_sent
        self.num_sent += 1
        rp = self.recv_pool
        req.send_seq = k
        req.worker, req.rank = rp.first_worker + k % rp.W, (k // rp.W) % rp.R

    def push_receipt(self, end, items):
        heapq.heappush(self.receipts, (end, self.receipt_seq, list(items)))
        self.receipt_seq += 1
        self.last_receipt = max(self.last_receipt, end)

    # ------------------------------------------------------------ output

    def result(self):
        requests, tokens = [], []
        for req in self.requests:
            if req.rejected:
                status = "rejected"
            elif req.completed:
                status = "completed"
            else:
                status = "incomplete"
            pd = self.disaggregated
            # Never placed (-1 under a routing policy, None for a session turn): null.
            worker, rank = (None if v is None or v < 0 else v for v in (req.worker, req.rank))
            requests.append(dict(
                status=status,
                worker=worker,
                rank=rank,
                prefill_worker=worker if pd else None,
                prefill_rank=rank if pd else None,
                decode_worker=req.decode_worker,   # None unless its transfer ended by the cap
                decode_rank=req.decode_rank,
                generated_tokens=req.generated,
                num_preemptions=req.num_preemptions,
                cached_tokens=req.cached_tokens,  # None if never admitted
                **self.offload_result(req),
                send_ns=req.send_ns,
                arrival_ns=req.arrival_ns,
                first_admit_ns=req.first_admit_ns,
                prompt_done_ns=req.prompt_done_ns,
                transfer_start_ns=req.transfer_start_ns,
                transfer_end_ns=req.transfer_end_ns,
                first_emit_ns=req.first_emit_ns,
                first_recv_ns=req.first_recv_ns,
                last_recv_ns=req.last_recv_ns,
                end_ns=req.end_ns,
            ))
            tokens.append([(emit, recv) for emit, recv, _ in req.tokens])
        spec = {}
        if self.emit_pool.spec_drafts:
            spec = dict(spec_counts=list(self.spec_counts), spec_positions=len(self.emit_pool.spec_rates))
        scaling = {} if self.scaler is None else dict(scale_log=list(self.scaler.log))
        if self.failures is not None:
            scaling = dict(scale_log=list(self.failures.log))
            for out, req in zip(requests, self.requests):
                out["failures"] = req.failures
            self.pass_records.sort(key=lambda p: (p["end_ns"], p["worker"], p["rank"]))
        return dict(mode=self.mode, requests=requests, tokens=tokens, passes=self.pass_records,
                    **self.offload_summary(), **spec, **scaling)


def simulate(config, request_ids, input_tokens, output_tokens, send_ns, hash_ids=None, sessions=None,
             acceptance_length=None, priority=None, predicted_output_tokens=None, prompt_id=None):
    """Run the reference simulation; see the module docstring and the task brief.
    ``hash_ids``: None, or one list of ints per row (Mooncake prefix-chained block
    hashes at workload.block_size tokens per block), for prefix caching.
    ``sessions``: None, or ``{"session": one label per row, "shared_prefix_tokens": int}``
    (multi-turn sessions; send_ns then gives the first turns' sends only).
    ``acceptance_length``: None, or each row's mean acceptance length (NaN: the pool's rates).
    ``priority``, ``predicted_output_tokens``: None, or one int per row (queue orders).
    ``prompt_id``: None, or one int >= 0 per row (speculative draws=prompt)."""
    return ReferenceSim(config, request_ids, input_tokens, output_tokens, send_ns,
                        hash_ids, sessions, acceptance_length, priority, predicted_output_tokens,
                        prompt_id).run()
