"""One request as the engine sees it: its token ids, its KV blocks, and its state."""
from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field
from typing import Any

from rill.ipc.images import image_runs
from rill.ipc.protocol import FinishReason, RequestTimings, SamplingParams


class RequestState(enum.IntEnum):
    WAITING = 0  # queued, or preempted and waiting to be recomputed
    RUNNING = 1
    FINISHED = 2
    # Queued, but its structured-output grammar is still compiling: the scheduler admits it only
    # once the engine attached the grammar (state WAITING), and meanwhile admits those behind it.
    WAITING_FOR_GRAMMAR = 3


@dataclass(eq=False)
class EngineRequest:
    req_id: str
    worker_id: str
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    # Tokens of prompt_ids + output_ids whose KV is in the cache (or scheduled into it).
    num_computed_tokens: int = 0
    # Prompt tokens found in the prefix cache at first scheduling (reported in usage).
    num_cached_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    # A model with sliding and global layers: the sliding layers' block tables, one per group (engine_proc/sched/window_tables.py).
    window_block_ids: list[int] = field(default_factory=list)
    state: RequestState = RequestState.WAITING
    finish: FinishReason | None = None
    num_preemptions: int = 0
    # With params.structured: its engine_proc.grammar.matcher.RequestGrammar once compiled. The
    # scheduler reads only its `finish` (FinishReason | None), so it stays free of xgrammar.
    grammar: Any = None
    # Engine clock (time.monotonic) stamps for the metrics, set outside the scheduler: 0 is unset.
    arrival_s: float = 0.0  # the input thread received it
    scheduled_s: float = 0.0  # first scheduled (a preemption keeps it)
    first_token_s: float = 0.0  # its first token was sampled
    # With params.prompt_logprobs: positions [0, num_prompt_scored) have scored the prompt token after
    # theirs, into `prompt_logprobs` (sent with the first token); a recompute does not score them again.
    num_prompt_scored: int = 0
    prompt_logprobs: list[Any] = field(default_factory=list)
    spec_state: Any = None  # the speculative proposer's own state (engine_proc/spec/ngram.py: NgramIndex)
    prediction: Any = None  # with params.prediction: its engine_proc/spec/prediction.py PredictionCursor
    thinking: Any = None  # with params.thinking: its engine_proc/sample/thinking.py ThinkingState
    embedding: Any = None  # params.embed: its pooled vector (a float32 numpy array), sent with its STOP delta
    # Its constraints together (allowed_token_ids, bad_words, a grammar) left no token to sample: the sampler
    # gave it a stop token instead, and it ends there (STOP).
    no_token_left: bool = False
    # Which load of its LoRA adapter it runs with (LoRAAdapter.load_id, set when the engine takes
    # it in): the prefix cache keys adapter blocks by it. 0: the base model, or no such numbering.
    lora_load_id: int = 0
    # Prepared once here, read every step: a client may send thousands of stop ids, and a set
    # keeps finish_after() O(1) per token (a list was scanned per token).
    stop_id_set: frozenset[int] = field(init=False, repr=False)
    # The sampler's tensors for it (engine_proc/sample/prepared.py), built at its first sample.
    sample_prep: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.stop_id_set = frozenset(self.params.stop_token_ids)

    @property
    def lora(self) -> str:
        """The LoRA adapter it runs with, by name ("": the base model; engine_proc/lora/)."""
        return self.params.lora

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def max_cached_blocks(self, block_size: int) -> int:
        """How many leading blocks the prefix cache may supply: never the last token's block (its
        logits are sampled), nor positions whose prompt logprobs are still to be computed."""
        limit = (self.num_tokens - 1) // block_size
        if self.params.prompt_logprobs is not None:
            limit = min(limit, self.num_prompt_scored // block_size)
        return limit

    @functools.cached_property
    def image_runs(self) -> list[tuple[int, int]]:
        """[start, end) of each of its images' tokens in the prompt, where they attend both ways (Gemma 3); else []."""
        images = self.params.images
        return image_runs(self.prompt_ids, images.token_id) if images is not None and images.bidirectional else []

    def chunk_end(self, start: int, budget: int) -> int:
        """Where a step's chunk from `start` ends with `budget` tokens: at its last token or the budget's end, but
        never inside an image whose tokens attend both ways, each seeing the whole image: that chunk ends where the
        image starts, and is empty (ends at `start`) if the image starts at or before it."""
        end = min(self.num_tokens, start + budget)
        for first, last in self.image_runs:
            if first < end < last:
                return max(first, start)
        return end

    def token_ids(self, start: int, end: int) -> list[int]:
        """Token ids [start, end) of prompt + output, without building the whole list."""
        num_prompt = len(self.prompt_ids)
        if end <= num_prompt:
            return self.prompt_ids[start:end]
        if start >= num_prompt:
            return self.output_ids[start - num_prompt : end - num_prompt]
        return self.prompt_ids[start:] + self.output_ids[: end - num_prompt]

    def timings(self, now_s: float) -> RequestTimings | None:
        """Queue, prefill and decode time of a request ending now; None if it never made a token."""
        if not self.first_token_s:
            return None
        return RequestTimings(self.scheduled_s - self.arrival_s, self.first_token_s - self.scheduled_s,
                              now_s - self.first_token_s)
