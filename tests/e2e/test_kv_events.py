"""End to end: --kv-events-endpoint publishes the prefix cache's blocks in vLLM's kv_events schema; a
ZeroMQ subscriber rebuilds the engine's cached blocks from them, evictions included."""
from __future__ import annotations

import time

import httpx
import msgspec
import pytest
import zmq

from rill.bench.serving.servers import free_port
from rill.engine_proc.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from tests.helpers.server import TINY_MODEL, start_server, stop_server

BLOCK = 16
decode_batch = msgspec.msgpack.Decoder(KVEventBatch).decode


@pytest.fixture(scope="module")
def events_server(tmp_path_factory):
    from rill.bench.serving.tiny_model import write_tiny_model

    tiny = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    port = free_port()
    # 50 blocks of 16 tokens in float32 for this model: the workload below evicts.
    srv = start_server(tmp_path_factory, "--model", str(tiny), "--load-format", "dummy", "--served-model-name",
                       TINY_MODEL, "--dtype", "float32", "--kv-cache-memory", str(50 * 8192),
                       "--kv-events-endpoint", f"tcp://127.0.0.1:{port}", "--kv-events-topic", "rill")
    srv.events_endpoint = f"tcp://127.0.0.1:{port}"
    yield srv
    stop_server(srv)


def complete(server, prompt: list[int]) -> dict:
    r = httpx.post(f"{server.base_url}/v1/completions", json={"model": TINY_MODEL, "prompt": prompt,
                                                               "max_tokens": 1}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def receive(sub: zmq.Socket, quiet_s: float) -> list[tuple[bytes, int, KVEventBatch]]:
    """Every message until none came for `quiet_s`."""
    out = []
    while sub.poll(int(quiet_s * 1000)):
        topic, seq, payload = sub.recv_multipart()
        out.append((topic, int.from_bytes(seq, "big"), decode_batch(payload)))
    return out


def test_a_subscriber_rebuilds_the_engines_cached_blocks(events_server):
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"rill")
    sub.connect(events_server.events_endpoint)
    # A PUB socket drops what it sent before the subscription reached it: warm up until events come.
    messages: list = []
    for i in range(50):
        complete(events_server, [7, i] * BLOCK)
        messages = receive(sub, 0.3)
        if messages:
            break
    assert messages, "no KV event arrived"
    shared = list(range(10, 10 + 3 * BLOCK))
    prompts = [shared + [200 + i] * (2 * BLOCK + 5) for i in range(5)]  # a shared prefix, private tails
    prompts += [list(range(1000 + 100 * i, 1000 + 100 * i + 6 * BLOCK + 3)) for i in range(12)]  # 72 blocks: evicts
    for prompt in prompts:
        complete(events_server, prompt)
    time.sleep(0.5)
    messages += receive(sub, 1.0)
    sub.close(linger=0)

    seqs = [seq for _, seq, _ in messages]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a gap in the sequence numbers"
    assert {topic for topic, _, _ in messages} == {b"rill"}
    live: dict[int, BlockStored] = {}
    removed = 0
    for _, _, batch in messages:
        assert batch.ts > 0
        for event in batch.events:
            if isinstance(event, BlockStored):
                assert event.block_size == BLOCK and len(event.token_ids) == BLOCK and event.medium == "CPU"
                assert event.parent_block_hash is None or event.parent_block_hash in live or seqs[0] > 0
                for block_hash in event.block_hashes:
                    assert block_hash not in live
                    live[block_hash] = event
            elif isinstance(event, BlockRemoved):
                for block_hash in event.block_hashes:
                    # Blocks stored before the subscription reached the socket may be removed unseen.
                    if live.pop(block_hash, None) is not None:
                        removed += 1
            else:
                assert isinstance(event, AllBlocksCleared)
                live.clear()
    assert removed > 0, "the workload was meant to evict"
    stats = httpx.get(f"{events_server.base_url}/stats", timeout=30).json()
    # Everything stored since the warm-up is accounted for: what is live now is what the engine holds,
    # less what it stored before we listened and still holds (at most the warm-up's blocks).
    assert stats["num_cached_blocks"] - 50 <= len(live) <= stats["num_cached_blocks"]
    # The last prompt's chain: its full blocks, in order, each the child of the one before.
    last = prompts[-1]
    chain = [e for e in live.values() if list(e.token_ids) == last[:BLOCK]]
    assert len(chain) == 1 and chain[0].parent_block_hash is None
    parent = chain[0].block_hashes[0]
    for i in range(1, 6):
        child = [e for e in live.values() if e.parent_block_hash == parent]
        assert len(child) == 1 and list(child[0].token_ids) == last[i * BLOCK : (i + 1) * BLOCK]
        parent = child[0].block_hashes[0]


def test_kv_events_need_prefix_caching(tmp_path_factory):
    from rill.bench.serving.servers import rill_server

    log = tmp_path_factory.mktemp("rill") / "serve.log"
    srv = rill_server("--no-enable-prefix-caching", "--kv-events-endpoint", f"tcp://127.0.0.1:{free_port()}",
                      "--enforce-eager", log_path=log)
    with pytest.raises(RuntimeError, match="needs prefix caching"):
        srv.wait_ready(timeout_s=120)
    srv.stop()
