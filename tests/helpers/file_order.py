"""The order `make test`'s two workers take the test files in: the longest first (tests/file_times.json).

xdist (`--dist loadfile`) hands each worker one file at a time, in the collection's order; by default it
reorders them by their number of tests, which put the files of one or two long tests (the portable kernel
builds, the benchmarks' quick runs) last, where one worker ran them while the other had nothing left. Longest
first (`--no-loadscope-reorder` and this order) leaves short files for the end, to even the two out.

`python -m tests.helpers.file_order JUNIT.xml` writes tests/file_times.json from a run's `--junitxml` (each
file's seconds: its tests' setup, call and teardown). A file missing from it counts as TYPICAL_S.
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

TIMES = Path(__file__).resolve().parents[1] / "file_times.json"
TYPICAL_S = 5.0  # a new file's guess: most files take a few seconds


def load_times(path: Path = TIMES) -> dict[str, float]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def longest_first(items: list, times: dict[str, float], root: Path) -> list:
    """`items` with each file's tests together, the files by their time, longest first; within a file, and
    among files of equal time, the collection's order."""
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(_file_of(item, root), i)

    def key(pair):
        i, item = pair
        file = _file_of(item, root)
        return -times.get(file, TYPICAL_S), first_seen[file], i

    return [item for _, item in sorted(enumerate(items), key=key)]


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
