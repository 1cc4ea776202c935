"""Images on the paged transformers route (engine_proc/model/hf_vision.py), a tiny random LLaVA: through the real
scheduler, every sampled row's logits are transformers' own forward over the whole sequence with its images,
with the images' tokens split over prompt chunks and mixed with other requests' decodes, after a prefix-cache hit
that ends inside an image, and after preemption."""
from __future__ import annotations

import queue

import numpy as np
import pytest
import torch

from rill.engine_proc.core import EngineCore
from rill.engine_proc.model.hf_paged import PagedTransformersRunner
from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.request import EngineRequest
from rill.engine_proc.sched.scheduler import Scheduler
from rill.ipc.images import image_inputs
from rill.ipc.protocol import FinishReason, SamplingParams
from tests.helpers.runners import make_runner
from tests.helpers.tiny_vision import TOKENS_PER_IMAGE, image, save_tiny_llava

BLOCK_SIZE = 8
NEW_TOKENS = 6
TEXTS = {  # name: (prompt text, image seeds)
    "two": ("A picture <image> and another <image> compared:", (1, 2)),
    "one": ("Describe <image> briefly.", (3,)),
    "text": ("No image in this prompt at all, only words.", ()),
    "two-again": ("A picture <image> and another <image> compared: and more", (1, 2)),  # shares "two"'s prefix
}


@pytest.fixture(scope="module")
def llava(tmp_path_factory):
    from transformers import AutoProcessor

    model_dir = tmp_path_factory.mktemp("llava")
    hf = save_tiny_llava(model_dir)
    processor = AutoProcessor.from_pretrained(model_dir)
    prompts = {}
    for name, (text, seeds) in TEXTS.items():
        images = [image(seed) for seed in seeds] or None
        out = processor(text=[text], images=images, return_tensors="np")
        pixels = out.get("pixel_values")
        prompts[name] = (out["input_ids"][0].tolist(), pixels)
    runner = make_runner(model_dir, runner_class=PagedTransformersRunner, num_kv_blocks=64, block_size=BLOCK_SIZE,
                         eos_token_ids=[2])
    return hf, runner, prompts


def run(llava, arrivals: dict[str, int], *, num_blocks: int = 64, budget: int = 2048, caching: bool = False):
    hf, runner, prompts = llava
    mismatches = []
    compute_logits = type(runner).compute_logits

    def checked(batch, *args, **kwargs):
        logits = compute_logits(runner, batch, *args, **kwargs)
        with torch.inference_mode():
            for row, seq in zip(logits, batch.sampled_seqs):
                ids = seq.req.token_ids(0, seq.start_pos + seq.num_new_tokens)
                pixels = prompts[seq.req.req_id][1]
                expected = hf(input_ids=torch.tensor([ids]),
                              pixel_values=None if pixels is None else torch.from_numpy(pixels)).logits[0, -1]
                if not torch.allclose(row, expected, atol=1e-4, rtol=1e-4):
                    mismatches.append(f"{seq.req.req_id} at {len(ids)}: {(row - expected).abs().max():.3g}")
        return logits

    scheduler = Scheduler(BlockManager(num_blocks, BLOCK_SIZE, enable_prefix_caching=caching), max_num_seqs=8,
                          max_num_batched_tokens=budget, max_model_len=256, eos_token_ids=[2])
    core = EngineCore(scheduler, runner, queue.SimpleQueue(), lambda out: None)
    reqs = {}
    for name in arrivals:
        ids, pixels = prompts[name]
        token_id = hf.config.image_token_id
        images = None if pixels is None else image_inputs({"pixel_values": pixels}, token_id)
        # as the API worker salts it: the same text with other images is never a prefix hit
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, min_tokens=NEW_TOKENS, images=images,
                                cache_salt=images.digest if images else b"")
        reqs[name] = EngineRequest(name, "w", ids, params)
    runner.compute_logits = checked
    try:
        for step in range(500):
            for name, arrival in arrivals.items():
                if arrival == step:
                    scheduler.add(reqs[name])
            if step > max(arrivals.values()) and not scheduler.has_work:
                break
            if batch := scheduler.schedule():
                core.step(batch)
    finally:
        del runner.compute_logits
    assert mismatches == []
    assert [r.finish for r in reqs.values()] == [FinishReason.LENGTH] * len(reqs)
    return reqs


def test_prompts_hold_their_images_tokens(llava):
    _, _, prompts = llava
    image_id = llava[0].config.image_token_id
    assert [prompts[name][0].count(image_id) for name in TEXTS] == [2 * TOKENS_PER_IMAGE, TOKENS_PER_IMAGE, 0,
                                                                   2 * TOKENS_PER_IMAGE]


def test_batched_requests_with_images_match_transformers(llava):
    reqs = run(llava, {"two": 0, "one": 0, "text": 0})
    # the images matter: the same text with no image features (each image token's own embedding) differs
    hf, _, prompts = llava
    ids = prompts["one"][0]
    with torch.inference_mode():
        blind = hf.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        seen = hf.generate(torch.tensor([ids]), pixel_values=torch.from_numpy(prompts["one"][1]),
                           max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    assert reqs["one"].output_ids == seen[0, len(ids):].tolist() != blind[0, len(ids):].tolist()


def test_image_tokens_split_over_chunks_match_transformers(llava):
    # 5 tokens a step: every image's 16 tokens in four chunks, beside other requests' decodes
    run(llava, {"two": 0, "one": 1, "text": 3}, budget=5)


def test_prefix_hit_ending_inside_an_image_matches_transformers(llava):
    reqs = run(llava, {"two": 0, "two-again": 8}, caching=True, budget=24)
    cached = reqs["two-again"].num_cached_tokens
    ids = llava[2]["two"][0]
    image_positions = np.flatnonzero(np.asarray(ids) == llava[0].config.image_token_id)
    assert cached > image_positions[0] and cached % BLOCK_SIZE == 0


def test_preempted_request_recomputes_its_images(llava):
    reqs = run(llava, {"two": 0, "one": 0, "text": 0}, num_blocks=12, caching=True)
    assert sum(r.num_preemptions for r in reqs.values()) > 0
