"""`pip install .` (not editable) into a fresh venv, then `rill serve` from another folder: the wheel carries the chat
templates and the kernels' sources, and the installed copy serves the bundled model."""
from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import httpx

from rill.bench.serving.servers import ROOT, ServerProcess, free_port


def pip(*args: str, cwd: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"], cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_a_wheel_installed_elsewhere_serves_the_bundled_model(tmp_path, model_dir):
    # A copy of the checkout, so the build writes nothing into it; no network (dependencies come
    # from this venv, which the installed copy shares).
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "__pycache__",
                                                             "results", ".pytest_cache"))
    pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src), cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("rill-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("rill/templates/chatml.jinja", "rill/templates/llama3.jinja", "rill/templates/plain.jinja",
                 "rill/engine_proc/kernels/csrc/bindings.cpp", "rill/engine_proc/kernels/csrc/float_bits.h",
                 "rill/asgi/app.py", "rill/cli.py"):
        assert name in names, name
    # Nothing but rill/ and its dist-info at the top of site-packages: no name another distribution may use.
    assert {name.split("/")[0] for name in names} == {"rill", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1]
                                                      + ".dist-info"}, sorted({n.split("/")[0] for n in names})
    # A fresh venv: the wheel installed into it as a user would (`pip install`, not editable); the
    # dependencies come from this venv through a .pth line (no network in tests). The checkout's
    # editable install is not seen there: .pth files of a directory a .pth line adds are not read.
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True, timeout=120)
    (site,) = (fresh / "lib").glob("python3*/site-packages")
    (site / "rill-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip("--python", str(fresh / "bin" / "python"), "install", "--no-deps", str(wheel), cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = subprocess.run([str(fresh / "bin" / "python"), "-c", "import rill.asgi.prompt.templating as t; "
                            "print(t.__file__); print(t.BUNDLED_TEMPLATES_DIR)"], cwd=elsewhere,
                           capture_output=True, text=True, timeout=120)
    module_file, templates_dir = where.stdout.split()
    assert module_file.startswith(str(site)) and templates_dir.startswith(str(site)), where.stdout + where.stderr

    port = free_port()
    server = ServerProcess([str(fresh / "bin" / "rill"), "serve", "--port", str(port), "--enforce-eager",
                            "--log-level", "warning"], port, tmp_path / "serve.log", cwd=elsewhere)
    with server:
        reply = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=120, json={
            "model": "smollm2-135m-instruct", "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Say hello."}]})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["content"]
    assert not list(elsewhere.iterdir())  # nothing written where it was started
