"""The shared-memory all-reduce with three real processes: every call's sum, in order, the same bits
on every rank, with calls of changing sizes and dtypes back to back (the alternating slots and
per-pair semaphores are what keep a fast rank from overwriting a slow one's inputs)."""
from __future__ import annotations

import multiprocessing as mp

import torch

from rill.engine_proc.parallel.shm_all_reduce import ShmAllReduce

CALLS = 300


def _inputs(rank: int, call: int) -> torch.Tensor:
    dtype = torch.float32 if call % 3 else torch.bfloat16
    g = torch.Generator().manual_seed(call * 10 + rank)
    return torch.randn(1 + call % 7, 5, generator=g).to(dtype)


def _rank(shm: ShmAllReduce, rank: int, results) -> None:
    shm.attach(rank)
    outs = [shm.all_reduce(_inputs(rank, call)) for call in range(CALLS)]
    results.put((rank, [o.float().tolist() for o in outs]))  # by value: a tensor would go as a file descriptor


def test_three_ranks_sum_every_call_alike():
    ctx = mp.get_context("spawn")
    shm = ShmAllReduce(3, ctx, slot_bytes=4096)
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(shm, r, results)) for r in range(3)]
    for p in procs:
        p.start()
    try:
        got = dict(results.get(timeout=60) for _ in procs)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        shm.unlink()
    for call in range(CALLS):
        parts = [_inputs(r, call) for r in range(3)]
        expected = parts[0].clone()
        for part in parts[1:]:
            expected += part
        for rank in range(3):
            assert got[rank][call] == expected.float().tolist(), (rank, call)


def test_too_big_for_a_slot_is_left_to_gloo():
    shm = ShmAllReduce(2, mp.get_context("spawn"), slot_bytes=64)
    try:
        shm.attach(0)
        assert shm.fits(torch.zeros(16)) and not shm.fits(torch.zeros(17))
    finally:
        shm.unlink()
