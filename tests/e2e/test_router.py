"""End to end: two `rill serve` behind SGLang's model gateway (`smg`, from PyPI) with its cache_aware
policy. Every endpoint it probes answers, requests sharing a prompt prefix stay on one server, and
the OpenAI SDK works through it."""
from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from rill.asgi.routes.router_probes import load_snapshot
from rill.bench.serving.servers import free_port
from rill.ipc.protocol import EngineStats
from tests.helpers.server import TINY_MODEL, start_servers, stop_server

SMG = Path(sys.executable).parent / "smg"
SYSTEM = "You are a careful assistant who answers questions about ships, harbours and the sea. " * 8


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    from rill.bench.serving.tiny_model import write_tiny_model

    tiny = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    flags = ("--model", str(tiny), "--load-format", "dummy", "--served-model-name", TINY_MODEL,
             "--max-model-len", "1024", "--log-level", "info")  # info: the access log shows what the gateway asks
    servers = start_servers(tmp_path_factory, flags, flags)
    port = free_port()
    log = tmp_path_factory.mktemp("smg") / "smg.log"
    with open(log, "wb") as out:
        gateway = subprocess.Popen([str(SMG), "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls",
                                    *(s.base_url for s in servers), "--policy", "cache_aware",
                                    "--health-check-interval-secs", "1", "--prometheus-host", "127.0.0.1",
                                    "--prometheus-port", str(free_port())], stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/v1/models", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert gateway.poll() is None, log.read_text()
        time.sleep(0.3)
    else:
        raise RuntimeError(f"smg not ready:\n{log.read_text()[-3000:]}")
    yield base, servers
    gateway.terminate()
    gateway.wait(30)
    for s in servers:
        stop_server(s)


def finished(server) -> int:
    return httpx.get(f"{server.base_url}/stats", timeout=30).json()["num_finished"]


def test_requests_sharing_a_prefix_stay_on_one_server(fleet):
    base, servers = fleet
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", _strict_response_validation=True, max_retries=0,
                           timeout=120)
    before = [finished(s) for s in servers]
    for i in range(8):
        reply = client.chat.completions.create(model=TINY_MODEL, max_tokens=4, messages=[
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Question {i}: what is a keel?"}])
        assert reply.choices[0].message.content is not None
    served = [finished(s) - b for s, b in zip(servers, before)]
    assert sorted(served) == [0, 8], served
    holder = servers[served.index(8)]
    stats = httpx.get(f"{holder.base_url}/stats", timeout=30).json()
    assert stats["num_prefix_hit_tokens"] > 0  # the shared prefix was served from its prefix cache


def test_every_endpoint_the_gateway_probes_answers(fleet):
    base, servers = fleet
    time.sleep(2)  # a health check or two
    for server in servers:
        probes = re.findall(r"rill\.access: GET (/[^ ?]*)\S* (\d{3})", server.log_path.read_text())
        assert probes, "the gateway probed nothing"
        refused = {path for path, status in probes if status != "200"}
        assert not refused, refused
    loads = httpx.get(f"{servers[0].base_url}/v1/loads", timeout=30).json()
    assert loads["dp_rank_count"] == 1 and loads["loads"][0]["max_running_requests"] > 0
    assert 0.0 <= loads["loads"][0]["token_usage"] <= 1.0
    info = httpx.get(f"{servers[0].base_url}/get_server_info", timeout=30).json()
    assert info["served_model_name"] == TINY_MODEL and info["context_length"] == 1024
    assert httpx.get(f"{servers[0].base_url}/get_model_info", timeout=30).json()["is_generation"] is True


def test_the_load_snapshot_reads_the_engines_figures():
    stats = EngineStats(num_running=3, num_waiting=2, num_free_blocks=75, num_total_blocks=100, num_aborted=0,
                        num_finished=0, num_prefix_queries_tokens=200, num_prefix_hit_tokens=50,
                        num_waiting_tokens=40)
    snap = load_snapshot(stats, block_size=16, max_num_seqs=64)
    assert (snap["num_running_reqs"], snap["num_waiting_reqs"], snap["num_total_reqs"]) == (3, 2, 5)
    assert snap["token_usage"] == 0.25 and snap["num_used_tokens"] == 25 * 16 and snap["max_total_num_tokens"] == 1600
    assert snap["cache_hit_rate"] == 0.25 and snap["num_waiting_uncached_tokens"] == 40
