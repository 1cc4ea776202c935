"""The ASGI application each Granian worker runs: lifespan, routing by (method, path), errors."""
from __future__ import annotations

import asyncio
import logging
import signal
import time

from asgi.engine_link.client import EngineDead
from asgi.engine_link.generate import GenerationFailed
from asgi.errors import APIError, engine_unavailable, error_body, shutting_down
from asgi.http.access_log import tag_records_with_request_id
from asgi.http.primitives import ClientDisconnected, read_body, require_json, send_response
from asgi.http.request_context import RequestContext, set_current
from asgi.routes.chat import chat_completions
from asgi.routes.completions import completions
from asgi.routes.conversations import conversations_route, create_conversation
from asgi.routes.metrics import METRICS_PATH, metrics_endpoint
from asgi.routes.responses import count_input_tokens, create_response
from asgi.routes.stored_responses import responses_route
from asgi.routes.tokenize import detokenize, get_version, tokenize
from asgi.state import WorkerSettings, WorkerState, dumps

log = logging.getLogger("rill.api")


async def health(state, body, receive, send):
    await send_response(send, 200, b"{}")


async def ready(state, body, receive, send):
    if state.draining():
        raise shutting_down()
    if not state.client.alive:
        raise engine_unavailable()
    await send_response(send, 200, b'{"status":"ready"}')


async def engine_stats(state, body, receive, send):
    """The engine's own figures (running, waiting, free KV blocks, aborted, finished)."""
    try:
        stats = await state.client.stats()
    except (EngineDead, TimeoutError):
        raise engine_unavailable() from None
    figures = {f: getattr(stats, f) for f in stats.__struct_fields__}
    limits = state.settings.limits
    chosen = {"dtype": limits.dtype, "dtype_reason": limits.dtype_reason, "quantization": limits.quantization,
              "cpu": limits.cpu, "compiled_decode": limits.compiled_decode,
              "attention_backend": limits.attention_backend}
    await send_response(send, 200, dumps({**figures, **chosen, "engine_pid": state.settings.engine_pid}))


async def list_models(state, body, receive, send):
    await send_response(send, 200, dumps({"object": "list", "data": [state.model_card()]}))


async def get_model(state, model_id, receive, send):
    if model_id != state.model_id:
        raise APIError(404, f"The model `{model_id}` does not exist.", param="model", code="model_not_found")
    await send_response(send, 200, dumps(state.model_card()))


ROUTES = {
    ("GET", "/health"): health,
    ("GET", "/ready"): ready,
    ("GET", "/stats"): engine_stats,
    ("GET", METRICS_PATH): metrics_endpoint,  # Prometheus text; guarded only under --protect-metrics
    ("GET", "/v1/models"): list_models,
    ("POST", "/v1/chat/completions"): chat_completions,
    ("POST", "/v1/completions"): completions,
    ("POST", "/v1/responses"): create_response,
    ("POST", "/v1/responses/input_tokens"): count_input_tokens,
    ("POST", "/v1/conversations"): create_conversation,
    ("POST", "/tokenize"): tokenize,  # vLLM's utility routes
    ("POST", "/detokenize"): detokenize,
    ("GET", "/version"): get_version,
}
PATHS = {path: [m for m, p in ROUTES if p == path] for _, path in ROUTES}
NEEDS_BODY = {"POST"}
MODEL_PREFIX = "/v1/models/"
# OpenVINO Model Server serves the OpenAI API under /v3/; it is an alias of /v1/ here.
ALIAS_PREFIX = "/v3/"


def ignore_sigint() -> None:
    """Ctrl-C reaches the whole process group; the launcher drains first, then Granian stops us
    with SIGTERM. Stopping here on SIGINT would stall in-flight streams (Granian stops the loop)."""
    asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class App:
    def __init__(self):
        self.state: WorkerState | None = None

    async def __call__(self, scope, receive, send):
        kind = scope["type"]
        if kind == "http":
            await self.http(scope, receive, send)
        elif kind == "lifespan":
            await self.lifespan(receive, send)

    async def lifespan(self, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    ignore_sigint()
                    self.state = WorkerState.load(WorkerSettings.from_env())
                    tag_records_with_request_id()
                    self.state.client.start()
                except Exception as exc:
                    log.exception("worker failed to start")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.state is not None:
                    self.state.client.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def http(self, scope, receive, send):
        ctx = RequestContext.from_scope(scope)
        set_current(ctx)  # a fresh context per request: the handler and its Generation fill it in
        try:
            await self.route(scope, receive, _tracking(send, ctx, self.state.cors.response_headers(scope["headers"])))
        finally:
            ctx.end_s = time.perf_counter()
            self.state.observe(ctx)

    async def route(self, scope, receive, send):
        method, path = scope["method"], scope["path"].rstrip("/") or "/"
        if path.startswith(ALIAS_PREFIX):
            path = "/v1/" + path[len(ALIAS_PREFIX):]
        elif path.startswith(("/responses", "/conversations")):  # as vLLM, also without /v1
            path = "/v1" + path
        query = scope.get("query_string", b"")
        handler = ROUTES.get((method, path)) or responses_route(method, path, query) \
            or conversations_route(method, path, query)
        try:
            if self.state.cors.is_preflight(method, scope["headers"]):  # before auth: preflights carry no key
                return await self.state.cors.answer_preflight(scope["headers"], send)
            self.state.auth.check(path, scope["headers"])
            if method in NEEDS_BODY and self.state.draining():
                raise shutting_down()
            if handler is None:
                if path.startswith(MODEL_PREFIX) and method == "GET":
                    return await get_model(self.state, path[len(MODEL_PREFIX):], receive, send)
                if path in PATHS or path.startswith(MODEL_PREFIX):
                    allowed = ", ".join(PATHS.get(path, ["GET"]))
                    raise APIError(405, f"Method {method} is not allowed for {path}; use {allowed}.",
                                   code="method_not_allowed")
                raise APIError(404, f"Unknown path: {path}", code="not_found")
            body = b""
            if method in NEEDS_BODY:
                require_json(scope["headers"])
                body = await read_body(receive, self.state.settings.max_body_bytes)
            await handler(self.state, body, receive, send)
        except APIError as exc:
            await send_response(send, exc.status, exc.body(), headers=exc.headers)
        except ClientDisconnected:
            pass
        except GenerationFailed as exc:
            await send_response(send, exc.status, error_body(str(exc), "server_error", code="engine_error"))
        except Exception:
            log.exception("unhandled error on %s %s", method, path)
            await send_response(send, 500, error_body("Internal server error.", "server_error"))


def _tracking(send, ctx: RequestContext, extra_headers=()):
    """`send` that records the status and adds X-Request-Id (and the CORS headers) to every response."""
    added = [(b"x-request-id", ctx.request_id.encode("latin-1")), *extra_headers]

    async def tracking_send(message):
        if message["type"] == "http.response.start":
            ctx.status = message["status"]
            message = {**message, "headers": [*message.get("headers", ()), *added]}
        await send(message)

    return tracking_send


app = App()
