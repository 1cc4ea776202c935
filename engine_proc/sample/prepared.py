"""A request's fixed sampling inputs as tensors, built at its first sample and reused every step."""
from __future__ import annotations

import torch

from rill.engine_proc.sample.bad_words import BadWords
from rill.ipc.protocol import SamplingParams

DENSE_FRACTION = 1 / 8


class SamplePrep:
    """What the sampler would otherwise rebuild from client-sized lists on every step.

    A client may send thousands of stop ids or logit_bias entries and a prompt of max_model_len
    tokens: turned into tensors once here, each step costs one torch op per row that uses them,
    never a Python loop over their entries (docs/admission-control.md has the measured bound).

    held_ids: the ids min_tokens holds back (its stop ids, and eos unless ignore_eos), or None.
    bad_words: vLLM's bad_words indexed (engine_proc/sample/bad_words.py), or None.
    bias_ids, bias_values: logit_bias, or None. allowed_ids: allowed_token_ids (every other token -inf), or None:
    kept as ids, not a [V] mask (16,384 ids at most, where a mask of Gemma's vocabulary is 1 MiB a request).
    prompt_ids: for a repetition penalty, or None.
    Past DENSE_FRACTION of the vocabulary, held_ids is a [V] bool mask and bias_ids None with
    bias_values a [V] vector: a contiguous op instead of a scattered one (5x faster at 49,152
    entries), in no more memory than the ids and values would take.
    Ids outside the vocabulary are dropped (the API worker refuses them; this is the engine's
    own guard, so that no such id ever reaches an index op).
    """

    __slots__ = ("held_ids", "bias_ids", "bias_values", "prompt_ids", "bad_words", "allowed_ids")

    @property
    def has_bias(self) -> bool:
        return self.bias_values is not None

    def __init__(self, params: SamplingParams, prompt_ids: list[int], eos_token_ids: list[int], vocab_size: int,
                 device: torch.device) -> None:
        self.held_ids = None
        if params.min_tokens > 0:
            # With ignore_eos, eos is an ordinary token and is not held back (as in vLLM).
            held = set(params.stop_token_ids) if params.ignore_eos else {*eos_token_ids, *params.stop_token_ids}
            held = sorted(i for i in held if 0 <= i < vocab_size)
            if params.allowed_token_ids and set(params.allowed_token_ids) <= set(held):
                held = []  # only stop ids are allowed: allowed_token_ids wins, the request may end at once
            if held:
                self.held_ids = torch.tensor(held, dtype=torch.long, device=device)
                if len(held) > vocab_size * DENSE_FRACTION:
                    mask = torch.zeros(vocab_size, dtype=torch.bool, device=device)
                    self.held_ids = mask.index_fill_(0, self.held_ids, True)
        self.bias_ids = self.bias_values = None
        if params.logit_bias:
            pairs = [(i, b) for i, b in params.logit_bias.items() if 0 <= i < vocab_size]
            if pairs:
                self.bias_ids = torch.tensor([i for i, _ in pairs], dtype=torch.long, device=device)
                self.bias_values = torch.tensor([b for _, b in pairs], dtype=torch.float32, device=device)
                if len(pairs) > vocab_size * DENSE_FRACTION:
                    dense = torch.zeros(vocab_size, dtype=torch.float32, device=device)
                    self.bias_values = dense.index_add_(0, self.bias_ids, self.bias_values)
                    self.bias_ids = None
        allowed = [i for i in params.allowed_token_ids if 0 <= i < vocab_size]
        self.allowed_ids = torch.tensor(allowed, dtype=torch.long, device=device) if allowed else None
        self.bad_words = BadWords(params.bad_words_ids) if params.bad_words_ids else None
        # On the CPU, where penalize() assembles its rows before one copy to the device.
        self.prompt_ids = (torch.tensor(prompt_ids, dtype=torch.long) if params.repetition_penalty != 1.0 and prompt_ids
                           else None)


def prepared(req, eos_token_ids: list[int], vocab_size: int, device: torch.device) -> SamplePrep:
    """req's SamplePrep, built and kept on it the first time (`req.sample_prep`)."""
    prep = req.sample_prep
    if prep is None:
        prep = req.sample_prep = SamplePrep(req.params, req.prompt_ids, eos_token_ids, vocab_size, device)
    return prep
