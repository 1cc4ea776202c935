"""The ASGI application each Granian worker runs: lifespan, routing by (method, path), errors."""
from __future__ import annotations

import logging
import os
import time

from rill.asgi.batch.records import BATCH_ID, FILE_ID
from rill.asgi.batch.runner import BatchRunner
from rill.asgi.engine_link.client import EngineDead
from rill.asgi.engine_link.dp_router import total_stats
from rill.asgi.errors import APIError, engine_unavailable, error_body, shutting_down
from rill.asgi.http.access_log import loggable, tag_records_with_request_id
from rill.asgi.http.paths import normalize
from rill.asgi.http.primitives import ClientDisconnected, read_json_body, send_response
from rill.asgi.http.request_context import RequestContext, current, set_current
from rill.asgi.http.router import HTTPRequest, Router
from rill.asgi.requests.model_choice import refresh_adapters, resolve_model
from rill.asgi.routes import (
    batches,
    cache_reset,
    conversations,
    files,
    llama_cpp,
    lora_admin,
    messages,
    ollama,
    router_probes,
    sagemaker,
    sglang,
    stored_chats,
    tgi,
)
from rill.asgi.routes import stored_responses as stored
from rill.asgi.routes.chat import chat_completions
from rill.asgi.routes.classify import classify, pool
from rill.asgi.routes.completions import completions
from rill.asgi.routes.embeddings import create_embeddings, llama_embedding
from rill.asgi.routes.llama_cpp import completion, infill
from rill.asgi.routes.metrics import METRICS_PATH, metrics_endpoint
from rill.asgi.routes.rerank import rerank, score
from rill.asgi.routes.responses import count_input_tokens, create_response, stop_background
from rill.asgi.routes.tokenize import detokenize, get_version, tokenize
from rill.asgi.state import WorkerSettings, WorkerState, dumps
from rill.asgi.stores.base import StoreUnavailable
from rill.asgi.stores.chat_store import CHAT_ID
from rill.asgi.stores.items import CONVERSATION_ID, ITEM_ID, RESPONSE_ID
from rill.ipc.lifetime import die_with_parent

log = logging.getLogger("rill.api")


async def health(http: HTTPRequest) -> None:
    await send_response(http.send, 200, b"{}")


async def ready(http: HTTPRequest) -> None:
    if http.state.draining():
        raise shutting_down()
    if not http.state.client.alive:
        raise engine_unavailable()
    await send_response(http.send, 200, b'{"status":"ready"}')


async def engine_stats(http: HTTPRequest) -> None:
    """The engine's own figures (running, waiting, free KV blocks, aborted, finished)."""
    state = http.state
    try:
        per_engine = await state.client.stats_per_engine()
    except (EngineDead, TimeoutError):
        raise engine_unavailable() from None
    stats = total_stats(per_engine)
    figures = {f: getattr(stats, f) for f in stats.__struct_fields__ if f != "data_parallel_rank"}
    # --data-parallel-size: each engine's own figures beside the totals (one entry per engine).
    pids = state.settings.engine_pids
    figures["engines"] = [{**{f: getattr(e, f) for f in e.__struct_fields__}, "pid": pids[e.data_parallel_rank]}
                          for e in per_engine]
    limits = state.settings.limits
    chosen = {"dtype": limits.dtype, "dtype_reason": limits.dtype_reason, "quantization": limits.quantization,
              "cpu": limits.cpu, "compiled_decode": limits.compiled_decode,
              "attention_backend": limits.attention_backend, "speculative": limits.speculative,
              "kv_cache_dtype": limits.kv_cache_dtype,
              "sampling_defaults": state.sampling_defaults}
    if limits.speculative:  # the share of drafted tokens the target model accepted
        drafted = stats.num_spec_draft_tokens
        chosen["spec_acceptance_rate"] = stats.num_spec_accepted_tokens / drafted if drafted else 0.0
    await send_response(http.send, 200, dumps({**figures, **chosen, "engine_pid": state.settings.engine_pids[0]}))


