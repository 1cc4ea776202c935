"""The run directory (sockets, the state store, metrics) is never one somebody else made: a
directory planted at the launcher's predictable old name is not adopted, and the start-up sweep
removes only our own directories of runs that are gone."""
from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from rill.bench.serving.servers import RILL, ServerProcess, free_port
from rill.ipc.channels import RUN_FILE, remove_stale_run_dirs, run_dir_base, run_dirs_of
from tests.helpers.server import TINY_MODEL, leftovers

NOBODY = 65534
# Plants /tmp/rill-<its own pid>, open to all (and another user's, where we may chown), then
# becomes `rill serve` by exec: the launcher keeps the pid, so that is the name it would pick.
PLANT_THEN_SERVE = """
import os, sys
planted = f"/tmp/rill-{os.getpid()}"
os.mkdir(planted)
os.chmod(planted, 0o777)
open(f"{planted}/planted", "w").close()
if os.geteuid() == 0:
    os.chown(planted, 65534, 65534)
os.execv(sys.argv[1], sys.argv[1:])
"""


def test_a_planted_run_directory_is_not_adopted(tmp_path_factory):
    from rill.bench.serving.tiny_model import write_tiny_model

    tiny = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    port = free_port()
    argv = [sys.executable, "-c", PLANT_THEN_SERVE, str(RILL), "serve", "--port", str(port), "--model", str(tiny),
            "--load-format", "dummy", "--served-model-name", TINY_MODEL, "--max-model-len", "256",
            "--kv-cache-memory", "64MiB", "--enforce-eager", "--log-level", "warning"]
    srv = ServerProcess(argv, port, tmp_path_factory.mktemp("rill") / "serve.log",
                        env={"RUNTIME_DIRECTORY": "", "XDG_RUNTIME_DIR": ""}).wait_ready()
    planted = Path(f"/tmp/rill-{srv.proc.pid}")
    try:
        assert sorted(p.name for p in planted.iterdir()) == ["planted"], "the server used a planted directory"
        (run_dir,) = run_dirs_of(srv.proc.pid, Path("/tmp"))
        st = run_dir.lstat()
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
        assert (run_dir / "engine-in.sock").exists()
    finally:
        code = srv.stop()
    assert code == 0, srv.log()
    assert leftovers(srv.proc.pid) == []
    assert (planted / "planted").exists(), "another user's directory was removed"
    (planted / "planted").unlink()
    planted.rmdir()


def make_run_dir(base: Path, name: str, *, run_file: str | None = None, owner: int | None = None) -> Path:
    path = base / name
    path.mkdir(mode=0o700)
    if run_file is not None:
        (path / RUN_FILE).write_text(run_file)
    if owner is not None:
        os.chown(path, owner, owner)
    return path


def dead_pid() -> int:
    pid = 4_000_000  # above the default pid_max: never a live process here
    while Path(f"/proc/{pid}").exists():
        pid += 1
    return pid


def test_the_sweep_removes_only_our_own_dead_runs(tmp_path):
    me, gone = os.getpid(), dead_pid()
    ours_dead = make_run_dir(tmp_path, f"rill-{gone}-abc123")
    old_style = make_run_dir(tmp_path, f"rill-{gone}")
    alive = make_run_dir(tmp_path, f"rill-{me}-def456", run_file=f"{me} {start_time(me)}\n")
    reused = make_run_dir(tmp_path, f"rill-{me}-ghi789", run_file=f"{me} 1\n")  # an earlier process of this pid
    link = tmp_path / f"rill-{gone}-link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    theirs = make_run_dir(tmp_path, f"rill-{gone}-xyz000", owner=NOBODY) if os.geteuid() == 0 else None
    remove_stale_run_dirs(tmp_path)
    assert not ours_dead.exists() and not old_style.exists() and not reused.exists()
    assert alive.exists()
    assert link.is_symlink() and (tmp_path / "elsewhere").is_dir()
    if theirs is not None:
        assert theirs.exists(), "another user's directory was removed"


def start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


@pytest.mark.parametrize("variable", ["RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR"])
def test_a_private_runtime_directory_is_used_and_a_shared_one_is_not(tmp_path, monkeypatch, variable):
    private, shared = tmp_path / "private", tmp_path / "shared"
    private.mkdir(mode=0o700)
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv(variable, str(private))
    assert run_dir_base() == private
    monkeypatch.setenv(variable, str(shared))
    assert run_dir_base() == Path("/tmp")
