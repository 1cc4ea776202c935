"""Picks one token per row of logits (greedy, or by the exponential race), and its logprobs."""
from __future__ import annotations

from typing import Any

import torch

from rill.engine_proc.grammar.bitmask import GrammarMasker
from rill.engine_proc.sample.bad_words import ban_bad_words
from rill.engine_proc.sample.logit_bias import add_logit_bias, biased_rows
from rill.engine_proc.sample.no_token import end_rows_without_a_token
from rill.engine_proc.sample.penalties import penalize, uses_penalties
from rill.engine_proc.sample.prepared import SamplePrep, prepared
from rill.engine_proc.sample.thinking import force_thinking_ends
from rill.engine_proc.sample.top_logprobs import gather_logprobs
from rill.engine_proc.sched.batch import ScheduledSeq
from rill.ipc.logprobs import TokenLogprobs

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
    min_p: torch.Tensor | None,
    exp_noise: torch.Tensor,
) -> torch.Tensor:
    """The torch twin of the sampling kernel: token ids [n] from logits [n, V] (float32).

    temperature [n] > 0; top_k [n] (0 = off) or None when no row uses it; top_p [n] in
    (0, 1] or None when no row uses it; min_p [n] in [0, 1] (0 = off) or None when no row uses
    it; exp_noise [n, V] is Exp(1) noise indexed by token id.

    After temperature, the filters run in vLLM V0's order: top-k, then top-p over the
    renormalised top-k, then min-p, which keeps a token when its probability is >= min_p times
    the most likely token's. Min-p compares ratios of probabilities, which renormalising leaves
    alone, and the most likely token survives every filter: so min-p drops the same tokens
    whether it sees the distribution before or after top-k and top-p. What the order decides is
    that top-p's mass is counted without min-p's cut (vLLM V1 runs min-p before top-p instead).

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
        if min_p is not None:
            probs = probs.masked_fill(probs < min_p.unsqueeze(1) * probs[:, :1], 0.0)
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
    if min_p is not None:
        probs = probs.masked_fill(probs < min_p.unsqueeze(1) * probs.amax(dim=-1, keepdim=True), 0.0)
    return (probs / exp_noise).argmax(dim=-1)


class SamplerOutput(list[int]):
    """The step's token ids, one per sampled seq in order, and the logprobs of rows that asked.

    It is the plain list of ids to callers that want only those (the scheduler, tests, benches);
    `logprobs` is None when no row asked, else one entry per row (None for rows that did not).
    """

    def __init__(self, token_ids: list[int], logprobs: list[TokenLogprobs | None] | None = None) -> None:
        super().__init__(token_ids)
        self.logprobs = logprobs
        # (seq, its prompt tokens' logprobs) per seq of batch.scoring_seqs; set by the model runner.
        self.prompt_logprobs: list[tuple[ScheduledSeq, TokenLogprobs]] = []
        # (seq, its vector) per embedding seq (params.embed) of the step: a float32 numpy array each.
        self.embeddings: list[tuple[ScheduledSeq, Any]] = []
        # A step with drafts (engine_proc/spec/verify.py): per sampled seq, every token it keeps
        # (the first is self[i]); None in a step without drafts.
        self.spec_ids: list[list[int]] | None = None


class Sampler:
    """Turns the step's logits into token ids, one per sampled sequence, in order."""

    def __init__(self, eos_token_ids: list[int], seed: int | None = None, *,
                 device: torch.device | str = "cpu", use_triton: bool = False) -> None:
        self.eos_token_ids = list(eos_token_ids)
        self.device = torch.device(device)
        # The Triton kernel on a GPU (imported only then), its torch twin otherwise.
        self._sample_tokens = _triton_sample_tokens() if use_triton else sample_tokens
        # Rows without a seed share one generator: random from run to run unless `seed`.
        self._shared_generator = torch.Generator(device=self.device)
        if seed is None:
            self._shared_generator.seed()
        else:
            self._shared_generator.manual_seed(seed)
        self._seeded_generator = torch.Generator(device=self.device)
        self._grammar_masker = GrammarMasker(self.device)

    def sample(self, logits: torch.Tensor, seqs: list[ScheduledSeq]) -> SamplerOutput:
        assert logits.shape[0] == len(seqs), (logits.shape, len(seqs))
        if not seqs:
            return SamplerOutput([])
        params = [s.req.params for s in seqs]
        logprob_rows = [i for i, p in enumerate(params) if p.logprobs is not None]
        grammar_rows = [i for i, s in enumerate(seqs) if s.req.grammar is not None]
        # A batch of plain greedy rows takes argmax of the model's own logits (bfloat16 to float32 is exact):
        # Qwen2.5-1.5B's 32 x 151,936 logits cost 2.3 ms a step against 4.7 converted first. Anything else
        # works in float32 (_processed converts where it changes a logit).
        if logprob_rows or grammar_rows or any(p.temperature > 0 and p.top_k != 1 for p in params):
            logits = logits.float()
        # vLLM's default (raw_logprobs): the model's own distribution, before a grammar's mask,
        # min_tokens, penalties, temperature and filters.
        raw_logprobs = logits[logprob_rows].log_softmax(dim=-1) if logprob_rows else None
        # Structured outputs: each grammar's bitmask first, so that everything after it (and
        # greedy argmax) chooses among the tokens the grammar allows. Nothing for other batches.
        if grammar_rows:
            logits = self._grammar_masker.masked(logits, seqs, grammar_rows)
        logits, narrowed_rows = self._processed(logits, seqs)
        if grammar_rows:  # a grammar at a dead end masked every token (engine_proc/grammar/matcher.py)
            narrowed_rows += [i for i in grammar_rows if seqs[i].req.grammar.finish is not None]
        token_ids = self._choose(logits, seqs)
        if narrowed_rows:
            end_rows_without_a_token(logits, token_ids, seqs, narrowed_rows, self.eos_token_ids)
        if any(s.req.params.thinking is not None for s in seqs):  # a thinking budget spent: its end marker
            token_ids = force_thinking_ends(token_ids, seqs)
        if grammar_rows:
            self._grammar_masker.accept(token_ids.tolist(), seqs, grammar_rows)
        if raw_logprobs is None:
            return SamplerOutput(token_ids.tolist())
        nums_top = [params[i].logprobs for i in logprob_rows]
        logprobs: list[TokenLogprobs | None] = [None] * len(seqs)
        for row, lp in zip(logprob_rows, gather_logprobs(raw_logprobs, token_ids[logprob_rows], nums_top)):
            logprobs[row] = lp
        return SamplerOutput(token_ids.tolist(), logprobs)

    def _choose(self, logits: torch.Tensor, seqs: list[ScheduledSeq]) -> torch.Tensor:
        """Token ids [len(seqs)]: argmax for greedy rows (temperature 0, or top_k 1), the race for the rest.

        top_k 1 is greedy outright: the race would keep every token tied at the top, and in
        bfloat16 logits ties are common, so it could pick another than argmax's first."""
        params = [s.req.params for s in seqs]
        sampled_rows = [i for i, p in enumerate(params) if p.temperature > 0 and p.top_k != 1]
        if not sampled_rows:
            return logits.max(dim=-1).indices  # the first maximum, as argmax; several times faster on CPU
        if len(sampled_rows) == len(seqs):
            return self._sample_rows(logits, seqs)
        tokens = self._sample_rows(logits[sampled_rows], [seqs[i] for i in sampled_rows])
        greedy_rows = [i for i, p in enumerate(params) if p.temperature <= 0 or p.top_k == 1]
        out = torch.empty(len(seqs), dtype=torch.long, device=logits.device)
        out[greedy_rows] = logits[greedy_rows].max(dim=-1).indices
        out[sampled_rows] = tokens
        return out

    def _processed(self, logits: torch.Tensor, seqs: list[ScheduledSeq]) -> tuple[torch.Tensor, list[int]]:
        """logit_bias, min_tokens' held-back ids, then penalties; on a copy, only when a row needs them. With the
        rows that bad_words or allowed_token_ids narrowed, which may have no token left.

        Per row a constant number of attribute reads and at most one torch op per feature: the
        client-sized parts (stop ids, logit_bias, the prompt) are tensors made once (SamplePrep).
        """
        vocab_size = logits.shape[1]
        preps = [prepared(s.req, self.eos_token_ids, vocab_size, self.device) for s in seqs]
        held_rows = self._held_rows(seqs, preps)
        penalised_rows = [i for i, s in enumerate(seqs) if uses_penalties(s.req.params)]
        bias_rows = biased_rows(preps)
        bad_word_rows = [i for i, prep in enumerate(preps) if prep.bad_words is not None]
        allowed_rows = [i for i, prep in enumerate(preps) if prep.allowed_ids is not None]
        if not held_rows and not penalised_rows and not bias_rows and not bad_word_rows and not allowed_rows:
            return logits, []
        # the caller's logits stay as they were; float32 for the arithmetic below
        logits = logits.clone() if logits.dtype == torch.float32 else logits.float()
        if bias_rows:
            add_logit_bias(logits, bias_rows, preps)
        if bad_word_rows:
            ban_bad_words(logits, bad_word_rows, seqs, preps)
        for i in allowed_rows:  # allowed_token_ids: every other token -inf
            allowed = preps[i].allowed_ids
            kept = logits[i, allowed]
            logits[i].fill_(float("-inf")).index_copy_(0, allowed, kept)
        for i in held_rows:
            held = preps[i].held_ids
            if held.dtype == torch.bool:  # dense: a whole-vocabulary mask
                logits[i].masked_fill_(held, float("-inf"))
            else:
                logits[i].index_fill_(0, held, float("-inf"))
        if penalised_rows:
            reqs = [seqs[i].req for i in penalised_rows]
            logits[penalised_rows] = penalize(logits[penalised_rows], reqs)
        return logits, sorted({*bad_word_rows, *allowed_rows})

    @staticmethod
    def _held_rows(seqs: list[ScheduledSeq], preps: list[SamplePrep]) -> list[int]:
        """Rows before their min_tokens: their stop ids (and eos) may not be sampled yet."""
        rows = []
        for i, (s, prep) in enumerate(zip(seqs, preps)):
            # A grammar decides where its request may end (its mask allows eos only there).
            if prep.held_ids is not None and len(s.req.output_ids) < s.req.params.min_tokens and s.req.grammar is None:
                rows.append(i)
        return rows

    def _sample_rows(self, logits: torch.Tensor, seqs: list[ScheduledSeq]) -> torch.Tensor:
        """Sample rows whose temperature is > 0: logits [len(seqs), V]."""
        params = [s.req.params for s in seqs]
        device = logits.device
        temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
        top_k = top_p = min_p = None
        if any(p.top_k > 0 for p in params):
            top_k = torch.tensor([p.top_k for p in params], dtype=torch.long, device=device)
        if any(p.top_p < 1.0 for p in params):
            top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
        if any(p.min_p > 0.0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device)
        noise = self._exp_noise(seqs, logits.shape[1])
        return self._sample_tokens(logits, temperature, top_k, top_p, min_p, noise)

    def _exp_noise(self, seqs: list[ScheduledSeq], vocab_size: int) -> torch.Tensor:
        noise = torch.empty(len(seqs), vocab_size, dtype=torch.float32, device=self.device)
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
            fresh = torch.empty(len(unseeded_rows), vocab_size, device=self.device)
            noise[unseeded_rows] = fresh.exponential_(generator=self._shared_generator)
        # exponential_ can return 0 in float32; 0 / 0 would be a NaN that argmax picks.
        return noise.clamp_(min=torch.finfo(torch.float32).tiny)


def _triton_sample_tokens():
    from rill.engine_proc.sample.triton import sample_tokens_triton  # needs triton's driver

    return sample_tokens_triton
