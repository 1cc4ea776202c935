"""What each API worker holds for its lifetime: settings from the launcher, tokenizer, engine link."""
from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from tokenizers import Tokenizer

from rill.asgi.batch.file_disk import FileDisk, files_folder
from rill.asgi.engine_link.client import EngineClient
from rill.asgi.http.access_log import log_access
from rill.asgi.http.auth import ApiKeyGuard
from rill.asgi.http.cors import CorsPolicy
from rill.asgi.http.request_context import RequestContext
from rill.asgi.output.detokenizer import Detokenizer
from rill.asgi.output.token_text import TokenTexts
from rill.asgi.prompt.fim import FimTokens, fim_tokens
from rill.asgi.prompt.templating import ChatTemplate, load_template_arg
from rill.asgi.prompt.vision import ImagePrompts, accepts_images
from rill.asgi.requests.sampling_defaults import sampling_defaults
from rill.asgi.routes.metrics import Metrics
from rill.asgi.stores.base import Bounds, StateStore
from rill.asgi.stores.batch_store import BatchStore
from rill.asgi.stores.chat_store import ChatStore
from rill.asgi.stores.open import open_store
from rill.asgi.stores.open_batches import batch_store_for
from rill.asgi.stores.open_chats import chat_store_for
from rill.ipc.channels import RunPaths
from rill.ipc.config import HttpConfig
from rill.ipc.pair_segments import pair_separator
from rill.ipc.protocol import EngineLimits

SETTINGS_ENV = "RILL_WORKER_SETTINGS"
log = logging.getLogger("rill.api")


class WorkerSettings(msgspec.Struct):
    """Handed from `rill serve` to every Granian worker through the environment: the workers' slice
    of the config (ipc/config.py) and what the launcher learned at start."""

    http: HttpConfig
    run_id: str
    run_dir: str
    engine_pids: list[int]  # every engine's pid, by --data-parallel-size rank
    limits: EngineLimits  # rank 0's READY
    created: int = 0
    # Digests of the API keys only: the keys themselves never leave the launcher (asgi/http/auth.py).
    api_key_digests: list[str] = []

    def to_env(self) -> str:
        return msgspec.json.encode(self).decode()

    @classmethod
    def from_env(cls) -> WorkerSettings:
        return msgspec.json.decode(os.environ[SETTINGS_ENV], type=cls)


