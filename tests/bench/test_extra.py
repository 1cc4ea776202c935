"""The benchmark's dependencies are an extra (`rill[bench]`): `rill bench` without them says so."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_rill_bench_without_its_extra_names_what_to_install():
    # aiohttp made unimportable, as in an install without the extra.
    code = "import sys; sys.modules['aiohttp'] = None; from rill.cli import main; main(['bench', 'serve', '-h'])"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "pip install 'rill[bench]'" in done.stderr and "aiohttp" in done.stderr
    assert "Traceback" not in done.stderr


def test_serving_imports_none_of_the_bench_extra():
    code = ("import sys; import asgi.app, rill.launcher, engine_proc.main; "
            "print(sorted(m for m in ('aiohttp', 'tqdm', 'matplotlib') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
