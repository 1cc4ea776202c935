"""The suite's own guard (tests/conftest.py, pytest_sessionfinish): a process a test session
started and left running is killed at the end, named, and fails the run."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LEAVES_ONE_BEHIND = """
import subprocess

def test_starts_a_process_and_forgets_it(tmp_path):
    proc = subprocess.Popen(["sleep", "60"])
    (tmp_path.parent.parent / "left.pid").write_text(str(proc.pid))
"""


def test_a_process_left_running_fails_the_session(tmp_path):
    (tmp_path / "test_inner.py").write_text(LEAVES_ONE_BEHIND)
    inner = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                            "--basetemp", str(tmp_path / "base"), str(tmp_path / "test_inner.py")],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    pid = int((tmp_path / "left.pid").read_text())
    assert inner.returncode == 1, inner.stdout + inner.stderr
    assert f"pid {pid}: sleep 60" in inner.stdout, inner.stdout
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]:
        assert time.monotonic() < deadline, "the leftover was not killed"
        time.sleep(0.1)
