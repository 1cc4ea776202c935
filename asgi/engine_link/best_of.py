"""OpenAI's legacy `best_of` (completions): `best_of` candidates a prompt, sampled as `n` choices are, of which the
`n` with the highest mean logprob per token are answered, best first. Never streamed (OpenAI's rule): the choice is
made once every candidate is whole."""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from rill.asgi.engine_link.generate import KEEPALIVE, ChoiceDelta, Generation, Usage
from rill.ipc.logprobs import TokenLogprobs


def merged(parts: list[ChoiceDelta]) -> ChoiceDelta:
    """A choice's deltas as one."""
    logprobs = [d.logprobs for d in parts if d.logprobs is not None]
    ids = [d.token_ids for d in parts if d.token_ids is not None]
    return ChoiceDelta(parts[0].index if parts else 0, "".join(d.text for d in parts),
                       next((d.finish_reason for d in reversed(parts) if d.finish_reason), None),
                       TokenLogprobs.concat(logprobs) if logprobs else None,
                       next((d.prompt_logprobs for d in parts if d.prompt_logprobs is not None), None),
                       [t for chunk in ids for t in chunk] if ids else None)


def mean_logprob(choice: ChoiceDelta) -> float:
    lp = choice.logprobs
    if lp is None or lp.num_tokens == 0:
        return float("-inf")
    return float(lp.logprobs[:, 0].sum()) / lp.num_tokens


class BestOfGeneration:
    """Wraps the Generation of `best_of` candidates a prompt (which asks each token's logprob); answers as a
    Generation of `n` choices a prompt. Quacks as a Generation for asgi/output/respond.py."""

    def __init__(self, candidates: Generation, n: int, keep_logprobs: bool):
        """`keep_logprobs`: the request asked for logprobs (else the ones read to choose are dropped)."""
        self.candidates = candidates
        self.n = n
        self.keep_logprobs = keep_logprobs
        self.ctx = candidates.ctx
        self.request_id = candidates.request_id
        self.num_choices = len(candidates.prompts) * n

    @property
    def disconnected(self) -> bool:
        return self.candidates.disconnected

    @property
    def mailbox(self):  # nvext's timings read the engine's
        return self.candidates.mailbox

    async def start(self) -> None:
        await self.candidates.start()

    def on_disconnect(self) -> None:
        self.candidates.on_disconnect()

    async def deltas(self, keepalive_due_in: Callable[[], float] | None = None) -> AsyncIterator:
        best_of = self.candidates.n
        parts: list[list[ChoiceDelta]] = [[] for _ in range(self.candidates.num_choices)]
        async for item in self.candidates.deltas(keepalive_due_in):
            if item is KEEPALIVE:
                yield item
                continue
            for delta in item:
                parts[delta.index].append(delta)
        if self.disconnected:
            return
        out = []
        for prompt in range(len(self.candidates.prompts)):
            group = [merged(parts[i]) for i in range(prompt * best_of, (prompt + 1) * best_of)]
            group.sort(key=mean_logprob, reverse=True)  # stable: among equals, the earlier candidate
            for j, choice in enumerate(group[: self.n]):
                choice.index = prompt * self.n + j
                if not self.keep_logprobs:
                    choice.logprobs = None
                out.append(choice)
        yield out

    def usage(self) -> Usage:
        """Every candidate's tokens, as OpenAI counts (and bills) `best_of`."""
        return self.candidates.usage()

    def record(self, failed: bool = False) -> None:
        self.candidates.record(failed)
