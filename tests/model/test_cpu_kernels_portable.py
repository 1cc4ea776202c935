"""The C++ kernels built for older x86-64 CPUs than this one (AVX2 without AVX-512, and SSE2 alone)
pass the same numerical tests: the paths a CI machine or a user's CPU would take, checked here."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rill.engine_proc.cpu_features import cpu_info
from rill.engine_proc.kernels import extension

ROOT = Path(__file__).resolve().parents[2]
TESTS = ["tests/unit/test_fused_ops.py", "tests/model/test_cpu_attention.py", "tests/model/test_quantization.py",
         "tests/model/test_int4.py"]
# The kernels' own tests; the model runners and benchmarks do not depend on the build target.
SELECT = "not runner and not quick and not load_model and not cli"


@pytest.mark.skipif(not extension.available(), reason="no C++ compiler: the kernels are not built")
@pytest.mark.parametrize("arch", ["x86-64-v3", "x86-64"], ids=["avx2", "sse2"])
def test_kernels_built_for_an_older_cpu_pass_their_tests(arch):
    env = {**os.environ, "RILL_CPU_ARCH": arch}
    # The AMX paths, prompt attention and linears (torch's micro-kernels, called from code built for the
    # target). Without AMX (a Zen 4, say) they run only in a build for AVX-512 BF16, which these are not.
    amx = (["tests/unit/test_cpu_prefill_attention.py", "tests/unit/test_amx_linear.py"]
           if cpu_info().has("amx_bf16") else [])
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS, *amx, "-k", SELECT],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout.splitlines()[-1], done.stdout[-500:]


@pytest.mark.skipif(not extension.available(), reason="no C++ compiler: the kernels are not built")
def test_batch_invariance_holds_on_an_avx2_cpu():
    """--batch-invariant on a CPU with AVX2 and no AVX-512 (issue 12 asks it of every x86-64 CPU):
    this machine made one, as far as the code can tell: Rill's kernels built for AVX2, oneDNN capped
    at its AVX2 kernels (ONEDNN_MAX_CPU_ISA) and ATen at its AVX2 ones (ATEN_CPU_CAPABILITY). The
    CPU backend, both dtypes; the torch backend is the same linears."""
    env = {**os.environ, "RILL_CPU_ARCH": "x86-64-v3", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/model/test_batch_invariant.py", "-k", "cpu-"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout.splitlines()[-1], done.stdout[-500:]


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
    every .cpp file is a translation unit of it."""
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
