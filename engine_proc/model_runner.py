"""Runs one scheduled batch through the native model over the paged KV cache, then samples."""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from engine_proc.batch import Batch
from engine_proc.kv_cache import AttentionMetadata, KVCache, PrefillChunk, num_blocks_for_memory
from engine_proc.model_loader import load_config, load_model
from engine_proc.sampler import Sampler, SamplerOutput

log = logging.getLogger("rill.model")


class ModelRunner:
    """Owns the model, its KV cache and the sampler; `execute(batch)` is one engine step."""

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
    ) -> None:
        self.config = load_config(model_dir)
        self.dtype = dtype
        self.device = torch.device(device)
        self.block_size = block_size
        self.vocab_size: int = self.config.vocab_size
        self.max_model_len: int = self.config.max_position_embeddings
        self.model = load_model(
            model_dir, self.config, dtype=dtype, device=self.device, load_format=load_format
        )
        self.kv_cache = KVCache(
            self.config, num_blocks=num_kv_blocks, block_size=block_size, dtype=dtype, device=self.device
        )
        self.sampler = Sampler(eos_token_ids)
        cache_mib = self.kv_cache.num_bytes / 2**20
        log.info("KV cache: %d blocks of %d tokens, %.0f MiB", num_kv_blocks, block_size, cache_mib)

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
        sampled_seqs = batch.sampled_seqs
        logits = self.compute_logits(batch)
        return self.sampler.sample(logits, sampled_seqs)

    @torch.inference_mode()
    def compute_logits(self, batch: Batch) -> torch.Tensor:
        """Logits [len(batch.sampled_seqs), vocab] of each sampled seq's last token (fills the cache)."""
        input_ids, positions, meta, logits_indices = self._prepare(batch)
        return self.model(input_ids, positions, meta, self.kv_cache, logits_indices)

    # ---- step inputs -----------------------------------------------------------------

    def _prepare(
        self, batch: Batch
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        """Flatten the batch (decodes first, then prefill chunks) and build the index tensors once."""
        block_size = self.block_size
        decodes = [s for s in batch.seqs if s.num_new_tokens == 1]
        prefills = [s for s in batch.seqs if s.num_new_tokens > 1]
        input_ids: list[int] = []
        positions: list[torch.Tensor] = []
        slots: list[torch.Tensor] = []
        last_token_index: dict[int, int] = {}  # id(ScheduledSeq) -> its last token's row
        meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long))

        if decodes:
            decode_positions = [s.start_pos for s in decodes]
            context_lens = [pos + 1 for pos in decode_positions]
            max_num_blocks = (max(context_lens) + block_size - 1) // block_size
            # Pad with block 0: those slots lie past each row's length and are masked.
            table_rows = [
                _padded(s.req.block_ids, (n + block_size - 1) // block_size, max_num_blocks)
                for s, n in zip(decodes, context_lens)
            ]
            decode_slots = [
                s.req.block_ids[pos // block_size] * block_size + pos % block_size
                for s, pos in zip(decodes, decode_positions)
            ]
            for i, s in enumerate(decodes):
                input_ids.extend(s.token_ids)
                last_token_index[id(s)] = i
            positions.append(torch.tensor(decode_positions, dtype=torch.long))
            slots.append(torch.tensor(decode_slots, dtype=torch.long))
            meta.num_decode_tokens = len(decodes)
            meta.decode_block_table = torch.tensor(table_rows, dtype=torch.long, device=self.device)
            meta.decode_context_len = max(context_lens)
            if min(context_lens) < meta.decode_context_len:
                lens = torch.tensor(context_lens, dtype=torch.long, device=self.device)
                key_pos = torch.arange(meta.decode_context_len, device=self.device)
                mask = key_pos.unsqueeze(0) < lens.unsqueeze(1)
                meta.decode_mask = mask.view(len(decodes), 1, 1, -1)

        for s in prefills:
            token_start = len(input_ids)
            input_ids.extend(s.token_ids)
            end_pos = s.start_pos + s.num_new_tokens
            last_token_index[id(s)] = len(input_ids) - 1
            chunk_positions = torch.arange(s.start_pos, end_pos, dtype=torch.long)
            num_blocks = (end_pos + block_size - 1) // block_size
            block_table = torch.tensor(s.req.block_ids[:num_blocks], dtype=torch.long)
            positions.append(chunk_positions)
            block_of_token = block_table[chunk_positions // block_size]
            slots.append(block_of_token * block_size + chunk_positions % block_size)
            chunk = PrefillChunk(token_start=token_start, token_end=len(input_ids))
            if s.start_pos > 0:
                # On top of cached tokens: query at position p sees keys 0..p, so the
                # causal diagonal is shifted right by start_pos.
                chunk.block_table = block_table.to(self.device)
                chunk.context_len = end_pos
                key_pos = torch.arange(end_pos, device=self.device)
                query_pos = chunk_positions.to(self.device)
                chunk.causal_mask = key_pos.unsqueeze(0) <= query_pos.unsqueeze(1)
            meta.prefills.append(chunk)

        meta.slot_mapping = torch.cat(slots).to(self.device)
        logits_indices = [last_token_index[id(s)] for s in batch.sampled_seqs]
        return (
            torch.tensor(input_ids, dtype=torch.long, device=self.device),
            torch.cat(positions).to(self.device),
            meta,
            torch.tensor(logits_indices, dtype=torch.long, device=self.device),
        )


def _padded(block_ids: list[int], num_blocks: int, padded_len: int) -> list[int]:
    row = block_ids[:num_blocks]
    return row + [0] * (padded_len - len(row))

