"""Shared fixtures: the bundled model, a real `rill serve`, and OpenAI SDK clients."""
from __future__ import annotations

import os
import shutil

# Without a GPU the Triton kernels run under Triton's interpreter. Set before anything imports
# triton (transformers may, through its integrations), since triton reads it when it loads.
if not shutil.which("nvidia-smi"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from bench.servers import ServerProcess, rill_server  # noqa: E402
from tests.server import leftovers  # noqa: E402


@pytest.fixture(scope="session")
def model_dir():
    from engine_proc.bundled_model import ensure_bundled_model

    return ensure_bundled_model()


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def start_server(tmp_path_factory, *flags: str, env: dict[str, str] | None = None) -> ServerProcess:
    log_path = tmp_path_factory.mktemp("rill") / "serve.log"
    return rill_server(*flags, log_path=log_path, env=env).wait_ready()


def stop_server(server: ServerProcess) -> None:
    code = server.stop()
    assert code == 0, f"rill serve exited with {code}:\n{server.log()}"
    assert leftovers(server.proc.pid) == [], "shared memory or socket files left behind"


@pytest.fixture(scope="session")
def server(model_dir, tmp_path_factory):
    """One shared server for the read-only end-to-end tests."""
    srv = start_server(tmp_path_factory, "--max-model-len", "2048")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", _strict_response_validation=True,
                  max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def aclient_factory(server):
    from openai import AsyncOpenAI

    return lambda: AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused",
                               _strict_response_validation=True, max_retries=0, timeout=120)
