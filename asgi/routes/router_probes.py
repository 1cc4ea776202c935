"""What model gateways probe besides the OpenAI routes: SGLang's load and info endpoints.

SGLang's model gateway (`smg`) polls `GET /v1/loads` for its load-aware policies (the engine's
running and waiting requests and its KV-cache usage, one entry per data-parallel rank) and asks
`/server_info` and `/model_info` (older names: `/get_server_info`, `/get_model_info`) what a
worker serves. Answering them makes Rill a worker like any other behind it.
"""
from __future__ import annotations

import datetime

from rill.asgi.engine_link.client import EngineDead
from rill.asgi.errors import engine_unavailable
from rill.asgi.http.primitives import send_response
from rill.asgi.http.router import HTTPRequest
from rill.asgi.state import WorkerState, dumps
from rill.ipc.protocol import EngineStats


async def _stats(state: WorkerState) -> EngineStats:
    try:
        return await state.client.stats()
    except (EngineDead, TimeoutError):
        raise engine_unavailable() from None


def load_snapshot(stats: EngineStats, block_size: int, max_num_seqs: int) -> dict:
    """One engine's load in SGLang's `SchedulerLoadSnapshot` shape."""
    used_blocks = stats.num_total_blocks - stats.num_free_blocks
    total = max(stats.num_total_blocks, 1)
    queried = stats.num_prefix_queries_tokens
    return {"dp_rank": 0, "num_running_reqs": stats.num_running, "num_waiting_reqs": stats.num_waiting,
            "num_waiting_uncached_tokens": stats.num_waiting_tokens,
            "num_total_reqs": stats.num_running + stats.num_waiting,
            "num_used_tokens": used_blocks * block_size, "max_total_num_tokens": total * block_size,
            "token_usage": used_blocks / total, "gen_throughput": 0.0,
            "cache_hit_rate": stats.num_prefix_hit_tokens / queried if queried else 0.0,
            "utilization": min(1.0, stats.num_running / max_num_seqs), "max_running_requests": max_num_seqs}


async def loads(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    limits = state.settings.limits
    snapshot = load_snapshot(await _stats(state), limits.block_size, limits.max_num_seqs)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat()
    await send_response(http.send, 200, dumps({"timestamp": now, "dp_rank_count": 1, "loads": [snapshot]}))


async def server_info(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    limits = state.settings.limits
    await send_response(http.send, 200, dumps({
        "model_path": limits.model_dir, "served_model_name": state.model_id, "tp_size": 1, "dp_size": 1,
        "context_length": limits.max_model_len, "max_running_requests": limits.max_num_seqs,
        "max_total_num_tokens": limits.num_kv_blocks * limits.block_size, "page_size": limits.block_size,
        "chunked_prefill_size": limits.max_num_batched_tokens, "dtype": limits.dtype, "runtime": "rill"}))


async def model_info(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    limits = state.settings.limits
    await send_response(http.send, 200, dumps({
        "model_path": limits.model_dir, "tokenizer_path": limits.model_dir, "served_model_name": state.model_id,
        "is_generation": limits.generates, "max_model_len": limits.max_model_len}))
