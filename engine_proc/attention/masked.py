"""Attention the prompt kernels do not do, in torch over the paged cache: sliding windows, logit
soft-capping (Gemma 2), attention sinks (GPT-OSS) and images that attend both ways (Gemma 3), for
the transformers route's layers and steps that ask for them (engine_proc/model/hf_attention.py).

A query at position p attends to keys at positions (p - window, p] of its own sequence (all of
[0, p] without a window), as transformers' sliding_window_overlay masks them; an image's token
that attends both ways sees up to its image's last, (p - window, last]. Each prompt chunk
goes on its own. One-token rows (the decodes) go through the backend's kernel where it has one
(the CPU's C++ decode kernel takes all three), else here as one batch over their gathered blocks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from rill.engine_proc.attention.kv_cache import gather_blocks
from rill.engine_proc.sched.batch import Batch

EXPLICIT_QUERIES = 256


@dataclass
class TokenTables:
    """The step's rows as this module reads them: each sequence's blocks and its rows."""

    block_tables: torch.Tensor  # [num_seqs, max_blocks] long, padded with block 0
    positions: torch.Tensor  # [num_tokens] long: each row's position
    single_rows: torch.Tensor  # [n] long: the rows of one-token sequences
    single_seqs: torch.Tensor  # [n] long: their rows of block_tables
    single_positions: tuple[int, int]  # the lowest and highest position of those rows
    spans: list[tuple[int, int, int, int]]  # (seq, first row, end row, first position) of each longer chunk


class ImageSpan(NamedTuple):
    """Rows of a prompt chunk that are an image's tokens attending both ways (Gemma 3): each sees every key of its
    sequence up to the image's last (engine_proc/model/hf_vision.py whole_images)."""

    seq: int  # its sequence's index in row order (TokenTables.block_tables' row)
    first_row: int
    end_row: int
    last_key: int  # the position of the image's last token


def key_limits(spans: list[ImageSpan], positions: torch.Tensor) -> torch.Tensor:
    """[T] the last key each row sees: its own position, an image's rows their image's last."""
    limits = positions.clone()
    for span in spans:
        limits[span.first_row:span.end_row] = span.last_key
    return limits


def attend_whole_images(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: TokenTables,
                        scale: float, spans: list[ImageSpan], out: torch.Tensor) -> None:
    """Writes into `out` [T, H, D] the attention of the spans' rows (the step's K/V already written), each over
    every key of its sequence up to its image's last, unmasked: where no window masks, the rest of the step goes
    through the backend's causal kernels and only these rows again."""
    for span in spans:
        rows = slice(span.first_row, span.end_row)
        out[rows] = _attend(q[rows].unsqueeze(0), k_cache, v_cache, tables.block_tables[span.seq : span.seq + 1],
                            tables.positions[rows].unsqueeze(0), None, (0, span.last_key), scale, None, None,
                            None)[0]


def row_order(batch: Batch, decodes_first: bool) -> list:
    """The batch's seqs in the row order of the step's inputs: the batch's order, or its one-token
    seqs first (engine_proc/model/step_inputs.py prepare_step)."""
    if not decodes_first:
        return list(batch.seqs)
    return [s for s in batch.seqs if s.num_new_tokens == 1] + [s for s in batch.seqs if s.num_new_tokens > 1]


def start_rows(batch: Batch, decodes_first: bool):
    """(seq, its first row in the step's input ids), in the backend's row order (row_order)."""
    row = 0
    for seq in row_order(batch, decodes_first):
        yield seq, row
        row += seq.num_new_tokens


