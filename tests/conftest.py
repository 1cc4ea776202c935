"""Shared fixtures: the bundled model, a real `rill serve`, and OpenAI SDK clients."""
from __future__ import annotations

import os
import shutil
import signal
import time
import uuid
from pathlib import Path

# Without a GPU the Triton kernels run under Triton's interpreter. Set before anything imports
# triton (transformers may, through its integrations), since triton reads it when it loads.
if not shutil.which("nvidia-smi"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# `make test` runs two pytest-xdist workers on a two-core machine. Each process's torch (and every
# server a test starts, which inherits this) then gets its share of the cores, not all of them: two
# OpenMP teams as wide as the machine wait at every op's barrier for each other's descheduled
# threads (measured: a model test file took 20x as long beside a copy of itself, 1.3x with one
# thread each). Set before anything imports torch, which reads it once.
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))

import pytest  # noqa: E402

from tests.helpers.file_order import (  # noqa: E402
    SHARED_GROUP,
    file_or_shared_scheduling,
    load_times,
    longest_first,
    shared_files_path,
    shared_server_files,
    write_shared_files,
)
from tests.helpers.redis_server import redis_server  # noqa: E402, F401 (a fixture)
from tests.helpers.server import TINY_MAX_LOGPROBS, TINY_MODEL, sdk_client, start_server, stop_server  # noqa: E402

# Every process this session starts inherits this mark (servers, engines, workers, ranks, their
# helpers), so the end of the session can find any of them still running: see pytest_sessionfinish.
SESSION_MARK = "RILL_TEST_SESSION"
os.environ[SESSION_MARK] = uuid.uuid4().hex
shared_files_path()  # chosen by the controller, inherited by the xdist workers it starts (file_order.py)
LEFTOVER_GRACE_S = 3.0  # for processes stopped by the last teardowns to finish exiting
# Helpers that live as long as the process that started them (this pytest included): Python's
# resource tracker and forkserver, torch.compile's worker pool.
HELPER_PROCESSES = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "compile_worker")

# Each folder is one kind of test, and its marker says so: `pytest -m "not e2e"` leaves out every
# test that starts a server, `make test-unit` runs tests/unit alone.
FOLDER_MARKERS = {"unit": "unit", "model": "model", "e2e": "e2e", "hardening": "e2e", "bench": "bench"}


def pytest_sessionstart(session):
    """Under xdist, the bundled model's directory is made ready in the controller before any worker
    starts: a conversion, or a cache filled from another checkout made to follow this one's file
    (engine_proc/model/bundled.py), never happens under another worker's running test."""
    if getattr(session.config.option, "numprocesses", None) and not hasattr(session.config, "workerinput"):
        from rill.engine_proc.model.bundled import ensure_bundled_model

        ensure_bundled_model()


def pytest_collection_modifyitems(config, items):
    root = Path(config.rootpath)
    # An xdist worker says which files use the shared servers, for the controller's scheduler (file_order.py).
    shared = shared_server_files(items, root)
    if hasattr(config, "workerinput"):
        write_shared_files(shared)
    for item in items:
        marker = FOLDER_MARKERS.get(item.path.parent.name)
        if marker:
            item.add_marker(marker)
    # The longest units first, for xdist's workers to end together (tests/helpers/file_order.py).
    items[:] = longest_first(items, load_times(), root, unit_of=lambda item, file: SHARED_GROUP if file in shared else file)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`make test`'s `--dist loadfile`: each file a unit, but the files of the shared servers one unit."""
    return file_or_shared_scheduling(config, log) if config.getvalue("dist") == "loadfile" else None


@pytest.fixture(scope="session")
def model_dir():
    from rill.engine_proc.model.bundled import ensure_bundled_model

    return ensure_bundled_model()


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


@pytest.fixture(scope="session")
def server(model_dir, tmp_path_factory):
    """One shared server for the read-only end-to-end tests, compiled as `rill serve` is by default
    (and serving embeddings too)."""
    srv = start_server(tmp_path_factory, "--max-model-len", "2048", "--enable-embeddings", compiled=True)
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def tiny_server(model_dir, tmp_path_factory):
    """The hardening suite's server: bench's tiny random-weight model (each step costs almost
    nothing, so what is under test is the serving stack) behind two API workers, with a 12 MiB
    body limit (a 10 MB string fits, 13 MB does not), a 64 MiB KV cache and 40 top logprobs a
    token at most (TINY_MAX_LOGPROBS, not the default 20)."""
    from rill.bench.serving.tiny_model import write_tiny_model

    tiny = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    srv = start_server(tmp_path_factory, "--model", str(tiny), "--load-format", "dummy", "--served-model-name",
                       TINY_MODEL, "--max-model-len", "256", "--workers", "2", "--kv-cache-memory", "64MiB",
                       "--max-request-body", "12MiB", "--max-logprobs", str(TINY_MAX_LOGPROBS))
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def client(server):
    return sdk_client(server)


@pytest.fixture(scope="session")
def aclient_factory(server):
    from openai import AsyncOpenAI

    return lambda: AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused",
                               _strict_response_validation=True, max_retries=0, timeout=120)


def processes_of_this_session() -> list[tuple[int, str]]:
    """(pid, command line) of every live process carrying this session's mark, but helpers
    (HELPER_PROCESSES): those of a leftover go with it, and this pytest's own until it exits."""
    mark = f"{SESSION_MARK}={os.environ[SESSION_MARK]}".encode()
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            if mark not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state in ("Z", "X") or any(helper in command for helper in HELPER_PROCESSES):
            continue
        found.append((int(entry.name), command))
    return found


def pytest_sessionfinish(session, exitstatus):
    """No server, engine or worker of this session outlives it: any still running once every
    fixture is torn down is killed, named, and fails the run (a run once left three API workers
    behind, with PPID 1). Under pytest-xdist each worker checks its own; the controller starts nothing."""
    if session.config.pluginmanager.has_plugin("dsession"):
        shared_files_path().unlink(missing_ok=True)
        return
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while (left := processes_of_this_session()) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not left:
        return
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{len(left)} processes of this test session were still running (killed now):",
             *(f"  pid {pid}: {command[:300]}" for pid, command in left)]
    if reporter is not None:
        reporter.write_line("\n".join(lines), red=True)
    else:
        print("\n".join(lines))
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
