"""Rill's settings: one `Config` built once from `rill serve`'s flags, handed whole or as a named slice to each process.

msgspec Structs, because the slices cross process boundaries: the engine's slice is the argument of
the engine process, the model's travels to every tensor-parallel rank, the HTTP workers' goes
through an environment variable. Values decided at start (the dtype chosen, the KV blocks that fit,
the eos ids, a run's directory) are not settings: they are passed beside a slice, never into it.
Adding a flag touches this file, the flag's definition (rill/cli.py or a `*_flags.py`), the code
that reads it, and its docs.
"""
from __future__ import annotations

import json
from typing import Any

import msgspec


def json_object(text: str, *, not_json: str, not_object: str, error: type[ValueError] = ValueError) -> dict:
    """A flag's JSON object; `error` (ValueError by default) with `not_json` + the parser's reason, or
    `not_object` when the JSON is something else."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{not_json}{exc}") from None
    if not isinstance(value, dict):
        raise error(not_object)
    return value


class ModelConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What a runner builds its model, KV cache, attention and decode steps from (every rank too)."""

    model_dir: str  # a local Hugging Face directory (the bundled model's once converted)
    dtype: str = "auto"  # auto: bfloat16 on a GPU and on a CPU that multiplies it natively (choose_dtype)
    device: str = "auto"  # auto: cuda when torch sees a GPU, else cpu
    attention_backend: str = "auto"  # auto: triton on a GPU; cpu (C++ decode kernel) or torch on the CPU
    load_format: str = "auto"
    quantization: str = "none"  # none | int8 | int4: quantized weights for the linears and the head (CPU)
    int4_group_size: int = 32  # int4: the weights a scale (and offset) covers, 32 or 128
    int4_symmetric: bool = False  # int4: no offsets (offset = -8 * scale)
    model_impl: str = "auto"  # auto | native | transformers, as vLLM's --model-impl
    batch_invariant: bool = False  # a request's logits do not depend on what else is in the step
    seed: int | None = None  # --seed: the sampler's generator for requests without a seed (None: random)
    enforce_eager: bool = False  # True: no torch.compile of decode steps (engine_proc/model/decode_graphs.py)
    block_size: int = 16
    max_num_seqs: int = 64  # the decode graphs are built up to this batch
    enable_embeddings: bool = False  # a decoder serves /v1/embeddings too (last-token pooling)
    task: str = "auto"  # auto | generate | embed | score: what to serve (engine_proc/model/task.py)
    max_loras: int = 0  # --enable-lora: slots for LoRA adapters (engine_proc/lora/); 0 off
    max_lora_rank: int = 16
    speculative_config: str = ""  # --speculative-config's JSON (engine_proc/spec/config.py); "" off
    jump_forward_tokens: int = 8  # drafts a step from what a structured output's grammar forces; 0 off
    num_threads: int | None = None  # torch threads; None: torch's
    kv_cache_dtype: str = "auto"  # auto: the model's dtype; int8: rows and their scales (attention/kv_int8.py)


class ParallelConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Tensor and data parallelism (docs/tensor-parallel.md): ranks, nodes, where they meet."""

    tensor_parallel_size: int = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"  # node 0, where the TCPStore listens
    master_port: int = 0  # 0: a free port (one node)
    data_parallel_size: int = 1


class SchedulerConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The KV cache's size, a step's budget, admission control and --request-timeout; 0: no bound."""

    kv_cache_memory_bytes: int = 1 << 30
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None  # None: the model's
    enable_prefix_caching: bool = True
    max_queued_requests: int = 0
    max_queued_tokens: int = 0
    request_timeout_s: float = 0.0
    scheduling_policy: str = "fcfs"  # fcfs | priority (engine_proc/sched/priority.py)
    priority_aging_s: float = 60.0  # under priority: a request's priority improves by one per this long waiting


class LogConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The one log format of every process (ipc/logs.py)."""

    level: str = "INFO"
    format: str = "text"  # text | json
    log_requests: bool = False  # prompts on rill.requests at debug level


class EngineConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The engine process's slice: its model, scheduler, parallelism, logs and optional parts."""

    model_id: str
    model: ModelConfig
    scheduler: SchedulerConfig = msgspec.field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = msgspec.field(default_factory=ParallelConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    lora_modules: dict[str, str] = {}  # --lora-modules: name -> PEFT adapter directory, loaded at start
    kv_events_endpoint: str = ""  # a ZeroMQ endpoint to publish KV-cache events on (engine_proc/kv_events.py)
    kv_events_topic: str = ""
    kv_cache_disk: str = ""  # --kv-cache-disk: the prefix cache's disk tier's folder (engine_proc/kv_disk/); "" none
    kv_cache_disk_bytes: int = 4 << 30


class HttpConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What `rill serve`'s HTTP side (Granian and every API worker) reads of the flags."""

    host: str = "127.0.0.1"
    port: int = 8000
    uds: str = ""  # --uds: a Unix-domain socket instead of host and port (rill/listening.py)
    ssl_certfile: str = ""  # TLS (--ssl-certfile, --ssl-keyfile; --ssl-ca-certs and --ssl-cert-reqs for clients')
    ssl_keyfile: str = ""
    ssl_ca_certs: str = ""
    ssl_cert_reqs: int = 0
    workers: int = 1
    served_model_name: str = ""
    served_model_aliases: list[str] = []  # --served-model-name's other names, which requests may use too
    sse_keepalive_s: float = 15.0
    shutdown_timeout_s: float = 30.0
    timeout_keep_alive_s: float = 125.0
    max_body_bytes: int = 32 << 20
    chat_template: str | None = None  # --chat-template: a file, a bundled name, or the template itself
    # The model's sampling defaults (asgi/requests/sampling_defaults.py): auto | vllm | none | a folder
    generation_config: str = "auto"
    override_generation_config: str | None = None  # JSON fields on top
    # Chat templates, tools, reasoning (asgi/prompt/chat_messages.py, asgi/requests/tool_choice.py,
    # asgi/parsers/chat_parsing.py).
    trust_request_chat_template: bool = False
    default_chat_template_kwargs: dict[str, Any] = {}  # under each request's own chat_template_kwargs
    max_images_per_prompt: int = 8  # --limit-mm-per-prompt: a vision model's images per chat request
    max_logprobs: int = 20  # --max-logprobs: most top logprobs a request asks per token; -1 the vocabulary's
    mm_processor_kwargs: dict[str, int] = {}  # --mm-processor-kwargs: a Qwen-VL image processor's pixel budget
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    reasoning_parser: str | None = None
    # API keys themselves stay in the launcher: the workers get their digests (asgi/state.py).
    protect_metrics: bool = False
    # --prefix-cache-isolation (asgi/requests/cache_salt.py): "key" salts each request's cached blocks with its API
    # key's digest; "none" shares them. Without keys the two are the same.
    prefix_cache_isolation: str = "key"
    allowed_origins: list[str] = []
    allowed_methods: list[str] = msgspec.field(default_factory=lambda: ["GET", "POST"])
    allowed_headers: list[str] = msgspec.field(default_factory=lambda: ["*"])
    access_log: bool = True
    log_requests: bool = False  # prompts on rill.requests at debug level
    metrics_prefix: str = "rill"  # GET /metrics' names' prefix, `vllm` for vLLM's dashboards
    otlp_traces_endpoint: str = ""  # a span per request to this OTLP/HTTP collector URL (asgi/http/trace_export.py)
    # The Responses API's and Conversations' store (asgi/stores/), shared by every worker: its URL
    # (empty: SQLite in the run directory) and bounds, enforced by the store; 0 disables a kind.
    state_store_url: str = ""
    responses_store_max_entries: int = 1000
    responses_store_ttl_s: float = 3600.0
    conversations_store_max_entries: int = 1000
    conversations_store_ttl_s: float = 3600.0
    chat_store_max_entries: int = 1000  # stored chat completions (asgi/stores/chat_store.py)
    chat_store_ttl_s: float = 3600.0
    allow_runtime_lora_updating: bool = False  # POST /v1/load_lora_adapter and /v1/unload_lora_adapter
    enable_cache_reset: bool = False  # POST /reset_prefix_cache and /flush_cache (asgi/routes/cache_reset.py)
    # The Batch API (docs/batch.md): where its files live (empty: beside the state store), their
    # bounds, and how many lines of a batch run at once in this server (0: it runs none).
    files_dir: str = ""
    files_max_bytes: int = 100 << 20
    files_max_count: int = 1000
    batch_max_lines: int = 50_000
    batch_concurrency: int = 4


class Config(msgspec.Struct, frozen=True, kw_only=True):
    """Everything `rill serve` was told, built once (rill/config_args.py) and sliced per process."""

    engine: EngineConfig
    http: HttpConfig = msgspec.field(default_factory=HttpConfig)
    cache_dir: str | None = None  # where the bundled model is converted
