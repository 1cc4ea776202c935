"""The order `make test`'s two workers take the test files in: the longest first (tests/file_times.json).

xdist (`--dist loadfile`) hands each worker one file at a time, in the collection's order; by default it
reorders them by their number of tests, which put the files of one or two long tests (the portable kernel
builds, the benchmarks' quick runs) last, where one worker ran them while the other had nothing left. Longest
first (`--no-loadscope-reorder` and this order) leaves short files for the end, to even the two out.

A file that uses a session's shared server (SHARED_SERVERS) belongs to one unit with every other such file: the
worker that takes the unit starts those servers once, where two workers each started their own (the compiled
server's start was 20-25 s of each worker's time). The workers, which collect, write those files down
(`write_shared_files`, at the path the controller put in $RILL_TEST_SHARED_FILES for them to inherit); the
controller's scheduler, which sees only node ids, reads them (`file_or_shared_scheduling`). A unit's time is its
files' sum. (xdist's own `loadgroup` renames the marked tests' node ids, which pytest 9 no longer lets it do.)

`python -m tests.helpers.file_order JUNIT.xml` writes tests/file_times.json from a run's `--junitxml` (each
file's seconds: its tests' setup, call and teardown). A file missing from it counts as TYPICAL_S.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import uuid
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

TIMES = Path(__file__).resolve().parents[1] / "file_times.json"
TYPICAL_S = 5.0  # a new file's guess: most files take a few seconds
SHARED_SERVERS = frozenset({"server", "tiny_server"})  # tests/conftest.py's session fixtures that start a server
SHARED_GROUP = "shared-servers"  # the unit of the files that use one
SHARED_FILES_ENV = "RILL_TEST_SHARED_FILES"


def load_times(path: Path = TIMES) -> dict[str, float]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def longest_first(items: list, times: dict[str, float], root: Path, unit_of=None) -> list:
    """`items` with each unit's tests together (a file, or what `unit_of(item, file)` names), the units by their
    time, longest first, and within a unit its files so; among equals, and within a file, the collection's order."""
    files = [_file_of(item, root) for item in items]
    units = [unit_of(item, file) if unit_of else file for item, file in zip(items, files)]
    first_seen: dict[str, int] = {}
    unit_files: dict[str, set[str]] = defaultdict(set)
    for i, (unit, file) in enumerate(zip(units, files)):
        first_seen.setdefault(unit, i)
        first_seen.setdefault(file, i)
        unit_files[unit].add(file)
    unit_time = {unit: sum(times.get(f, TYPICAL_S) for f in fs) for unit, fs in unit_files.items()}

    def key(i: int):
        unit, file = units[i], files[i]
        return -unit_time[unit], first_seen[unit], -times.get(file, TYPICAL_S), first_seen[file], i

    return [items[i] for i in sorted(range(len(items)), key=key)]


def shared_server_files(items: list, root: Path) -> set[str]:
    """The files of `items` that use a fixture of SHARED_SERVERS (directly or through another fixture)."""
    return {_file_of(item, root) for item in items if SHARED_SERVERS & set(getattr(item, "fixturenames", ()))}


def shared_files_path() -> Path:
    """Where the workers write the shared servers' files: set by the first process to ask (the controller, when
    tests/conftest.py is imported), inherited by the workers it starts."""
    return Path(os.environ.setdefault(SHARED_FILES_ENV, str(Path(tempfile.gettempdir()) / f"rill-shared-{uuid.uuid4().hex}")))


def write_shared_files(files: set[str]) -> None:
    """Both workers write the same list: each whole, by a rename."""
    path = shared_files_path()
    part = path.with_name(f"{path.name}.{os.getpid()}")
    part.write_text("\n".join(sorted(files)))
    os.replace(part, path)


def read_shared_files(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:  # no worker wrote it: every file a unit of its own
        return set()


def scope_of(nodeid: str, shared: set[str]) -> str:
    """A test's unit for xdist: SHARED_GROUP for the files of `shared`, else its file."""
    file = nodeid.split("::", 1)[0]
    return SHARED_GROUP if file in shared else file


def file_or_shared_scheduling(config, log):
    """xdist's loadfile scheduling, but with the files that use the shared servers as one unit. It reads their
    list when it first splits the collection, which is once every worker has collected."""
    from xdist.scheduler import LoadFileScheduling

    class FileOrSharedScheduling(LoadFileScheduling):
        shared: set[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.shared is None:
                self.shared = read_shared_files(shared_files_path())
            return scope_of(nodeid, self.shared)

    return FileOrSharedScheduling(config, log)


def _file_of(item, root: Path) -> str:
    path = Path(str(item.path))
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()


def times_from_junit(junit: Path) -> dict[str, float]:
    """Each file's seconds in a --junitxml report (xunit2's classname: the module's dotted path)."""
    totals: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = (case.get("classname") or "").split("::")[0]
        parts = module.split(".")
        while parts and not parts[-1].startswith("test_"):
            parts.pop()  # a test class's name
        if parts:
            totals["/".join(parts) + ".py"] += float(case.get("time") or 0)
    return {file: round(s, 1) for file, s in sorted(totals.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    TIMES.write_text(json.dumps(times_from_junit(Path(sys.argv[1])), indent=0) + "\n")
    print(f"wrote {TIMES}")
