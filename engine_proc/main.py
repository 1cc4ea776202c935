"""The engine process: build the model and scheduler, say READY with real limits, loop."""
from __future__ import annotations

import gc
import logging
import os
import signal
import time
from pathlib import Path

import msgspec

from rill.engine_proc.cpu_features import cpu_info
from rill.engine_proc.model.choice import choose_dtype, choose_runner, eos_token_ids
from rill.ipc import protocol as p
from rill.ipc.channels import RunPaths
from rill.ipc.config import EngineConfig
from rill.ipc.lifetime import die_with_parent
from rill.ipc.logs import configure_logging, route_transformers_logs

log = logging.getLogger("rill.engine")

# Under the packed linears (model_loader.PackedLinear) oneDNN keeps a primitive per input shape in
# two LRU caches, its own and ideep's, of 1,024 entries each by default. A step's number of rows
# changes from step to step, so the engine's RSS grew by hundreds of MiB over a few thousand
# requests until both were full (tests/hardening/test_soak.py). 64 entries keep the shapes of the
# last ten or so steps: RSS stays flat, for about 2% more CPU on the tiny model, where making a
# primitive weighs most against the step. Read by oneDNN when it first runs; a user's value wins.
ONEDNN_CACHE_CAPACITY = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}


def freeze_startup_heap() -> None:
    """Moves what start-up made (the model, the compiled decode steps: about 700,000 objects) out of
    the garbage collector's view, as vLLM does: a full collection over them paused the engine for
    210 ms, one after the freeze 0.01 ms."""
    gc.collect()
    gc.freeze()


