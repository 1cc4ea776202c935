"""Images on the paged transformers route (engine_proc/model/hf_vision.py), a tiny random LLaVA, Qwen2-VL,
Qwen2.5-VL (3-D rotary positions) and Gemma 3 (image tokens that attend both ways): through the real scheduler,
every sampled row's logits are transformers' own forward over the whole sequence with its images, with the images'
tokens split over prompt chunks (Gemma 3's never: chunks cut short before them) and mixed with other requests'
decodes, after a prefix-cache hit that ends inside an image, after preemption, and (Qwen) in compiled decode steps,
whose positions run behind the tokens' index."""
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
from rill.engine_proc.sched.window_tables import window_tables_of
from rill.ipc.images import BIDIRECTIONAL_MODEL_TYPES, image_inputs
from rill.ipc.protocol import FinishReason, SamplingParams
from tests.helpers.runners import make_runner
from tests.helpers.tiny_vision import PLACEHOLDER, ROUTE_KINDS, forward_kwargs, image, save_tiny_vlm, vlm_prompt

BLOCK_SIZE = 8
NEW_TOKENS = 6
PREEMPTING = {"gemma3": (17, NEW_TOKENS), "idefics3": (15, 14), "smolvlm": (15, 14)}  # (blocks, new tokens); the others' (12, 6)
MODEL_DIRS = {}  # kind: its tiny model's directory, as the llava fixture saved it
TEXTS = {  # name: (prompt text, image seeds); {} an image's placeholder
    "two": ("A picture {} and another {} compared:", (1, 2)),
    "one": ("Describe {} briefly.", (3,)),
    "text": ("No image in this prompt at all, only words.", ()),
    "two-again": ("A picture {} and another {} compared: and more", (1, 2)),  # shares "two"'s prefix
}


@pytest.fixture(scope="module", params=ROUTE_KINDS)
def llava(request, tmp_path_factory):
    """(transformers' model, the runner, {name: (prompt ids, the images' arrays)}) of a family."""
    kind = request.param
    model_dir = tmp_path_factory.mktemp(kind)
    hf = save_tiny_vlm(kind, model_dir)
    prompts = {}
    for name, (text, seeds) in TEXTS.items():
        prompts[name] = vlm_prompt(kind, model_dir, text.format(*[PLACEHOLDER[kind]] * len(seeds)),
                                   [image(seed, width=40 + 8 * seed) for seed in seeds])
    runner = make_runner(model_dir, runner_class=PagedTransformersRunner, num_kv_blocks=64, block_size=BLOCK_SIZE,
                         eos_token_ids=[2])
    MODEL_DIRS[kind] = model_dir
    return hf, runner, prompts


