"""The generic fallback: any transformers causal LM, one cache per request, correct and slower."""
from __future__ import annotations

import inspect
import logging
import weakref
from dataclasses import dataclass

import torch

from rill.engine_proc.attention.kv_layout import bytes_per_block
from rill.engine_proc.model.hf_paged import load_hf_model
from rill.engine_proc.model.loader import LOAD_FORMATS, transformers_config
from rill.engine_proc.model.runner_api import RunnerInfo
from rill.engine_proc.model.sampling_runner import SamplingRunner
from rill.engine_proc.sample.sampler import Sampler
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest, RequestState
from rill.ipc.config import ModelConfig

log = logging.getLogger("rill.model")


@dataclass(frozen=True)
class KVBudget:
    """Stands in for the paged KVCache: the bytes the scheduler's blocks let request caches hold.

    Nothing is allocated up front: each request's transformers cache grows as it runs, and the
    scheduler's block accounting (still run, with the configured number of blocks) bounds the
    tokens held across requests. Allocating the paged cache too would double the memory for
    tensors this runner never reads.
    """

    num_blocks: int
    block_size: int
    num_bytes: int


@dataclass(eq=False)
class _RequestCache:
    past_key_values: object  # what the model returned: a transformers Cache of its own kind
    num_tokens: int  # tokens [0, num_tokens) of the request are in it


class TransformersRunner(SamplingRunner):
    """Runs each scheduled seq through transformers' own model on top of that request's cache.

    The `Runner` protocol (engine_proc/model/runner_api.py): `execute` (SamplingRunner's) = `compute_logits`
    then sampling.
    Sequences run one at a time (batch size 1, no padding), which is what makes this slower.
    """

    info = RunnerInfo("transformers")

    def __init__(
        self,
        model: ModelConfig,
        *,
        dtype: torch.dtype,
        device: torch.device | str,
        num_kv_blocks: int,
        eos_token_ids: list[int],
    ) -> None:
        # --batch-invariant holds already: each seq runs alone, whatever else is batched.
        model_dir, block_size, load_format, quantization = (model.model_dir, model.block_size, model.load_format,
                                                            model.quantization)
        if load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format {load_format!r}: expected one of {LOAD_FORMATS}")
        if quantization != "none":
            raise ValueError(f"--quantization {quantization} is implemented for the native model only, "
                             "not the transformers runner (--model-impl transformers or an architecture "
                             "without a native implementation); use --quantization none")
        self.config = transformers_config(model_dir)
        self.dtype = dtype
        self.device = torch.device(device)
        self.block_size = block_size
        text_config = self.config.get_text_config()
        self.vocab_size: int = text_config.vocab_size
        # A model without learned or rotary limits is bounded only by what the cache holds.
        self.max_model_len: int = (
            getattr(text_config, "max_position_embeddings", None) or num_kv_blocks * block_size
        )
        self.model = load_hf_model(model_dir, self.config, dtype, self.device, load_format, attn_implementation=None)
        # The LM head on the last token only, where the model's forward allows it.
        accepts_logits_to_keep = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self._forward_kwargs = {"logits_to_keep": 1} if accepts_logits_to_keep else {}
        self.kv_cache = KVBudget(
            num_blocks=num_kv_blocks,
            block_size=block_size,
            num_bytes=num_kv_blocks * bytes_per_block(text_config, dtype, block_size),
        )
        self.sampler = Sampler(eos_token_ids, model.seed)
        # Keyed by the request object, weakly: a request's cache goes when the request does.
        self._caches: weakref.WeakKeyDictionary[EngineRequest, _RequestCache] = weakref.WeakKeyDictionary()

    @property
    def num_request_caches(self) -> int:
        return len(self._caches)

    @torch.inference_mode()
    def compute_logits(self, batch: Batch, eager: bool = False, hidden_only: bool = False) -> torch.Tensor:
        """Logits [len(batch.sampled_seqs), vocab] of each sampled seq's last token (fills its cache),
        then the prompt-scoring rows, in the order of step_inputs.logits_rows. No embeddings here."""
        assert not hidden_only, "the transformers runner does not embed (refused at start)"
        self._drop_idle_caches(batch)
        rows = []
        scored: dict[int, torch.Tensor] = {}
        scoring = bool(batch.scoring_seqs)
        for seq in batch.seqs:
            logits = self._run_seq(seq, all_rows=scoring and bool(seq.prompt_scored))
            if logits.dim() == 2:  # every new token's row: this seq scores prompt tokens
                scored[id(seq)] = logits[[pos - seq.start_pos for pos in seq.prompt_scored]]
                logits = logits[-1]
            if seq.needs_sample:
                rows.append(logits)
        rows += [scored[id(seq)] for seq in batch.scoring_seqs] if scoring else []
        if not rows:
            return torch.empty(0, self.vocab_size, dtype=self.dtype, device=self.device)
        return torch.cat([r.view(-1, r.shape[-1]) for r in rows])

    def _run_seq(self, seq: ScheduledSeq, all_rows: bool = False) -> torch.Tensor:
        """Runs the seq's new tokens on top of its request's cache; the last token's logits [vocab]
        (`all_rows`: every new token's, [num_new_tokens, vocab])."""
        req = seq.req
        end_pos = seq.start_pos + seq.num_new_tokens
        cache = self._caches.get(req)
        # Robust by construction: whatever the cache holds that is not [0, start_pos) (a
        # request restarted by preemption, a prefix-cache hit that skipped tokens) is put
        # right here. A request's tokens only ever grow, so a shorter cache is a valid prefix
        # and is extended; a longer one is rebuilt from position 0.
        from_pos = cache.num_tokens if cache is not None and cache.num_tokens <= seq.start_pos else 0
        if from_pos != seq.start_pos:
            log.debug("request %s: cache holds %d tokens, step starts at %d; recomputing from %d",
                      req.req_id, 0 if cache is None else cache.num_tokens, seq.start_pos, from_pos)
        past_key_values = cache.past_key_values if from_pos > 0 else None
        input_ids = torch.tensor([req.token_ids(from_pos, end_pos)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, past_key_values=past_key_values, use_cache=True,
                         **({} if all_rows else self._forward_kwargs))
        self._caches[req] = _RequestCache(out.past_key_values, end_pos)
        return out.logits[0, seq.start_pos - end_pos :] if all_rows else out.logits[0, -1]

    def _drop_idle_caches(self, batch: Batch) -> None:
        """Frees the caches of requests that finished or were preempted (the scheduler freed
        their blocks): so the memory held stays within what its block accounting allows."""
        in_batch = {id(seq.req) for seq in batch.seqs}
        for req in list(self._caches.keys()):
            if req.state is not RequestState.RUNNING and id(req) not in in_batch:
                del self._caches[req]
