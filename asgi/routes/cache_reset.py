"""POST /reset_prefix_cache (vLLM's, served under its VLLM_SERVER_DEV_MODE) and GET or POST /flush_cache (SGLang's):
every engine's prefix cache emptied between two of its steps, for a benchmark that must start cold, or after
the files behind a prefix changed. Served only under --enable-cache-reset: a shared cache is every tenant's, so
emptying it is an operator's act, not a request's."""
from __future__ import annotations

from rill.asgi.errors import APIError, engine_unavailable
from rill.asgi.http.primitives import send_response
from rill.asgi.http.router import HTTPRequest
from rill.asgi.state import WorkerState


async def reset_prefix_cache(http: HTTPRequest) -> None:
    """vLLM's answer: 200 and no body."""
    await _reset(http)
    await send_response(http.send, 200, b"", content_type=b"text/plain; charset=utf-8")


async def flush_cache(http: HTTPRequest) -> None:
    """SGLang's answer: 200 and a line of text."""
    num_blocks = await _reset(http)
    await send_response(http.send, 200, f"Cache flushed: {num_blocks} blocks.\n".encode(),
                        content_type=b"text/plain; charset=utf-8")


async def _reset(http: HTTPRequest) -> int:
    state: WorkerState = http.state
    if not state.settings.http.enable_cache_reset:
        raise APIError(404, "Not Found: start the server with --enable-cache-reset to empty the prefix cache "
                            "over HTTP.", type="not_found_error")
    try:
        answers = await state.client.reset_prefix_cache()
    except Exception:  # noqa: BLE001  (EngineDead, a timeout)
        raise engine_unavailable() from None
    if any(a.num_blocks < 0 for a in answers):
        raise APIError(500, "The engine failed to reset its prefix cache (see the server log); it goes on.",
                       type="server_error", code="cache_reset_failed")
    return sum(a.num_blocks for a in answers)
