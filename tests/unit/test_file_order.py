"""make test's file order: the longest files first, each file's tests together and in order."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from tests.helpers.file_order import (
    SHARED_FILES_ENV,
    SHARED_GROUP,
    TYPICAL_S,
    longest_first,
    read_shared_files,
    scope_of,
    shared_files_path,
    shared_server_files,
    times_from_junit,
    write_shared_files,
)

ROOT = Path("/repo")


def items(*names: str, fixtures: dict[str, tuple[str, ...]] | None = None) -> list:
    return [SimpleNamespace(path=ROOT / name.split("::")[0], name=name, fixturenames=(fixtures or {}).get(name, ()))
            for name in names]


def test_the_longest_files_come_first_each_files_tests_together():
    collected = items("tests/a.py::1", "tests/a.py::2", "tests/b.py::1", "tests/c.py::1", "tests/b.py::2")
    times = {"tests/b.py": 90.0, "tests/a.py": 1.0}  # c.py is new: TYPICAL_S
    ordered = [i.name for i in longest_first(collected, times, ROOT)]
    assert ordered == ["tests/b.py::1", "tests/b.py::2", "tests/c.py::1", "tests/a.py::1", "tests/a.py::2"]
    assert 1.0 < TYPICAL_S < 90.0
    assert [i.name for i in longest_first(collected, {}, ROOT)] == [  # no times: the collection's order, grouped
        "tests/a.py::1", "tests/a.py::2", "tests/b.py::1", "tests/b.py::2", "tests/c.py::1"]


def test_the_files_of_the_shared_servers_are_one_unit_timed_as_their_sum():
    collected = items("tests/a.py::1", "tests/b.py::1", "tests/c.py::1", "tests/d.py::1", "tests/a.py::2",
                      fixtures={"tests/a.py::2": ("tmp_path", "server"), "tests/d.py::1": ("client", "tiny_server")})
    shared = shared_server_files(collected, ROOT)
    assert shared == {"tests/a.py", "tests/d.py"}  # a.py through one of its tests
    times = {"tests/a.py": 20.0, "tests/b.py": 50.0, "tests/c.py": 1.0, "tests/d.py": 40.0}
    ordered = [i.name for i in longest_first(collected, times, ROOT,
                                             unit_of=lambda item, file: SHARED_GROUP if file in shared else file)]
    # the unit (60 s) before b.py (50 s), its files longest first, each file's tests together
    assert ordered == ["tests/d.py::1", "tests/a.py::1", "tests/a.py::2", "tests/b.py::1", "tests/c.py::1"]


def test_the_scheduler_keeps_a_file_together_and_the_shared_files_together(tmp_path, monkeypatch):
    monkeypatch.setenv(SHARED_FILES_ENV, str(tmp_path / "shared"))
    assert read_shared_files(shared_files_path()) == set()  # none written: every file its own unit
    write_shared_files({"tests/e2e/test_b.py", "tests/e2e/test_c.py"})
    shared = read_shared_files(tmp_path / "shared")
    assert scope_of("tests/e2e/test_a.py::test_x[1]", shared) == "tests/e2e/test_a.py"
    assert scope_of("tests/e2e/test_b.py::test_y[1]", shared) == scope_of("tests/e2e/test_c.py::z", shared) == SHARED_GROUP
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shared"]  # nothing half-written left


def test_times_add_up_per_file_from_a_junit_report(tmp_path):
    junit = tmp_path / "j.xml"
    junit.write_text('<testsuites><testsuite>'
                     '<testcase classname="tests.model.test_x" name="a" time="2.5"/>'
                     '<testcase classname="tests.model.test_x.TestGroup" name="b" time="1.0"/>'
                     '<testcase classname="tests.e2e.test_y" name="c" time="7"/>'
                     '</testsuite></testsuites>')
    assert times_from_junit(junit) == {"tests/e2e/test_y.py": 7.0, "tests/model/test_x.py": 3.5}
    assert list(times_from_junit(junit)) == ["tests/e2e/test_y.py", "tests/model/test_x.py"]  # longest first
