"""When a request ends, decided after each token it samples (Scheduler.update)."""
from __future__ import annotations

from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import FinishReason


def finish_after(req: EngineRequest, token_id: int, *, eos_token_ids: frozenset[int], max_model_len: int,
                 cache_len: int, last: bool = True) -> FinishReason | None:
    """Why `req` ends now that it sampled `token_id` (already in its output_ids), or None. `last`: the step's
    last token kept (its grammar has taken them all: a token that ends it is the last, drafts being none)."""
    params = req.params
    # A complete grammar ends the request (its bitmask then allows only a stop token, which
    # min_tokens or ignore_eos would otherwise turn into text outside the grammar).
    if last and req.grammar is not None and req.grammar.finish is not None:
        return req.grammar.finish
    if req.no_token_left:
        return FinishReason.STOP
    num_output_ids = len(req.output_ids)
    if num_output_ids >= params.min_tokens and (
        (token_id in eos_token_ids and not params.ignore_eos) or token_id in req.stop_id_set
    ):
        return FinishReason.STOP
    num_tokens = req.num_tokens
    if num_output_ids >= params.max_tokens or num_tokens >= max_model_len:
        return FinishReason.LENGTH
    # The next step computes position num_tokens - 1: if the whole cache cannot hold that, the
    # request could only be preempted forever. The engine should advertise min(max_model_len,
    # cache tokens) so that clients meet LENGTH before this.
    if num_tokens > cache_len:
        return FinishReason.ERROR
    return None


def append_outputs(req: EngineRequest, token_ids: list[int], **limits) -> tuple[list[int], FinishReason | None]:
    """Appends the step's tokens to req's output up to the first that ends it (a step with drafts
    may keep several): those appended, and why it ends (None: it goes on)."""
    for num_new, token_id in enumerate(token_ids, 1):
        req.output_ids.append(token_id)
        if (finish := finish_after(req, token_id, last=num_new == len(token_ids), **limits)) is not None:
            return token_ids[:num_new], finish
    return token_ids, None
