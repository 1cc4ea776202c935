"""Granian as `rill serve` runs it: SIGTERM, SIGINT and SIGHUP drain before the workers stop, a
worker that died is replaced once its engine requests are ended, and every worker dies with the
launcher from the moment it is forked."""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import threading
from pathlib import Path

from rill.engine_monitor import EngineMonitor
from rill.ipc.channels import RunPaths
from rill.ipc.config import Config, HttpConfig
from rill.ipc.lifetime import PR_SET_PDEATHSIG
from rill.listening import Listener
from rill.sdnotify import ServiceReporter

log = logging.getLogger("rill")
ABORT_WAIT_S = 5.0  # after the drain timed out: for the engine to end what is left


def make_draining_granian():
    """Granian, but SIGTERM/SIGINT/SIGHUP first drain in-flight requests, then stop the workers,
    and a worker that died is replaced after its engine requests were ended.

    Granian's own worker shutdown stops the worker's event loop while it waits for open
    connections, so a stream in progress could never finish there; we finish them first.
    """
    from granian import Granian

    class DrainingGranian(Granian):
        def __init__(self, paths: RunPaths, timeout_s: float, monitor: EngineMonitor, reporter: ServiceReporter,
                     *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.paths = paths
            self.monitor = monitor
            self.reporter = reporter
            self.drain_timeout_s = timeout_s
            self.drain_thread: threading.Thread | None = None
            self.listen_fd = -1

        def signal_handler_interrupt(self, *args, **kwargs):
            if self.drain_thread is not None:  # a second signal: stop now
                log.warning("second stop signal: stopping without waiting")
                return super().signal_handler_interrupt()
            self.drain_thread = threading.Thread(target=self._drain_then_stop, name="drain", daemon=True)
            self.drain_thread.start()

        def signal_handler_reload(self, *args, **kwargs):
            """SIGHUP (a terminal hangup, `kill -HUP`): a drain and a stop, as SIGTERM. Granian's
            reload respawned the workers with no drain: streams were cut without an error event or
            [DONE], and their engine requests ran on for nobody. Nothing here is reloadable
            without a restart (the flags, the model), so a stop is what the signal can mean."""
            if os.getpid() != self.pid:  # a worker, forked with this handler: not its call to make
                return
            log.info("SIGHUP: stopping as on SIGTERM")
            self.signal_handler_interrupt()

        def _respawn_workers(self, workers, *args, **kwargs):
            """A worker that died (Granian's respawn_failed_workers) leaves engine requests whose
            deltas go nowhere: the engine ends them (each engine request names its worker, whose
            id is its pid)."""
            old = [self.wrks[idx].inner for idx in workers]
            for proc in old:
                if not proc.is_alive():
                    log.error("API worker %d died (exit code %s); ending its requests, starting another",
                              proc.pid, proc.exitcode)
                    self.monitor.abort_all(worker_id=str(proc.pid))
            alive = [proc for proc in old if proc.is_alive()]
            super()._respawn_workers(workers, *args, **kwargs)
            for proc in alive:  # replaced alive: Granian stopped it, and its streams with it
                self.monitor.abort_all(worker_id=str(proc.pid))

        def _init_shared_socket(self):
            """systemd's socket (socket activation) or the launcher's (rill/listening.py reserve_port); else
            Granian's own (a Unix socket)."""
            if self.listen_fd < 0:
                return super()._init_shared_socket()
            from granian._granian import SocketHolder

            sock = socket.socket(fileno=os.dup(self.listen_fd))
            self._shd = SocketHolder(self.listen_fd, sock.family == socket.AF_UNIX, self.backlog)
            self._sfd, self._ssp = self.listen_fd, None
            sock.set_inheritable(True)
            self._sso = sock  # as Granian's own shared socket: inherited by the workers, closed at the end

        def _drain_then_stop(self) -> None:
            self.paths.draining_flag.touch()
            self.reporter.stopping()
            log.info("draining: waiting up to %.0f s for in-flight requests", self.drain_timeout_s)
            if not self.monitor.wait_idle(self.drain_timeout_s) and self.monitor.engine_alive():
                # The engine ends each with an ABORT delta; its worker sends an error event and [DONE].
                stats = self.monitor.latest
                log.warning("%d requests still running after %.0f s; ending them with an error",
                            stats.num_running + stats.num_waiting if stats else -1, self.drain_timeout_s)
                self.monitor.abort_all()
                self.monitor.wait_idle(ABORT_WAIT_S)
            super().signal_handler_interrupt()

    return DrainingGranian


def http1_settings(timeout_keep_alive_s: float):
    """Granian's HTTP/1 header read timeout is also how long an idle keep-alive connection lives."""
    from granian.http import HTTP1Settings

    if timeout_keep_alive_s <= 0:
        return HTTP1Settings(keep_alive=False)
    return HTTP1Settings(header_read_timeout=max(1, round(timeout_keep_alive_s * 1000)))


def die_with_launcher_when_forked() -> None:
    """Each API worker Granian forks dies with the launcher from its first instant. Its lifespan
    asks for that too (asgi/app.py), but only once the app is imported, seconds later: a launcher
    killed in between left the worker running with PPID 1. libc is loaded here, before any fork."""
    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:  # not Linux: the lifespan's watcher thread does it
        return
    launcher = os.getpid()

    def in_child() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != launcher:  # it died before the request took hold
            os._exit(1)

    os.register_at_fork(after_in_child=in_child)


def listen_settings(http: HttpConfig, listener: Listener) -> dict:
    """Granian's arguments for where (rill/listening.py) and with which TLS it serves."""
    from granian.constants import SSLProtocols

    where = {"address": http.host, "port": http.port}
    if listener.uds and listener.fd < 0:
        where["uds"] = Path(listener.uds)
    if not http.ssl_certfile:
        return where
    return {**where, "ssl_cert": Path(http.ssl_certfile), "ssl_key": Path(http.ssl_keyfile),
            "ssl_ca": Path(http.ssl_ca_certs) if http.ssl_ca_certs else None,
            "ssl_client_verify": http.ssl_cert_reqs > 0,
            "ssl_protocol_min": SSLProtocols.tls12}  # as uvicorn (vLLM): TLS 1.2 clients are still common


def run_granian(config: Config, paths: RunPaths, monitor: EngineMonitor, reporter: ServiceReporter,
                listener: Listener, log_config: dict | None = None, own_socket: socket.socket | None = None) -> bool:
    """Serve until stopped; True when Granian reports a failure (a worker crashed). `own_socket`: the TCP socket the
    launcher bound at its start (rill/listening.py reserve_port), served as systemd's would be."""
    from granian.constants import Interfaces, Loops

    http = config.http
    server = make_draining_granian()(
        paths,
        http.shutdown_timeout_s,
        monitor,
        reporter,
        "rill.asgi.app:app",
        **listen_settings(http, listener),
        interface=Interfaces.ASGI,
        workers=http.workers,
        loop=Loops.uvloop,
        log_level=config.engine.log.level.lower(),
        log_dictconfig=log_config,  # the run's format in Granian's own lines and in every worker
        http1_settings=http1_settings(http.timeout_keep_alive_s),
        workers_kill_timeout=5,  # requests were drained before the workers are told to stop
        # A worker that dies (killed, out of memory) is replaced rather than stopping the server; one
        # that dies again within 5.5 s of its start stops it, with exit status 1 (a crash loop).
        respawn_failed_workers=True,
        backlog=2048,
    )
    server.listen_fd = listener.fd
    if own_socket is not None:
        own_socket.listen(server.backlog)
        server.listen_fd = own_socket.fileno()
    die_with_launcher_when_forked()
    try:
        server.serve()
    except SystemExit as exc:  # Granian exits non-zero when a worker crashed
        if exc.code:
            log.error("the HTTP server stopped with status %s", exc.code)
            return True
    return False
