"""Picks one token per row of logits: greedy, or temperature/top-k/top-p by the exponential race."""
from __future__ import annotations

import torch

from engine_proc.batch import ScheduledSeq

_MASK_64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK_64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK_64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK_64
    return x ^ (x >> 31)


def step_seed(seed: int, num_generated: int) -> int:
    """The noise seed of a seeded request's next token: a function of (seed, position) only."""
    return _splitmix64(_splitmix64(seed & _MASK_64) ^ num_generated) >> 1  # manual_seed takes < 2**63


def sample_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    exp_noise: torch.Tensor,
) -> torch.Tensor:
    """The torch twin of the sampling kernel: token ids [n] from logits [n, V] (float32).

    temperature [n] > 0; top_k [n] (0 = off) or None when no row uses it; top_p [n] in
    (0, 1] or None when no row uses it; exp_noise [n, V] is Exp(1) noise indexed by token id.
    The winner of argmax(probs / noise) is distributed as probs, with no host sync (unlike
    torch.multinomial). Filtered tokens keep probability 0; no renormalisation is needed
    because the race is scale-invariant.
    """
    logits = logits / temperature.unsqueeze(1)
    vocab_size = logits.shape[1]
    if top_p is not None:
        sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True)
        if top_k is not None:
            keep_len = torch.where(top_k > 0, top_k, vocab_size).unsqueeze(1)
            ranks = torch.arange(vocab_size, device=logits.device).unsqueeze(0)
            sorted_logits = sorted_logits.masked_fill(ranks >= keep_len, float("-inf"))
        probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p (the first stays).
        mass_before = probs.cumsum(dim=-1) - probs
        probs = probs.masked_fill(mass_before > top_p.unsqueeze(1), 0.0)
        choice = (probs / exp_noise.gather(1, sorted_ids)).argmax(dim=-1, keepdim=True)
        return sorted_ids.gather(1, choice).squeeze(1)
    if top_k is not None:
        # top_k.max() syncs on a GPU; the Triton twin avoids it, this one runs on the CPU.
        max_k = int(top_k.clamp(min=1).max())
        kth = logits.topk(min(max_k, vocab_size), dim=-1).values
        index = (top_k.clamp(min=1, max=kth.shape[1]) - 1).unsqueeze(1)
        threshold = kth.gather(1, index).masked_fill((top_k <= 0).unsqueeze(1), float("-inf"))
        logits = logits.masked_fill(logits < threshold, float("-inf"))
    probs = logits.softmax(dim=-1)
    return (probs / exp_noise).argmax(dim=-1)


class Sampler:
    """Turns the step's logits into token ids, one per sampled sequence, in order."""

    def __init__(self, eos_token_ids: list[int], seed: int | None = None) -> None:
        self.eos_token_ids = list(eos_token_ids)
        # Rows without a seed share one generator: random from run to run unless `seed`.
        self._shared_generator = torch.Generator(device="cpu")
        if seed is None:
            self._shared_generator.seed()
        else:
            self._shared_generator.manual_seed(seed)
        self._seeded_generator = torch.Generator(device="cpu")

    def sample(self, logits: torch.Tensor, seqs: list[ScheduledSeq]) -> list[int]:
        assert logits.shape[0] == len(seqs), (logits.shape, len(seqs))
        if not seqs:
            return []
        logits = logits.float()
        logits = self._block_stop_tokens(logits, seqs)
        params = [s.req.params for s in seqs]
        sampled_rows = [i for i, p in enumerate(params) if p.temperature > 0]
        if not sampled_rows:
            return logits.argmax(dim=-1).tolist()
        if len(sampled_rows) == len(seqs):
            return self._sample_rows(logits, seqs).tolist()
        tokens = self._sample_rows(logits[sampled_rows], [seqs[i] for i in sampled_rows])
        greedy_rows = [i for i, p in enumerate(params) if p.temperature <= 0]
        out = torch.empty(len(seqs), dtype=torch.long)
        out[greedy_rows] = logits[greedy_rows].argmax(dim=-1)
        out[sampled_rows] = tokens
        return out.tolist()

    def _block_stop_tokens(self, logits: torch.Tensor, seqs: list[ScheduledSeq]) -> torch.Tensor:
        """Before min_tokens, a request may not end: its stop ids (and eos) get -inf."""
        rows: list[int] = []
        cols: list[int] = []
        vocab_size = logits.shape[1]
        for i, s in enumerate(seqs):
            p = s.req.params
            if len(s.req.output_ids) >= p.min_tokens:
                continue
            # With ignore_eos, eos is an ordinary token and is not held back (as in vLLM).
            stop_ids = p.stop_token_ids if p.ignore_eos else [*self.eos_token_ids, *p.stop_token_ids]
            for token_id in stop_ids:
                if 0 <= token_id < vocab_size:
                    rows.append(i)
                    cols.append(token_id)
        if not rows:
            return logits
        logits = logits.clone()  # the caller's logits stay as they were
        logits[rows, cols] = float("-inf")
        return logits

    def _sample_rows(self, logits: torch.Tensor, seqs: list[ScheduledSeq]) -> torch.Tensor:
        """Sample rows whose temperature is > 0: logits [len(seqs), V]."""
        params = [s.req.params for s in seqs]
        temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)
        top_k = top_p = None
        if any(p.top_k > 0 for p in params):
            top_k = torch.tensor([p.top_k for p in params], dtype=torch.long)
        if any(p.top_p < 1.0 for p in params):
            top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
        return sample_tokens(logits, temperature, top_k, top_p, self._exp_noise(seqs, logits.shape[1]))

    def _exp_noise(self, seqs: list[ScheduledSeq], vocab_size: int) -> torch.Tensor:
        noise = torch.empty(len(seqs), vocab_size, dtype=torch.float32)
        unseeded_rows = []
        for i, s in enumerate(seqs):
            seed = s.req.params.seed
            if seed is None:
                unseeded_rows.append(i)
                continue
            # Stateless: the noise depends on (seed, tokens generated so far) only, so a
            # seeded request gives the same tokens in any batch and after a recompute.
            self._seeded_generator.manual_seed(step_seed(seed, len(s.req.output_ids)))
            noise[i].exponential_(generator=self._seeded_generator)
        if len(unseeded_rows) == len(seqs):
            noise.exponential_(generator=self._shared_generator)
        elif unseeded_rows:
            fresh = torch.empty(len(unseeded_rows), vocab_size)
            noise[unseeded_rows] = fresh.exponential_(generator=self._shared_generator)
        # exponential_ can return 0 in float32; 0 / 0 would be a NaN that argmax picks.
        return noise.clamp_(min=torch.finfo(torch.float32).tiny)