@dataclass(eq=False)
class WorkerState:
    settings: WorkerSettings
    client: EngineClient
    tokenizer: Tokenizer
    template: ChatTemplate
    # Called with every finished RequestContext (the access log, the metrics).
    observers: list[Callable[[RequestContext], None]] = field(default_factory=list)
    auth: ApiKeyGuard = field(default_factory=ApiKeyGuard)
    cors: CorsPolicy = field(default_factory=CorsPolicy)
    metrics: Metrics | None = None
    traces: object | None = None  # --otlp-traces-endpoint: asgi/http/trace_export.py TraceExport
    store: StateStore | None = None
    batches: BatchStore | None = None  # the Batch API's records, in `store`
    chats: ChatStore | None = None  # stored chat completions (`store: true`), beside `store`
    files: FileDisk | None = None  # the Batch API's files
    # Responses in progress on this worker, by id: how to cancel each (the store holds their snapshot).
    in_progress: dict[str, Callable[[], None]] = field(default_factory=dict)
    # `background: true` responses running on this worker, after their create was answered (asgi/routes/responses.py)
    background: set = field(default_factory=set)
    # The events of those also streamed, by id, while they run (asgi/output/event_log.py)
    event_logs: dict = field(default_factory=dict)
    event_readers: int = 0  # GET /v1/responses/{id}?stream=true streams open (asgi/routes/stored_responses.py)
    # LoRA adapters, name -> path: those loaded at start, then as this worker last heard from the
    # engine (asgi/requests/model_choice.py refreshes it when a request names one it does not know).
    lora_names: dict[str, str] = field(default_factory=dict)
    # The model's sampling defaults for fields a request leaves out (asgi/requests/sampling_defaults.py).
    sampling_defaults: dict = field(default_factory=dict)
    _marker_ids: dict[str, list[int]] = field(default_factory=dict)  # encode_markers' (a few fixed markers)
    vision: ImagePrompts | None = None  # a vision model's processor (asgi/prompt/vision.py); None: text only

    @classmethod
    def load(cls, settings: WorkerSettings) -> WorkerState:
        model_dir = Path(settings.limits.model_dir)
        paths = RunPaths(settings.run_id, Path(settings.run_dir))
        http = settings.http
        template = (load_template_arg(http.chat_template, model_dir) if http.chat_template
                    else ChatTemplate(model_dir))
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        # A tokenizer.json may pad and truncate (sentence-transformers' often pad to 128): a prompt is
        # its own tokens, and one too long is a 400, never silently cut.
        tokenizer.no_padding()
        tokenizer.no_truncation()
        limits = settings.limits  # with a queue bound the engine answers each Submit (admission control)
        client = EngineClient(paths, settings.engine_pids,
                              bool(limits.max_queued_requests or limits.max_queued_tokens), block_size=limits.block_size)
        state = cls(settings, client, tokenizer, template, lora_names=dict(limits.lora_modules),
                    sampling_defaults=sampling_defaults(model_dir, http.generation_config,
                                                        http.override_generation_config))
        if accepts_images(model_dir):
            state.vision = ImagePrompts(model_dir, http.max_images_per_prompt, tokenizer, http.mm_processor_kwargs)
        state.auth = ApiKeyGuard(settings.api_key_digests, http.protect_metrics)
        state.cors = CorsPolicy(http.allowed_origins, http.allowed_methods, http.allowed_headers)
        state.store = open_store(http.state_store_url, paths.run_dir,
                                 Bounds(http.responses_store_max_entries, http.responses_store_ttl_s),
                                 Bounds(http.conversations_store_max_entries, http.conversations_store_ttl_s))
        state.batches = batch_store_for(state.store)
        state.chats = chat_store_for(state.store, Bounds(http.chat_store_max_entries, http.chat_store_ttl_s))
        state.files = FileDisk(files_folder(http.files_dir, http.state_store_url, paths.run_dir))
        state.metrics = Metrics(http.metrics_prefix, http.served_model_name, settings.limits.max_model_len)
        state.observers.append(state.metrics.observe)
        if http.access_log:
            state.observers.append(log_access)
        if http.otlp_traces_endpoint:  # imported only then: no OpenTelemetry in a worker without the flag
            from rill.asgi.http.trace_export import TraceExport

            state.traces = TraceExport(http.otlp_traces_endpoint)
            state.observers.append(state.traces.tracer.observe)
        return state

    def observe(self, ctx: RequestContext) -> None:
        for observer in self.observers:
            try:
                observer(ctx)
            except Exception:  # an observer's bug must not turn a served request into an error
                log.exception("request observer %r failed", observer)

    def draining(self) -> bool:
        """The launcher got SIGTERM/SIGINT: finish what runs, take nothing new."""
        return self.client.paths.draining_flag.exists()

    @property
    def model_id(self) -> str:
        return self.settings.http.served_model_name

    @functools.cached_property
    def token_texts(self) -> TokenTexts:
        """Token text and bytes for logprobs, cached over the worker's lifetime."""
        return TokenTexts(self.tokenizer)

    @functools.cached_property
    def fim_tokens(self) -> FimTokens | None:
        """The served model's fill-in-the-middle tokens (asgi/prompt/fim.py), None where it has none."""
        return fim_tokens(self.tokenizer, self.settings.limits.vocab_size)

    @functools.cached_property
    def pair_separator(self) -> int | None:
        """The token that ends a scored pair's first segment (ipc/pair_segments.py): a cross-encoder's [SEP]."""
        return pair_separator(self.tokenizer)

    def detokenizer(self, *, stop: list[str], skip_special_tokens: bool, include_stop: bool):
        return lambda: Detokenizer(self.tokenizer, skip_special_tokens=skip_special_tokens, stop=stop,
                                   include_stop_str_in_output=include_stop)

    def encode_markers(self, text: str) -> list[int]:
        """A reasoning format's marker (`</think>`, `<|end|>`) as the served model's ids, special tokens read;
        each tokenized once per worker (a copy each time: the engine's params own their lists)."""
        if (ids := self._marker_ids.get(text)) is None:
            ids = self._marker_ids[text] = self.tokenizer.encode(text, add_special_tokens=False).ids
        return list(ids)

    def decode_prompt(self, ids: list[int]) -> str:
        """A prompt's ids as text, special tokens included (what the model sees)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    @property
    def model_names(self) -> list[str]:
        """The served model's id, then its aliases (--served-model-name's other names)."""
        return [self.model_id, *self.settings.http.served_model_aliases]

    def model_card(self, adapter: str | None = None, alias: str | None = None) -> dict:
        """The served model's card (under `alias`, one of its other names), or a LoRA adapter's (its base model as
        `parent`, as vLLM)."""
        limits = self.settings.limits
        return {
            "id": adapter or alias or self.model_id,
            "object": "model",
            "created": self.settings.created or int(time.time()),
            "owned_by": "rill",
            "root": self.lora_names[adapter] if adapter else limits.model_dir,
            "parent": self.model_id if adapter else None,
            "max_model_len": limits.max_model_len,
        }


def dumps(obj) -> bytes:
    return msgspec.json.encode(obj)


