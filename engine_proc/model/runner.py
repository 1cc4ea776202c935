"""Runs one scheduled batch through the native model over the paged KV cache, then samples."""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from rill.engine_proc.attention.choice import create_attention_backend, resolve_attention_backend
from rill.engine_proc.attention.kv_cache import KVCache
from rill.engine_proc.attention.kv_layout import num_blocks_for_memory
from rill.engine_proc.kernels.invariant_linear import tile_linears
from rill.engine_proc.model.decode_graphs import DecodeGraphs
from rill.engine_proc.model.llama_weights import has_multipliers
from rill.engine_proc.model.loader import load_config, load_model
from rill.engine_proc.model.runner_api import RunnerInfo
from rill.engine_proc.model.sampling_runner import SamplingRunner
from rill.engine_proc.parallel.sharding import Shard
from rill.engine_proc.sample.sampler import Sampler
from rill.engine_proc.sched.batch import Batch
from rill.engine_proc.spec.config import parse_speculative_config
from rill.ipc.config import ModelConfig

log = logging.getLogger("rill.model")


class ModelRunner(SamplingRunner):
    """Owns the model, its KV cache and the sampler; `execute(batch)` is one engine step."""

    verifies_drafts = True

    def __init__(
        self,
        model: ModelConfig,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        num_kv_blocks: int,
        eos_token_ids: list[int],
        tp_rank: int = 0,
        tp_size: int = 1,
        step_broadcast=None,
        max_model_len: int | None = None,
        max_num_batched_tokens: int = 2048,
    ) -> None:
        """`model`: the settings (ipc/config.py); the rest was decided at start (engine_proc/main.py).
        `max_model_len`: --max-model-len where given, which bounds the decode graphs' block tables;
        `max_num_batched_tokens`: a step's most tokens, the largest prompt-step CUDA graph's."""
        model_dir, block_size, batch_invariant = model.model_dir, model.block_size, model.batch_invariant
        attention_backend, quantization, load_format = model.attention_backend, model.quantization, model.load_format
        self.embeddings = model.enable_embeddings  # serve embedding requests too (--enable-embeddings)
        self.config = load_config(model_dir)
        # Tensor parallelism: this rank's heads and columns (engine_proc/parallel/sharding.py); rank 0
        # sends each step to the other ranks (`step_broadcast`: engine_proc/parallel/ranks.py).
        shard = Shard(tp_rank, tp_size, self.config) if tp_size > 1 else None
        self.step_broadcast = step_broadcast
        self.dtype = dtype
        self.device = torch.device(device)
        self.block_size = block_size
        # Chosen once (engine_proc/attention/choice.py): the Triton kernels on a GPU; on the CPU Rill's
        # C++ kernels ("cpu"), or torch alone; --batch-invariant's form of either. The model's layers
        # hold it; `attention_backend` is its flag's name, which the start log shows.
        self.attention_backend = resolve_attention_backend(attention_backend, self.device)
        self.attention = create_attention_backend(self.attention_backend, self.device, dtype, block_size, batch_invariant,
                                                  model.kv_cache_dtype)
        self.vocab_size: int = self.config.vocab_size
        self.max_model_len: int = self.config.max_position_embeddings
        self.model = load_model(
            model_dir, self.config, dtype=dtype, device=self.device, load_format=load_format,
            quantization=quantization, int4_group_size=model.int4_group_size, int4_symmetric=model.int4_symmetric,
            shard=shard, batch_invariant=batch_invariant, attention=self.attention,
        )
        if batch_invariant:  # the matmuls too, not only attention: fixed-size row tiles
            tile_linears(self.model)
            self.model.bind_kernels()  # the kernel paths chosen again, for the wrapped linears
        self.lora = None  # --enable-lora: adapters in slots, applied per row (engine_proc/lora/)
        if model.max_loras:
            if shard is not None:
                raise ValueError("--enable-lora is not served with --tensor-parallel-size > 1")
            if has_multipliers(self.config):  # an adapter's delta would miss the scale folded into the weights
                raise ValueError(f"--enable-lora is not served for model_type {self.config.model_type!r} "
                                 "(its residual and attention multipliers)")
            from rill.engine_proc.lora.manager import LoRAManager

            self.lora = LoRAManager(self.model, self.model.config, model.max_loras, model.max_lora_rank, self.device)
        self.kv_cache = KVCache(
            self.model.config, num_blocks=num_kv_blocks, block_size=block_size, dtype=dtype, device=self.device,
            kv_cache_dtype=model.kv_cache_dtype,
        )
        # The engine compiles decode steps unless --enforce-eager; tests and benches build eager runners.
        self.decode_graphs = self.compiled_prefill = self.prompt_graphs = None
        longest = min(max_model_len or self.max_model_len, self.max_model_len, num_kv_blocks * block_size)
        if not model.enforce_eager and self.attention_backend == "triton" and self.device.type == "cuda":
            self.compiled_prefill = self._compiled_prefill()
            if self.compiled_prefill is not None and step_broadcast is None:  # one GPU: graphs of the prompt steps
                self.prompt_graphs = self._prompt_graphs(model.max_num_seqs, max_num_batched_tokens, longest)
        if not model.enforce_eager:
            self.decode_graphs = self._compiled_decode(model.max_num_seqs, longest)
        self.sampler = Sampler(eos_token_ids, model.seed, device=self.device,
                               use_triton=self.attention_backend == "triton")
        cache_mib = self.kv_cache.num_bytes / 2**20
        log.info("KV cache: %d blocks of %d tokens, %.0f MiB, %s", num_kv_blocks, block_size, cache_mib,
                 "int8" if model.kv_cache_dtype == "int8" else str(dtype).removeprefix("torch."))
        # --speculative-config's draft model (engine_proc/spec/draft_model.py): it shares this
        # runner's device, dtype, blocks and attention, so it is built from it, here.
        self.drafter = None
        speculative = parse_speculative_config(model.speculative_config)
        if speculative is not None and speculative.method == "draft_model":
            if shard is not None:
                raise ValueError("--speculative-config method 'draft_model' is not served with --tensor-parallel-size > 1")
            from rill.engine_proc.spec.draft_model import DraftModelProposer

            self.drafter = DraftModelProposer(speculative, self)
        self.info = RunnerInfo("native", self.attention_backend, self.decode_graphs is not None)

    def close(self) -> None:
        if self.step_broadcast is not None:
            self.step_broadcast.stop()

    def _compiled_decode(self, max_num_seqs: int, max_model_len: int) -> DecodeGraphs | None:
        if self.attention.graph_decode_op is None:
            return None  # the invariant backends have their own attention; Triton on the CPU is for tests
        for cpp_wrapper in (True, False):  # the C++ wrapper failing (an operator it cannot call): Python's
            try:
                graphs = DecodeGraphs(self.model, self.kv_cache, self.block_size, self.device, max_num_seqs,
                                      max_model_len, cpp_wrapper=cpp_wrapper)
                graphs.warm_up()
                return graphs
            except Exception as exc:  # no C++ compiler, an unsupported torch: serve, slower
                log.warning("decode steps %s: torch.compile failed (%s: %s)",
                            "try Inductor's Python wrapper" if cpp_wrapper else "run eagerly", type(exc).__name__, exc)
        return None

    def _compiled_prefill(self):
        from rill.engine_proc.model.compiled_prefill import CompiledPrefill

        try:
            compiled = CompiledPrefill(self.model, self.kv_cache, self.device)
            compiled.warm_up()
        except Exception as exc:  # an unsupported torch: serve, slower
            log.warning("prompt steps run eagerly: torch.compile failed (%s: %s)", type(exc).__name__, exc)
            return None
        return compiled

    def _prompt_graphs(self, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int):
        from rill.engine_proc.model.prompt_graphs import PromptGraphs

        graphs = PromptGraphs(self.compiled_prefill, self.block_size, max_num_seqs, max_num_batched_tokens,
                              max_model_len, self.device)
        try:
            graphs.capture()
        except Exception as exc:  # an unsupported torch: the compiled prompt step, launched from Python
            log.warning("prompt steps run without CUDA graphs: a capture failed (%s: %s)", type(exc).__name__, exc)
            return None
        return graphs

    @staticmethod
    def num_kv_blocks_for_memory(
        model_dir: str | Path, *, dtype: torch.dtype, block_size: int, memory_bytes: int, kv_cache_dtype: str = "auto"
    ) -> int:
        """How many KV blocks fit in `memory_bytes` for this model (reads only its config)."""
        return num_blocks_for_memory(load_config(model_dir), dtype, block_size, memory_bytes,
                                     kv_cache_dtype=kv_cache_dtype)

    @torch.inference_mode()
    def compute_logits(self, batch: Batch, eager: bool = False, hidden_only: bool = False) -> torch.Tensor:
        """Logits [len(batch.sampled_seqs), vocab] of each sampled seq's last token (fills the cache),
        then the prompt-scoring rows of step_inputs.logits_rows. `eager`: not through the compiled
        decode graphs (which make only the sampled rows' logits); `hidden_only`: the rows' final
        hidden states, before the head."""
        # A step with an adapter runs eagerly: the compiled graph holds the base linears alone.
        uses_lora = self.lora is not None and any(s.req.lora for s in batch.seqs)
        graphs = self.decode_graphs is not None and not eager and not uses_lora and self.decode_graphs.can_run(batch)
        if self.step_broadcast is not None:  # the other tensor-parallel ranks run the same step
            if hidden_only:
                raise ValueError("tensor parallelism does not serve embeddings")
            self.step_broadcast.send(batch, graphs)
        return self.forward_step(batch, graphs, hidden_only)

    @torch.inference_mode()
    def forward_step(self, batch: Batch, graphs: bool, hidden_only: bool = False) -> torch.Tensor:
        """The step through the compiled decode graphs (`graphs`) or eagerly; what every
        tensor-parallel rank runs (engine_proc/parallel/rank_worker.py)."""
        if graphs:
            return self.decode_graphs.run(batch)
        no_lora = self.lora is None or not any(s.req.lora for s in batch.seqs)
        if self.prompt_graphs is not None and no_lora and not hidden_only:  # prompt_graphs.py
            logits = self.prompt_graphs.run(batch)
            if logits is not None:
                return logits
        input_ids, positions, meta, logits_indices = self.attention.prepare(batch)
        if no_lora:
            if self.compiled_prefill is not None and not hidden_only:  # on a GPU (compiled_prefill.py)
                return self.compiled_prefill.run(input_ids, positions, meta, logits_indices)
            return self.model(input_ids, positions, meta, self.kv_cache, logits_indices, hidden_only=hidden_only)
        with self.lora.step_rows(batch, self.attention.flat):
            return self.model(input_ids, positions, meta, self.kv_cache, logits_indices, hidden_only=hidden_only)

