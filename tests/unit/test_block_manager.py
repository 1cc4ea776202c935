"""The KV block manager: allocate/free, free-stack reuse, reference counts, block edges."""
from __future__ import annotations

import pytest

from rill.engine_proc.sched.block_manager import NULL_BLOCK_ID, BlockManager
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams


def make_req(req_id: str = "r") -> EngineRequest:
    return EngineRequest(req_id, "w0", [1, 2, 3], SamplingParams(max_tokens=4))


def test_fresh_manager_reserves_the_null_block() -> None:
    bm = BlockManager(num_blocks=5, block_size=4)
    assert bm.num_total_blocks() == 4
    assert bm.num_free_blocks() == 4
    req = make_req()
    bm.allocate(req, 16)
    assert NULL_BLOCK_ID not in req.block_ids
    assert sorted(req.block_ids) == [1, 2, 3, 4]
    assert bm.num_free_blocks() == 0


def test_allocate_covers_positions_and_grows_incrementally() -> None:
    bm = BlockManager(num_blocks=9, block_size=4)
    req = make_req()
    bm.allocate(req, 5)
    assert req.block_ids == [1, 2]  # ascending on a fresh cache
    bm.allocate(req, 8)  # still inside the second block
    assert req.block_ids == [1, 2]
    bm.allocate(req, 9)
    assert req.block_ids == [1, 2, 3]
    bm.allocate(req, 3)  # already covered: no-op
    assert req.block_ids == [1, 2, 3]
    assert bm.num_free_blocks() == 5


@pytest.mark.parametrize(
    ("num_held_blocks", "num_tokens", "expected"),
    [
        (0, 0, 0),
        (0, 1, 1),
        (0, 4, 1),
        (0, 5, 2),
        (1, 4, 0),
        (1, 5, 1),
        (2, 8, 0),
        (2, 9, 1),
        (2, 3, 0),  # holds more than needed: never negative
        (0, 17, 5),
    ],
)
def test_num_blocks_needed_at_block_edges(num_held_blocks: int, num_tokens: int, expected: int) -> None:
    bm = BlockManager(num_blocks=20, block_size=4)
    req = make_req()
    bm.allocate(req, num_held_blocks * 4)
    assert len(req.block_ids) == num_held_blocks
    assert bm.num_blocks_needed(req, num_tokens) == expected


def test_num_blocks_for() -> None:
    bm = BlockManager(num_blocks=3, block_size=16)
    assert [bm.num_blocks_for(n) for n in (0, 1, 16, 17, 32, 33)] == [0, 1, 1, 2, 2, 3]


def test_can_allocate_boundaries() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)  # 3 usable
    assert bm.can_allocate(0)
    assert bm.can_allocate(3)
    assert not bm.can_allocate(4)
    req = make_req()
    bm.allocate(req, 3)  # 2 blocks
    assert bm.can_allocate(1)
    assert not bm.can_allocate(2)
    bm.allocate(req, 6)
    assert bm.can_allocate(0)
    assert not bm.can_allocate(1)


def test_allocate_beyond_free_asserts() -> None:
    bm = BlockManager(num_blocks=3, block_size=2)
    with pytest.raises(AssertionError):
        bm.allocate(make_req(), 5)


def test_free_returns_blocks_and_clears_the_request() -> None:
    bm = BlockManager(num_blocks=6, block_size=4)
    a, b = make_req("a"), make_req("b")
    bm.allocate(a, 8)
    bm.allocate(b, 4)
    assert bm.num_free_blocks() == 2
    bm.free(a)
    assert a.block_ids == []
    assert bm.num_free_blocks() == 4
    bm.free(b)
    assert bm.num_free_blocks() == 5
    assert all(count == 0 for count in bm.ref_counts[1:])
    bm.free(a)  # nothing held: harmless
    assert bm.num_free_blocks() == 5


def test_freed_blocks_are_reused_first() -> None:
    bm = BlockManager(num_blocks=10, block_size=4)
    a, b, c = make_req("a"), make_req("b"), make_req("c")
    bm.allocate(a, 8)
    bm.allocate(b, 4)
    freed = list(a.block_ids)
    bm.free(a)
    bm.allocate(c, 8)
    assert sorted(c.block_ids) == sorted(freed)
    assert not set(c.block_ids) & set(b.block_ids)


def test_ref_counts_free_a_shared_block_only_when_the_last_holder_lets_go() -> None:
    bm = BlockManager(num_blocks=6, block_size=4)
    owner, sharer = make_req("owner"), make_req("sharer")
    bm.allocate(owner, 8)
    shared = owner.block_ids[:1]
    bm.share(sharer, shared)
    bm.allocate(sharer, 8)  # one block of its own after the shared prefix
    assert sharer.block_ids[0] == shared[0]
    assert bm.ref_counts[shared[0]] == 2
    assert bm.num_free_blocks() == 2

    bm.free(owner)
    assert bm.ref_counts[shared[0]] == 1
    assert bm.num_free_blocks() == 3  # owner's unshared block only
    bm.free(sharer)
    assert bm.ref_counts[shared[0]] == 0
    assert bm.num_free_blocks() == 5


def test_share_rejects_free_blocks() -> None:
    bm = BlockManager(num_blocks=4, block_size=4)
    with pytest.raises(AssertionError):
        bm.share(make_req(), [2])
    with pytest.raises(AssertionError):
        bm.share(make_req(), [NULL_BLOCK_ID])
