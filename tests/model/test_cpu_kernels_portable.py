"""The C++ kernels built for older x86-64 CPUs than this one (AVX2 without AVX-512, and SSE2 alone)
pass the same numerical tests: the paths a CI machine or a user's CPU would take, checked here."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import NamedTuple

import pytest

from rill.engine_proc.cpu_features import cpu_info
from rill.engine_proc.kernels import extension

ROOT = Path(__file__).resolve().parents[2]
TESTS = ["tests/unit/test_fused_ops.py", "tests/model/test_cpu_attention.py", "tests/model/test_quantization.py",
         "tests/model/test_int4.py", "tests/model/test_moe_experts.py", "tests/model/test_kv_int8.py"]
# The kernels' own tests; the model runners and benchmarks do not depend on the build target. Of the
# experts' tests, the int8 operator's (the bfloat16 one needs AVX-512 BF16 or AMX, which these lack; so do the
# quantized layers' panels, csrc/quant_panels.cpp).
SELECT = ("not runner and not quick and not load_model and not cli and not (test_moe_experts and not int8) "
          "and not panels")
# An AVX2 CPU, as far as this one can be made one: Rill's kernels built for AVX2 (no AVX-512), oneDNN
# capped at its AVX2 kernels and ATen at its AVX2 ones. Both portable builds are at -O1: the same paths, built in
# about half the time (the build was most of each test's 80-95 s). The AVX2 build's kernel tests and its batch
# invariance run in one such process: one pytest and torch start-up, not two.
AVX2_CPU = {"RILL_CPU_ARCH": "x86-64-v3", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "RILL_CPU_OPT": "-O1"}
BATCH_INVARIANT = "tests/model/test_batch_invariant.py"
# Which of its cases run there: every case of the CPU backend's native runners (float32 and bfloat16; the
# transformers route and the torch backend call the same kernels, and run on this CPU's in the suite). The file runs
# on the bundled model's first 4 layers: these 14 cases take about 3.5 s (one thread, a Zen 4).
BATCH_INVARIANT_SELECT = "cpu- and native"
RUNNERS = ("cpu-float32-native", "cpu-bfloat16-native")


def amx_tests() -> list[str]:
    """The AMX paths, prompt attention and linears (torch's micro-kernels, called from code built for the
    target). Without AMX (a Zen 4, say) they run only in a build for AVX-512 BF16, which these are not; nor is
    Rill's AVX-512 BF16 kernel (csrc/bf16_dot_panel.h) in them, whose test AMX_SELECT leaves out."""
    return (["tests/unit/test_cpu_prefill_attention.py", "tests/unit/test_amx_linear.py"]
            if cpu_info().has("amx_bf16") else [])


AMX_SELECT = "not avx512_kernel"


class Run(NamedTuple):
    outcomes: dict[str, tuple[str, str]]  # node id: (its file, passed, xfailed, failure, error or skipped)
    output: str  # the end of pytest's output, for a failure's message


