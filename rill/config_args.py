"""`rill serve`'s parsed flags into the one `Config` (ipc/config.py): the only place that maps flag to setting."""
from __future__ import annotations

import argparse
from pathlib import Path

from rill.asgi.http.auth import has_api_keys
from rill.asgi.requests.cache_salt import default_isolation
from rill.chat_flags import default_template_kwargs, images_per_prompt, processor_kwargs
from rill.ipc.config import Config, EngineConfig, HttpConfig, LogConfig, ModelConfig, ParallelConfig, SchedulerConfig
from rill.lora_flags import lora_modules


def config_from_args(args: argparse.Namespace, model_dir: Path | str, model_id: str) -> Config:
    """The checked flags (rill/cli.py) and the resolved model (rill/launcher.py: resolve_model)."""
    model = ModelConfig(
        model_dir=str(model_dir), dtype=args.dtype, device=args.device, attention_backend=args.attention_backend,
        load_format=args.load_format, quantization=args.quantization, int4_group_size=args.int4_group_size,
        int4_symmetric=args.int4_symmetric, model_impl=args.model_impl,
        batch_invariant=args.batch_invariant, enforce_eager=args.enforce_eager, block_size=args.block_size,
        seed=args.seed,
        max_num_seqs=args.max_num_seqs, enable_embeddings=args.enable_embeddings, task=args.task,
        max_loras=args.max_loras if args.enable_lora else 0, max_lora_rank=args.max_lora_rank,
        speculative_config=args.speculative_config, jump_forward_tokens=args.jump_forward_tokens,
        num_threads=args.num_threads,
        kv_cache_dtype=args.kv_cache_dtype,
    )
    scheduler = SchedulerConfig(
        kv_cache_memory_bytes=args.kv_cache_memory, max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len, enable_prefix_caching=args.enable_prefix_caching,
        max_queued_requests=args.max_queued_requests, max_queued_tokens=args.max_queued_tokens,
        request_timeout_s=args.request_timeout, scheduling_policy=args.scheduling_policy,
        priority_aging_s=args.priority_aging,
    )
    parallel = ParallelConfig(
        tensor_parallel_size=args.tensor_parallel_size, nnodes=args.nnodes, node_rank=args.node_rank,
        master_addr=args.master_addr, master_port=args.master_port, data_parallel_size=args.data_parallel_size,
    )
    log = LogConfig(level=args.log_level.upper(), format=args.log_format, log_requests=args.log_requests)
    engine = EngineConfig(
        model_id=model_id, model=model, scheduler=scheduler, parallel=parallel, log=log,
        lora_modules=lora_modules(args), kv_events_endpoint=args.kv_events_endpoint,
        kv_events_topic=args.kv_events_topic, kv_cache_disk=args.kv_cache_disk,
        kv_cache_disk_bytes=args.kv_cache_disk_size or (4 << 30),
    )
    http = HttpConfig(
        host=args.host, port=args.port, workers=args.workers, served_model_name=model_id, uds=args.uds or "",
        served_model_aliases=[n for n in (args.served_model_name or [])[1:] if n != model_id],
        ssl_certfile=args.ssl_certfile or "", ssl_keyfile=args.ssl_keyfile or "", ssl_ca_certs=args.ssl_ca_certs or "",
        ssl_cert_reqs=args.ssl_cert_reqs,
        sse_keepalive_s=args.sse_keepalive, shutdown_timeout_s=args.shutdown_timeout,
        timeout_keep_alive_s=args.timeout_keep_alive, max_body_bytes=args.max_request_body,
        chat_template=args.chat_template, trust_request_chat_template=args.trust_request_chat_template,
        generation_config=args.generation_config, override_generation_config=args.override_generation_config,
        default_chat_template_kwargs=default_template_kwargs(args.default_chat_template_kwargs),
        max_images_per_prompt=images_per_prompt(args.limit_mm_per_prompt), max_logprobs=args.max_logprobs,
        mm_processor_kwargs=processor_kwargs(args.mm_processor_kwargs),
        tool_call_parser=args.tool_call_parser, enable_auto_tool_choice=args.enable_auto_tool_choice,
        reasoning_parser=args.reasoning_parser, protect_metrics=args.protect_metrics,
        prefix_cache_isolation=default_isolation(args.prefix_cache_isolation, has_api_keys(args)),
        allowed_origins=args.allowed_origins, allowed_methods=args.allowed_methods,
        allowed_headers=args.allowed_headers, access_log=args.access_log, log_requests=args.log_requests,
        metrics_prefix=args.metrics_prefix, otlp_traces_endpoint=args.otlp_traces_endpoint or "",
        allow_runtime_lora_updating=args.allow_runtime_lora_updating, enable_cache_reset=args.enable_cache_reset,
        state_store_url=args.state_store,
        responses_store_max_entries=max(args.responses_store_max_entries, 0),
        responses_store_ttl_s=max(args.responses_store_ttl, 0.0),
        conversations_store_max_entries=max(args.conversations_store_max_entries, 0),
        conversations_store_ttl_s=max(args.conversations_store_ttl, 0.0),
        chat_store_max_entries=max(args.chat_completions_store_max_entries, 0),
        chat_store_ttl_s=max(args.chat_completions_store_ttl, 0.0),
        files_dir=args.files_dir, files_max_bytes=args.files_max_bytes, files_max_count=max(args.files_max_count, 1),
        batch_max_lines=max(args.batch_max_lines, 1), batch_concurrency=max(args.batch_concurrency, 0),
    )
    return Config(engine=engine, http=http, cache_dir=args.cache_dir)
