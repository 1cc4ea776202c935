"""The engine of a model that reads each prompt once, whole, and keeps nothing: an embedding model in the
sentence-transformers layout, a cross-encoder, a sequence classifier, or a decoder served as a yes/no reranker
(rerank, score). The same loop, scheduler and admission control as a generating engine, with an EncoderRunner,
ClassifierRunner or YesNoRunner, whose blocks are an accounting of tokens in flight (no KV cache)."""
from __future__ import annotations

import functools
import logging
import time
from pathlib import Path

from rill.engine_proc.cpu_features import cpu_info
from rill.engine_proc.model.task import Served
from rill.ipc import protocol as p
from rill.ipc.channels import RunPaths
from rill.ipc.config import EngineConfig

log = logging.getLogger("rill.engine")
SMALL_MODEL_BYTES = 2 << 30  # weight files up to this size run in float32 under --dtype auto


def auto_dtype(served: Served, model_dir: Path, chosen: str, reason: str) -> tuple[str, str]:
    """--dtype auto's choice for a model read this way: float32 for a small one (an encoder, a small classifier),
    where bfloat16 would cost precision for little; `chosen` (the machine's) for a decoder reranker, and for a
    large model (a reward model of billions of weights), whose memory float32 would double."""
    if served is Served.YES_NO or weight_bytes(model_dir) > SMALL_MODEL_BYTES:
        return chosen, reason
    return "float32", f"--dtype auto for a small model ({served.value})"


def weight_bytes(model_dir: Path) -> int:
    """The size of a model directory's weight files (safetensors, or PyTorch's .bin)."""
    return sum(f.stat().st_size for pattern in ("*.safetensors", "*.bin") for f in model_dir.glob(pattern))


def build_encoder_engine(config: EngineConfig, paths: RunPaths, rank: int, dtype_name: str, dtype_reason: str, device,
                         served: Served):
    import torch

    from rill.engine_proc.assembly import start_core
    from rill.engine_proc.model.classifier_runner import ClassifierRunner
    from rill.engine_proc.model.encoder_runner import EncoderRunner
    from rill.engine_proc.model.yes_no_runner import YesNoRunner
    from rill.engine_proc.sched.block_manager import BlockManager
    from rill.engine_proc.sched.priority import priority_order
    from rill.engine_proc.sched.scheduler import Scheduler
    from rill.ipc.logs import route_transformers_logs

    route_transformers_logs()  # the runners' modules imported transformers

    model, limits = config.model, config.scheduler
    model_dir = Path(model.model_dir)
    if model.dtype == "auto":
        dtype_name, dtype_reason = auto_dtype(served, model_dir, dtype_name, dtype_reason)
    started = time.perf_counter()
    runner_class = {Served.EMBED: EncoderRunner, Served.CROSS_ENCODER: ClassifierRunner, Served.YES_NO: YesNoRunner,
                    Served.CLASSIFY: functools.partial(ClassifierRunner, pairs=False)}
    runner = runner_class[served](model, dtype=getattr(torch, dtype_name), device=device, num_kv_blocks=2)
    max_model_len = min(limits.max_model_len or runner.max_model_len, runner.max_model_len)
    # Enough blocks for every seat at the longest prompt: they bound nothing but the seats.
    num_blocks = model.max_num_seqs * -(-max_model_len // model.block_size) + 1
    # A prefix "hit" would skip nothing (an encoder reads the whole prompt) and report cached tokens.
    blocks = BlockManager(num_blocks, model.block_size, enable_prefix_caching=False)
    scheduler = Scheduler(blocks, max_num_seqs=model.max_num_seqs, max_model_len=max_model_len,
                          max_num_batched_tokens=max(limits.max_num_batched_tokens, max_model_len), eos_token_ids=[],
                          priority=priority_order(limits.scheduling_policy, limits.priority_aging_s))
    if served is not Served.EMBED:
        log.info("%s loaded in %.1f s: %s, %s, max_model_len %d, on %s", served.value, time.perf_counter() - started,
                 config.model_id, dtype_name, max_model_len, device)
    else:
        log.info("embedding model loaded in %.1f s: %s, %s, %d dimensions, %s pooling%s, max_model_len %d, on %s",
                 time.perf_counter() - started, config.model_id, dtype_name, runner.embedding_dim, runner.pooling.mode,
                 ", normalised" if runner.pooling.normalize else "", max_model_len, device)
    core, threads = start_core(config, paths, scheduler, runner, rank=rank)
    limits = p.EngineLimits(
        model_id=config.model_id, model_dir=str(model_dir), max_model_len=max_model_len,
        max_num_seqs=model.max_num_seqs, max_num_batched_tokens=scheduler.max_num_batched_tokens,
        num_kv_blocks=num_blocks, block_size=model.block_size, eos_token_ids=[], vocab_size=runner.vocab_size,
        dtype=dtype_name, dtype_reason=dtype_reason, cpu=cpu_info().summary(),
        max_queued_requests=limits.max_queued_requests, max_queued_tokens=limits.max_queued_tokens,
        request_timeout_s=limits.request_timeout_s, scheduling_policy=limits.scheduling_policy, generates=False, embedding_dim=runner.embedding_dim,
        scorer="" if served is Served.EMBED else served.value,
        labels=list(runner.head.labels) if served is Served.CLASSIFY else [],
    )
    return core, threads, limits
