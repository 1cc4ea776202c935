"""Which engine gets a request, when several serve one model (--data-parallel-size).

Prefix affinity first: each API worker remembers which engine it sent each prompt's full KV
blocks to (the engines' own chained block hash, engine_proc/sched/prefix_cache.py), and a
request goes to the engine that holds its longest prefix, unless that engine is overloaded.
Otherwise it goes to the least-loaded engine, scored as vLLM scores its data-parallel engines:
waiting * 4 + running. Each engine reports its queue with every step's outputs to this worker;
requests this worker sent since count as waiting. Ties go round the engines in turn, so that
requests which each finish before the next arrives (an idle server, or a worker whose reports
are stale) still spread.
"""
from __future__ import annotations

from collections import OrderedDict

from rill.ipc.cache_salt import salted_root
from rill.ipc.protocol import EngineStats

ROOT_HASH = 0
MAX_BLOCKS_REMEMBERED = 200_000  # about 12 MiB of hashes per worker


def block_hashes(prompt: list[int], block_size: int, cache_salt: bytes = b"") -> list[int]:
    """The chained hashes of a prompt's full blocks, as the engine's prefix cache computes them: from the
    salted root when the request has a cache salt, so one tenant's prompt never follows another's."""
    hashes = []
    parent = salted_root(ROOT_HASH, cache_salt) if cache_salt else ROOT_HASH
    for start in range(0, len(prompt) - block_size + 1, block_size):
        parent = hash((parent, tuple(prompt[start : start + block_size])))
        hashes.append(parent)
    return hashes


class EngineChooser:
    def __init__(self, num_engines: int, block_size: int, max_blocks: int = MAX_BLOCKS_REMEMBERED) -> None:
        self.num_engines = num_engines
        self.block_size = block_size
        self.max_blocks = max_blocks
        self.queues = [(0, 0)] * num_engines  # (running, waiting) as each engine last reported
        self.sent = [0] * num_engines  # requests sent to each since its last report
        self.turn = 0  # the engine first in line among equally loaded ones
        self._owner: OrderedDict[int, int] = OrderedDict()  # block hash -> engine, least recent first

    def score(self, rank: int) -> int:
        running, waiting = self.queues[rank]
        return 4 * (waiting + self.sent[rank]) + running

    def overloaded(self, rank: int, least: int) -> bool:
        """Too busy to be worth its cached prefix: over twice the least-loaded engine's score, plus two
        waiting requests' worth."""
        return self.score(rank) > 2 * self.score(least) + 8

    def choose(self, prompt: list[int], cache_salt: bytes = b"") -> int:
        if self.num_engines == 1:
            return 0
        hashes = block_hashes(prompt, self.block_size, cache_salt)
        holder = None
        for block_hash in hashes:
            rank = self._owner.get(block_hash)
            if rank is None:
                break
            holder = rank
        n = self.num_engines
        least = min(range(n), key=lambda r: (self.score(r), (r - self.turn) % n))
        if holder is not None and not self.overloaded(holder, least):
            rank = holder
        else:
            rank = least
            self.turn = (least + 1) % n
        owner = self._owner
        for block_hash in hashes:
            owner[block_hash] = rank
            owner.move_to_end(block_hash)
        while len(owner) > self.max_blocks:
            owner.popitem(last=False)
        self.sent[rank] += 1
        return rank

    def reported(self, rank: int, running: int, waiting: int) -> None:
        if rank < self.num_engines:
            self.queues[rank] = (running, waiting)
            self.sent[rank] = 0


def total_stats(per_engine: list[EngineStats]) -> EngineStats:
    """The engines' figures summed (the peak RSS too: the memory they hold together)."""
    if len(per_engine) == 1:
        return per_engine[0]
    fields = {name: sum(getattr(s, name) for s in per_engine) for name in EngineStats.__struct_fields__
              if name not in ("spec_accepted_per_pos", "lora_modules", "by_priority")}
    fields["lora_modules"] = per_engine[0].lora_modules
    fields["spec_accepted_per_pos"] = [sum(c) for c in zip(*(s.spec_accepted_per_pos for s in per_engine))]
    fields["data_parallel_rank"] = 0
    by_priority: dict[str, list[int]] = {}
    for s in per_engine:
        for key, (running, waiting) in s.by_priority.items():
            pair = by_priority.setdefault(key, [0, 0])
            pair[0] += running
            pair[1] += waiting
    fields["by_priority"] = by_priority
    return EngineStats(**fields)
