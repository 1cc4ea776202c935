"""The data-parallel engine chooser: prefix affinity, least load, and turns among equals."""
from __future__ import annotations

from rill.asgi.engine_link.dp_router import EngineChooser

BLOCK = 4


def test_an_idle_pair_takes_requests_in_turn_even_when_each_finishes_first():
    chooser = EngineChooser(2, BLOCK)
    ranks = []
    for _ in range(4):
        rank = chooser.choose([1, 2])
        ranks.append(rank)
        chooser.reported(rank, 0, 0)  # finished before the next one arrived
    assert ranks == [0, 1, 0, 1]


def test_the_least_loaded_engine_wins_over_the_turn():
    chooser = EngineChooser(3, BLOCK)
    chooser.reported(0, 2, 0)
    chooser.reported(1, 0, 1)
    assert chooser.choose([1]) == 2
    assert chooser.choose([1]) == 0  # 2 now has one sent (4); 0 runs two (2), 1 waits one (4)


def test_a_shared_prefix_goes_back_to_its_holder_until_it_is_overloaded():
    chooser = EngineChooser(2, BLOCK)
    prompt = list(range(3 * BLOCK))
    first = chooser.choose(prompt + [99])
    assert chooser.choose(prompt + [98]) == first  # affinity beats the turn
    chooser.reported(first, 0, 5)  # 20 > 2 * 0 + 8
    assert chooser.choose(prompt + [97]) == 1 - first