def run_pytest(env: dict[str, str], args: list[str], junit: Path) -> Run:
    """Runs pytest on `args` in a process of its own with `env` added. Fails if pytest stopped short."""
    # Of the plugins, the suite's per-test timeout alone: the others (schemathesis, hypothesis, anyio,
    # xdist) serve none of these tests and take 2.5 s of each start. xunit1: each case's file.
    env = {**os.environ, **env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_timeout",
                           f"--junitxml={junit}", "-o", "junit_family=xunit1", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    output = done.stdout[-3000:] + done.stderr[-2000:]
    # 0: all passed, 1: some failed (each test below looks at its own); any other code is an error of
    # the run itself (collection, usage, nothing selected).
    assert done.returncode in (0, 1) and junit.exists(), output
    cases = ET.parse(junit).getroot().iter("testcase")
    return Run({f"{case.get('file')}::{case.get('name')}": (case.get("file"), outcome(case)) for case in cases}, output)


def outcome(case: ET.Element) -> str:
    for element in case:
        if element.tag == "skipped" and element.get("type") == "pytest.xfail":
            return "xfailed"
        if element.tag in ("failure", "error", "skipped"):
            return element.tag
    return "passed"


def check(runs: list[Run], files: list[str]) -> list[str]:
    """That every test of `files` that `runs` ran passed or failed as expected (none skipped), and some
    ran: their node ids."""
    ran = {name: result for run in runs for name, (file, result) in run.outcomes.items() if file in files}
    bad = {name: result for name, result in ran.items() if result not in ("passed", "xfailed")}
    assert ran and not bad, f"{bad or 'no test ran'}\n" + "\n".join(run.output for run in runs)
    return list(ran)


@pytest.fixture(scope="module")
def avx2_runs(tmp_path_factory) -> list[Run]:
    """One process for the AVX2 CPU's kernel tests and its batch invariance (one build, one start-up of
    pytest and torch), and where the CPU has AMX, one for the AMX tests without oneDNN's cap (their
    torch micro-kernels are oneDNN's)."""
    folder = tmp_path_factory.mktemp("avx2")
    select = f"({SELECT}) and not test_batch_invariant.py or test_batch_invariant.py and {BATCH_INVARIANT_SELECT}"
    runs = [run_pytest(AVX2_CPU, [*TESTS, BATCH_INVARIANT, "-k", select], folder / "kernels.xml")]
    if amx := amx_tests():
        runs.append(run_pytest({"RILL_CPU_ARCH": AVX2_CPU["RILL_CPU_ARCH"], "RILL_CPU_OPT": "-O1"}, [*amx, "-k", AMX_SELECT],
                               folder / "amx.xml"))
    return runs


@pytest.mark.skipif(not extension.available(), reason="no C++ compiler: the kernels are not built")
@pytest.mark.parametrize("arch", ["x86-64-v3", "x86-64"], ids=["avx2", "sse2"])
def test_kernels_built_for_an_older_cpu_pass_their_tests(arch, request, tmp_path):
    if arch == AVX2_CPU["RILL_CPU_ARCH"]:
        runs = request.getfixturevalue("avx2_runs")
    else:
        runs = [run_pytest({"RILL_CPU_ARCH": arch, "RILL_CPU_OPT": "-O1"}, [*TESTS, *amx_tests(), "-k", f"({SELECT}) and {AMX_SELECT}"],
                           tmp_path / "kernels.xml")]
    check(runs, [*TESTS, *amx_tests()])


@pytest.mark.skipif(not extension.available(), reason="no C++ compiler: the kernels are not built")
def test_batch_invariance_holds_on_an_avx2_cpu(avx2_runs):
    """--batch-invariant on a CPU with AVX2 and no AVX-512 (issue 12 asks it of every x86-64 CPU):
    this machine made one, as far as the code can tell: Rill's kernels built for AVX2, oneDNN capped
    at its AVX2 kernels (ONEDNN_MAX_CPU_ISA) and ATen at its AVX2 ones (ATEN_CPU_CAPABILITY). The
    CPU backend, both dtypes (BATCH_INVARIANT_SELECT says which cases); the torch backend is the same
    linears. It runs in the AVX2 kernel tests' process (avx2_runs)."""
    ran = check(avx2_runs, [BATCH_INVARIANT])
    for runner in RUNNERS:  # each runner's batch check ran: the selection still finds them
        assert any(f"test_logits_do_not_depend_on_the_batch[{runner}-" in name for name in ran), (runner, ran)


def test_prune_deletes_stale_and_ctypes_era_builds_only(tmp_path):
    now = 1_000_000_000.0
    fresh, stale, legacy, keep = (tmp_path / n for n in ("rill_cpu-a.so", "rill_cpu-b.so", "paged_decode-c.so",
                                                        "rill_cpu-d.so"))
    for f in (fresh, stale, legacy, keep):
        f.write_bytes(b"")
        os.utime(f, (now, now))
    os.utime(stale, (now - extension.STALE_AFTER_S - 1,) * 2)
    os.utime(keep, (now - extension.STALE_AFTER_S - 1,) * 2)  # old, but the one being kept
    removed = extension.prune(tmp_path, keep=keep, now=now)
    assert sorted(removed) == sorted([stale, legacy])
    assert fresh.exists() and keep.exists() and not stale.exists() and not legacy.exists()


def test_the_build_key_covers_every_source_file(tmp_path, monkeypatch):
    """A change to any file of csrc/ must make a new build (its text is part of the cache key), and
    every .cpp file is a source of it."""
    csrc = tmp_path / "csrc"
    shutil.copytree(extension.CSRC, csrc)
    monkeypatch.setattr(extension, "CSRC", csrc)
    assert extension.sources() == sorted(csrc.glob("*.cpp")) and len(extension.sources()) > 1
    compiler = extension._compiler() or "true"
    keys = {extension._library_path(compiler)}
    for f in sorted(csrc.iterdir()):
        assert f.suffix in (".cpp", ".h"), f
        text = f.read_text()
        f.write_text(text + "\n")
        keys.add(extension._library_path(compiler))
        f.write_text(text)
    assert len(keys) == 1 + len(list(csrc.iterdir()))


def test_processes_starting_together_build_once(tmp_path, monkeypatch):
    """Two builders at once (here threads, each with its own lock file description, as processes have): one
    builds, the other waits and finds the library; no lock file is left."""
    calls = []

    def fake_build(compiler, path):
        calls.append(path)
        time.sleep(0.3)  # long enough for the other to arrive and wait
        path.write_bytes(b"built")

    monkeypatch.setattr(extension, "_build", fake_build)
    path = tmp_path / "kernels" / "rill_cpu-test.so"
    path.parent.mkdir()
    threads = [threading.Thread(target=extension.ensure_built, args=("c++", path)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [path] and path.read_bytes() == b"built"
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_unity_groups_balance_the_files_and_keep_each_once(tmp_path):
    files = []
    for name, size in [("bindings.cpp", 100), ("a.cpp", 900), ("b.cpp", 500), ("c.cpp", 400), ("d.cpp", 50)]:
        (f := tmp_path / name).write_text("x" * size)
        files.append(f)
    groups = extension.unity_groups(files, 2)
    assert sorted(f for g in groups for f in g) == sorted(files)
    # bindings.cpp counts 100 + 900 (torch/library.h): 1,000 + 400 + 50 against 900 + 500
    assert [sorted(f.name for f in g) for g in groups] == [["bindings.cpp", "c.cpp", "d.cpp"], ["a.cpp", "b.cpp"]]
    assert len(extension.unity_groups(files, 16)) == len(files) and len(extension.unity_groups(files, 0)) == 1
