"""Images whose tokens attend both ways (Gemma 3) go into one step whole: a prompt chunk stops where such an image
starts (engine_proc/sched/request.py chunk_end), waits for a step with room for it, and never takes others in
behind it; an image larger than a whole step errors out at once, and nothing else waits for it."""
from __future__ import annotations

import numpy as np
import pytest

from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.images import image_inputs, image_runs
from rill.ipc.protocol import FinishReason, SamplingParams
from tests.helpers.scheduling import PagedFakeModel, make_req, make_scheduler, run_until_done, shape, step

IMAGE = 7  # the image token's id


def image_req(req_id: str, layout: str, bidirectional: bool = True, max_tokens: int = 4) -> EngineRequest:
    """A request whose prompt is `layout`: "t" a text token, "i" an image token (a run of them: one image)."""
    ids = [IMAGE if c == "i" else 20 + n % 30 for n, c in enumerate(layout)]
    images = image_inputs({"pixel_values": np.zeros((1, 3), np.float32)}, IMAGE, bidirectional)
    return EngineRequest(req_id, "w0", ids, SamplingParams(max_tokens=max_tokens, images=images))


def test_image_runs_are_the_runs_of_image_tokens():
    assert image_runs([1, 7, 7, 2, 7, 3, 7, 7, 7], 7) == [(1, 3), (4, 5), (6, 9)]
    assert image_runs([7, 7], 7) == [(0, 2)] and image_runs([1, 2], 7) == [] and image_runs([], 7) == []


@pytest.mark.parametrize("start,budget,end", [
    (0, 100, 14),  # all of it
    (0, 5, 3),  # would end inside the first image: ends where it starts
    (0, 3, 3), (0, 8, 8),  # ends just before it, or just after it: as asked
    (3, 4, 3),  # starts at the image, too little room: empty
    (5, 4, 9),  # starts inside it (a prefix-cache hit), the rest fits
    (5, 2, 5),  # starts inside it, the rest does not fit: empty
    (8, 3, 10),  # ends inside the second image: where it starts
])
def test_a_chunk_never_ends_inside_an_image(start, budget, end):
    req = image_req("r", "ttt" + "iiiii" + "tt" + "iii" + "t")
    assert req.image_runs == [(3, 8), (10, 13)]
    assert req.chunk_end(start, budget) == end


def test_causal_images_and_text_chunk_as_before():
    req = image_req("r", "ttt" + "iiiii" + "tt", bidirectional=False)
    assert req.image_runs == [] and req.chunk_end(0, 5) == 5
    assert make_req("t", 10).chunk_end(0, 4) == 4


def test_a_chunk_cut_short_takes_no_one_in_behind_it():
    sched = make_scheduler(max_num_batched_tokens=6)
    sched.add(image_req("a", "tt" + "iiiii" + "t"))
    sched.add(make_req("b", 3))
    batch, _ = step(sched)
    assert shape(batch) == [("a", 0, 2)]  # 4 tokens left over, not given to "b"
    batch, _ = step(sched)
    assert shape(batch) == [("a", 2, 6)]  # the image whole, and the prompt's last token


def test_an_image_waits_for_a_step_with_room_beside_the_decodes():
    sched = make_scheduler(max_num_batched_tokens=6)
    for name in ("x", "y"):
        sched.add(make_req(name, 2, max_tokens=3))
    step(sched)  # both prompts
    sched.add(image_req("a", "t" + "iiiii"))
    batch, _ = step(sched)
    assert shape(batch) == [("x", 2, 1), ("y", 2, 1), ("a", 0, 1)]  # its image would not fit beside them
    batch, _ = step(sched)
    assert shape(batch) == [("x", 3, 1), ("y", 3, 1)]  # still not: it waits, and no one is let in
    batch, _ = step(sched)  # the decodes ended
    assert shape(batch) == [("a", 1, 5)]


def test_an_image_larger_than_a_step_errors_at_once_and_no_one_waits_for_it():
    sched = make_scheduler(max_num_batched_tokens=4)
    sched.add(image_req("big", "t" + "iiiii"))
    sched.add(make_req("b", 3))
    model = PagedFakeModel(4, sched.block_manager)
    _, deltas = step(sched, model=model)
    assert [(d.req.req_id, d.finish) for d in deltas if d.finish] == [("big", FinishReason.ERROR)]
    _, finishes = run_until_done(sched, model)
    assert finishes == {"b": FinishReason.LENGTH}


def test_a_random_workload_with_images_keeps_every_invariant():
    rng = np.random.default_rng(0)
    sched = make_scheduler(num_blocks=40, max_num_batched_tokens=9, max_num_seqs=4)
    model = PagedFakeModel(4, sched.block_manager)
    reqs = [image_req(f"r{n}", "t".join(rng.choice(["t", "iiii", "iiiiiiii"], size=rng.integers(1, 6))),
                      max_tokens=int(rng.integers(1, 6))) for n in range(20)]
    for req in reqs:
        sched.add(req)
    chunks = []
    schedule = sched.schedule

    def recorded():
        batch = schedule()
        chunks.extend((s.req, s.start_pos + s.num_new_tokens) for s in batch.seqs)
        return batch

    sched.schedule = recorded
    streamed, finishes = run_until_done(sched, model)
    assert set(finishes.values()) == {FinishReason.LENGTH} and len(finishes) == len(reqs)
    assert not [(req.req_id, end) for req, end in chunks for first, last in req.image_runs if first < end < last]
