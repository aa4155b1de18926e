"""The CPU offload tier of the reference simulator (docs/prefix-caching.md, "CPU offload tier").

Plain Python beside ``sim.py``, called from short hooks there.  Per rank a
``CpuTier``: an ``OrderedDict`` identity -> pins (loads reading the block),
head = least recently used, and the instant its copy stream is free.  Per
request: ``off_state`` (None, "loading", "ready", "loaded"), ``off_hits`` /
``off_upto`` (GPU hits and GPU hits + loaded blocks of its last load),
``off_next_stored`` (next prompt block to store), ``cpu_first`` (loaded tokens
counted at the first admission) and ``load_ns`` (issue to end, summed).

Decisions (vLLM's OffloadingConnector and LRUOffloadingManager):

- Admission, for each waiting request in queue order while running < max_sequences
  and budget > 0: "loading" -> passed over; nothing computed while max_sequences
  loads are in flight on the rank -> passed over; "ready" -> computed = upto*bs (minus 1
  if that is every known token), blocks registered up to computed // bs, then
  "loaded"; "loaded" with computed > 0 -> admitted like any request if computed + n
  fits (else head-of-line stop).  Otherwise (nothing computed): GPU hits h, touch
  (every CPU-resident prompt block moved to the MRU end, last block first), c =
  CPU-resident prompt blocks h, h+1, ... consecutively (none when known == 1).
  c == 0: the prefix-caching admission.  Else: passed over if one of them is
  pinned; head-of-line stop if c + (hits with ref 0) > num_blocks - used; else it
  takes its hits, allocates c blocks (held h + c, nothing registered beyond h),
  pins them, and its load runs from max(now, stream free) for max(1, c *
  block_ns) ns; it stays in waiting, off_next_stored = h + c.
- A load end (phase (d), after KV-transfer ends, by (instant, row)): "ready",
  its blocks unpinned.
- Stores, after each vLLM batch (also one that preempted): the batch's entries
  admitted by it and never preempted, then the running ones, then the admitted
  preempted ones, in batch order; blocks off_next_stored .. min((computed + n)
  // bs, prompt blocks) - 1: those not resident need CPU room; if fewer unpinned
  blocks than missing can be evicted from the head, nothing happens; else the
  evicted go, the new ones join the MRU end in block order, off_next_stored
  advances and, if any was new, the request's blocks up to there are touched.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict


class CpuTier:
    def __init__(self, capacity):
        self.capacity = capacity
        self.blocks = OrderedDict()  # identity -> pins; head = least recently used
        self.load_free = 0
        self.loading = 0  # loads in flight

    def touch(self, idents):
        for ident in reversed(idents):
            if ident in self.blocks:
                self.blocks.move_to_end(ident)


def offload_params(pool_params):
    """(num_blocks, block copy ns as a function of block_size, bytes_per_token) or None."""
    raw = pool_params.get("kv_offload") or {}
    if all(raw.get(key) is None for key in ("num_blocks", "bandwidth_gb_per_second", "bytes_per_token")):
        return None
    return int(raw["num_blocks"]), float(raw["bandwidth_gb_per_second"]), float(raw["bytes_per_token"])


class OffloadMixin:
    """ReferenceSim methods of the CPU tier; ``self.loads`` is the heap of (end, row)."""

    def offload_setup(self, pool):
        self.loads = []
        self.loaded_blocks = 0
        self.stored_blocks = 0
        self.offload = offload_params(pool.params) if pool.prefix_caching else None
        if self.offload is None:
            return
        num_blocks, bandwidth, bytes_per_token = self.offload
        bs = pool.block_size
        # one block's copy: rint(bs x bytes_per_token / (bandwidth x 1e9) x 1e9) ns
        self.block_ns = round(bs * bytes_per_token / (bandwidth * 1e9) * 1e9)
        self.block_bytes = bs * bytes_per_token
        for w in self.workers:
            if w.pool is pool:
                for rank in w.ranks:
                    rank.cpu = CpuTier(num_blocks)
        for req in self.requests:
            req.off_state = None
            req.off_hits = req.off_upto = req.off_next_stored = 0
            req.cpu_first = 0
            req.load_ns = 0

    def offload_on(self, pool):
        return pool is self.recv_pool and self.offload is not None

    def offload_next_time(self):
        return self.loads[0][0] if self.loads else None

    def offload_loads_end(self, t):
        progressed = False
        while self.loads and self.loads[0][0] == t:
            _, row = heapq.heappop(self.loads)
            req = self.requests[row]
            req.off_state = "ready"
            cpu = self.workers[req.worker].ranks[req.rank].cpu
            cpu.loading -= 1
            for ident in req.idents[req.off_hits:req.off_upto]:
                cpu.blocks[ident] -= 1
            progressed = True
        return progressed

    def offload_admit(self, pool, rank, batch, admitted, B):
        """Step 2 of the vllm builder on a rank with a CPU tier; returns the budget left."""
        bs = pool.block_size
        cpu = rank.cpu
        i = 0
        while i < len(rank.waiting) and len(rank.running) < pool.max_sequences and B > 0:
            req = rank.waiting[i]
            if req.off_state == "loading":
                i += 1
                continue
            if req.off_state == "ready":
                tokens = req.off_upto * bs
                if tokens == req.known:
                    tokens -= 1
                req.computed = tokens
                self.register(pool, rank, req, req.computed)
                if req.first_admit_ns is None:
                    req.cpu_first = tokens - req.off_hits * bs
                req.off_state = "loaded"
            if req.off_state == "loaded" and req.computed > 0:
                n = min(req.known - req.computed, B)
                if not self.fits(pool, rank, req, n):
                    break
                del rank.waiting[i]
                rank.running.append(req)
                req.hit_tokens = req.computed
                self.schedule(pool, rank, batch, req, n)
                admitted.append(req)
                B -= n
                continue
            assert req.held_blocks == 0 and not req.blocks and req.computed == 0
            if cpu.loading >= pool.max_sequences:  # vLLM's back-pressure on loads
                i += 1
                continue
            hits = self.lookup_hits(pool, rank, req)
            h = len(hits)
            cpu.touch(req.idents)
            c = 0
            while req.known > 1 and h + c < len(req.idents) and req.idents[h + c] in cpu.blocks:
                c += 1
            evictable = sum(1 for block in hits if block.ref == 0)
            if c > 0:
                if any(cpu.blocks[ident] > 0 for ident in req.idents[h:h + c]):
                    i += 1
                    continue
                if c + evictable > pool.num_blocks - rank.used_blocks:
                    break
                self.take_hits(rank, req, hits)
                for _ in range(c):
                    req.blocks.append(self.alloc_block(pool, rank))
                req.held_blocks = h + c
                for ident in req.idents[h:h + c]:
                    cpu.blocks[ident] += 1
                start = max(self.now, cpu.load_free)
                end = start + max(1, c * self.block_ns)
                cpu.load_free = end
                cpu.loading += 1
                req.off_state = "loading"
                req.off_hits, req.off_upto, req.off_next_stored = h, h + c, h + c
                req.load_ns += end - self.now
                self.loaded_blocks += c
                heapq.heappush(self.loads, (end, req.row))
                i += 1
                continue
            # no CPU hit: the prefix-caching admission (docs/prefix-caching.md)
            computed = h * bs
            n = min(req.known - computed, B)
            if pool.blocks_for(computed + n) - h + evictable > pool.num_blocks - rank.used_blocks:
                break
            del rank.waiting[i]
            rank.running.append(req)
            self.take_hits(rank, req, hits)
            req.computed = computed
            req.hit_tokens = computed
            self.schedule(pool, rank, batch, req, n)
            admitted.append(req)
            B -= n
        return B

    @staticmethod
    def take_hits(rank, req, hits):
        """Reference the hit blocks, in block order (cached ones leave the LRU queue)."""
        for block in hits:
            if block.ref == 0:
                del rank.lru[block]
                rank.used_blocks += 1
            block.ref += 1
        req.blocks = list(hits)
        req.held_blocks = len(hits)
        req.reg = len(hits)

    def offload_store_batch(self, pool, rank, batch, admitted):
        ids = {id(req) for req in admitted}
        new = [(req, n) for req, n, _ in batch if id(req) in ids and req.num_preemptions == 0]
        running = [(req, n) for req, n, _ in batch if id(req) not in ids]
        resumed = [(req, n) for req, n, _ in batch if id(req) in ids and req.num_preemptions > 0]
        for req, n in new + running + resumed:
            self.offload_store(pool, rank.cpu, req, req.computed + n)

    def offload_store(self, pool, cpu, req, tokens):
        upto = min(tokens // pool.block_size, len(req.idents))
        start = req.off_next_stored
        if upto <= start:
            return
        missing = [ident for ident in req.idents[start:upto] if ident not in cpu.blocks]
        evict = len(missing) - (cpu.capacity - len(cpu.blocks))
        if evict > 0:
            victims = [ident for ident, pins in cpu.blocks.items() if pins == 0][:evict]
            if len(victims) < evict:
                return  # vLLM skips the store
            for ident in victims:
                del cpu.blocks[ident]
        for ident in req.idents[start:upto]:
            if ident not in cpu.blocks and len(cpu.blocks) < cpu.capacity:
                cpu.blocks[ident] = 0
                self.stored_blocks += 1
        req.off_next_stored = upto
        if missing:
            cpu.touch(req.idents[:upto])

    def offload_result(self, req):
        if self.offload is None:
            return {}
        return dict(cpu_cached_tokens=req.cpu_first if req.first_admit_ns is not None else None,
                    kv_load_ns=req.load_ns)

    def offload_summary(self):
        if self.offload is None:
            return {}
        return dict(loaded_bytes=self.loaded_blocks * self.block_bytes,
                    stored_bytes=self.stored_blocks * self.block_bytes)
