"""End to end: `rill serve --tensor-parallel-size 2` on the CPU (gloo), on one node and over two
"nodes" (two `rill serve` processes, the second --headless) across a veth pair where this machine allows
network namespaces, else on loopback. Every arrangement gives the one-rank model's greedy
tokens (float32); a rank's death stops the server with status 1 and leaves no process behind."""
from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest
import torch

from rill.bench.serving.servers import RILL, free_port
from tests.helpers.generation import BLOCK_SIZE, EOS_ID, generate
from tests.helpers.runners import make_runner
from tests.helpers.server import leftovers, start_server, stop_server

PROMPTS = [[1, 504, 3458, 282, 4063, 30, 2], [1, 9690, 253, 1345, 2], list(range(600, 700))]
MAX_TOKENS = 12
TP2 = ("--tensor-parallel-size", "2", "--dtype", "float32")


@pytest.fixture(scope="module")
def expected(model_dir, tokenizer) -> list[str]:
    """The one-rank model's greedy texts, from a runner in this process (cheaper than a server)."""

    runner = make_runner(model_dir, dtype=torch.float32, num_kv_blocks=32, block_size=BLOCK_SIZE,
                         eos_token_ids=[EOS_ID])
    return [tokenizer.decode(ids) for ids in generate(runner, PROMPTS, max_tokens=MAX_TOKENS)]


def answers(base_url: str) -> list[str]:
    def one(prompt):
        r = httpx.post(f"{base_url}/v1/completions", timeout=120, json={
            "model": "smollm2-135m-instruct", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:  # batched together in the engine
        return list(pool.map(one, PROMPTS))


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture(scope="module")
def tp2(tmp_path_factory):
    srv = start_server(tmp_path_factory, *TP2)
    yield srv
    if srv.proc.poll() is None:
        stop_server(srv)


def test_two_ranks_answer_as_one(tp2, expected):
    assert answers(tp2.base_url) == expected


def test_a_ranks_death_stops_the_server_with_a_failure(tp2):
    engine = httpx.get(f"{tp2.base_url}/stats", timeout=30).json()["engines"][0]["pid"]
    (rank1,) = children(engine)
    os.kill(rank1, signal.SIGKILL)
    assert tp2.proc.wait(60) == 1, tp2.log()
    assert "tensor-parallel rank died" in tp2.log()
    time.sleep(0.5)
    assert not alive(engine) and not alive(rank1)
    assert leftovers(tp2.proc.pid) == [] and not list(Path("/dev/shm").glob(f"rill-tp_{engine}_*"))


def headless(port: int, log_path: Path, master_addr: str, *prefix: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*prefix, str(RILL), "serve", "--headless", *TP2, "--nnodes", "2", "--node-rank", "1",
                             "--master-addr", master_addr, "--master-port", str(port)],
                            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, start_new_session=True,
                            env=None if env is None else {**os.environ, **env})


def serve_two_nodes(tmp_path_factory, tmp_path, expected, master_addr: str, *prefix: str) -> None:
    """Node 1 headless (under `prefix`), node 0 serving: the one-rank answers; node 0's stop ends node 1."""
    port = free_port()
    node1 = headless(port, tmp_path / "node1.log", master_addr, *prefix)
    try:
        node0 = start_server(tmp_path_factory, *TP2, "--nnodes", "2", "--node-rank", "0", "--master-addr",
                             master_addr, "--master-port", str(port))
        assert answers(node0.base_url) == expected
        stop_server(node0)
        assert node1.wait(60) == 0, (tmp_path / "node1.log").read_text()
    finally:
        if node1.poll() is None:
            node1.kill()


def _netns(*args: str) -> bool:
    return subprocess.run(["ip", *args], capture_output=True).returncode == 0


@pytest.fixture
def node1_network():
    """Where node 1 runs: in a network namespace joined to this one by a veth pair (10.77.0.1 here, 10.77.0.2
    there) where this machine allows it (root and `ip netns`), so only the veth pair joins the nodes and gloo
    picks the interface that routes to --master-addr on each side; else beside node 0, on loopback. Yields
    node 0's address and the prefix that runs a command in node 1's place."""
    name, here, there = f"rill{uuid.uuid4().hex[:6]}", f"rv{uuid.uuid4().hex[:6]}", f"rw{uuid.uuid4().hex[:6]}"
    if os.geteuid() != 0 or not _netns("netns", "add", name):
        yield "127.0.0.1", ()
        return
    try:
        steps = [("link", "add", here, "type", "veth", "peer", "name", there), ("link", "set", there, "netns", name),
                 ("addr", "add", "10.77.0.1/24", "dev", here), ("link", "set", here, "up"),
                 ("-n", name, "addr", "add", "10.77.0.2/24", "dev", there), ("-n", name, "link", "set", there, "up"),
                 ("-n", name, "link", "set", "lo", "up")]
        yield ("10.77.0.1", ("ip", "netns", "exec", name)) if all(_netns(*step) for step in steps) else ("127.0.0.1", ())
    finally:
        _netns("link", "del", here)
        _netns("netns", "del", name)


def test_two_nodes(tmp_path_factory, tmp_path, expected, node1_network):
    master_addr, prefix = node1_network
    serve_two_nodes(tmp_path_factory, tmp_path, expected, master_addr, *prefix)