def run_engine(config: EngineConfig, paths: RunPaths, ready_conn, rank: int = 0) -> None:
    """Entry point of the engine process (`rank`: among --data-parallel-size). Sends EngineLimits (or an
    error string) on ready_conn."""
    die_with_parent()
    # The launcher decides when we stop (after the HTTP workers drained); a Ctrl-C or a terminal
    # hangup (SIGHUP) that reaches the whole process group must not kill in-flight requests.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    configure_logging(config.log.level, config.log.format)
    for name, value in ONEDNN_CACHE_CAPACITY.items():
        os.environ.setdefault(name, value)
    try:
        core, threads, limits = build_engine(config, paths, rank)
        route_transformers_logs()  # where start-up imported it (a scaled RoPE's functions, say)
    except Exception as exc:
        log.exception("engine failed to start")
        ready_conn.send_bytes(msgspec.json.encode(f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1)
    freeze_startup_heap()
    ready_conn.send_bytes(msgspec.json.encode(limits))
    ready_conn.close()
    try:
        core.run_busy_loop()
    finally:
        gc.unfreeze()  # collectable again should the interpreter tear down (an error: bindings warn of instances never freed)
        core.runner.close()
        input_thread, output_thread = threads
        output_thread.publish(None)
        output_thread.join(timeout=5)
        input_thread.close()
        if core.kv_events is not None:
            core.kv_events.close()
        if core.kv_disk is not None:
            core.kv_disk.close()  # the hottest blocks still cached, to disk for the next start
        log.info("engine stopped")
    exit_now()


def exit_now() -> None:
    """Ends the process once the loop stopped cleanly and every channel is closed, without the interpreter's
    teardown: destroying the model, torch's and the compiled steps' objects one by one and collecting them
    took 1.3 s of a 1.7 s stop (the tiny model; more for a bigger one), and there is nothing left to save."""
    logging.shutdown()
    os._exit(0)


def build_engine(config: EngineConfig, paths: RunPaths, rank: int = 0):
    import torch

    from rill.engine_proc.assembly import start_core
    from rill.engine_proc.attention.kv_layout import num_blocks_for_memory
    from rill.engine_proc.grammar.compiler import GrammarCompiler
    from rill.engine_proc.grammar.gate import GrammarGate
    from rill.engine_proc.model.config_json import JsonConfig
    from rill.engine_proc.model.loader import load_config, transformers_config
    from rill.engine_proc.model.runner import ModelRunner
    from rill.engine_proc.model.task import Served, choose_served
    from rill.engine_proc.sched.block_manager import BlockManager
    from rill.engine_proc.sched.priority import priority_order
    from rill.engine_proc.sched.scheduler import Scheduler
    from rill.engine_proc.sched.window_tables import window_tables_of
    from rill.engine_proc.spec.build import build_speculator

    model, limits = config.model, config.scheduler
    if model.num_threads:
        torch.set_num_threads(model.num_threads)
    device = torch.device(model.device if model.device != "auto" else "cuda" if torch.cuda.is_available() else "cpu")
    dtype_name, dtype_reason = choose_dtype(model.dtype, device)
    dtype = getattr(torch, dtype_name)
    log.info("dtype %s: %s; CPU %s", dtype_name, dtype_reason, cpu_info().summary())
    model_dir = Path(model.model_dir)
    served = choose_served(model.task, model_dir)  # a ValueError stops the start, saying why
    if served is not Served.GENERATE:  # embeddings only, or scores only: each prompt read once, no KV cache to page
        if served is Served.YES_NO and (model.enable_embeddings or model.max_loras or model.speculative_config):
            raise ValueError("--task score serves rerank and score only: it takes no --enable-embeddings, "
                             "--enable-lora or --speculative-config")
        from rill.engine_proc.encoder_engine import build_encoder_engine

        return build_encoder_engine(config, paths, rank, dtype_name, dtype_reason, device, served)
    hf_config = load_config(model_dir)
    runner_class = choose_runner(model.model_impl, hf_config)
    native = runner_class is ModelRunner
    if not native and isinstance(hf_config, JsonConfig):  # transformers' model: its config as transformers reads it
        hf_config = transformers_config(model_dir)
    if not native and model.enable_embeddings:
        raise ValueError("--enable-embeddings needs the native runner (a Llama-family model)")
    paged_transformers = False
    if not native:  # transformers' model: imported here, as the native runner needs none of its 2 s of imports
        from rill.engine_proc.model.hf_linear_attention import has_linear_attention
        from rill.engine_proc.model.hf_paged import PagedTransformersRunner, route_layer_window

        paged_transformers = runner_class is PagedTransformersRunner
    if not (native or paged_transformers) and model.max_loras:
        raise ValueError("--enable-lora needs the native runner or the paged transformers route")
    enable_prefix_caching = limits.enable_prefix_caching
    if not (native or paged_transformers) and enable_prefix_caching:  # transformers' model one sequence at a time
        # Its per-request caches share nothing: a prefix "hit" would still be recomputed,
        # reported as cached_tokens, and held twice in memory beyond the blocks counted.
        log.info("prefix caching off: the transformers runner recomputes every prompt")
        enable_prefix_caching = False
    if paged_transformers and enable_prefix_caching and has_linear_attention(hf_config.get_text_config()):
        log.info("prefix caching off: a linear-attention layer's state at a cached prefix is not kept")
        enable_prefix_caching = False
    eos_ids = eos_token_ids(model_dir, hf_config)
    # A model with sliding and global layers: as many block tensors as global layers, their blocks
    # shared with the sliding layers' window tables (engine_proc/sched/window_tables.py)
    layer_window = route_layer_window(hf_config, limits) if paged_transformers else None
    num_tensors = hf_config.get_text_config().num_hidden_layers - len(layer_window[1]) if layer_window else None
    if model.kv_cache_dtype != "auto" and not native:
        raise ValueError(f"--kv-cache-dtype {model.kv_cache_dtype} needs the native runner (a Llama-family model)")
    num_blocks = num_blocks_for_memory(hf_config.get_text_config(), dtype, model.block_size, limits.kv_cache_memory_bytes,
                                       num_tensors,
                                       model.kv_cache_dtype)
    if num_blocks < 2:
        raise ValueError(f"--kv-cache-memory {limits.kv_cache_memory_bytes} bytes holds no KV block of "
                         f"{model.block_size} tokens for this model; give it more memory")
    started = time.perf_counter()
    computed = dict(dtype=dtype, device=device, num_kv_blocks=num_blocks, eos_token_ids=eos_ids)
    if not native:
        if config.parallel.tensor_parallel_size > 1:
            raise ValueError("--tensor-parallel-size needs the native runner (a Llama-family model)")
        if paged_transformers:  # the paged route picks LongRoPE's factors by it (hf_rope.py)
            computed["max_model_len"] = limits.max_model_len
        runner = runner_class(model, **computed)
    else:
        tp, model = start_tensor_parallel(config, dtype_name, device, num_blocks, eos_ids)
        runner = runner_class(model, **computed, tp_size=config.parallel.tensor_parallel_size, step_broadcast=tp,
                              max_model_len=limits.max_model_len, max_num_batched_tokens=limits.max_num_batched_tokens)
    for name, path in config.lora_modules.items():  # an AdapterError stops the start, naming why
        runner.lora.load(name, path)
    max_model_len = min(limits.max_model_len or runner.max_model_len, runner.max_model_len)
    # A model whose every layer slides holds at most its window of KV blocks per request (hf_paged.py).
    blocks = BlockManager(num_blocks, model.block_size, enable_prefix_caching=enable_prefix_caching,
                          sliding_window=runner.sliding_window, window=window_tables_of(runner),
                          record_events=bool(config.kv_events_endpoint))
    # Block 0 is reserved as padding: what a lone request can use is the rest of the cache.
    max_model_len = min(max_model_len, blocks.num_tokens_alone(limits.max_num_batched_tokens))
    kv_dtype = dtype_name if model.kv_cache_dtype == "auto" else model.kv_cache_dtype
    log.info(
        "model loaded in %.1f s: %s, %s, quantization %s, KV cache %s %d blocks x %d tokens%s (%.0f MiB), "
        "max_model_len %d, prefix caching %s, %s runner on %s%s%s%s",
        time.perf_counter() - started, config.model_id, dtype_name, model.quantization, kv_dtype, num_blocks,
        model.block_size,
        f" (the sliding layers in {blocks.window.num_groups} window table(s) a request)" if blocks.window else "",
        limits.kv_cache_memory_bytes / 2**20, max_model_len, "on" if enable_prefix_caching else "off",
        runner.info.kind, device, ", batch-invariant" if model.batch_invariant else "",
        ", decode steps compiled" if runner.info.compiled_decode else ", eager",
        f", {runner.info.attention_backend} attention" if runner.info.attention_backend else "",
    )
    speculator, speculative = build_speculator(model.speculative_config, runner, model.jump_forward_tokens)
    scheduler = Scheduler(blocks, max_num_seqs=model.max_num_seqs, max_num_batched_tokens=limits.max_num_batched_tokens,
                          max_model_len=max_model_len, eos_token_ids=eos_ids, speculator=speculator,
                          priority=priority_order(limits.scheduling_policy, limits.priority_aging_s))
    kv_events = None
    if config.kv_events_endpoint:
        from rill.engine_proc.kv_events import publisher_for

        kv_events = publisher_for(config, rank, blocks, device)
    kv_disk = None
    if config.kv_cache_disk:  # the hottest blocks on disk back into the prefix cache, before READY
        from rill.engine_proc.kv_disk.tier import open_disk_tier

        kv_disk = open_disk_tier(config, rank, runner, blocks, dtype_name)
        if kv_events is not None:  # BlockStored for each block reloaded
            kv_events.publish(blocks.prefix_cache.take_events())
    # Structured outputs: bitmasks as wide as the model's logits, compiled off the busy loop.
    core, threads = start_core(config, paths, scheduler, runner, rank=rank, kv_events=kv_events, kv_disk=kv_disk,
                               make_grammar_gate=lambda notify: GrammarGate(GrammarCompiler(
                                   model_dir, vocab_size=runner.vocab_size, stop_token_ids=eos_ids, notify=notify)))
    engine_limits = p.EngineLimits(
        model_id=config.model_id,
        model_dir=str(model_dir),
        max_model_len=max_model_len,
        max_num_seqs=model.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        num_kv_blocks=num_blocks,
        block_size=model.block_size,
        eos_token_ids=eos_ids,
        vocab_size=runner.vocab_size,
        dtype=dtype_name,
        dtype_reason=dtype_reason,
        quantization=model.quantization,
        cpu=cpu_info().summary(),
        compiled_decode=runner.info.compiled_decode,
        attention_backend=runner.info.attention_backend,
        max_queued_requests=limits.max_queued_requests,
        max_queued_tokens=limits.max_queued_tokens,
        request_timeout_s=limits.request_timeout_s,
        scheduling_policy=limits.scheduling_policy,
        embedding_dim=hf_config.hidden_size if model.enable_embeddings else 0,
        speculative=speculative,
        lora_modules=config.lora_modules,
        kv_cache_dtype=kv_dtype,
    )
    return core, threads, engine_limits


def start_tensor_parallel(config: EngineConfig, dtype_name: str, device, num_blocks: int, eos_ids: list[int]):
    """(rank 0's TensorParallel, the model slice its runner builds from). --tensor-parallel-size > 1:
    start the other ranks and send them the setup (they load their shards while this process loads
    its own); (None, the model slice) for one rank."""
    model = config.model
    if config.parallel.tensor_parallel_size <= 1:
        return None, model
    from rill.engine_proc.parallel.group import RankSetup
    from rill.engine_proc.parallel.ranks import TensorParallel

    if model.enable_embeddings:
        raise ValueError("--enable-embeddings is not served with --tensor-parallel-size > 1")
    from rill.engine_proc.spec.config import parse_speculative_config

    speculative = parse_speculative_config(model.speculative_config)
    if speculative is not None and speculative.method == "draft_model":  # refused before any rank starts
        raise ValueError("--speculative-config method 'draft_model' is not served with --tensor-parallel-size > 1")
    if not model.enforce_eager and device.type != "cpu":  # no NCCL inside CUDA graphs
        model = msgspec.structs.replace(model, enforce_eager=True)
    tp = TensorParallel(config.parallel, device.type, config.log)
    # The ranks run rank 0's steps: they draft nothing (rank 0's scheduler owns the speculator).
    tp.share(RankSetup(msgspec.structs.replace(model, speculative_config=""), dtype_name, num_blocks, eos_ids))
    return tp, model
