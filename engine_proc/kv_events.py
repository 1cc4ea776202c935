"""KV-cache events for KV-aware routers (NVIDIA Dynamo, llm-d), in vLLM's `kv_events` schema.

`--kv-events-endpoint tcp://127.0.0.1:5557` publishes, after each engine step that changed the
prefix cache, one `KVEventBatch` over a ZeroMQ XPUB socket as vLLM's ZmqEventPublisher does: a
multipart message [topic, sequence number (8 bytes, big-endian), msgpack payload]. A block is
*stored* when the prefix cache indexes it (full, computed, findable by other requests) and
*removed* when the cache forgets it (evicted for new tokens, or replaced). Each time a subscriber
connects, `AllBlocksCleared` goes out followed by every block the cache holds: a subscriber
that knew an earlier engine (a restart) drops what it knew and learns what this one holds.
The events carry every user's prompt token ids, to whoever can connect (docs/kv-events.md).
"""
from __future__ import annotations

import ipaddress
import logging
import queue
import threading
import time
from typing import Any

import msgspec
import zmq

log = logging.getLogger("rill.engine")


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """The base of vLLM's events (tagged by class name)."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None  # the adapter's load id (a name loaded again gets a new one); None: base model
    medium: str | None = None
    lora_name: str | None = None  # where vLLM has it, after medium; omitted (None) for the base model


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


_encode = msgspec.msgpack.Encoder().encode
SNAPSHOT_BATCH = 1000  # events per message of the snapshot a new subscriber gets
POLL_S = 0.1  # how soon the publisher thread notices a new subscriber while the engine is idle


class KVEventPublisher(threading.Thread):
    """Owns the XPUB socket in a thread of its own; `publish(raw)` hands it the prefix cache's raw
    events of one step (the busy loop never encodes or sends).

    Raw events (engine_proc/sched/prefix_cache.py): ("stored", hash, parent hash or None, token
    ids, adapter name, adapter load id) and ("removed", hash). Consecutive removals go out as one
    BlockRemoved. The blocks stored and not removed are mirrored here (bounded by the KV cache),
    for the snapshot a new subscriber gets.
    """

    def __init__(self, endpoint: str, *, block_size: int, medium: str, topic: str = "",
                 data_parallel_rank: int | None = None, ctx: zmq.Context | None = None) -> None:
        super().__init__(name="kv-events", daemon=True)
        self.block_size = block_size
        self.medium = medium
        self.topic = topic.encode()
        self.data_parallel_rank = data_parallel_rank
        self._socket = (ctx or zmq.Context.instance()).socket(zmq.XPUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, 100_000)  # a slow subscriber drops events, never the engine
        self._socket.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscriber's subscription, not only a topic's first
        self._socket.bind(endpoint)
        self._seq = 0
        self._stored: dict[int, BlockStored] = {}  # by block hash: what the cache holds now
        self._raw: queue.SimpleQueue = queue.SimpleQueue()
        self._send([AllBlocksCleared()])
        self.start()

    def publish(self, raw: list[tuple[Any, ...]]) -> None:
        if raw:
            self._raw.put(raw)

    def close(self) -> None:
        self._raw.put(None)
        self.join(timeout=5)

    def run(self) -> None:
        try:
            while True:
                try:
                    raw = self._raw.get(timeout=POLL_S)
                except queue.Empty:
                    raw = []
                if raw is None:
                    return
                if self._subscribed():
                    self._send_snapshot()
                if raw:
                    self._send(self._events(raw))
        finally:
            self._socket.close(linger=0)

    def _subscribed(self) -> bool:
        """Did a subscriber connect (subscribe) since the last look?"""
        joined = False
        while True:
            try:
                message = self._socket.recv(flags=zmq.NOBLOCK)
            except zmq.Again:
                return joined
            joined = joined or message[:1] == b"\x01"  # \x00: an unsubscription

    def _send_snapshot(self) -> None:
        """AllBlocksCleared, then every block held: to all subscribers (PUB has no other way), so the
        ones connected already clear and rebuild the same state."""
        events: list[KVCacheEvent] = [AllBlocksCleared(), *self._stored.values()]
        for start in range(0, len(events), SNAPSHOT_BATCH):
            self._send(events[start : start + SNAPSHOT_BATCH])

    def _events(self, raw: list[tuple[Any, ...]]) -> list[KVCacheEvent]:
        events: list[KVCacheEvent] = []
        for item in raw:
            if item[0] == "stored":
                _, block_hash, parent, token_ids, lora_name, lora_load_id = item
                event = BlockStored([block_hash], parent, list(token_ids), self.block_size, lora_load_id or None,
                                    self.medium, lora_name or None)
                self._stored[block_hash] = event
                events.append(event)
                continue
            self._stored.pop(item[1], None)
            if events and isinstance(events[-1], BlockRemoved):
                events[-1].block_hashes.append(item[1])
            else:
                events.append(BlockRemoved([item[1]], self.medium))
        return events

    def _send(self, events: list[KVCacheEvent]) -> None:
        payload = _encode(KVEventBatch(time.time(), events, self.data_parallel_rank))
        try:
            self._socket.send_multipart([self.topic, self._seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)
        except zmq.Again:  # past the high-water mark: dropped, as a PUB socket drops
            pass
        self._seq += 1


def publisher_for(config, rank: int, blocks, device) -> KVEventPublisher:
    """--kv-events-endpoint (`config`: the engine's EngineConfig; `rank`: the engine's among
    --data-parallel-size): the events `blocks`' prefix cache records (BlockManager's record_events),
    published after each step."""
    if blocks.prefix_cache is None:
        raise ValueError("--kv-events-endpoint needs prefix caching: the events are the prefix cache's")
    publisher = KVEventPublisher(endpoint_for_rank(config.kv_events_endpoint, rank), block_size=config.model.block_size,
                                 medium="GPU" if device.type == "cuda" else "CPU", topic=config.kv_events_topic,
                                 data_parallel_rank=rank)
    log.info("KV-cache events published on %s", config.kv_events_endpoint)
    if not is_loopback(config.kv_events_endpoint):
        log.warning("KV-cache events on %s carry every user's prompt token ids to anyone who can connect, "
                    "whatever --api-key says: bind 127.0.0.1 (tcp://127.0.0.1:PORT) or keep the port behind a "
                    "firewall (docs/kv-events.md)", config.kv_events_endpoint)
    return publisher


def is_loopback(endpoint: str) -> bool:
    """Can only this host connect? tcp on a loopback address, or a local transport (ipc, inproc)."""
    transport, _, address = endpoint.partition("://")
    if transport != "tcp":
        return transport in ("ipc", "inproc")
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # *, an interface name, a host name: possibly every interface
        return False


def endpoint_for_rank(endpoint: str, rank: int) -> str:
    """Engine `rank`'s KV-event endpoint: a TCP port moves up by the rank (as vLLM offsets it)."""
    host, sep, port = endpoint.rpartition(":")
    return f"{host}:{int(port) + rank}" if rank and sep and port.isdigit() else endpoint
