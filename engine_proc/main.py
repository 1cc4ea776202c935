"""The engine process: build the model and scheduler, say READY with real limits, loop."""
from __future__ import annotations

import gc
import logging
import os
import queue
import signal
import time
from pathlib import Path

import msgspec
import zmq

from engine_proc.cpu_features import cpu_info
from engine_proc.model.choice import choose_dtype, choose_runner, eos_token_ids
from ipc import protocol as p
from ipc.channels import RunPaths
from ipc.lifetime import die_with_parent
from ipc.logs import configure_logging

log = logging.getLogger("rill.engine")

# Under the packed linears (model_loader.PackedLinear) oneDNN keeps a primitive per input shape in
# two LRU caches, its own and ideep's, of 1,024 entries each by default. A step's number of rows
# changes from step to step, so the engine's RSS grew by hundreds of MiB over a few thousand
# requests until both were full (tests/hardening/test_soak.py). 64 entries keep the shapes of the
# last ten or so steps: RSS stays flat, for about 2% more CPU on the tiny model, where making a
# primitive weighs most against the step. Read by oneDNN when it first runs; a user's value wins.
ONEDNN_CACHE_CAPACITY = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}


class EngineConfig(msgspec.Struct):
    model_dir: str
    model_id: str
    run_id: str
    run_dir: str
    dtype: str = "auto"  # auto: bfloat16 on a GPU and on a CPU that multiplies it natively (choose_dtype)
    device: str = "auto"  # auto: cuda when torch sees a GPU, else cpu
    attention_backend: str = "auto"  # auto: triton on a GPU; cpu (C++ decode kernel) or torch on the CPU
    load_format: str = "auto"
    quantization: str = "none"  # none | int8: int8 weights for the linears and the head (CPU)
    speculative_config: str = ""  # --speculative-config's JSON (engine_proc/spec/config.py); "" off
    max_loras: int = 0  # --enable-lora: slots for LoRA adapters (engine_proc/lora/); 0 off
    max_lora_rank: int = 16
    lora_modules: dict[str, str] = {}  # --lora-modules: name -> PEFT adapter directory, loaded at start
    model_impl: str = "auto"  # auto | native | transformers, as vLLM's --model-impl
    batch_invariant: bool = False  # a request's logits do not depend on what else is in the step
    enforce_eager: bool = False  # True: no torch.compile of decode steps (engine_proc/model/decode_graphs.py)
    block_size: int = 16
    kv_cache_memory_bytes: int = 1 << 30
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int | None = None
    num_threads: int | None = None
    enable_prefix_caching: bool = True
    enable_embeddings: bool = False  # a decoder serves /v1/embeddings too (last-token pooling)
    kv_events_endpoint: str = ""  # a ZeroMQ endpoint to publish KV-cache events on (engine_proc/kv_events.py)
    data_parallel_rank: int = 0  # this engine's rank among --data-parallel-size engines
    # Tensor parallelism (engine_proc/parallel/): this engine is rank 0 of tensor_parallel_size ranks
    # over nnodes nodes, meeting at master_addr:master_port (empty / 0: this host, a free port).
    tensor_parallel_size: int = 1
    nnodes: int = 1
    master_addr: str = ""
    master_port: int = 0
    kv_events_topic: str = ""
    # Admission control and --request-timeout (engine_proc/sched/admission.py, deadlines.py); 0: none.
    max_queued_requests: int = 0
    max_queued_tokens: int = 0
    request_timeout_s: float = 0.0
    log_level: str = "INFO"
    log_format: str = "text"  # text | json (ipc/logs.py)


def freeze_startup_heap() -> None:
    """Moves what start-up made (the model, the compiled decode steps: about 700,000 objects) out of
    the garbage collector's view, as vLLM does: a full collection over them paused the engine for
    210 ms, one after the freeze 0.01 ms."""
    gc.collect()
    gc.freeze()


def run_engine(config: EngineConfig, ready_conn) -> None:
    """Entry point of the engine process. Sends EngineLimits (or an error string) on ready_conn."""
    die_with_parent()
    # The launcher decides when we stop (after the HTTP workers drained); a Ctrl-C or a terminal
    # hangup (SIGHUP) that reaches the whole process group must not kill in-flight requests.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    configure_logging(config.log_level, config.log_format, with_transformers=True)
    for name, value in ONEDNN_CACHE_CAPACITY.items():
        os.environ.setdefault(name, value)
    try:
        core, threads, limits = build_engine(config)
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
        gc.unfreeze()  # collectable again at exit (bindings warn of instances never freed)
        if getattr(core.runner, "step_broadcast", None) is not None:
            core.runner.step_broadcast.stop()
        input_thread, output_thread = threads
        output_thread.publish(None)
        output_thread.join(timeout=5)
        input_thread.close()
        if core.kv_events is not None:
            core.kv_events.close()
        log.info("engine stopped")