def run(llava, arrivals: dict[str, int], *, num_blocks: int = 64, budget: int = 2048, caching: bool = False,
        new_tokens: int = NEW_TOKENS, speculator=None):
    hf, runner, prompts = llava
    mismatches = []
    compute_logits = type(runner).compute_logits

    def checked(batch, *args, **kwargs):
        logits = compute_logits(runner, batch, *args, **kwargs)
        rows = iter(logits)
        with torch.inference_mode():
            for seq in batch.sampled_seqs:
                before = seq.req.token_ids(0, seq.start_pos + seq.num_new_tokens - len(seq.draft_ids))
                for j in range(seq.num_logits_rows):  # the last token's row, then one after each draft
                    row, ids = next(rows), before + seq.draft_ids[:j]
                    kwargs = forward_kwargs(hf, ids, prompts[seq.req.req_id][1])
                    expected = hf(input_ids=torch.tensor([ids]), **kwargs).logits[0, -1]
                    if not torch.allclose(row, expected, atol=1e-4, rtol=1e-4):
                        mismatches.append(f"{seq.req.req_id} at {len(ids)}: {(row - expected).abs().max():.3g}")
        return logits

    # Gemma 3's sliding layer: window tables of its own, as in the engine (main.py)
    blocks = BlockManager(num_blocks, BLOCK_SIZE, enable_prefix_caching=caching, window=window_tables_of(runner))
    scheduler = Scheduler(blocks, max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=256, eos_token_ids=[2],
                          speculator=speculator)
    core = EngineCore(scheduler, runner, queue.SimpleQueue(), lambda out: None)
    reqs = {}
    for name in arrivals:
        ids, arrays = prompts[name]
        bidirectional = hf.config.model_type in BIDIRECTIONAL_MODEL_TYPES
        images = image_inputs(arrays, hf.config.image_token_id, bidirectional) if arrays else None
        # as the API worker salts it: the same text with other images is never a prefix hit
        params = SamplingParams(max_tokens=new_tokens, temperature=0.0, min_tokens=new_tokens, images=images,
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


def test_prompts_hold_one_image_token_per_feature_row(llava):
    hf, _, prompts = llava
    for name in TEXTS:
        ids, arrays = prompts[name]
        rows = 0
        if arrays:
            features = hf.get_image_features(**{k: torch.from_numpy(v) for k, v in arrays.items()})
            rows = sum(f.shape[0] for f in getattr(features, "pooler_output", features))
        assert ids.count(hf.config.image_token_id) == rows > 0 or not arrays


def test_the_api_workers_prompts_are_the_processors(llava):
    """asgi/prompt/vision.py, the API worker's side, for every family (those not served end to end too): the prompt
    ids and image tensors it sends from images as a client sends them (PNG data URLs) are what the family's processor
    makes of the pixels, and they say what the engine reads: the image token, and whether it attends both ways."""
    import asyncio

    from tokenizers import Tokenizer

    from rill.asgi.prompt.vision import ImagePrompts
    from rill.ipc.images import arrays_of
    from tests.helpers.tiny_vision import data_url

    hf, _, prompts = llava
    kind = _kind(llava)
    worker = ImagePrompts(MODEL_DIRS[kind], 8, Tokenizer.from_file(str(MODEL_DIRS[kind] / "tokenizer.json")))
    text, seeds = TEXTS["two"]
    urls = [(data_url(image(seed, width=40 + 8 * seed)), f"messages[0].content[{seed}]") for seed in seeds]
    ids, images = asyncio.run(worker.encode(text.format(*[PLACEHOLDER[kind]] * len(seeds)), urls, True))
    expected_ids, expected_arrays = prompts["two"]
    assert ids == expected_ids
    arrays = arrays_of(images)
    assert set(expected_arrays) <= set(arrays)
    assert all(np.array_equal(arrays[name], array) for name, array in expected_arrays.items())
    assert (images.token_id, images.bidirectional) == (hf.config.image_token_id, _bidirectional(llava))


def test_batched_requests_with_images_match_transformers(llava):
    reqs = run(llava, {"two": 0, "one": 0, "text": 0})
    # the images matter: transformers' answer with other pixels differs
    hf, _, prompts = llava
    ids, arrays = prompts["one"]
    negated = {**arrays, "pixel_values": -arrays["pixel_values"]}  # another image of the same size
    with torch.inference_mode():
        seen, other = (hf.generate(torch.tensor([ids]), **forward_kwargs(hf, ids, a),
                                   max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
                       for a in (arrays, negated))
    assert reqs["one"].output_ids == seen != other


def test_drafts_after_images_match_transformers(llava):
    """Drafts (predicted outputs, jump-forward, n-grams) of requests with images: each draft's row is transformers'
    logits over the images and the drafts before it (Qwen's positions behind the index, Gemma 3's window)."""
    from rill.engine_proc.spec.speculator import Speculator

    plain = {name: r.output_ids for name, r in run(llava, {"two": 0, "text": 1}).items()}

    class Oracle:  # the model's own next tokens, the third one wrong
        def propose(self, req, max_drafts):
            ahead = plain[req.req_id][len(req.output_ids):][:max_drafts]
            return [max(token - 1, 3) if j == 2 and token != 3 else token for j, token in enumerate(ahead)]

    speculator = Speculator(Oracle(), 4)
    assert {name: r.output_ids for name, r in run(llava, {"two": 0, "text": 1}, speculator=speculator).items()} == plain
    assert 0 < speculator.stats.num_accepted_tokens < speculator.stats.num_draft_tokens, speculator.stats


def test_image_tokens_split_over_chunks_match_transformers(llava):
    # 5 tokens a step: every image's 16 tokens in four chunks, beside other requests' decodes. Gemma 3's image
    # tokens attend both ways: each image goes whole into a step of 20 tokens, the chunk before it cut short.
    run(llava, {"two": 0, "one": 1, "text": 3}, budget=20 if _bidirectional(llava) else 5)


def test_an_image_that_attends_both_ways_is_never_split(llava):
    """Gemma 3: no prompt chunk ends inside an image, whatever the budget left beside the decodes."""
    if not _bidirectional(llava):
        pytest.skip("this family's image tokens attend causally: an image may be split")
    chunks = []
    schedule = Scheduler.schedule

    def recorded(self):
        batch = schedule(self)
        chunks.extend((s.req.req_id, s.start_pos + s.num_new_tokens) for s in batch.seqs)
        return batch

    Scheduler.schedule = recorded
    try:
        reqs = run(llava, {"text": 0, "two": 1, "one": 2}, budget=19)
    finally:
        Scheduler.schedule = schedule
    ends = {name: [end for req_id, end in chunks if req_id == name] for name in reqs}
    for name in ("two", "one"):
        runs = reqs[name].image_runs
        assert runs and ends[name][0] < runs[-1][1]  # its prompt took more than one chunk
        assert not [end for end in ends[name] for first, last in runs if first < end < last]


def _bidirectional(llava) -> bool:
    return _kind(llava) in BIDIRECTIONAL_MODEL_TYPES


def _kind(llava) -> str:
    return llava[0].config.model_type


def test_prefix_hit_ending_inside_an_image_matches_transformers(llava):
    reqs = run(llava, {"two": 0, "two-again": 8}, caching=True, budget=24)
    cached = reqs["two-again"].num_cached_tokens
    ids = llava[2]["two"][0]
    image_positions = np.flatnonzero(np.asarray(ids) == llava[0].config.image_token_id)
    assert cached > image_positions[0] and cached % BLOCK_SIZE == 0


def test_a_text_prompt_holding_the_image_token_beside_images_is_that_token(llava):
    """A client's token-id prompt may hold the image token with no image (and a model may generate it): it is that
    token's embedding, as in transformers' forward without pixels, and the images of the requests beside it in the
    same steps keep theirs (Qwen3-VL's forward matches features to every image token of the step)."""
    hf, runner, prompts = llava
    text_ids = prompts["text"][0]
    stray = (text_ids[:3] + [hf.config.image_token_id] * 2 + text_ids[3:], {})
    run((hf, runner, {**prompts, "stray": stray}), {"two": 0, "stray": 0, "one": 1})


def test_preempted_request_recomputes_its_images(llava):
    # blocks too few for all three as they grow (Gemma 3's window tables besides); Idefics3's "two" fills its last
    # block with 6 new tokens, so it makes more
    blocks, new_tokens = PREEMPTING.get(_kind(llava), (12, NEW_TOKENS))
    reqs = run(llava, {"two": 0, "one": 0, "text": 0}, num_blocks=blocks, caching=True, new_tokens=new_tokens)
    assert sum(r.num_preemptions for r in reqs.values()) > 0


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl"])
def test_compiled_decode_steps_take_positions_behind_the_index(tmp_path, kind):
    """Qwen2.5-VL's and Qwen3-VL's tokens after an image sit at their index + delta (< 0): the compiled decode
    steps' positions are offset so (decode_graphs.py's rope_offset), their slots not."""
    from tests.helpers.tiny_vision import save_tiny_qwen2_5_vl, save_tiny_qwen3_vl

    hf = (save_tiny_qwen2_5_vl if kind == "qwen2_5_vl" else save_tiny_qwen3_vl)(tmp_path, hidden_size=256)
    prompts = {name: vlm_prompt(kind, tmp_path, text.format(*[PLACEHOLDER[kind]] * len(seeds)),
                                [image(seed, width=40 + 8 * seed) for seed in seeds])
               for name, (text, seeds) in TEXTS.items()}
    runner = make_runner(tmp_path, runner_class=PagedTransformersRunner, num_kv_blocks=64, block_size=BLOCK_SIZE,
                         eos_token_ids=[2], compile_decode=True, max_num_seqs=8)
    assert runner.decode_graphs is not None and runner.decode_graphs.rope_offset is not None
    ran = []
    graphs_run = type(runner.decode_graphs).run

    def counted(graphs, batch):
        ran.append([s.req.req_id for s in batch.seqs])
        return graphs_run(graphs, batch)

    runner.decode_graphs.run = counted.__get__(runner.decode_graphs)
    run((hf, runner, prompts), {"two": 0, "one": 0, "text": 0})
    assert any("two" in ids for ids in ran)
