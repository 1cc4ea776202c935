"""Runs one scheduled batch through the native model over the paged KV cache, then samples."""
from __future__ import annotations

import logging
import math
from pathlib import Path

import torch

from engine_proc.attention import cpu as cpu_attention
from engine_proc.attention.invariant import PAD_MULTIPLE
from engine_proc.attention.kv_cache import KVCache, num_blocks_for_memory
from engine_proc.model.decode_graphs import DecodeGraphs
from engine_proc.model.invariant_linear import tile_linears
from engine_proc.model.loader import load_config, load_model
from engine_proc.model.step_inputs import prepare_flat_step, prepare_step
from engine_proc.parallel.sharding import Shard
from engine_proc.sample.prompt_logprobs import score_prompts
from engine_proc.sample.sampler import Sampler, SamplerOutput
from engine_proc.sched.batch import Batch
from engine_proc.spec import verify as spec_verify

log = logging.getLogger("rill.model")


class ModelRunner:
    """Owns the model, its KV cache and the sampler; `execute(batch)` is one engine step."""

    embeddings = False  # serve embedding requests too (--enable-embeddings); set per instance
    drafter = None  # --speculative-config's draft model (engine_proc/spec/draft_model.py), set by the engine

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: torch.dtype = torch.float32,
        num_kv_blocks: int,
        block_size: int = 16,
        eos_token_ids: list[int],
        load_format: str = "auto",
        device: torch.device | str = "cpu",
        batch_invariant: bool = False,
        attention_backend: str = "auto",
        quantization: str = "none",
        compile_decode: bool = False,
        max_num_seqs: int = 64,
        embeddings: bool = False,
        tp_rank: int = 0,
        tp_size: int = 1,
        max_loras: int = 0,
        max_lora_rank: int = 16,
    ) -> None:
        self.embeddings = embeddings
        self.config = load_config(model_dir)
        # Tensor parallelism: this rank's heads and columns (engine_proc/parallel/sharding.py); rank 0
        # sends each step to the other ranks (step_broadcast, set by engine_proc/parallel/ranks.py).
        shard = Shard(tp_rank, tp_size, self.config) if tp_size > 1 else None
        self.step_broadcast = None
        self.dtype = dtype
        self.device = torch.device(device)
        self.block_size = block_size
        # Chosen once: the Triton kernels on a GPU; on the CPU Rill's C++ decode kernel beside SDPA
        # for prefill ("cpu"), or torch alone (SDPA over gathered blocks). "triton" on the CPU runs
        # the Triton kernels under Triton's interpreter (TRITON_INTERPRET=1): tests only.
        self.attention_backend = resolve_attention_backend(attention_backend, self.device)
        if batch_invariant and self.attention_backend == "triton":
            raise ValueError("--batch-invariant is implemented for the torch attention path only")
        # The batch-invariant mode: on the "cpu" backend every token, decode or prompt, goes through
        # the C++ kernel as a row of its own (its arithmetic depends on nothing else in the step);
        # otherwise the torch path pads every context to whole vector widths and whole blocks.
        self.invariant_kernel = (batch_invariant and self.attention_backend == "cpu"
                                 and dtype in cpu_attention.DTYPES)
        self.context_pad = math.lcm(PAD_MULTIPLE, block_size) if batch_invariant and not self.invariant_kernel else None
        self.vocab_size: int = self.config.vocab_size
        self.max_model_len: int = self.config.max_position_embeddings
        self.model = load_model(
            model_dir, self.config, dtype=dtype, device=self.device, load_format=load_format,
            quantization=quantization, shard=shard, batch_invariant=batch_invariant,
        )
        if batch_invariant:  # the matmuls too, not only attention: fixed-size row tiles
            tile_linears(self.model)
        self.lora = None  # --enable-lora: adapters in slots, applied per row (engine_proc/lora/)
        if max_loras:
            if shard is not None:
                raise ValueError("--enable-lora is not served with --tensor-parallel-size > 1")
            from engine_proc.lora.manager import LoRAManager

            self.lora = LoRAManager(self.model, self.model.config, max_loras, max_lora_rank, self.device)
        self.kv_cache = KVCache(
            self.model.config, num_blocks=num_kv_blocks, block_size=block_size, dtype=dtype, device=self.device
        )
        # The engine compiles decode steps unless --enforce-eager; tests and benches build eager runners.
        self.decode_graphs = None
        if compile_decode:
            self.decode_graphs = self._compiled_decode(batch_invariant, max_num_seqs)
        self.sampler = Sampler(eos_token_ids, device=self.device,
                               use_triton=self.attention_backend == "triton")
        cache_mib = self.kv_cache.num_bytes / 2**20
        log.info("KV cache: %d blocks of %d tokens, %.0f MiB", num_kv_blocks, block_size, cache_mib)

    def _compiled_decode(self, batch_invariant: bool, max_num_seqs: int) -> DecodeGraphs | None:
        if batch_invariant or (self.device.type == "cpu" and self.attention_backend == "triton"):
            return None  # the invariant mode has its own attention; Triton on the CPU is for tests
        try:
            graphs = DecodeGraphs(self.model, self.kv_cache, self.block_size, self.device, max_num_seqs,
                                  cpu_kernel=self.attention_backend == "cpu")
            graphs.warm_up()
        except Exception as exc:  # no C++ compiler, an unsupported torch: serve, slower
            log.warning("decode steps run eagerly: torch.compile failed (%s: %s)", type(exc).__name__, exc)
            return None
        return graphs

    @staticmethod
    def num_kv_blocks_for_memory(
        model_dir: str | Path, *, dtype: torch.dtype, block_size: int, memory_bytes: int
    ) -> int:
        """How many KV blocks fit in `memory_bytes` for this model (reads only its config)."""
        return num_blocks_for_memory(load_config(model_dir), dtype, block_size, memory_bytes)

    def execute(self, batch: Batch) -> SamplerOutput:
        """Run the step; one sampled token id per seq of `batch.sampled_seqs`, in that order."""
        if not batch:
            return SamplerOutput([])
        if self.drafter is not None:  # the draft model's tokens into the slots the scheduler reserved
            self.drafter.fill(batch)
        sampled_seqs = batch.sampled_seqs
        scoring_seqs = batch.scoring_seqs
        embed_rows = [i for i, s in enumerate(sampled_seqs) if s.req.params.embed] if self.embeddings else []
        if not scoring_seqs and not embed_rows:  # with drafts, verified (engine_proc/spec/verify.py)
            return spec_verify.sample(self.sampler, self.compute_logits(batch), sampled_seqs)
        return self._execute_mixed(batch, sampled_seqs, scoring_seqs, embed_rows)

    def _execute_mixed(self, batch: Batch, sampled_seqs, scoring_seqs, embed_rows: list[int]) -> SamplerOutput:
        """A step with prompts to score or to embed: the sampled rows that are not embeddings,
        then the scoring rows, go through the head; the embedding rows' hidden states are pooled
        (the last token's, L2-normalised, as vLLM pools a decoder for embeddings)."""
        rows = self.compute_logits(batch, eager=True, hidden_only=bool(embed_rows))
        out = SamplerOutput([-1] * len(sampled_seqs))
        if embed_rows:  # an embedding is a prompt: one row each (only decodes have drafts)
            first_row = [0]
            for s in sampled_seqs:
                first_row.append(first_row[-1] + s.num_logits_rows)
            embed_at = [first_row[i] for i in embed_rows]
            vectors = torch.nn.functional.normalize(rows[embed_at].float(), dim=-1).cpu().numpy()
            out.embeddings = [(sampled_seqs[i], v) for i, v in zip(embed_rows, vectors)]
            skip = set(embed_at)
            keep = [i for i in range(rows.shape[0]) if i not in skip]
            rows = self.model.lm_logits(rows[keep]) if keep else rows[:0]
        generating = [i for i, s in enumerate(sampled_seqs) if not s.req.params.embed]
        num_rows = sum(sampled_seqs[i].num_logits_rows for i in generating)
        sampled = spec_verify.sample(self.sampler, rows[:num_rows], [sampled_seqs[i] for i in generating])
        for i, token_id in zip(generating, sampled):
            out[i] = token_id
        if sampled.spec_ids is not None:
            out.spec_ids = [[token_id] for token_id in out]
            for i, kept in zip(generating, sampled.spec_ids):
                out.spec_ids[i] = kept
        if sampled.logprobs is not None:
            out.logprobs = [None] * len(sampled_seqs)
            for i, lp in zip(generating, sampled.logprobs):
                out.logprobs[i] = lp
        if scoring_seqs:
            out.prompt_logprobs = list(zip(scoring_seqs, score_prompts(rows[num_rows:], scoring_seqs)))
        return out

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
        flat = self.attention_backend == "triton" or self.invariant_kernel
        if flat:
            step = prepare_flat_step(batch, self.block_size, self.device)
            if self.invariant_kernel:  # each token a row of the kernel: its own table, built once a step
                meta = step[2]
                meta.cpu_kernel = True
                meta.decode_block_table = meta.block_tables.index_select(0, meta.seq_of_token).long()
                meta.decode_lens = meta.context_lens.long()
        else:
            step = prepare_step(batch, self.block_size, self.device, self.context_pad,
                                decode_lens=self.attention_backend == "cpu")
        input_ids, positions, meta, logits_indices = step
        if self.lora is None or not any(s.req.lora for s in batch.seqs):
            return self.model(input_ids, positions, meta, self.kv_cache, logits_indices, hidden_only=hidden_only)
        # Token rows in the order the step laid them out: the flat step keeps the batch's order,
        # prepare_step puts one-token decodes first.
        ordered = batch.seqs if flat else ([s for s in batch.seqs if s.num_new_tokens == 1]
                                           + [s for s in batch.seqs if s.num_new_tokens > 1])
        self.lora.set_rows(ordered)
        try:
            return self.model(input_ids, positions, meta, self.kv_cache, logits_indices, hidden_only=hidden_only)
        finally:
            self.lora.clear()


ATTENTION_BACKENDS = ("auto", "cpu", "torch", "triton")


def resolve_attention_backend(name: str, device: torch.device) -> str:
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend {name!r}: expected one of {ATTENTION_BACKENDS}")
    if name == "auto":
        if device.type == "cuda":
            return "triton"
        return "cpu" if cpu_attention.available() else "torch"
    if name == "cpu":
        if device.type != "cpu":
            raise ValueError(f"attention backend 'cpu' runs on the CPU, not on {device.type}")
        if not cpu_attention.available():
            raise ValueError("attention backend 'cpu' needs its C++ kernel, which could not be built here "
                             "(see the warning above); use --attention-backend torch")
    return name
