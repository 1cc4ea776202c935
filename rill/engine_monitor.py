"""The launcher's view of the engine loop: a StatsQuery every poll, answered by the busy loop itself.

The busy loop answers a StatsQuery between two steps (engine_proc/core.py), so a fresh answer
proves the loop is alive, not just the process: the systemd watchdog pings on it, STATUS= shows
its figures, and the drain waits on it until the engine is idle.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

import zmq

from rill.asgi.engine_link.dp_router import total_stats
from rill.ipc import protocol as p
from rill.ipc.channels import RunPaths, make_socket

log = logging.getLogger("rill")
LAUNCHER_ID = "launcher"  # the launcher's worker id: the engine answers it on its own socket
FLUSH_S = 0.3  # after the engine's last delta, time for the workers to write the last chunks


def idle_alike(before: p.EngineStats | None, after: p.EngineStats) -> bool:
    """Both answers idle, with the same count of requests ended (finished, aborted, refused, timed out)."""
    def ended(stats: p.EngineStats) -> tuple[int, ...]:
        return stats.num_finished, stats.num_aborted, stats.num_rejected, stats.num_timed_out

    return (before is not None and before.num_running == before.num_waiting == 0
            and after.num_running == after.num_waiting == 0 and ended(before) == ended(after))


class EngineMonitor(threading.Thread):
    """Keeps at most one StatsQuery in flight; a new one goes out `poll_s` after the last."""

    def __init__(self, paths: RunPaths, engine_alive: Callable[[], bool], poll_s: float = 0.5,
                 resend_s: float = 10.0, num_engines: int = 1):
        super().__init__(name="engine-monitor", daemon=True)
        self.paths = paths
        self.engine_alive = engine_alive
        self.poll_s = poll_s
        self.resend_s = resend_s  # a query unanswered this long is sent again (a lost message)
        self.num_engines = num_engines  # --data-parallel-size: a query goes to each; `latest` sums them
        self.latest: p.EngineStats | None = None
        self.answered_at = float("-inf")  # time.monotonic() of the latest answer
        self.asked_at = float("-inf")  # and of the query it answers
        self._query_now = False
        self._cond = threading.Condition()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()  # other messages for the engine
        self._stopped = threading.Event()

    # ---- read by other threads ------------------------------------------------------------

    def answered_within(self, seconds: float) -> bool:
        """Did the busy loop answer in the last `seconds`?"""
        return time.monotonic() - self.answered_at <= seconds

    def wait_idle(self, timeout_s: float) -> bool:
        """True once an answer to a query sent after this call shows nothing running or waiting.

        False when `timeout_s` runs out, or the engine process is gone (nothing to wait for)."""
        self.poll_s = min(self.poll_s, 0.1)  # draining: look often
        start = time.monotonic()
        deadline = start + timeout_s
        with self._cond:
            before, before_at = self.latest, self.answered_at
            self._query_now = True
            while not (self.asked_at >= start and self.latest.num_running == 0 and self.latest.num_waiting == 0):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.engine_alive():
                    return False
                self._cond.wait(min(remaining, 0.2))
            # Idle already at the answer before, with no request ended since: the last delta went out before
            # that answer, and only what is left of FLUSH_S after it is waited.
            last_delta_at = before_at if idle_alike(before, self.latest) else time.monotonic()
        time.sleep(max(0.0, last_delta_at + FLUSH_S - time.monotonic()))
        return True

    def abort_all(self, worker_id: str = "") -> None:
        """Have the engine end every request now, or every one of API worker `worker_id` (see p.AbortAll)."""
        self._outbox.put(p.AbortAll(worker_id))

    def stop(self) -> None:
        self._stopped.set()

    # ---- the thread -----------------------------------------------------------------------

    def run(self) -> None:
        ctx = zmq.Context()
        outs = [make_socket(ctx, zmq.PUSH, self.paths.engine_input_for(rank), bind=False)
                for rank in range(self.num_engines)]
        inbox = make_socket(ctx, zmq.PULL, self.paths.worker_output(LAUNCHER_ID), bind=True)
        answers: dict[int, p.EngineStats] = {}
        sent_at: float | None = None  # when the query in flight went out
        next_query = 0.0
        try:
            while not self._stopped.is_set():
                while not self._outbox.empty():
                    message = p.input_encoder.encode(self._outbox.get_nowait())
                    for out in outs:
                        out.send(message)
                now = time.monotonic()
                due = self._query_now or now >= next_query
                if (sent_at is None and due) or (sent_at is not None and now - sent_at > self.resend_s):
                    self._query_now = False
                    answers = {}
                    for out in outs:
                        out.send(p.input_encoder.encode(p.StatsQuery(LAUNCHER_ID)))
                    sent_at, next_query = now, now + self.poll_s
                if inbox.poll(50):
                    answer = p.output_decoder.decode(inbox.recv())
                    answers[answer.data_parallel_rank] = answer
                    if len(answers) < self.num_engines:
                        continue
                    stats = total_stats([answers[rank] for rank in sorted(answers)])
                    with self._cond:
                        self.latest, self.answered_at = stats, time.monotonic()
                        self.asked_at = self.asked_at if sent_at is None else sent_at  # None: a resend's twin
                        self._cond.notify_all()
                    sent_at = None
        except Exception:
            log.exception("the engine monitor stopped")
        finally:
            for out in outs:
                out.close()
            inbox.close()
            ctx.term()
