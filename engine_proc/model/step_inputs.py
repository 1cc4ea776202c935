"""One step's model inputs: the batch flattened (decodes first, then prefill chunks) and its index tensors."""
from __future__ import annotations

import torch

from rill.engine_proc.attention.kv_cache import AttentionMetadata, PrefillChunk
from rill.engine_proc.sched.batch import Batch


def prepare_step(
    batch: Batch, block_size: int, device: torch.device, context_pad: int | None = None,
    decode_lens: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
    """input_ids, positions, attention metadata and the rows whose logits are needed (`logits_rows`).

    `decode_lens`: give the decode rows' context lengths, for the CPU decode kernel
    (engine_proc/attention/cpu.py), which then reads the cache in place.

    `context_pad` (the batch-invariant mode, see engine_proc/attention/invariant.py): every
    query reads its context from the cache, padded to a multiple of `context_pad` tokens and
    masked past its own position, whatever else is in the step.
    """
    decodes = [s for s in batch.seqs if s.num_new_tokens == 1]
    prefills = [s for s in batch.seqs if s.num_new_tokens > 1]
    input_ids: list[int] = []
    positions: list[torch.Tensor] = []
    slots: list[torch.Tensor] = []
    start_row: dict[int, int] = {}  # id(ScheduledSeq) -> its first token's row
    meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long))

    if decodes:
        decode_positions = [s.start_pos for s in decodes]
        context_lens = [pos + 1 for pos in decode_positions]
        padded_len = _round_up(max(context_lens), context_pad or block_size)
        max_num_blocks = padded_len // block_size
        # Pad with block 0: those slots lie past each row's length and are masked.
        table_rows = [
            _padded(s.req.block_ids, _round_up(n, block_size) // block_size, max_num_blocks)
            for s, n in zip(decodes, context_lens)
        ]
        decode_slots = [
            s.req.block_ids[pos // block_size] * block_size + pos % block_size
            for s, pos in zip(decodes, decode_positions)
        ]
        for i, s in enumerate(decodes):
            input_ids.extend(s.token_ids)
            start_row[id(s)] = i
        positions.append(torch.tensor(decode_positions, dtype=torch.long))
        slots.append(torch.tensor(decode_slots, dtype=torch.long))
        meta.num_decode_tokens = len(decodes)
        meta.decode_block_table = torch.tensor(table_rows, dtype=torch.long, device=device)
        meta.decode_context_len = max(context_lens) if context_pad is None else padded_len
        if decode_lens and context_pad is None:  # the batch-invariant mode keeps its own attention
            meta.decode_lens = torch.tensor(context_lens, dtype=torch.long, device=device)
        if context_pad is not None or min(context_lens) < meta.decode_context_len:
            lens = torch.tensor(context_lens, dtype=torch.long, device=device)
            key_pos = torch.arange(meta.decode_context_len, device=device)
            mask = key_pos.unsqueeze(0) < lens.unsqueeze(1)
            meta.decode_mask = mask.view(len(decodes), 1, 1, -1)

    for s in prefills:
        token_start = start_row[id(s)] = len(input_ids)
        input_ids.extend(s.token_ids)
        end_pos = s.start_pos + s.num_new_tokens
        chunk_positions = torch.arange(s.start_pos, end_pos, dtype=torch.long)
        num_blocks = _round_up(end_pos, block_size) // block_size
        block_table = torch.tensor(s.req.block_ids[:num_blocks], dtype=torch.long)
        positions.append(chunk_positions)
        block_of_token = block_table[chunk_positions // block_size]
        slots.append(block_of_token * block_size + chunk_positions % block_size)
        chunk = PrefillChunk(token_start=token_start, token_end=len(input_ids), start_pos=s.start_pos)
        if s.start_pos > 0 or context_pad is not None:
            # On top of cached tokens: query at position p sees keys 0..p, so the
            # causal diagonal is shifted right by start_pos.
            context_len = end_pos if context_pad is None else _round_up(end_pos, context_pad)
            table = _padded(s.req.block_ids, num_blocks, _round_up(context_len, block_size) // block_size)
            chunk.block_table = torch.tensor(table, dtype=torch.long, device=device)
            chunk.context_len = context_len
            key_pos = torch.arange(context_len, device=device)
            query_pos = chunk_positions.to(device)
            chunk.causal_mask = key_pos.unsqueeze(0) <= query_pos.unsqueeze(1)
        meta.prefills.append(chunk)

    meta.slot_mapping = torch.cat(slots).to(device)
    logits_indices = logits_rows(batch, start_row)
    return (
        torch.tensor(input_ids, dtype=torch.long, device=device),
        torch.cat(positions).to(device),
        meta,
        torch.tensor(logits_indices, dtype=torch.long, device=device),
    )


def prepare_flat_step(
    batch: Batch, block_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
    """The same four for the Triton attention kernel: per token its sequence and context length.

    Every token, decode or prefill, attends to positions [0, position] of its sequence, whose
    blocks are row `seq_of_token[t]` of `block_tables`; no masks, no padding of the tokens.
    """
    input_ids: list[int] = []
    positions: list[int] = []
    seq_of_token: list[int] = []
    slots: list[int] = []
    tables: list[list[int]] = []
    start_row: dict[int, int] = {}  # id(ScheduledSeq) -> its first token's row
    for row, s in enumerate(batch.seqs):
        end_pos = s.start_pos + s.num_new_tokens
        block_ids = s.req.block_ids[: _round_up(end_pos, block_size) // block_size]
        tables.append(block_ids)
        for pos in range(s.start_pos, end_pos):
            slots.append(block_ids[pos // block_size] * block_size + pos % block_size)
        positions.extend(range(s.start_pos, end_pos))
        seq_of_token.extend([row] * s.num_new_tokens)
        start_row[id(s)] = len(input_ids)
        input_ids.extend(s.token_ids)
    width = max(map(len, tables))
    as_tensor = lambda values, dtype: torch.tensor(values, dtype=dtype).to(device, non_blocking=True)  # noqa: E731
    positions_t = as_tensor(positions, torch.long)
    meta = AttentionMetadata(
        slot_mapping=as_tensor(slots, torch.long),
        block_tables=as_tensor([_padded(t, len(t), width) for t in tables], torch.int32),
        seq_of_token=as_tensor(seq_of_token, torch.int32),
        context_lens=(positions_t + 1).to(torch.int32),
    )
    return as_tensor(input_ids, torch.long), positions_t, meta, as_tensor(logits_rows(batch, start_row), torch.long)


def logits_rows(batch: Batch, start_row: dict[int, int]) -> list[int]:
    """The last token's row of each sampled seq, and its drafts' rows, in order; then, for each
    seq of `batch.scoring_seqs` in order, the rows of its `prompt_scored` positions."""
    rows = []
    for s in batch.sampled_seqs:
        end = start_row[id(s)] + s.num_new_tokens
        rows.extend(range(end - s.num_logits_rows, end))
    for s in batch.scoring_seqs:
        first = start_row[id(s)] - s.start_pos
        rows.extend(first + pos for pos in s.prompt_scored)
    return rows


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _padded(block_ids: list[int], num_blocks: int, padded_len: int) -> list[int]:
    row = block_ids[:num_blocks]
    return row + [0] * (padded_len - len(row))
