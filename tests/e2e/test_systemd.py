"""systemd: the sd_notify protocol over a real Unix datagram socket, and `rill systemd-unit`."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from rill.bench.serving.servers import RILL, ServerProcess, free_port
from rill.sdnotify import Notifier
from rill.systemd_unit import STOP_MARGIN_S, render_unit
from tests.helpers.server import leftovers, stats

ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"
WATCHDOG_S = 2.0  # WATCHDOG_USEC the test gives: pings every 1 s while the engine loop answers


class NotifySocket:
    """What systemd listens on: a datagram socket; every message kept with its arrival time."""

    def __init__(self, address: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, list[str]]] = []
        self._stopped = False
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stopped:
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            self.messages.append((time.monotonic(), data.decode().split("\n")))

    def fields(self, since: float = 0.0) -> list[str]:
        return [f for t, fields in list(self.messages) if t >= since for f in fields]

    def wait_for(self, predicate, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if found := [f for f in self.fields() if predicate(f)]:
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no matching sd_notify message in {timeout_s} s; got {self.fields()[-10:]}")

    def close(self) -> None:
        self._stopped = True
        self._thread.join()
        self.sock.close()


# ---- the protocol --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_notifier_sends_one_datagram_per_call(tmp_path, kind):
    address = str(tmp_path / "notify.sock") if kind == "path" else f"@rill-test-{os.getpid()}"
    listener = NotifySocket(address if kind == "path" else "\0" + address[1:])
    try:
        notifier = Notifier(address)
        notifier.send("READY=1", "STATUS=serving")
        notifier.send("WATCHDOG=1")
        listener.wait_for(lambda f: f == "WATCHDOG=1", timeout_s=5)
        assert [fields for _, fields in listener.messages] == [["READY=1", "STATUS=serving"], ["WATCHDOG=1"]]
    finally:
        listener.close()


def test_notifier_from_env_takes_the_variables_out():
    env = {"NOTIFY_SOCKET": "/run/x.sock", "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid()), "A": "1"}
    notifier = Notifier.from_env(env)
    assert notifier.enabled and notifier.watchdog_s == 4.0
    assert env == {"A": "1"}  # the engine and workers, started later, never see them
    other = Notifier.from_env({"NOTIFY_SOCKET": "/run/x.sock", "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"})
    assert other.enabled and other.watchdog_s == 0  # that watchdog is meant for another process
    off = Notifier.from_env({})
    assert not off.enabled and off.watchdog_s == 0
    off.send("READY=1")  # a no-op, not an error
    assert not Notifier("vsock:2:1234").enabled  # unsupported transports are ignored, with a warning


def test_unreachable_notify_socket_never_raises(tmp_path):
    Notifier(str(tmp_path / "nobody-listens.sock")).send("READY=1")


# ---- the unit ------------------------------------------------------------------------------


def unit_settings(text: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def test_unit_has_what_the_issue_asks():
    unit = unit_settings(render_unit(rill="/opt/rill/.venv/bin/rill", user="svc", serve_flags=["--port", "8001"],
                                     shutdown_timeout_s=45))
    one = {key: values[-1] for key, values in unit.items()}
    assert one["Type"] == "notify" and one["NotifyAccess"] == "main"
    assert one["Restart"] == "on-failure" and one["KillMode"] == "mixed"
    assert int(one["TimeoutStopSec"]) == 45 + STOP_MARGIN_S > 45
    assert int(one["WatchdogSec"]) > 0
    assert one["EnvironmentFile"] == "-/etc/rill/rill.env"
    assert one["User"] == "svc"
    assert one["ExecStart"] == ("/opt/rill/.venv/bin/rill serve --shutdown-timeout 45 --cache-dir /var/cache/rill "
                                "--state-store sqlite:////var/lib/rill/state.db --port 8001 $RILL_ARGS")
    for key, value in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("PrivateTmp", "yes"),
                       ("PrivateDevices", "yes"), ("ProtectHome", "read-only"), ("ProtectKernelTunables", "yes"),
                       ("LockPersonality", "yes"), ("RestrictAddressFamilies", "AF_UNIX AF_INET AF_INET6"),
                       ("CacheDirectory", "rill"), ("StateDirectory", "rill")]:
        assert one[key] == value, key
    custom = unit_settings(render_unit(rill="/r", user="svc", serve_flags=[], shutdown_timeout_s=5,
                                       cache_dir="/srv/rill-cache"))
    assert custom["ReadWritePaths"] == ["/srv/rill-cache"] and "CacheDirectory" not in custom


def test_deploy_unit_is_what_the_command_prints():
    """deploy/rill.service is `rill systemd-unit --exec /opt/rill/.venv/bin/rill`: it never drifts."""
    printed = subprocess.run([str(RILL), "systemd-unit", "--exec", "/opt/rill/.venv/bin/rill"], capture_output=True,
                             text=True, check=True).stdout
    assert (ROOT / "deploy" / "rill.service").read_text() == printed


def test_deploy_socket_is_what_the_command_prints(tmp_path):
    """deploy/rill.socket is `rill systemd-unit --socket 127.0.0.1:8000`; systemd-analyze accepts it beside the service."""
    printed = subprocess.run([str(RILL), "systemd-unit", "--socket", "127.0.0.1:8000"], capture_output=True,
                             text=True, check=True).stdout
    assert (ROOT / "deploy" / "rill.socket").read_text() == printed
    assert unit_settings(printed)["ListenStream"] == ["127.0.0.1:8000"]
    unix = unit_settings(subprocess.run([str(RILL), "systemd-unit", "--socket", "/run/rill/rill.sock"],
                                        capture_output=True, text=True, check=True).stdout)
    assert unix["ListenStream"] == ["/run/rill/rill.sock"] and unix["SocketMode"] == ["0660"]
    bad = subprocess.run([str(RILL), "systemd-unit", "--socket", "a b"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--socket" in bad.stderr
    if shutil.which("systemd-analyze"):
        (tmp_path / "rill.socket").write_text(printed)
        (tmp_path / "rill.service").write_text((ROOT / "deploy" / "rill.service").read_text())
        result = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "rill.socket")], capture_output=True,
                                text=True)
        complaints = [line for line in (result.stdout + result.stderr).splitlines() if "rill.socket" in line]
        assert result.returncode == 0 and complaints == [], result.stdout + result.stderr


def test_command_checks_the_serve_flags():
    ok = subprocess.run([str(RILL), "systemd-unit", "--shutdown-timeout", "10", "--", "--workers", "4"],
                        capture_output=True, text=True)
    assert ok.returncode == 0
    assert (f"ExecStart={RILL} serve --shutdown-timeout 10 --cache-dir /var/cache/rill --state-store "
            "sqlite:////var/lib/rill/state.db --workers 4 $RILL_ARGS") in ok.stdout
    assert f"TimeoutStopSec={10 + STOP_MARGIN_S}\n" in ok.stdout
    bad = subprocess.run([str(RILL), "systemd-unit", "--", "--no-such-flag"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--no-such-flag" in bad.stderr


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_analyze_verifies_the_unit(tmp_path):
    unit = tmp_path / "rill.service"
    unit.write_text(subprocess.run([str(RILL), "systemd-unit"], capture_output=True, text=True, check=True).stdout)
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    complaints = [line for line in (result.stdout + result.stderr).splitlines() if "rill.service" in line]
    assert result.returncode == 0 and complaints == [], result.stdout + result.stderr


# ---- a real `rill serve` under a fake systemd ----------------------------------------------


def read_stream(url: str, body: dict, lines: list[str]) -> None:
    with httpx.stream("POST", url, json=body, timeout=120) as r:
        lines.extend(line for line in r.iter_lines() if line)


def pings_between(listener: NotifySocket, start: float, end: float) -> int:
    return sum(1 for t, fields in list(listener.messages) if start <= t < end and "WATCHDOG=1" in fields)


def test_sd_notify_sequence_with_a_hung_engine(model_dir, tmp_path):
    listener = NotifySocket(str(tmp_path / "notify.sock"))
    port = free_port()
    env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": str(int(WATCHDOG_S * 1e6))}
    # Eager: the watchdog is what is tested, not the ~30 s compile of decode steps at start.
    srv = ServerProcess([str(RILL), "serve", "--port", str(port), "--log-level", "warning", "--enforce-eager"], port,
                        tmp_path / "serve.log", env=env)
    engine_pid = None
    try:
        # READY=1 only once the engine is loaded and HTTP answers: checked the moment it comes.
        listener.wait_for(lambda f: f == "READY=1", timeout_s=300)
        assert httpx.get(f"{srv.base_url}/ready", timeout=5).status_code == 200
        before_ready = listener.fields()[: listener.fields().index("READY=1")]
        assert before_ready and all(f.startswith("STATUS=") for f in before_ready)  # no ping before READY

        time.sleep(2.5 * WATCHDOG_S)  # pings at half the watchdog period while the loop answers
        ready_at = next(t for t, fields in listener.messages if "READY=1" in fields)
        assert pings_between(listener, ready_at, time.monotonic()) >= 3

        # STATUS= follows the work: a long stream shows as running, with tokens/s.
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 120, "ignore_eos": True, "stream": True}
        lines: list[str] = []
        stream = threading.Thread(target=read_stream, args=(f"{srv.base_url}/v1/completions", body, lines))
        stream.start()
        listener.wait_for(lambda f: f.startswith("STATUS=") and " 1 running" in f and " 0.0 tokens/s" not in f)

        # A hung engine loop: the pings stop, while the server itself stays up.
        engine_pid = stats(srv)["engine_pid"]
        os.kill(engine_pid, signal.SIGSTOP)
        time.sleep(WATCHDOG_S)  # at most one last ping, from the loop's last answer
        quiet_from = time.monotonic()
        time.sleep(1.5 * WATCHDOG_S)
        assert pings_between(listener, quiet_from, time.monotonic()) == 0
        assert httpx.get(f"{srv.base_url}/health", timeout=5).status_code == 200
        listener.wait_for(lambda f: f.startswith("STATUS=") and "not answering" in f, timeout_s=5)

        # It answers again: so do the pings, and the stream finishes.
        os.kill(engine_pid, signal.SIGCONT)
        resumed = time.monotonic()
        engine_pid = None
        time.sleep(1.5 * WATCHDOG_S)
        assert pings_between(listener, resumed, time.monotonic()) >= 1
        stream.join(300)
        assert not stream.is_alive() and lines[-1] == "data: [DONE]"

        stop_sent = time.monotonic()
        assert srv.stop() == 0
        assert "STOPPING=1" in listener.fields(since=stop_sent)
        assert "READY=1" not in listener.fields(since=stop_sent)
        assert leftovers(srv.proc.pid) == []
    finally:
        if engine_pid is not None:
            os.kill(engine_pid, signal.SIGCONT)
        if srv.proc.poll() is None:
            srv.stop()
        listener.close()