async def list_models(http: HTTPRequest) -> None:
    state = http.state
    if state.settings.http.allow_runtime_lora_updating:
        await refresh_adapters(state)
    cards = [state.model_card(), *(state.model_card(alias=name) for name in state.model_names[1:]),
             *(state.model_card(name) for name in state.lora_names)]
    await send_response(http.send, 200, dumps({"object": "list", "data": cards}))


async def get_model(http: HTTPRequest) -> None:
    name = http.params["model_id"]
    adapter = await resolve_model(http.state, name)
    await send_response(http.send, 200, dumps(http.state.model_card(adapter or None, alias=name)))


def generative(handler):
    """A route that generates text: a 400 on a server of an embedding model or a cross-encoder."""
    async def guarded(http: HTTPRequest) -> None:
        if not http.state.settings.limits.generates:
            scorer = http.state.settings.limits.scorer
            what, use = (("a classifier", "POST /classify") if scorer == "classify" else
                         (f"a reranker ({scorer})", "POST /v1/rerank or /score") if scorer else
                         ("an embedding model", "POST /v1/embeddings"))
            raise APIError(400, f"This server serves {what}, which does not generate text; use {use}.",
                           param="model", code="unsupported_model")
        await handler(http)
    return guarded


ROUTES = [
    ("GET", "/health", health),
    ("GET", "/ready", ready),
    ("GET", "/stats", engine_stats),
    ("GET", METRICS_PATH, metrics_endpoint),  # Prometheus text; guarded only under --protect-metrics
    ("GET", "/v1/models", list_models),
    ("GET", "/v1/models/{model_id:path}", get_model),  # ids may hold slashes (org/name)
    ("POST", "/v1/chat/completions", generative(chat_completions)),
    ("GET", "/v1/chat/completions", stored_chats.list_completions),  # `store: true`'s (asgi/routes/stored_chats.py)
    ("GET", "/v1/chat/completions/{completion_id:chat}", stored_chats.retrieve),
    ("POST", "/v1/chat/completions/{completion_id:chat}", stored_chats.update),
    ("DELETE", "/v1/chat/completions/{completion_id:chat}", stored_chats.delete),
    ("GET", "/v1/chat/completions/{completion_id:chat}/messages", stored_chats.list_messages),
    ("POST", "/v1/completions", generative(completions)),
    ("POST", "/v1/embeddings", create_embeddings),
    ("POST", "/v1/rerank", rerank),  # Jina's and Cohere's shapes, as vLLM serves them (asgi/routes/rerank.py)
    ("POST", "/v2/rerank", rerank),
    ("POST", "/rerank", rerank),
    ("POST", "/classify", classify),  # vLLM's (asgi/routes/classify.py)
    ("POST", "/v1/classify", classify),  # SGLang's
    ("POST", "/pooling", pool),  # vLLM's: a classifier's scores or an embedding, alone
    ("POST", "/score", score),  # vLLM's
    ("POST", "/v1/score", score),
    ("POST", "/v1/responses", generative(create_response)),
    ("POST", "/v1/responses/input_tokens", count_input_tokens),
    ("POST", "/v1/messages", generative(messages.create_message)),  # Anthropic's Messages API
    ("POST", "/v1/messages/count_tokens", messages.count_tokens),
    ("GET", "/v1/responses/{response_id:resp}", stored.retrieve),
    ("DELETE", "/v1/responses/{response_id:resp}", stored.delete),
    ("GET", "/v1/responses/{response_id:resp}/input_items", stored.list_input_items),
    ("POST", "/v1/responses/{response_id:resp}/cancel", stored.cancel),
    ("POST", "/v1/conversations", conversations.create),
    ("GET", "/v1/conversations/{conversation_id:conv}", conversations.retrieve),
    ("POST", "/v1/conversations/{conversation_id:conv}", conversations.update),
    ("DELETE", "/v1/conversations/{conversation_id:conv}", conversations.delete),
    ("GET", "/v1/conversations/{conversation_id:conv}/items", conversations.list_items),
    ("POST", "/v1/conversations/{conversation_id:conv}/items", conversations.add_items),
    ("GET", "/v1/conversations/{conversation_id:conv}/items/{item_id:item}", conversations.get_item),
    ("DELETE", "/v1/conversations/{conversation_id:conv}/items/{item_id:item}", conversations.delete_item),
    ("POST", "/v1/files", files.upload),  # the Batch API (docs/batch.md): multipart, read by the route itself
    ("GET", "/v1/files", files.list_files),
    ("GET", "/v1/files/{file_id:file}", files.retrieve),
    ("GET", "/v1/files/{file_id:file}/content", files.content),
    ("DELETE", "/v1/files/{file_id:file}", files.delete),
    ("POST", "/v1/batches", batches.create),
    ("GET", "/v1/batches", batches.list_batches),
    ("GET", "/v1/batches/{batch_id:batch}", batches.retrieve),
    ("POST", "/v1/batches/{batch_id:batch}/cancel", batches.cancel),
    ("POST", "/reset_prefix_cache", cache_reset.reset_prefix_cache),  # --enable-cache-reset (vLLM's)
    ("POST", "/flush_cache", cache_reset.flush_cache),  # SGLang's, either method
    ("GET", "/flush_cache", cache_reset.flush_cache),
    ("POST", "/v1/load_lora_adapter", lora_admin.load_lora_adapter),  # --allow-runtime-lora-updating
    ("POST", "/v1/unload_lora_adapter", lora_admin.unload_lora_adapter),
    ("POST", "/infill", generative(infill)),  # llama.cpp's fill-in-the-middle with context (asgi/routes/llama_cpp.py)
    ("POST", "/completion", generative(completion)),  # llama.cpp's native completion
    ("POST", "/completions", generative(completion)),  # its other name in llama-server
    ("POST", "/embedding", llama_embedding),  # llama.cpp's native embeddings (asgi/routes/embeddings.py)
    ("GET", "/props", generative(llama_cpp.props)),
    ("POST", "/apply-template", generative(llama_cpp.apply_template)),
    ("POST", "/generate", generative(sglang.generate)),  # SGLang's native generation, or TGI's (asgi/routes/tgi.py)
    ("POST", "/generate_stream", generative(tgi.generate_stream)),  # TGI's
    ("POST", "/", generative(tgi.compat_generate)),
    ("GET", "/info", tgi.info),
    ("POST", "/tokenize", tokenize),  # vLLM's utility routes
    ("POST", "/detokenize", detokenize),
    ("GET", "/version", get_version),
    ("POST", "/api/chat", generative(ollama.chat)),  # Ollama's API (asgi/routes/ollama.py)
    ("POST", "/api/generate", generative(ollama.generate)),
    ("POST", "/api/embed", ollama.embed),
    ("POST", "/api/embeddings", ollama.embeddings),
    ("POST", "/api/show", ollama.show),
    ("GET", "/api/tags", ollama.tags),
    ("GET", "/api/ps", ollama.running),
    ("GET", "/api/version", ollama.version),
    ("GET", "/v1/loads", router_probes.loads),  # what SGLang's model gateway probes (asgi/routes/router_probes.py)
    ("GET", "/loads", router_probes.loads),
    ("GET", "/server_info", router_probes.server_info),
    ("GET", "/get_server_info", router_probes.server_info),
    ("GET", "/model_info", router_probes.model_info),
    ("GET", "/get_model_info", router_probes.model_info),
]
ROUTES += [  # SageMaker's (asgi/routes/sagemaker.py): its probe, and every body through the route its keys name
    ("GET", "/ping", ready),
    ("POST", "/ping", ready),
    ("POST", "/invocations", sagemaker.make_invocations({path: h for method, path, h in ROUTES if method == "POST"})),
]
ROUTER = Router(ROUTES, shapes={"resp": RESPONSE_ID, "conv": CONVERSATION_ID, "item": ITEM_ID,  # the ids the store
                                "file": FILE_ID, "batch": BATCH_ID, "chat": CHAT_ID})  # mints and keeps
