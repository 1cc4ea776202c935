"""KV events: a subscriber that connects late (a router that reconnects, or one that finds a
restarted engine) first gets AllBlocksCleared and every block the cache holds; a LoRA adapter's
blocks name it (lora_id, lora_name); an endpoint open to other hosts is warned about at start."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import httpx
import msgspec
import pytest
import zmq

from rill.bench.serving.servers import free_port
from rill.engine_proc.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    is_loopback,
    publisher_for,
)
from rill.ipc.config import EngineConfig, ModelConfig
from tests.helpers.server import TINY_MODEL, start_server, stats, stop_server
from tests.helpers.tiny_lora import write_adapter

BLOCK = 16
decode_batch = msgspec.msgpack.Decoder(KVEventBatch).decode


@pytest.fixture(scope="module")
def lora_events_server(tmp_path_factory):
    from rill.bench.serving.tiny_model import write_tiny_model

    tiny = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    adapter = write_adapter(tmp_path_factory.mktemp("adapter") / "ad", seed=1)
    port = free_port()
    srv = start_server(tmp_path_factory, "--model", str(tiny), "--load-format", "dummy", "--served-model-name",
                       TINY_MODEL, "--max-model-len", "256", "--kv-cache-memory", "16MiB", "--enable-lora",
                       "--lora-modules", f"ad={adapter}", "--kv-events-endpoint", f"tcp://127.0.0.1:{port}",
                       "--log-level", "info")
    srv.events_endpoint = f"tcp://127.0.0.1:{port}"
    yield srv
    stop_server(srv)


def complete(server, model: str, prompt: list[int]) -> None:
    r = httpx.post(f"{server.base_url}/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1},
                   timeout=60)
    assert r.status_code == 200, r.text


def subscribe(endpoint: str) -> zmq.Socket:
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    return sub


def receive(sub: zmq.Socket, first_wait_s: float, quiet_s: float = 0.5) -> list[KVEventBatch]:
    """Every batch until none came for `quiet_s` (the first may take `first_wait_s`)."""
    out = []
    wait_s = first_wait_s
    while sub.poll(int(wait_s * 1000)):
        _, _, payload = sub.recv_multipart()
        out.append(decode_batch(payload))
        wait_s = quiet_s
    return out


def test_a_late_subscriber_learns_what_the_cache_holds(lora_events_server):
    """No request runs after it subscribes: what it learns, it learns from the snapshot alone."""
    for i in range(3):
        complete(lora_events_server, TINY_MODEL, [7, i] * (2 * BLOCK))  # two full blocks each
    sub = subscribe(lora_events_server.events_endpoint)
    batches = receive(sub, first_wait_s=5)
    sub.close(linger=0)
    assert batches, "nothing arrived for a subscriber of an idle engine"
    events = [e for b in batches for e in b.events]
    assert isinstance(events[0], AllBlocksCleared), events[:1]
    live = {}
    for event in events:
        if isinstance(event, AllBlocksCleared):
            live.clear()
        elif isinstance(event, BlockStored):
            live.update(dict.fromkeys(event.block_hashes, event))
        else:
            assert isinstance(event, BlockRemoved)
            for block_hash in event.block_hashes:
                live.pop(block_hash, None)
    assert len(live) == stats(lora_events_server)["num_cached_blocks"] >= 6
    assert {tuple(e.token_ids) for e in live.values()} >= {tuple([7, i] * (BLOCK // 2)) for i in range(3)}


def test_an_adapters_blocks_name_it(lora_events_server):
    sub = subscribe(lora_events_server.events_endpoint)
    receive(sub, first_wait_s=5)  # the snapshot
    prompt = list(range(300, 300 + 2 * BLOCK + 1))
    complete(lora_events_server, "ad", prompt)
    complete(lora_events_server, TINY_MODEL, prompt)
    stored = [e for b in receive(sub, first_wait_s=5) for e in b.events if isinstance(e, BlockStored)]
    sub.close(linger=0)
    by_adapter = {e.lora_name: e for e in stored if list(e.token_ids) == prompt[:BLOCK]}
    assert set(by_adapter) == {"ad", None}, stored
    assert isinstance(by_adapter["ad"].lora_id, int) and by_adapter["ad"].lora_id >= 1
    assert by_adapter[None].lora_id is None
    # The same tokens under the adapter are other K/V: another block, another hash.
    assert by_adapter["ad"].block_hashes != by_adapter[None].block_hashes


@pytest.mark.parametrize(("endpoint", "loopback"), [
    ("tcp://127.0.0.1:5557", True), ("tcp://[::1]:5557", True), ("tcp://localhost:5557", True),
    ("ipc:///run/rill/kv.sock", True), ("tcp://*:5557", False), ("tcp://0.0.0.0:5557", False),
    ("tcp://10.1.2.3:5557", False), ("tcp://eth0:5557", False),
])
def test_which_endpoints_other_hosts_can_reach(endpoint, loopback):
    assert is_loopback(endpoint) is loopback


def test_an_endpoint_open_to_other_hosts_is_warned_about(caplog):
    blocks = SimpleNamespace(prefix_cache=SimpleNamespace(events=[]))
    config = EngineConfig(model_id="m", model=ModelConfig(model_dir="m", block_size=BLOCK), kv_events_endpoint="tcp://*:*")
    with caplog.at_level(logging.WARNING, logger="rill.engine"):
        publisher = publisher_for(config, 0, blocks, SimpleNamespace(type="cpu"))
    publisher.close()
    assert any("prompt token ids" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
