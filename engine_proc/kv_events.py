"""KV-cache events for KV-aware routers (NVIDIA Dynamo, llm-d), in vLLM's `kv_events` schema.

`--kv-events-endpoint tcp://*:5557` publishes, after each engine step that changed the prefix
cache, one `KVEventBatch` over a ZeroMQ PUB socket as vLLM's ZmqEventPublisher does: a multipart
message [topic, sequence number (8 bytes, big-endian), msgpack payload]. A block is *stored*
when the prefix cache indexes it (full, computed, findable by other requests) and *removed*
when the cache forgets it (evicted for new tokens, or replaced); `AllBlocksCleared` opens the
stream, so a subscriber that saw an earlier engine drops what it knew.
"""
from __future__ import annotations

import logging
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
    lora_id: int | None = None
    medium: str | None = None


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


class KVEventPublisher:
    """Owns the PUB socket; `publish(raw)` sends the prefix cache's raw events of one step.

    Raw events (engine_proc/sched/prefix_cache.py): ("stored", hash, parent hash or None, token
    ids) and ("removed", hash). Consecutive removals go out as one BlockRemoved.
    """

    def __init__(self, endpoint: str, *, block_size: int, medium: str, topic: str = "",
                 data_parallel_rank: int | None = None, ctx: zmq.Context | None = None) -> None:
        self.block_size = block_size
        self.medium = medium
        self.topic = topic.encode()
        self.data_parallel_rank = data_parallel_rank
        self._socket = (ctx or zmq.Context.instance()).socket(zmq.PUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, 100_000)  # a slow subscriber drops events, never the engine
        self._socket.bind(endpoint)
        self._seq = 0
        self._send([AllBlocksCleared()])

    def publish(self, raw: list[tuple[Any, ...]]) -> None:
        if not raw:
            return
        events: list[KVCacheEvent] = []
        for item in raw:
            if item[0] == "stored":
                _, block_hash, parent, token_ids = item
                events.append(BlockStored([block_hash], parent, list(token_ids), self.block_size, None, self.medium))
            elif events and isinstance(events[-1], BlockRemoved):
                events[-1].block_hashes.append(item[1])
            else:
                events.append(BlockRemoved([item[1]], self.medium))
        self._send(events)

    def _send(self, events: list[KVCacheEvent]) -> None:
        payload = _encode(KVEventBatch(time.time(), events, self.data_parallel_rank))
        try:
            self._socket.send_multipart([self.topic, self._seq.to_bytes(8, "big"), payload], flags=zmq.NOBLOCK)
        except zmq.Again:  # past the high-water mark: dropped, as a PUB socket drops
            pass
        self._seq += 1

    def close(self) -> None:
        self._socket.close(linger=0)


def publisher_for(config, blocks, device) -> KVEventPublisher:
    """--kv-events-endpoint: the prefix cache records its events, published after each step."""
    if blocks.prefix_cache is None:
        raise ValueError("--kv-events-endpoint needs prefix caching: the events are the prefix cache's")
    rank = config.data_parallel_rank
    publisher = KVEventPublisher(endpoint_for_rank(config.kv_events_endpoint, rank), block_size=config.block_size,
                                 medium="GPU" if device.type == "cuda" else "CPU", topic=config.kv_events_topic,
                                 data_parallel_rank=rank)
    blocks.prefix_cache.events = []
    log.info("KV-cache events published on %s", config.kv_events_endpoint)
    return publisher


def endpoint_for_rank(endpoint: str, rank: int) -> str:
    """Engine `rank`'s KV-event endpoint: a TCP port moves up by the rank (as vLLM offsets it)."""
    host, sep, port = endpoint.rpartition(":")
    return f"{host}:{int(port) + rank}" if rank and sep and port.isdigit() else endpoint
