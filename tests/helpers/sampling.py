"""Scheduled rows for sampler tests: a request with some tokens generated and the given sampling params."""
from __future__ import annotations

from rill.engine_proc.sched.batch import ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams

EOS_ID = 2



def make_seq(num_generated: int = 0, **params) -> ScheduledSeq:
    """A request about to sample its next token after `num_generated` outputs."""
    params.setdefault("max_tokens", 1000)
    req = EngineRequest("r", "w", prompt_ids=[5, 6, 7], params=SamplingParams(**params))
    req.output_ids = [9] * num_generated
    req.num_computed_tokens = req.num_tokens - 1
    return ScheduledSeq(req, start_pos=req.num_tokens - 1, num_new_tokens=1)
