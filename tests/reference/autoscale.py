"""Reference autoscaling (docs/autoscaling.md): which replicas of each pool are up.

Slow on purpose and independent of the kernel's state: the load a decision
reads is recounted from the simulator's objects (the router's ``outstanding``,
each rank's blocks in use), the latencies from each token's emission as the
simulator emits it, and the scaling log is a list of ``(instant ns, worker,
event)``.

Pools: the receiving one (aggregated, or P/D prefill: ``engine.autoscale``)
and the P/D decode pool (``engine.decode_autoscale``), each with its own
parameters; an unscaled pool's workers are ready from 0.

At an instant t, before the phases: the starting workers whose ready instant
is t become ready; then each pool at its decision instant (multiples of its
interval), the receiving pool first: the load is the sum over its ready and
draining workers of the metric (or, for ``ttft``/``itl``, their count x the
mean latency in ms of the tokens emitted since its previous decision: no
token, no decision), desired = ceil(load / target) within [min_replicas,
workers of the pool]; fewer active (ready or starting) than desired: resume
the lowest draining, else start the lowest off (ready after the startup, at
once if it is 0); more: cancel the highest starting, else drain the highest
ready.  After the phases at t, before (e): a draining worker with no request
at it, no pass and no KV transfer from or to its ranks is off.  Scaling
events are instants only while another event is pending.
"""

from __future__ import annotations

import math

OFF, STARTING, READY, DRAINING = "off", "starting", "ready", "draining"


def ms_ns(ms) -> int:
    """ms -> ns, rounding half to even (as simcore.units.ms_to_ns)."""
    return round(float(ms) * 1e6)


class ScaledPool:
    """One pool's controller parameters and its interval's latency samples."""

    def __init__(self, scale, first, count):
        self.metric = scale["metric"]
        self.target = float(scale["target"])
        self.interval = ms_ns(scale["interval_ms"])
        self.min = int(scale.get("min_replicas", 1))
        self.startup = ms_ns(scale["startup_ms"])
        self.first, self.count = first, count
        self.next_decision = self.interval
        self.samples = []  # latencies (ns) since the previous decision


class ReferenceAutoscaler:
    def __init__(self, sim, config):
        engine = config["engine"]
        self.sim = sim
        self.workers = len(sim.workers)
        pools = [(engine.get("autoscale") or {}, sim.recv_pool)]
        if sim.disaggregated:
            pools.append((engine.get("decode_autoscale") or {}, sim.emit_pool))
        self.status = [READY] * self.workers
        self.ready_at = [None] * self.workers
        self.pools = []
        self.log = []
        for scale, pool in pools:
            scaled = scale.get("metric", "none") != "none"
            for w in range(pool.first_worker, pool.first_worker + pool.W):
                if scaled and w - pool.first_worker >= int(scale.get("min_replicas", 1)):
                    self.status[w] = OFF
                else:
                    self.log += [(0, w, "start"), (0, w, "ready")]
            if scaled:
                self.pools.append(ScaledPool(scale, pool.first_worker, pool.W))

    def ready(self, w) -> bool:
        return self.status[w] == READY

    def emitted(self, req, t, index, previous_emit):
        """Token ``index`` of req emitted at t (previous_emit: the one before it, ns): the latency samples."""
        for pool in self.pools:
            if pool.metric == "ttft" and index == 0:
                pool.samples.append(t - req.send_ns)
            elif pool.metric == "itl" and index > 0:
                pool.samples.append(t - previous_emit)

    def next_time(self, t, horizon):
        """The earliest of t (the next event, or None) and the scaling events; ``horizon``: with no engine
        event, the last receipt (events after it do not happen; -1: none)."""
        events = [pool.next_decision for pool in self.pools] + [r for r in self.ready_at if r is not None]
        if horizon is not None:
            events = [e for e in events if e <= horizon]
        return min(events + ([] if t is None else [t]), default=None)

    def load(self, pool):
        total = 0.0
        for w in range(pool.first, pool.first + pool.count):
            if self.status[w] not in (READY, DRAINING):
                continue
            if pool.metric == "outstanding":
                total += self.sim.router.outstanding(w)
            else:
                worker = self.sim.workers[w]
                used = sum(rank.used_blocks for rank in worker.ranks)
                total += used / (worker.pool.num_blocks * len(worker.ranks))
        return total

    def step(self, t):
        for w in range(self.workers):
            if self.ready_at[w] == t:
                self.ready_at[w] = None
                self.status[w] = READY
                self.log.append((t, w, "ready"))
        for pool in self.pools:
            if pool.next_decision == t:
                pool.next_decision += pool.interval
                self.decide(pool, t)

    def decide(self, pool, t):
        workers = range(pool.first, pool.first + pool.count)
        if pool.metric in ("ttft", "itl"):
            samples, pool.samples = pool.samples, []
            if not samples:  # nothing measured: no decision
                return
            serving = sum(self.status[w] in (READY, DRAINING) for w in workers)
            high, low = divmod(sum(samples), 2**62)  # the kernel's two words, each converted exactly or rounded once
            load = serving * ((float(high) * float(2**62) + float(low)) / float(len(samples)) / 1e6)
        else:
            load = self.load(pool)
        ratio = load / pool.target
        desired = pool.count if ratio >= pool.count else min(max(math.ceil(ratio), pool.min), pool.count)
        active = sum(self.status[w] in (READY, STARTING) for w in workers)
        while active < desired:
            draining = [w for w in workers if self.status[w] == DRAINING]
            if draining:
                self.status[draining[0]] = READY
                self.log.append((t, draining[0], "ready"))
            else:
                w = next(w for w in workers if self.status[w] == OFF)
                self.log.append((t, w, "start"))
                if pool.startup == 0:
                    self.status[w] = READY
                    self.log.append((t, w, "ready"))
                else:
                    self.status[w] = STARTING
                    self.ready_at[w] = t + pool.startup
            active += 1
        while active > desired:
            starting = [w for w in workers if self.status[w] == STARTING]
            if starting:
                w = starting[-1]
                self.status[w] = OFF
                self.ready_at[w] = None
                self.log.append((t, w, "off"))
            else:
                w = max(w for w in workers if self.status[w] == READY)
                self.status[w] = DRAINING
                self.log.append((t, w, "drain"))
            active -= 1

    def drained(self, t):
        for w in range(self.workers):
            worker = self.sim.workers[w]
            if (self.status[w] == DRAINING and self.sim.router.outstanding(w) == 0 and worker.current is None
                    and all(rank.inflight == 0 for rank in worker.ranks)):
                self.status[w] = OFF
                self.log.append((t, w, "off"))


