"""make test's file order: the longest files first, each file's tests together and in order."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.helpers.file_order import TYPICAL_S, longest_first, times_from_junit

ROOT = Path("/repo")


def items(*names: str) -> list:
    return [SimpleNamespace(path=ROOT / name.split("::")[0], name=name) for name in names]


def test_the_longest_files_come_first_each_files_tests_together():
    collected = items("tests/a.py::1", "tests/a.py::2", "tests/b.py::1", "tests/c.py::1", "tests/b.py::2")
    times = {"tests/b.py": 90.0, "tests/a.py": 1.0}  # c.py is new: TYPICAL_S
    ordered = [i.name for i in longest_first(collected, times, ROOT)]
    assert ordered == ["tests/b.py::1", "tests/b.py::2", "tests/c.py::1", "tests/a.py::1", "tests/a.py::2"]
    assert 1.0 < TYPICAL_S < 90.0
    assert [i.name for i in longest_first(collected, {}, ROOT)] == [  # no times: the collection's order, grouped
        "tests/a.py::1", "tests/a.py::2", "tests/b.py::1", "tests/b.py::2", "tests/c.py::1"]


def test_times_add_up_per_file_from_a_junit_report(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text('<testsuites><testsuite>'
                     '<testcase classname="tests.model.test_x" name="a" time="2.5"/>'
                     '<testcase classname="tests.model.test_x.TestGroup" name="b" time="1.0"/>'
                     '<testcase classname="tests.e2e.test_y" name="c" time="7"/>'
                     '</testsuite></testsuites>')
    assert times_from_junit(junit) == {"tests/e2e/test_y.py": 7.0, "tests/model/test_x.py": 3.5}
    assert list(times_from_junit(junit)) == ["tests/e2e/test_y.py", "tests/model/test_x.py"]  # longest first
