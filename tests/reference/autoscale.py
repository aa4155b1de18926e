"""Reference autoscaling (docs/autoscaling.md): which replicas of the aggregated pool are up.

Slow on purpose and independent of the kernel's state: the load a decision
reads is recounted from the simulator's objects (the router's ``outstanding``,
each rank's blocks in use), and the scaling log is a list of
``(instant ns, worker, event)``.

At an instant t, before the phases: the starting workers whose ready instant
is t become ready; at a decision instant (multiples of the interval) the load
is the sum over ready and draining workers of the metric, desired =
ceil(load / target) within [min_replicas, workers]; fewer active (ready or
starting) than desired: resume the lowest draining, else start the lowest off
(ready after the startup, at once if it is 0); more: cancel the highest
starting, else drain the highest ready.  After the phases at t, before (e):
a draining worker with no request at it and no pass is off.  Scaling events
are instants only while another event is pending.
"""

from __future__ import annotations

import math

OFF, STARTING, READY, DRAINING = "off", "starting", "ready", "draining"


def ms_ns(ms) -> int:
    """ms -> ns, rounding half to even (as simcore.units.ms_to_ns)."""
    return round(float(ms) * 1e6)


class ReferenceAutoscaler:
    def __init__(self, sim, config):
        scale = config["engine"]["autoscale"]
        self.sim = sim
        self.metric = scale["metric"]
        self.target = float(scale["target"])
        self.interval = ms_ns(scale["interval_ms"])
        self.min = int(scale["min_replicas"])
        self.startup = ms_ns(scale["startup_ms"])
        self.workers = sim.recv_pool.W
        self.status = [READY if w < self.min else OFF for w in range(self.workers)]
        self.ready_at = [None] * self.workers
        self.next_decision = self.interval
        self.log = []
        for w in range(self.min):
            self.log += [(0, w, "start"), (0, w, "ready")]

    def ready(self, w) -> bool:
        return self.status[w] == READY

    def next_time(self, t, horizon):
        """The earliest of t (the next event, or None) and the scaling events; ``horizon``: with no engine
        event, the last receipt (events after it do not happen; -1: none)."""
        events = [self.next_decision] + [r for r in self.ready_at if r is not None]
        if horizon is not None:
            events = [e for e in events if e <= horizon]
        return min(events + ([] if t is None else [t]), default=None)

    def load(self):
        total = 0.0
        for w in range(self.workers):
            if self.status[w] not in (READY, DRAINING):
                continue
            if self.metric == "outstanding":
                total += self.sim.router.outstanding(w)
            else:
                ranks = self.sim.workers[w].ranks
                used = sum(rank.used_blocks for rank in ranks)
                total += used / (self.sim.recv_pool.num_blocks * len(ranks))
        return total

    def step(self, t):
        for w in range(self.workers):
            if self.ready_at[w] == t:
                self.ready_at[w] = None
                self.status[w] = READY
                self.log.append((t, w, "ready"))
        if self.next_decision != t:
            return
        self.next_decision += self.interval
        ratio = self.load() / self.target
        desired = self.workers if ratio >= self.workers else min(max(math.ceil(ratio), self.min), self.workers)
        active = sum(s in (READY, STARTING) for s in self.status)
        while active < desired:
            draining = [w for w in range(self.workers) if self.status[w] == DRAINING]
            if draining:
                self.status[draining[0]] = READY
                self.log.append((t, draining[0], "ready"))
            else:
                w = self.status.index(OFF)
                self.log.append((t, w, "start"))
                if self.startup == 0:
                    self.status[w] = READY
                    self.log.append((t, w, "ready"))
                else:
                    self.status[w] = STARTING
                    self.ready_at[w] = t + self.startup
            active += 1
        while active > desired:
            starting = [w for w in range(self.workers) if self.status[w] == STARTING]
            if starting:
                w = starting[-1]
                self.status[w] = OFF
                self.ready_at[w] = None
                self.log.append((t, w, "off"))
            else:
                w = max(w for w in range(self.workers) if self.status[w] == READY)
                self.status[w] = DRAINING
                self.log.append((t, w, "drain"))
            active -= 1

    def drained(self, t):
        for w in range(self.workers):
            if (self.status[w] == DRAINING and self.sim.router.outstanding(w) == 0
                    and self.sim.workers[w].current is None):
                self.status[w] = OFF
                self.log.append((t, w, "off"))


def scaling_summary(log, requests, goodput, gpus_per_replica, cap_ns):
    """The summary keys of an autoscaled run, from the reference's log and request dicts."""
    incomplete = any(r["status"] == "incomplete" for r in requests)
    if incomplete and cap_ns is not None:
        end = cap_ns
    else:
        ends = [r["last_recv_ns"] for r in requests if r["status"] == "completed"]
        ends += [r["end_ns"] for r in requests if r["status"] == "rejected"]
        end = max(ends, default=0)
    on_since, up_ns = {}, 0
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
            up_ns += t - on_since.pop(w)
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
    attainment = None
    targets = {key: goodput.get(key) for key in ("ttft_ms", "tpot_ms", "e2el_ms")}
    if any(v is not None for v in targets.values()) and requests:
        good = sum(r["status"] == "completed" and all(
            target is None or _within(r, key, target) for key, target in targets.items()) for r in requests)
        attainment = good / len(requests)
    return {
        "gpu_seconds": up_ns / 1e9 * gpus_per_replica,
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
