"""Start an HTTP server as a child process, wait until it is ready, stop it with SIGTERM."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
RILL = Path(sys.executable).with_name("rill")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerExited(RuntimeError):
    """A server that exited before it was ready; `returncode` is negative where a signal killed it."""

    def __init__(self, returncode: int, log: str):
        super().__init__(f"server exited with {returncode}:\n{log}")
        self.returncode = returncode


class ServerProcess:
    """`argv` must make the server listen on `port`; `ready_path` answering 200 means ready."""

    def __init__(self, argv: list[str], port: int, log_path: Path, *, ready_path: str = "/ready",
                 env: dict[str, str] | None = None, cwd: Path = ROOT):
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.ready_path = ready_path
        self._log = open(log_path, "wb")
        # A session of its own: a Ctrl-C meant for the caller does not reach the server.
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=cwd,
                                     start_new_session=True, env=None if env is None else {**os.environ, **env})

    def wait_ready(self, timeout_s: float = 300.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerExited(self.proc.returncode, self.log())
            try:
                if httpx.get(f"{self.base_url}{self.ready_path}", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise
        finally:
            self._log.close()

    def __enter__(self):
        return self.wait_ready()

    def __exit__(self, *exc) -> None:
        self.stop()


class TimedServer(ServerProcess):
    """A peer's server whose start is timed (`startup_s`, once ready) and may take `ready_timeout_s`;
    `check()` runs once it answers, before it counts as up."""

    ready_timeout_s = 300.0

    def __init__(self, argv: list[str], port: int, log_path: Path, *, ready_path: str, env: dict[str, str]):
        self.started_s = time.monotonic()
        self.startup_s: float | None = None
        super().__init__(argv, port, log_path, ready_path=ready_path, env=env)

    def check(self) -> None:
        """Nothing more by default."""

    def __enter__(self):
        try:
            self.wait_ready(self.ready_timeout_s)
            self.check()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - self.started_s
        return self


def rill_server(*flags: str, log_path: Path, env: dict[str, str] | None = None) -> ServerProcess:
    port = free_port()
    return ServerProcess([str(RILL), "serve", "--port", str(port), "--log-level", "warning", *flags], port, log_path,
                         env=env)


def baseline_server(log_path: Path) -> ServerProcess:
    port = free_port()
    return ServerProcess([sys.executable, "-m", "rill.bench.serving.baseline_app", "--port", str(port)], port, log_path)
