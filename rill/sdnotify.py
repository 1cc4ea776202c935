"""systemd's sd_notify protocol, spoken by the launcher: READY=1, STATUS=, STOPPING=1, WATCHDOG=1.

Without $NOTIFY_SOCKET every call is a no-op. The variables are taken out of the environment
at start, so the engine and the Granian workers never talk to systemd: only the main process
may (systemd's default NotifyAccess=main).

What is said when (ServiceReporter):
- READY=1 once the engine's busy loop has answered a StatsQuery and a Granian worker answers
  HTTP on the listening socket (checked with a real request), never before.
- STATUS= with requests running and waiting and tokens/s, updated as they change.
- WATCHDOG=1 every WATCHDOG_USEC/2, but only while the busy loop answered within that half
  period: a hung engine stops the pings, so systemd restarts the service after WatchdogSec
  (at most 1.5 x WatchdogSec after the engine's last answer). Pings resume as soon as the loop
  answers again. The engine's longest step must stay well under WatchdogSec/2.
- STOPPING=1 when a drain starts; the watchdog stays on while draining (systemd's does too).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque

from rill.engine_monitor import EngineMonitor
from rill.listening import Listener

log = logging.getLogger("rill")
NOTIFY_VARS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
RATE_WINDOW_S = 5.0  # tokens/s in STATUS= is averaged over this long


class Notifier:
    """Sends sd_notify datagrams to a Unix socket: a path, or an abstract name (leading '@')."""

    def __init__(self, address: str | None, watchdog_usec: int = 0):
        if address is not None and not address.startswith(("/", "@")):
            log.warning("NOTIFY_SOCKET=%s: only Unix socket paths and abstract names are supported", address)
            address = None
        self.address = address
        self.watchdog_s = watchdog_usec / 1e6 if address else 0.0  # systemd's WatchdogSec; 0: off
        self._target = None if address is None else ("\0" + address[1:] if address[0] == "@" else address)
        self._sock = None if address is None else socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._warned = False

    @classmethod
    def from_env(cls, environ: dict | None = None) -> Notifier:
        """Takes the variables out of `environ` (os.environ by default), so children never see them."""
        environ = os.environ if environ is None else environ
        address, usec, pid = (environ.pop(name, "") for name in NOTIFY_VARS)
        # WATCHDOG_PID names the process systemd watches; a watchdog meant for another is not ours.
        watchdog_usec = int(usec) if usec.isdigit() and pid in ("", str(os.getpid())) else 0
        return cls(address or None, watchdog_usec)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str) -> None:
        """One datagram of newline-separated fields; a failure is logged once, never raised."""
        if self._sock is None:
            return
        try:
            self._sock.sendto("\n".join(fields).encode(), self._target)
        except OSError as exc:
            if not self._warned:
                log.warning("sd_notify to %s failed: %s", self.address, exc)
                self._warned = True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class ServiceReporter(threading.Thread):
    """Tells systemd how the service is doing, from the launcher (see the module docstring)."""

    def __init__(self, notifier: Notifier, monitor: EngineMonitor, model_id: str, listener: Listener):
        super().__init__(name="sd-notify", daemon=True)
        self.notifier = notifier
        self.monitor = monitor
        self.model_id = model_id
        self.listener = listener
        self.ping_interval_s = notifier.watchdog_s / 2
        self.tick_s = min(1.0, self.ping_interval_s / 2) if self.ping_interval_s else 1.0
        self.draining = False
        self._samples: deque[tuple[float, int]] = deque()  # (answered_at, num_generated_tokens)
        self._samples_lock = threading.Lock()  # the drain thread renders a status too
        self._stopped = threading.Event()

    def stopping(self) -> None:
        self.draining = True
        self.notifier.send("STOPPING=1", f"STATUS={self.status_text()}")

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        if not self.notifier.enabled or not self._wait_until_serving():
            return
        self.notifier.send("READY=1", f"STATUS={self.status_text()}")
        log.info("told systemd READY=1")
        last_status = ""
        next_ping = 0.0
        while not self._stopped.is_set():
            now = time.monotonic()
            if self.ping_interval_s and now >= next_ping and self.monitor.answered_within(self.ping_interval_s):
                self.notifier.send("WATCHDOG=1")
                next_ping = now + self.ping_interval_s
            if (text := self.status_text()) != last_status:
                self.notifier.send(f"STATUS={text}")
                last_status = text
            self._stopped.wait(self.tick_s)

    def _wait_until_serving(self) -> bool:
        while not self._stopped.is_set() and not self.draining:
            if self.monitor.latest is not None and self.listener.answers():
                return True
            self._stopped.wait(0.1)
        return False

    def status_text(self) -> str:
        stats = self.monitor.latest
        prefix = f"{self.model_id}: " + ("draining, " if self.draining else "")
        if stats is None:
            return prefix + "starting"
        silent_s = time.monotonic() - self.monitor.answered_at
        if silent_s > max(2.0, 4 * self.monitor.poll_s, self.ping_interval_s):
            return prefix + f"engine loop not answering for {silent_s:.0f} s"
        return (prefix + f"{stats.num_running} running, {stats.num_waiting} waiting, "
                f"{self._tokens_per_s(stats.num_generated_tokens):.1f} tokens/s")

    def _tokens_per_s(self, num_generated: int) -> float:
        with self._samples_lock:
            samples = self._samples
            if not samples or samples[-1][0] != self.monitor.answered_at:
                samples.append((self.monitor.answered_at, num_generated))
            while len(samples) > 2 and samples[-1][0] - samples[1][0] >= RATE_WINDOW_S:
                samples.popleft()
            (t0, n0), (t1, n1) = samples[0], samples[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0
