"""--scheduling-policy priority: which waiting request goes first, and which running one gives way.

vLLM's semantics: a request's `priority` (0 by default) orders the queue, lower first, and arrival
breaks ties. Waiting lowers a request's effective priority by one every `aging_s` seconds, so that a
steady stream of urgent requests delays bulk work but never starves it: a request that has waited
aging_s * (its priority - theirs) seconds goes before newcomers of any better priority.

When the best waiting request cannot be admitted (every seat taken, or too few free blocks), running
requests of a strictly worse effective priority are preempted for it, the worst first (their KV is
freed and recomputed when they come back, as after any preemption). A step preempts at most
MAX_PREEMPTIONS_PER_STEP of them.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from rill.engine_proc.sched.request import EngineRequest, RequestState

POLICIES = ("fcfs", "priority")
DEFAULT_AGING_S = 60.0
MAX_PREEMPTIONS_PER_STEP = 4
MAX_PRIORITY = 1 << 20  # |priority| a request may ask for: aging counts in these units


class PriorityOrder:
    def __init__(self, aging_s: float = DEFAULT_AGING_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.aging_s = aging_s
        self.clock = clock
        self.now = 0.0  # the clock at this step's start: every key of a step is taken at one instant

    def start_step(self) -> None:
        self.now = self.clock()

    def effective(self, req: EngineRequest) -> int:
        priority = req.params.priority
        if self.aging_s > 0 and req.arrival_s:
            priority -= int((self.now - req.arrival_s) / self.aging_s)
        return priority

    def key(self, req: EngineRequest) -> tuple[int, float]:
        return self.effective(req), req.arrival_s

    def first(self, waiting: Iterable[EngineRequest]) -> EngineRequest | None:
        """The waiting request to admit next (requests whose grammar still compiles passed over); among
        equals, the first in queue order (a preempted request is put back at the front)."""
        best, best_key = None, None
        for req in waiting:
            if req.state is RequestState.WAITING_FOR_GRAMMAR:
                continue
            key = self.key(req)
            if best_key is None or key < best_key:
                best, best_key = req, key
        return best

    def best_first(self, running: Iterable[EngineRequest]) -> list[EngineRequest]:
        """Running requests, best first: the last is the first to give way (sorted() is stable, so
        equals keep their admission order, as under FCFS)."""
        return sorted(running, key=self.key)


    def make_room(self, waiting: Iterable[EngineRequest], running: Iterable[EngineRequest],
                  would_admit: Callable[[EngineRequest], bool], preempt: Callable[[EngineRequest], None]) -> None:
        """Preempts running requests of a worse effective priority than the best waiting one, the worst first,
        until that one would be admitted (a seat and its first chunk's blocks), at most MAX_PREEMPTIONS_PER_STEP."""
        best = self.first(waiting)
        if best is None:
            return
        wanted = self.effective(best)
        victims = self.best_first(running)
        for _ in range(MAX_PREEMPTIONS_PER_STEP):
            if would_admit(best) or not victims or self.effective(victims[-1]) <= wanted:
                return
            preempt(victims.pop())


def priority_order(policy: str, aging_s: float) -> PriorityOrder | None:
    """The scheduler's order for --scheduling-policy (None: first come, first served)."""
    assert policy in POLICIES, policy
    return PriorityOrder(aging_s) if policy == "priority" else None


MAX_PRIORITY_LABELS = 16  # /metrics' priority label values: the lowest 15 priorities present, then "other"


def priority_figures(running: Iterable[EngineRequest], waiting: Iterable[EngineRequest]) -> dict[str, list[int]]:
    """{priority: [running, waiting]} by the priority each request asked for (not aged), the lowest
    MAX_PRIORITY_LABELS - 1 priorities present each under its own key and the rest summed under "other":
    clients choose priorities, and a label per value would let them grow /metrics without bound."""
    counts: dict[int, list[int]] = {}
    for column, requests in enumerate((running, waiting)):
        for req in requests:
            counts.setdefault(req.params.priority, [0, 0])[column] += 1
    figures: dict[str, list[int]] = {}
    for i, priority in enumerate(sorted(counts)):
        key = str(priority) if i < MAX_PRIORITY_LABELS - 1 else "other"
        pair = figures.setdefault(key, [0, 0])
        pair[0] += counts[priority][0]
        pair[1] += counts[priority][1]
    return figures