NEEDS_BODY = {"POST"}


def leave_launcher_group() -> None:
    """A signal to the whole process group (Ctrl-C, `kill -- -PGID`, `tini -g`, supervisord's
    stopasgroup) must reach the launcher alone: it drains in-flight requests, then Granian stops
    this worker with SIGTERM. Had the signal reached us too, Granian's handler would have stopped
    our loop mid-stream and the launcher would see an unexpected worker exit. A process group of
    our own keeps the session (and systemd's cgroup), so nothing else changes."""
    os.setpgid(0, 0)


class App:
    def __init__(self):
        self.state: WorkerState | None = None
        self.runner: BatchRunner | None = None

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
                    leave_launcher_group()
                    die_with_parent()  # out of the launcher's group, so `kill -9 -PGID` misses us
                    self.state = WorkerState.load(WorkerSettings.from_env())
                    tag_records_with_request_id()
                    self.state.client.start()
                    # Batch lines go through the routes' own handlers (asgi/batch/line_call.py).
                    self.runner = BatchRunner(self.state, lambda url: ROUTER.match("POST", url)[0])
                    self.runner.start()
                except Exception as exc:
                    log.exception("worker failed to start")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.runner is not None:
                    await self.runner.stop()  # lets go of its batch before the store closes
                if self.state is not None:
                    await stop_background(self.state)  # their responses end stored, before the store closes
                    if self.state.traces is not None:
                        await self.state.traces.close()  # the spans still queued, bounded in time
                    self.state.client.close()
                    await self.state.store.close()
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
        method = scope["method"]
        path = normalize(scope["path"])  # None: a `.` or `..` segment, a path no route has
        handler, params, allowed = ROUTER.match(method, path) if path is not None else (None, {}, [])
        try:
            if self.state.cors.is_preflight(method, scope["headers"]):  # before auth: preflights carry no key
                return await self.state.cors.answer_preflight(scope["headers"], send)
            key_digest = self.state.auth.check(path, scope["headers"])  # the same path the router matched
            if key_digest and self.state.settings.http.prefix_cache_isolation == "key":
                current().cache_namespace = key_digest  # each key's prompts cached apart (docs/prefix-caching.md)
            if method in NEEDS_BODY and self.state.draining():
                raise shutting_down()
            if handler is None:
                shown = loggable(scope["path"], 200)
                if allowed:
                    raise APIError(405, f"Method {loggable(method, 20)} is not allowed for {shown}; use "
                                        f"{', '.join(allowed)}.", code="method_not_allowed")
                raise APIError(404, f"Unknown path: {shown}", code="not_found")
            http = HTTPRequest(self.state, receive, send, query=scope.get("query_string", b""), params=params,
                               headers=scope["headers"])
            if method in NEEDS_BODY and not getattr(handler, "reads_body", False):
                http.body = await read_json_body(scope["headers"], receive, self.state.settings.http.max_body_bytes)
            await handler(http)
        except APIError as exc:
            if (ctx := current()) is not None:  # the trace's error code
                ctx.error_code = exc.code or exc.type
            body = (messages.anthropic_error(exc.status, exc.message) if _is_messages(path) else
                    ollama.ollama_error(exc.message) if path is not None and path.startswith(ollama.PREFIX) else
                    exc.body())
            await send_response(send, exc.status, body, headers=exc.headers)
        except ClientDisconnected:
            pass
        except StoreUnavailable as exc:  # the state store is down: only the routes that need it fail
            await send_response(send, 503, error_body(f"The state store is unavailable: {exc}.", "server_error",
                                                      code="store_unavailable"))
        except Exception:
            log.exception("unhandled error on %s %s", loggable(method), loggable(scope["path"]))
            await send_response(send, 500, error_body("Internal server error.", "server_error"))


def _is_messages(path: str | None) -> bool:
    """Anthropic's routes answer errors in Anthropic's shape."""
    return path is not None and path.startswith(messages.PREFIX)


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
