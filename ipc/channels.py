"""Where each process listens: the ZeroMQ addresses of one run, in its private run directory.

A run is one `rill serve`: its id is the launcher's pid and its sockets live in a directory of
its own, made fresh (mode 0700, by mkdtemp: never one that exists already, whoever made it) and
named `rill-<pid>-<random>`, so a restart can sweep what a killed run left behind.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

import zmq

_SOCKET_HWM = 100_000
RUN_FILE = "run"  # in each run directory: "<launcher pid> <its start time>", read by the sweep


@dataclass(frozen=True)
class RunPaths:
    run_id: str
    run_dir: Path

    @classmethod
    def create(cls, run_id: str, base: Path | None = None) -> RunPaths:
        """A new private run directory for run `run_id` (this process's pid) under `base`.

        A predictable name (`/tmp/rill-<pid>`) could be made first by another local user, who
        would then read the state store or swap socket files: mkdtemp picks a name nobody holds
        and creates it atomically, owned by us, mode 0700."""
        run_dir = Path(tempfile.mkdtemp(prefix=f"rill-{run_id}-", dir=base or run_dir_base()))
        (run_dir / RUN_FILE).write_text(f"{run_id} {_start_time(run_id)}\n")
        return cls(run_id, run_dir)

    @property
    def engine_input(self) -> str:
        return self.engine_input_for(0)

    def engine_input_for(self, rank: int) -> str:
        """Engine `rank`'s input (--data-parallel-size: one engine per rank, each with its own)."""
        return f"ipc://{self.run_dir}/engine-in.sock" if rank == 0 else f"ipc://{self.run_dir}/engine-in-{rank}.sock"

    def worker_output(self, worker_id: str) -> str:
        return f"ipc://{self.run_dir}/worker-{worker_id}.sock"

    @property
    def draining_flag(self) -> Path:
        """Exists while the server drains; the workers refuse new work when they see it."""
        return self.run_dir / "draining"

    def remove_run_dir(self) -> None:
        shutil.rmtree(self.run_dir, ignore_errors=True)


def run_dir_base() -> Path:
    """Where run directories go: systemd's RuntimeDirectory= ($RUNTIME_DIRECTORY), else the
    session's $XDG_RUNTIME_DIR, each only if it is a directory private to us; else /tmp."""
    for name in ("RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR"):
        value = os.environ.get(name, "").split(":")[0]
        if value and _ours(Path(value), private=True):
            return Path(value)
    return Path("/tmp")


def run_dirs_of(run_id: str | int, base: Path | None = None) -> list[Path]:
    """The run directories of run `run_id` (normally one)."""
    return sorted((base or run_dir_base()).glob(f"rill-{run_id}-*"))


def remove_stale_run_dirs(base: Path | None = None) -> None:
    """Run directories of ours whose launcher is gone (killed, not stopped). Another user's, or
    one that is not a plain directory, is left alone: removing it is not ours to do."""
    for path in (base or run_dir_base()).glob("rill-*"):
        run_id = path.name.removeprefix("rill-").split("-", 1)[0]
        if run_id.isdigit() and _ours(path) and not _running(path, run_id):
            shutil.rmtree(path, ignore_errors=True)


def _ours(path: Path, private: bool = False) -> bool:
    """A directory (not a link to one) owned by this user; `private`: nobody else may write in it."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not (private and st.st_mode & 0o022)


def _start_time(pid: str) -> str:
    """The process's start time in clock ticks since boot: a pid reused by another process differs."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def _running(run_dir: Path, run_id: str) -> bool:
    """Is the launcher of this run still running? Its pid may have been reused since: the start
    time recorded at creation tells."""
    if not Path(f"/proc/{run_id}").exists():
        return False
    try:
        recorded = (run_dir / RUN_FILE).read_text().split()
    except OSError:
        return True  # being made right now, or from an older version: leave it
    return len(recorded) < 2 or recorded[1] == _start_time(run_id)


def make_socket(ctx: zmq.Context, kind: int, address: str, *, bind: bool) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, _SOCKET_HWM)
    sock.setsockopt(zmq.RCVHWM, _SOCKET_HWM)
    if bind:
        sock.bind(address)
    else:
        sock.connect(address)
    return sock
