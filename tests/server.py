"""Start and stop a real `rill serve` for end-to-end tests."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
RILL = Path(sys.executable).with_name("rill")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_segments(run_id: int) -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"rill_{run_id}_*"))


class RillServer:
    def __init__(self, *flags: str, log_path: Path):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(
            [str(RILL), "serve", "--port", str(self.port), "--log-level", "warning", *flags],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
        )

    def wait_ready(self, timeout_s: float = 300.0) -> RillServer:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rill serve exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.base_url}/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"rill serve not ready after {timeout_s} s:\n{self.log()}")

    def stats(self) -> dict:
        return httpx.get(f"{self.base_url}/stats", timeout=10).json()

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
