"""Reference routing (docs/routing.md): which worker, then which rank, takes a request.

Slow on purpose and independent of the kernel's counters: every load a decision
reads is recounted from the simulator's request and rank objects at that
instant (where each request is now, what its rank runs and holds).

Decisions: the worker at the client's send (receiving pool) or at the handoff
(decode pool); the rank by the pool's ``rank_policy``: round robin over the
worker's requests in routing order (at the worker decision), or vLLM's DP load
balancer at the engine arrival (decode pool: at the handoff).  Ties go to the
first candidate of a scan starting at the decision's number (send k, handoff h)
modulo the candidates; least-loaded ranks scan from a start that moves by one
per decision at the worker.  ``random`` and ``power_of_two`` take the wrapper's
seeded draws (simcore.engine.router.route_draws): randomness is an input.
"""

from __future__ import annotations

from collections import defaultdict

from simcore.engine.router import DECODE_STREAM, RECEIVING_STREAM, route_draws

SEEDED = ("random", "power_of_two")


class ReferenceRouter:
    def __init__(self, sim, config):
        engine = config["engine"]
        router = engine.get("router") or {}
        weights = router.get("weights") or {}
        self.sim = sim
        self.policy = router.get("policy", "round_robin")
        self.decode_policy = (engine.get("decode_router") or {}).get("policy", "round_robin")
        self.weights = (float(weights.get("prefix", 3.0)), float(weights.get("queue", 2.0)),
                        float(weights.get("kv_cache", 2.0)))
        pools = [sim.recv_pool] + ([sim.emit_pool] if sim.disaggregated else [])
        self.rank_policy = {pool.name: (engine[pool.name].get("rank_policy") or "round_robin") for pool in pools}
        self.active = (self.policy != "round_robin" or self.decode_policy != "round_robin"
                       or any(p != "round_robin" for p in self.rank_policy.values()))
        n, seed = len(sim.requests), int(config.get("seed") or 0)
        self.draws = (route_draws(seed, RECEIVING_STREAM, n, sim.recv_pool.W).tolist()
                      if self.policy in SEEDED else None)
        self.decode_draws = (route_draws(seed, DECODE_STREAM, n, sim.emit_pool.W).tolist()
                             if sim.disaggregated and self.decode_policy in SEEDED else None)
        self.rr_rank = defaultdict(int)  # worker -> requests routed to it so far
        self.scan = defaultdict(int)     # worker -> least-loaded decisions so far
        self.decode_choice = {}          # handoff h -> (global worker, rank index)
        self.eligible = lambda w: True   # autoscaling: only ready workers take requests

    # ------------------------------------------------------------ where requests are

    def location(self, req):
        """(global worker, rank index or -1, past its prompt) of a request at a worker now, else None."""
        sim = self.sim
        if req.send_ns is None or req.rejected or req.retry_wait:
            return None
        finished = bool(req.tokens) and req.tokens[-1][2]
        if not sim.disaggregated:
            return None if finished else (req.worker, req.rank, req.first_emit_ns is not None)
        if req.handoff is None:
            return req.worker, req.rank, False
        if req.handoff not in self.decode_choice or finished:
            return None  # being routed now, or done
        w, r = self.decode_choice[req.handoff]
        return w, r, req.first_emit_ns is not None

    def at_worker(self, w):
        return [(req, loc) for req in self.sim.requests if (loc := self.location(req)) is not None and loc[0] == w]

    def outstanding(self, w):
        return len(self.at_worker(w))

    def tokens(self, w):
        """least_tokens: prompt tokens of requests not past their prompt, plus KV in use, tokens."""
        worker = self.sim.workers[w]
        pending = sum(req.input_tokens for req, loc in self.at_worker(w) if not loc[2])
        return pending + sum(rank.used_blocks for rank in worker.ranks) * worker.pool.block_size

    def running(self, w):
        return sum(len(rank.running) for rank in self.sim.workers[w].ranks)

    def rank_load(self, w, r):
        return sum(1 for _, loc in self.at_worker(w) if loc[1] == r)

    # ------------------------------------------------------------ decisions

    def pick(self, policy, seq, pool, draws, req):
        first, count = pool.first_worker, pool.W
        if policy == "round_robin":
            ready = [w for w in range(first, first + count) if self.eligible(w)]
            return ready[seq % len(ready)]
        if policy == "random":
            return first + draws[2 * seq]
        if policy == "power_of_two":
            a, b = first + draws[2 * seq], first + draws[2 * seq + 1]
            return b if self.outstanding(b) < self.outstanding(a) else a
        order = [w for i in range(count) if self.eligible(w := first + (seq + i) % count)]
        if policy == "least_outstanding":
            return min(order, key=self.outstanding)
        if policy == "least_tokens":
            return min(order, key=self.tokens)
        assert policy == "prefix_aware", policy
        return max(order, key=lambda w: self.prefix_score(w, req, range(first, first + count)))

    def prefix_score(self, w, req, candidates):
        """llm-d's weighted scorer sum (prefix match, queue, KV utilisation)."""
        queued = {c: self.outstanding(c) - self.running(c) for c in candidates}
        low, high = min(queued.values()), max(queued.values())
        queue = 1.0 if high == low else (high - queued[w]) / (high - low)
        worker = self.sim.workers[w]
        match = 0
        for rank in worker.ranks:
            j = 0
            while j < len(req.idents) and req.idents[j] in rank.resident:
                j += 1
            match = max(match, j)
        prefix = match / len(req.idents) if req.idents else 0.0
        used = sum(rank.used_blocks for rank in worker.ranks)
        capacity = worker.pool.num_blocks * worker.pool.R
        wp, wq, wkv = self.weights
        return wp * prefix + wq * queue + wkv * (1.0 - used / capacity)

    def round_robin_rank(self, w):
        r = self.rr_rank[w] % self.sim.workers[w].pool.R
        self.rr_rank[w] += 1
        return r

    def least_loaded_rank(self, w):
        """vLLM's DPLBAsyncMPClient.get_core_engine_for_request on exact counts."""
        pool = self.sim.workers[w].pool
        start = self.scan[w] % pool.R
        self.scan[w] += 1
        best, best_score = None, None
        for i in range(pool.R):
            r = (start + i) % pool.R
            rank = self.sim.workers[w].ranks[r]
            load = self.rank_load(w, r)
            waiting = load - len(rank.running)
            score = float(load)
            if waiting > 0:
                score += waiting * 6.0 * max(0.0, rank.used_blocks / pool.num_blocks - 0.5)
            if best is None or score < best_score:
                best, best_score = r, score
        return best

    # ------------------------------------------------------------ hooks

    def on_send(self, req):
        pool = self.sim.recv_pool
        seq = req.row if self.sim.sessions is None else req.send_seq  # sessions: the send sequence number
        req.worker = req.rank = -1  # not placed before this decision (sessions placed it round robin)
        req.worker = self.pick(self.policy, seq, pool, self.draws, req)
        if self.rank_policy[pool.name] == "round_robin":
            req.rank = self.round_robin_rank(req.worker)

    def on_arrival(self, req):
        if req.rank == -1:
            req.rank = self.least_loaded_rank(req.worker)

    def on_handoff(self, req, h):
        pool = self.sim.emit_pool
        w = self.pick(self.decode_policy, h, pool, self.decode_draws, req)
        if self.rank_policy[pool.name] == "round_robin":
            r = self.round_robin_rank(w)
        else:
            r = self.least_loaded_rank(w)
        self.decode_choice[h] = (w, r)