def build_engine(config: EngineConfig):
    import torch

    from engine_proc.attention.kv_cache import num_blocks_for_memory
    from engine_proc.grammar.compiler import GrammarCompiler
    from engine_proc.grammar.gate import GrammarGate
    from engine_proc.model.hf_runner import TransformersRunner
    from engine_proc.model.loader import load_config
    from engine_proc.model.sentence_layout import is_sentence_transformers
    from engine_proc.sched.block_manager import BlockManager
    from engine_proc.sched.scheduler import Scheduler
    from engine_proc.spec.build import build_speculator

    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    device = torch.device(config.device if config.device != "auto" else
                          "cuda" if torch.cuda.is_available() else "cpu")
    dtype_name, dtype_reason = choose_dtype(config.dtype, device)
    dtype = getattr(torch, dtype_name)
    log.info("dtype %s: %s; CPU %s", dtype_name, dtype_reason, cpu_info().summary())
    model_dir = Path(config.model_dir)
    if is_sentence_transformers(model_dir):  # an encoder: embeddings only, no KV cache to page
        from engine_proc.encoder_engine import build_encoder_engine

        return build_encoder_engine(config, model_dir, dtype_name, dtype_reason, device)
    hf_config = load_config(model_dir)
    runner_class = choose_runner(config.model_impl, hf_config)
    if runner_class is TransformersRunner and (config.enable_embeddings or config.max_loras):
        raise ValueError("--enable-embeddings and --enable-lora need the native runner (a Llama-family model)")
    enable_prefix_caching = config.enable_prefix_caching
    if runner_class is TransformersRunner and enable_prefix_caching:
        # Its per-request caches share nothing: a prefix "hit" would still be recomputed,
        # reported as cached_tokens, and held twice in memory beyond the blocks counted.
        log.info("prefix caching off: the transformers runner recomputes every prompt")
        enable_prefix_caching = False
    eos_ids = eos_token_ids(model_dir, hf_config)
    num_blocks = num_blocks_for_memory(hf_config, dtype, config.block_size, config.kv_cache_memory_bytes)
    if num_blocks < 2:
        raise ValueError(f"--kv-cache-memory {config.kv_cache_memory_bytes} bytes holds no KV block of "
                         f"{config.block_size} tokens for this model; give it more memory")
    started = time.perf_counter()
    tp = start_tensor_parallel(config, runner_class, model_dir, dtype_name, device, num_blocks, eos_ids)
    runner = runner_class(
        model_dir,
        dtype=dtype,
        num_kv_blocks=num_blocks,
        block_size=config.block_size,
        eos_token_ids=eos_ids,
        load_format=config.load_format,
        batch_invariant=config.batch_invariant,
        device=device,
        quantization=config.quantization,
        **({} if runner_class is TransformersRunner else {
            "attention_backend": config.attention_backend, "max_num_seqs": config.max_num_seqs,
            "compile_decode": not config.enforce_eager, "embeddings": config.enable_embeddings,
            "tp_size": config.tensor_parallel_size, "max_loras": config.max_loras,
            "max_lora_rank": config.max_lora_rank}),
    )
    for name, path in config.lora_modules.items():  # an AdapterError stops the start, naming why
        runner.lora.load(name, path)
    runner.step_broadcast = tp
    compiled_decode = getattr(runner, "decode_graphs", None) is not None  # the transformers runner has none
    max_model_len = min(config.max_model_len or runner.max_model_len, runner.max_model_len)
    blocks = BlockManager(num_blocks, config.block_size, enable_prefix_caching=enable_prefix_caching)
    # Block 0 is reserved as padding: what a lone request can use is the rest of the cache.
    max_model_len = min(max_model_len, blocks.num_total_blocks() * config.block_size)
    log.info(
        "model loaded in %.1f s: %s, %s, quantization %s, KV cache %d blocks x %d tokens (%.0f MiB), "
        "max_model_len %d, prefix caching %s, %s runner on %s%s%s%s",
        time.perf_counter() - started, config.model_id, dtype_name, config.quantization, num_blocks,
        config.block_size,
        config.kv_cache_memory_bytes / 2**20, max_model_len, "on" if enable_prefix_caching else "off",
        "transformers" if runner_class is TransformersRunner else "native", device,
        ", batch-invariant" if config.batch_invariant else "",
        ", decode steps compiled" if compiled_decode else ", eager",
        f", {runner.attention_backend} attention" if hasattr(runner, "attention_backend") else "",
    )
    speculator, speculative = build_speculator(config.speculative_config, runner, config.tensor_parallel_size)
    scheduler = Scheduler(blocks, max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
                          max_model_len=max_model_len, eos_token_ids=eos_ids, speculator=speculator)
    # Structured outputs: bitmasks as wide as the model's logits, compiled off the busy loop.
    core, threads = start_core(config, scheduler, runner, lambda notify: GrammarGate(GrammarCompiler(
        model_dir, vocab_size=runner.vocab_size, stop_token_ids=eos_ids, notify=notify)))
    if config.kv_events_endpoint:
        from engine_proc.kv_events import publisher_for

        core.kv_events = publisher_for(config, blocks, device)
    limits = p.EngineLimits(
        model_id=config.model_id,
        model_dir=str(model_dir),
        max_model_len=max_model_len,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        num_kv_blocks=num_blocks,
        block_size=config.block_size,
        eos_token_ids=eos_ids,
        vocab_size=runner.vocab_size,
        dtype=dtype_name,
        dtype_reason=dtype_reason,
        quantization=config.quantization,
        cpu=cpu_info().summary(),
        compiled_decode=compiled_decode,
        attention_backend=getattr(runner, "attention_backend", ""),
        max_queued_requests=config.max_queued_requests,
        max_queued_tokens=config.max_queued_tokens,
        request_timeout_s=config.request_timeout_s,
        embedding_dim=hf_config.hidden_size if config.enable_embeddings else 0,
        speculative=speculative,
        lora_modules=config.lora_modules,
    )
    return core, threads, limits


