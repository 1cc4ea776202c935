"""docs/architecture.md names every top-level package, every process's entry module and every channel's module."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text()
SERVING_PACKAGES = ("asgi", "engine_proc", "ipc", "rill")
# Where a process starts: the launcher and CLI, Granian's start-up and the app it runs, the engine,
# the tensor-parallel ranks (rank 0's side and the others), the headless node, the engine monitor.
ENTRY_MODULES = ("rill/cli.py", "rill/launcher.py", "rill/http_server.py", "asgi/app.py", "engine_proc/main.py",
                 "engine_proc/parallel/ranks.py", "engine_proc/parallel/rank_worker.py", "rill/headless.py",
                 "rill/engine_monitor.py")
# What marks a module as one end of a channel: a process spawned, a pipe, a ZeroMQ socket, a shared
# memory mapping (of a file: an anonymous one, fd -1, is a process's own memory), a torch.distributed group, the
# workers' settings variable.
CHANNEL_MARKERS = re.compile(r"\.Process\(|\.Pipe\(|def make_socket\(|make_socket\(|zmq\.X?PUB\)|mmap\.mmap\((?!-1)|init_process_group\(|"
                             r"^SETTINGS_ENV = ", re.MULTILINE)


def test_top_level_packages_are_named():
    packages = sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())
    assert set(SERVING_PACKAGES) <= set(packages)
    missing = [name for name in packages if f"`{name}/`" not in DOC]
    assert not missing, f"docs/architecture.md does not name the packages {missing}"


def test_entry_modules_are_named():
    for module in ENTRY_MODULES:
        assert (ROOT / module).is_file(), f"{module} is gone: update ENTRY_MODULES and docs/architecture.md"
    missing = [module for module in ENTRY_MODULES if module not in DOC]
    assert not missing, f"docs/architecture.md's process table does not name {missing}"


def test_channel_modules_are_named():
    channel_modules = sorted(str(path.relative_to(ROOT)) for package in SERVING_PACKAGES
                             for path in (ROOT / package).rglob("*.py") if CHANNEL_MARKERS.search(path.read_text()))
    assert "ipc/channels.py" in channel_modules and "engine_proc/kv_events.py" in channel_modules
    missing = [module for module in channel_modules if module not in DOC]
    assert not missing, f"docs/architecture.md's channel table does not name {missing}"
