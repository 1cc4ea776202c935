"""Prefix-cache tests' small pieces: the block size, requests of given ids, runs of ids, the blocks a row wrote."""
from __future__ import annotations

from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams

BS = 4  # tokens per block in the pure tests



def make_req(req_id: str, prompt_ids: list[int], max_tokens: int = 4) -> EngineRequest:
    return EngineRequest(req_id, "w0", list(prompt_ids), SamplingParams(max_tokens=max_tokens, ignore_eos=True))



def ids(start: int, num: int) -> list[int]:
    return list(range(start, start + num))



def written_block_ids(seq, block_size: int) -> list[int]:
    """The blocks a scheduled seq writes its new tokens' K/V into."""
    end_pos = seq.start_pos + seq.num_new_tokens
    return seq.req.block_ids[seq.start_pos // block_size : -(-end_pos // block_size)]