def token_tables(batch: Batch, block_size: int, positions: torch.Tensor, decodes_first: bool) -> TokenTables:
    """TokenTables of `batch` in the row order of the step's inputs (row_order)."""
    seqs = row_order(batch, decodes_first)
    tables, single_rows, single_seqs, single_positions, spans, row = [], [], [], [], [], 0
    for i, s in enumerate(seqs):
        end_pos = s.start_pos + s.num_new_tokens
        tables.append(s.req.block_ids[: -(-end_pos // block_size)])
        if s.num_new_tokens == 1:
            single_rows.append(row)
            single_seqs.append(i)
            single_positions.append(s.start_pos)
        else:
            spans.append((i, row, row + s.num_new_tokens, s.start_pos))
        row += s.num_new_tokens
    width = max(map(len, tables))
    device = positions.device
    as_long = lambda values: torch.tensor(values, dtype=torch.long, device=device)  # noqa: E731
    return TokenTables(as_long([t + [0] * (width - len(t)) for t in tables]), positions, as_long(single_rows),
                       as_long(single_seqs), (min(single_positions, default=0), max(single_positions, default=0)),
                       spans)


def masked_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: TokenTables,
                     scale: float, window: int | None = None, softcap: float | None = None,
                     sinks: torch.Tensor | None = None, decoded: torch.Tensor | None = None,
                     key_limits: torch.Tensor | None = None) -> torch.Tensor:
    """Attention [T, H, D] of the step's queries q [T, H, D] over the cache (the step's K/V already
    written), each within its window; `softcap`: scores pass through softcap * tanh(s / softcap);
    `sinks` [H]: a logit per head that joins each softmax's denominator and attends to nothing.
    `decoded`: the one-token rows' attention, already worked out by the backend's kernel.
    `key_limits` [T]: the last key position each row sees, past its own for an image's tokens that
    attend both ways (engine_proc/model/hf_vision.py); None: its own."""
    out = torch.empty_like(q)
    if decoded is not None:
        out[tables.single_rows] = decoded
    elif tables.single_rows.numel():
        rows = tables.single_rows
        query_pos = tables.positions[rows].unsqueeze(1)
        out[rows] = _attend(q[rows].unsqueeze(1), k_cache, v_cache, tables.block_tables[tables.single_seqs],
                            query_pos, query_pos, tables.single_positions, scale, window, softcap, sinks)[:, 0]
    # A chunk's explicit scores (soft-capping) are [heads, queries, keys] in float32: its queries go
    # EXPLICIT_QUERIES at a time, so a long prompt's chunk does not hold them all at once.
    piece = EXPLICIT_QUERIES if softcap is not None else 1 << 30
    for seq, first, end, start_pos in tables.spans:
        for lo in range(first, end, piece):
            hi = min(end, lo + piece)
            query_pos = tables.positions[lo:hi].unsqueeze(0)
            last_key = start_pos + hi - first - 1
            key_last = query_pos if key_limits is None else key_limits[lo:hi].unsqueeze(0)
            if key_limits is not None:
                last_key = max(last_key, int(key_limits[lo:hi].max()))
            out[lo:hi] = _attend(q[lo:hi].unsqueeze(0), k_cache, v_cache, tables.block_tables[seq : seq + 1],
                                 query_pos, key_last, (start_pos + lo - first, last_key), scale, window, softcap,
                                 sinks)[0]
    return out


def _attend(q, k_cache, v_cache, block_table, query_pos, key_last, pos_range, scale, window, softcap,
            sinks) -> torch.Tensor:
    """q [B, n, H, D] at positions query_pos [B, n], each seeing keys up to key_last [B, n] (from query position
    pos_range[0] to key position pos_range[1]), over the blocks of block_table [B, blocks]: [B, n, H, D].
    key_last None: every query sees every key up to pos_range[1], unmasked (no window, soft-cap or sinks)."""
    num_kv_heads, block_size = k_cache.shape[2], k_cache.shape[1]
    context_len = pos_range[1] + 1
    first_key = 0
    if window is not None:  # no key before the earliest query's window is read
        first_key = max(0, pos_range[0] - window + 1) // block_size * block_size
        block_table = block_table[:, first_key // block_size :]
    keys = gather_blocks(k_cache, block_table)[:, : context_len - first_key].transpose(1, 2)  # [B, Hkv, L, D]
    values = gather_blocks(v_cache, block_table)[:, : context_len - first_key].transpose(1, 2)
    batch, n, num_heads, head_dim = q.shape
    group = num_heads // num_kv_heads
    # [B, Hkv, group * n, D]: the query heads that share a KV head side by side, so no K/V is repeated
    queries = q.permute(0, 2, 1, 3).reshape(batch, num_kv_heads, group * n, head_dim)
    if key_last is None:
        assert window is None and softcap is None and sinks is None
        o = F.scaled_dot_product_attention(queries, keys, values, scale=scale)
        return o.view(batch, num_heads, n, head_dim).transpose(1, 2)
    key_pos = torch.arange(first_key, context_len, device=q.device)
    keep = key_pos.view(1, 1, -1) <= key_last.unsqueeze(-1)  # [B, n, L]
    if window is not None:
        keep &= key_pos.view(1, 1, -1) > query_pos.unsqueeze(-1) - window
    # [B, 1, group * n, L]; one query a row (a decode) broadcasts over its group's heads
    mask = keep.unsqueeze(1) if n == 1 else keep.unsqueeze(1).repeat(1, 1, group, 1)
    if softcap is None and sinks is None:
        o = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale)
    elif softcap is None and q.device.type == "cpu":
        # Sinks from the log-sum-exp torch's CPU flash attention returns: with a sink logit s the
        # softmax's weights are those without it times sigmoid(lse - s).
        additive = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~mask, float("-inf"))
        o, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(queries, keys, values, attn_mask=additive,
                                                                            scale=scale)
        sink = sinks.float().view(1, num_kv_heads, group, 1).expand(-1, -1, -1, n).reshape(1, num_kv_heads, -1)
        o = o * torch.sigmoid(lse.view(batch, num_kv_heads, -1) - sink).unsqueeze(-1).to(o.dtype)
    else:
        scores = torch.matmul(queries, keys.transpose(-1, -2)).float()  # a new tensor: changed in place below
        if softcap is not None:
            scores.mul_(scale / softcap).tanh_().mul_(softcap)
        else:
            scores.mul_(scale)
        scores.masked_fill_(~mask, float("-inf"))
        if sinks is not None:  # one more column per head, dropped after the softmax
            sink = sinks.float().view(1, num_kv_heads, group, 1, 1).expand(batch, -1, -1, n, 1)
            scores = torch.cat([scores, sink.reshape(batch, num_kv_heads, group * n, 1)], dim=-1)
        probs = torch.softmax(scores, dim=-1)
        o = torch.matmul(probs[..., : keys.shape[2]].to(values.dtype), values)
    return o.view(batch, num_heads, n, head_dim).transpose(1, 2)