def scaling_summary(log, requests, goodput, gpus_per_replica, cap_ns):
    """The summary keys of an autoscaled run, from the reference's log and request dicts
    (``gpus_per_replica``: a number, or a list per worker)."""
    incomplete = any(r["status"] == "incomplete" for r in requests)
    if incomplete and cap_ns is not None:
        end = cap_ns
    else:
        ends = [r["last_recv_ns"] for r in requests if r["status"] == "completed"]
        ends += [r["end_ns"] for r in requests if r["status"] == "rejected"]
        end = max(ends, default=0)
    on_since, up_ns, gpu_ns = {}, 0, 0
    per_worker = isinstance(gpus_per_replica, (list, tuple))
    ready, level_ns, max_ready, last_t = 0, 0, 0, 0
    draining, ups, downs = set(), 0, 0
    for i, (t, w, event) in enumerate(log):
        if t > end:  # after the run's end: no cost, no replica
            continue
        level_ns += ready * (t - last_t)
        last_t = t
        if event == "start":
            on_since[w] = t
            ups += t > 0
        elif event == "off":
            span = t - on_since.pop(w)
            up_ns += span
            gpu_ns += span * (gpus_per_replica[w] if per_worker else 0)
            if w in draining:
                draining.discard(w)
            else:
                downs += t > 0
        elif event == "ready":
            ready += 1
            draining.discard(w)
        elif event == "drain":
            ready -= 1
            draining.add(w)
            downs += t > 0
        if i + 1 == len(log) or log[i + 1][0] != t:  # the level once the instant's events are done
            max_ready = max(max_ready, ready)
    level_ns += ready * (end - last_t)
    up_ns += sum(end - since for since in on_since.values())
    gpu_ns += sum((end - since) * (gpus_per_replica[w] if per_worker else 0) for w, since in on_since.items())
    attainment = None
    targets = {key: goodput.get(key) for key in ("ttft_ms", "tpot_ms", "e2el_ms")}
    if any(v is not None for v in targets.values()) and requests:
        good = sum(r["status"] == "completed" and all(
            target is None or _within(r, key, target) for key, target in targets.items()) for r in requests)
        attainment = good / len(requests)
    return {
        "gpu_seconds": gpu_ns / 1e9 if per_worker else up_ns / 1e9 * gpus_per_replica,
        "replica_seconds": up_ns / 1e9,
        "mean_ready_replicas": level_ns / end if end > 0 else None,
        "max_ready_replicas": max_ready,
        "scale_ups": ups,
        "scale_downs": downs,
        "slo_attainment": attainment,
    }


def _within(r, key, target):
    """A completed request's metric (vllm bench serve's definitions, ms) by ``key`` within ``target``."""
    if key == "ttft_ms":
        return (r["first_recv_ns"] - r["send_ns"]) / 1e6 <= target
    if key == "e2el_ms":
        return (r["last_recv_ns"] - r["send_ns"]) / 1e6 <= target
    if r["generated_tokens"] < 2:  # tpot does not apply
        return True
    return ((r["last_recv_ns"] - r["first_recv_ns"]) / 1e6) / (r["generated_tokens"] - 1) <= target