def start_tensor_parallel(config: EngineConfig, runner_class, model_dir, dtype_name, device, num_blocks, eos_ids):
    """--tensor-parallel-size > 1: start the other ranks and send them the setup (they load their
    shards while this process loads its own); None for one rank."""
    if config.tensor_parallel_size <= 1:
        return None
    from engine_proc.model.runner import ModelRunner
    from engine_proc.parallel.group import RankSetup
    from engine_proc.parallel.ranks import TensorParallel

    if runner_class is not ModelRunner:
        raise ValueError("--tensor-parallel-size needs the native runner (a Llama-family model)")
    if config.enable_embeddings:
        raise ValueError("--enable-embeddings is not served with --tensor-parallel-size > 1")
    tp = TensorParallel(config.tensor_parallel_size, config.nnodes, config.master_addr, config.master_port,
                        device.type, config.log_level, config.log_format)
    compile_decode = not config.enforce_eager and device.type == "cpu"  # no NCCL inside CUDA graphs
    tp.share(RankSetup(str(model_dir), dtype_name, device.type, num_blocks, config.block_size, eos_ids,
                       config.load_format, config.batch_invariant, config.attention_backend, config.quantization,
                       compile_decode, config.max_num_seqs, config.num_threads, config.nnodes))
    if not compile_decode:
        config.enforce_eager = True
    return tp


def start_core(config: EngineConfig, scheduler, runner, make_grammar_gate=None):
    """The busy loop's core with its input and output threads (started); `make_grammar_gate(notify)`:
    structured outputs, None for a model that does not generate."""
    from engine_proc.core import EngineCore
    from engine_proc.io_threads import InputThread, OutputThread
    from engine_proc.sched.admission import AdmissionControl
    from engine_proc.sched.deadlines import Deadlines

    paths = RunPaths(config.run_id, Path(config.run_dir))
    ctx = zmq.Context()
    inputs: queue.SimpleQueue = queue.SimpleQueue()
    admission = AdmissionControl(config.max_queued_requests, config.max_queued_tokens,
                                 max_num_seqs=config.max_num_seqs)
    output_thread = OutputThread(ctx, paths)
    output_thread.rank = config.data_parallel_rank
    output_thread.load_of = lambda: (scheduler.num_running, scheduler.num_waiting)
    input_thread = InputThread(ctx, paths, inputs, admission, output_thread.publish, rank=config.data_parallel_rank)
    input_thread.start()
    output_thread.start()
    grammar_gate = make_grammar_gate(inputs.put) if make_grammar_gate is not None else None
    core = EngineCore(scheduler, runner, inputs, output_thread.publish, admission=admission,
                      deadlines=Deadlines(config.request_timeout_s), grammar_gate=grammar_gate)
    core.rank = config.data_parallel_rank
    return core, (input_thread, output_thread)
