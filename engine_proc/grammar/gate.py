"""Gives each structured request its grammar: at once from the cache, or once its compile ends."""
from __future__ import annotations

from collections import defaultdict

from rill.engine_proc.grammar.compiler import GrammarCompiled, GrammarCompiler, GrammarKey
from rill.engine_proc.grammar.matcher import RequestGrammar
from rill.engine_proc.sched.batch import TokenDelta
from rill.engine_proc.sched.request import EngineRequest, RequestState
from rill.engine_proc.sched.scheduler import Scheduler
from rill.ipc.grammar_spec import GrammarError, spec_key
from rill.ipc.protocol import FinishReason


class GrammarGate:
    """Runs on the busy loop's thread, between steps; compiling happens on the compiler's thread.

    `admit(req)` before the scheduler's `add(req)`: attaches the grammar if it is compiled, else
    marks the request WAITING_FOR_GRAMMAR, so that it waits in the scheduler without holding up
    others. `compiled(event)` when the compiler reports: the requests that waited for that spec
    may be scheduled, or, if it failed, end with ERROR (the engine goes on).
    """

    def __init__(self, compiler: GrammarCompiler) -> None:
        self.compiler = compiler
        self._waiting: dict[GrammarKey, list[EngineRequest]] = defaultdict(list)

    def admit(self, req: EngineRequest) -> TokenDelta | None:
        """None if the request may go to the scheduler; its ERROR delta if its spec failed to compile."""
        spec = req.params.structured
        result = self.compiler.lookup(spec)
        if result is None:
            req.state = RequestState.WAITING_FOR_GRAMMAR
            self._waiting[spec_key(spec)].append(req)
            return None
        if isinstance(result, GrammarError):
            req.state = RequestState.FINISHED
            req.finish = FinishReason.ERROR
            return TokenDelta(req, [], FinishReason.ERROR)
        req.grammar = RequestGrammar(result, spec.start_ids)
        return None

    def compiled(self, event: GrammarCompiled, scheduler: Scheduler) -> list[TokenDelta]:
        """Releases the requests waiting for this spec; the ERROR deltas of those whose compile failed."""
        reqs = [r for r in self._waiting.pop(event.key, []) if r.state is RequestState.WAITING_FOR_GRAMMAR]
        if not reqs:  # all aborted or timed out meanwhile
            return []
        result = self.compiler.lookup(reqs[0].params.structured)
        if result is None:  # evicted from the cache before we got here: compiling again
            self._waiting[event.key].extend(reqs)
            return []
        deltas = []
        for req in reqs:
            if isinstance(result, GrammarError):
                scheduler.abort(req.req_id)
                req.finish = FinishReason.ERROR
                deltas.append(TokenDelta(req, [], FinishReason.ERROR))
            else:
                req.grammar = RequestGrammar(result, req.params.structured.start_ids)
                scheduler.grammar_ready(req)
        return deltas

    @property
    def num_waiting(self) -> int:
        return sum(len(reqs) for reqs in self._waiting.values())
