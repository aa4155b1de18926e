"""Reference worker failures (docs/failures.md): a worker lost, its requests retried or failed.

Slow on purpose: the requests at a failed worker are found from the
simulator's rank objects and its arrival heap; the random failures' gaps are
the wrapper's seeded draws (``simcore.engine.router.failure_gaps``):
randomness is an input.

At an instant t, before the phases: repairs ending at t (the worker is up:
event ``ready``, its next random failure after the next gap), then the fixed
failures at t, then the random ones by worker; a failure of a worker that is
up cuts its pass (recorded as ending at t), drops its KV and loses every
request at it (running, waiting, in its tokenizer): the request's tokens and
engine instants are cleared, its failures count one more, and its client
retries it after ``min(delay x 2^(i-1), max_delay)`` while ``i <=
max_retries`` (``retry``), else it is rejected at t.  Retries are sends at
their instants, after the table's sends, by row; the send instant stays the
first.  A send with no worker up is lost at once.  Failure and repair
instants are events only while another event is pending.
"""

from __future__ import annotations

import heapq
from collections import deque

from simcore.engine.router import FAILURE_GAPS, failure_gaps


def ms_ns(ms) -> int:
    return round(float(ms) * 1e6)


class ReferenceFailures:
    def __init__(self, sim, config):
        fail = config["engine"]["failures"]
        self.sim = sim
        self.workers = sim.recv_pool.W
        self.fixed = sorted((ms_ns(at_ms), int(w)) for w, at_ms in fail.get("at") or [])
        self.repair = ms_ns(fail["repair_ms"])
        self.retry = (fail.get("on_failure") or "retry") == "retry"
        self.max_retries = int(fail.get("max_retries", 2))
        self.delay = ms_ns(fail.get("retry_delay_ms", 500.0))
        self.max_delay = ms_ns(fail.get("max_retry_delay_ms", 8000.0))
        self.gaps = None
        if fail.get("mtbf_ms") is not None:
            flat = failure_gaps(int(config.get("seed") or 0), self.workers, float(fail["mtbf_ms"])).tolist()
            self.gaps = [flat[w * FAILURE_GAPS:(w + 1) * FAILURE_GAPS] for w in range(self.workers)]
        self.up = [True] * self.workers
        self.repair_at = [None] * self.workers
        self.next_random = [g[0] for g in self.gaps] if self.gaps else [None] * self.workers
        self.gap_index = [1] * self.workers
        self.retries = []  # heap of (instant, row)
        self.count = 0
        self.log = []
        for w in range(self.workers):
            self.log += [(0, w, "start"), (0, w, "ready")]

    def ready(self, w) -> bool:
        return self.up[w]

    def next_time(self, t, horizon):
        """The earliest of t (the next event, or None) and the failures' events; ``horizon``: with no engine
        event, the last receipt (events after it do not happen; -1: none)."""
        events = [r for r in self.repair_at if r is not None] + [r for r in self.next_random if r is not None]
        if self.fixed:
            events.append(self.fixed[0][0])
        if horizon is not None:
            events = [e for e in events if e <= horizon]
        return min(events + ([] if t is None else [t]), default=None)

    def step(self, t):
        for w in range(self.workers):
            if self.repair_at[w] == t:
                self.repair_at[w] = None
                self.up[w] = True
                self.log.append((t, w, "ready"))
                if self.gaps and self.gap_index[w] < FAILURE_GAPS:
                    self.next_random[w] = t + self.gaps[w][self.gap_index[w]]
                    self.gap_index[w] += 1
        while self.fixed and self.fixed[0][0] == t:
            _, w = self.fixed.pop(0)
            if self.up[w]:
                self.fail(w, t)
        for w in range(self.workers):
            if self.next_random[w] == t and self.up[w]:
                self.fail(w, t)

    def fail(self, w, t):
        sim = self.sim
        worker = sim.workers[w]
        self.up[w] = False
        self.count += 1
        self.repair_at[w] = t + self.repair
        self.next_random[w] = None
        self.log.append((t, w, "fail"))
        p = worker.current
        if p is not None:  # the pass is cut: recorded as ending now
            for r in range(worker.pool.R):
                rec = dict(worker=w, rank=r, start_ns=p.start_ns, end_ns=t)
                rec.update((key, value) for key, value in p.summaries[r].items()
                           if key not in ("decode_kv_max", "draft_tokens"))
                rec["rank_time_ms"] = p.times_ms[r]
                rec["blocks_in_use"] = p.blocks[r]
                rec["pool"] = worker.pool.name
                sim.pass_records.append(rec)
        worker.current = None
        worker.queued = None
        lost = []
        for rank in worker.ranks:
            lost += list(rank.running) + list(rank.waiting)
            rank.running = []
            rank.waiting = deque()
            rank.used_blocks = 0
            rank.chunked = None
            rank.extend = False
            if worker.pool.policy == "sglang":
                rank.new_token_ratio = worker.pool.ratio_init
        kept = []
        for entry in sim.arrivals:  # its tokenizer's jobs
            req = sim.requests[entry[2]]
            if req.worker == w:
                lost.append(req)
            else:
                kept.append(entry)
        heapq.heapify(kept)
        sim.arrivals = kept
        worker.tok_free = [t] * len(worker.tok_free)
        for req in lost:
            self.lose(req, t)

    def lose(self, req, t):
        sim = self.sim
        for entry in sim.receipts:  # its tokens on their way to the client are gone with it
            entry[2][:] = [item for item in entry[2] if item[0] is not req]
        sim.receipts = [entry for entry in sim.receipts if entry[2]]
        heapq.heapify(sim.receipts)
        req.failures += 1
        req.computed = req.generated = req.held_blocks = req.placeholders = req.drafts = 0
        req.epoch += 1
        req.blocks = []
        req.reg = req.hit_tokens = 0
        req.cached_tokens = None
        req.tokens = []
        req.arrival_ns = req.first_admit_ns = req.prompt_done_ns = req.first_emit_ns = None
        req.first_recv_ns = req.last_recv_ns = None
        req.rank = -1  # its worker stays the one it was lost on (or last sent to) until it is sent again
        if self.retry and req.failures <= self.max_retries:
            req.retry_wait = True
            delay = self.delay
            for _ in range(req.failures - 1):
                delay = min(delay * 2, self.max_delay)
            heapq.heappush(self.retries, (t + min(delay, self.max_delay), req.row))
        else:
            req.retry_wait = False
            sim.reject(req, t)
