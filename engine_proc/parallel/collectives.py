"""The two collectives of a tensor-parallel forward, as opaque torch ops.

torch.distributed's (gloo on the CPU, NCCL on a GPU), wrapped as custom ops so the compiled decode
graph (engine_proc/model/decode_graphs.py) calls them as it calls the attention op: one extern call
each, with a fake for tracing. The group is the process's default one, set up by
engine_proc/parallel/group.py; a model with tensor-parallel size 1 never calls them. When every rank
is on one node, the all-reduce goes through shared memory (engine_proc/parallel/shm_all_reduce.py).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

_shm_all_reduce = None  # this process's ShmAllReduce, when every rank is on this node


def use_shm_all_reduce(shm) -> None:
    global _shm_all_reduce
    _shm_all_reduce = shm


@torch.library.custom_op("rill::tp_all_reduce", mutates_args=())
def tp_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """The sum of every rank's `x` (a row-parallel layer's partial outputs), on every rank."""
    if _shm_all_reduce is not None and _shm_all_reduce.fits(x):
        return _shm_all_reduce.all_reduce(x)
    out = x.clone()
    dist.all_reduce(out)
    return out


@tp_all_reduce.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("rill::tp_gather_vocab", mutates_args=())
def tp_gather_vocab(x: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Every rank's logits slice [T, vocab_per_rank] side by side, cut to [T, vocab_size]."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=-1)[:, :vocab_size].contiguous()


@tp_gather_vocab.register_fake
def _(x, vocab_size):
    return x.new_empty(x.shape[0], vocab_size)
