"""The sampling kernel in Triton: temperature, top-k/top-p cut-offs, min-p and the race, fused."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK_V = 2048  # vocabulary entries per inner step


@triton.jit
def _sample_kernel(
    logits_ptr, noise_ptr, temperature_ptr, cutoff_ptr, min_p_ptr, out_ptr,
    vocab_size, stride_logits, stride_noise,
    HAS_CUTOFF: tl.constexpr, HAS_MIN_P: tl.constexpr, BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    logits_row = logits_ptr + row * stride_logits
    noise_row = noise_ptr + row * stride_noise
    temperature = tl.load(temperature_ptr + row)
    offsets = tl.arange(0, BLOCK_V)

    # The row max of the raw logits; dividing it by T > 0 gives the max of logits / T
    # bit for bit, because a correctly rounded division by a positive number is monotone.
    row_max = tl.full([BLOCK_V], float("-inf"), dtype=tl.float32)
    for start in range(0, vocab_size, BLOCK_V):
        ids = start + offsets
        logits = tl.load(logits_row + ids, mask=ids < vocab_size, other=float("-inf"))
        row_max = tl.maximum(row_max, logits.to(tl.float32))
    scaled_max = tl.math.div_rn(tl.max(row_max, axis=0), temperature)
    cutoff = tl.load(cutoff_ptr + row) if HAS_CUTOFF else float("-inf")
    min_p = tl.load(min_p_ptr + row) if HAS_MIN_P else 0.0

    best_score = -1.0  # below every kept token's score (>= 0), so a filtered token never wins
    best_id = 0
    for start in range(0, vocab_size, BLOCK_V):
        ids = start + offsets
        in_vocab = ids < vocab_size
        logits = tl.load(logits_row + ids, mask=in_vocab, other=float("-inf")).to(tl.float32)
        noise = tl.load(noise_row + ids, mask=in_vocab, other=1.0)
        # div_rn, not `/` (approximate division on the GPU): the twin's logits / T exactly.
        scaled = tl.math.div_rn(logits, temperature)
        # Unnormalised probs: probs * sum, a positive per-row factor the race ignores.
        probs = tl.exp(scaled - scaled_max)
        keep = in_vocab & (scaled >= cutoff) & (probs >= min_p)
        score = tl.where(keep, tl.math.div_rn(probs, noise), -1.0)
        block_best = tl.max(score, axis=0)
        block_id = start + tl.argmax(score, axis=0)  # the first id of the block's best
        # Strictly greater: on a tie the lower id wins, like torch.argmax.
        better = block_best > best_score
        best_id = tl.where(better, block_id, best_id)
        best_score = tl.where(better, block_best, best_score)
    tl.store(out_ptr + row, best_id.to(tl.int64))


def cutoffs_of(
    scaled: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor | None:
    """Per row, the smallest scaled logit that top-k then top-p keep ([n] float32), or None.

    One sort per row on the device and no host sync; it mirrors the torch twin's filtering
    op for op, except that tokens tied with the cut-off are all kept (the twin's sort order
    picks among them arbitrarily).
    """
    if top_k is None and top_p is None:
        return None
    vocab_size = scaled.shape[1]
    sorted_logits = scaled.sort(dim=-1, descending=True).values
    ranks = torch.arange(vocab_size, device=scaled.device).unsqueeze(0)
    keep = torch.ones_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        keep_len = torch.where(top_k > 0, top_k, vocab_size).unsqueeze(1)
        keep = ranks < keep_len
        sorted_logits = sorted_logits.masked_fill(~keep, float("-inf"))
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p (the first stays).
        mass_before = probs.cumsum(dim=-1) - probs
        keep = keep & (mass_before <= top_p.unsqueeze(1))
    return sorted_logits.masked_fill(~keep, float("inf")).amin(dim=-1)


def sample_tokens_triton(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    exp_noise: torch.Tensor,
) -> torch.Tensor:
    """The Triton twin of engine_proc.sample.sampler.sample_tokens: token ids [n] (int64).

    logits [n, V] float32; temperature [n] > 0; top_k [n] (0 = off) or None; top_p [n] in
    (0, 1] or None; min_p [n] (0 = off) or None; exp_noise [n, V] Exp(1) noise by token id.
    The winner is argmax over the kept tokens of exp(l / T - max) / noise: the twin's
    probs / noise times the positive factor sum(exp(l / T - max)), so the same token up to
    rounding in near ties. Kept: l / T >= the top-k/top-p cut-off and, for min-p,
    exp(l / T - max) >= min_p, which is prob >= min_p * max prob.
    """
    num_rows, vocab_size = logits.shape
    assert exp_noise.shape == logits.shape and logits.stride(1) == 1 and exp_noise.stride(1) == 1
    out = torch.empty(num_rows, dtype=torch.long, device=logits.device)
    if num_rows == 0:
        return out
    temperature = temperature.to(torch.float32)
    cutoff = cutoffs_of(logits / temperature.unsqueeze(1), top_k, top_p)
    _sample_kernel[(num_rows,)](
        logits, exp_noise, temperature,
        temperature if cutoff is None else cutoff,  # unread placeholder when HAS_CUTOFF is off
        temperature if min_p is None else min_p.to(torch.float32),
        out, vocab_size, logits.stride(0), exp_noise.stride(0),
        HAS_CUTOFF=cutoff is not None, HAS_MIN_P=min_p is not None,
        BLOCK_V=min(_BLOCK_V, triton.next_power_of_2(vocab_size)),
    )
    return out
