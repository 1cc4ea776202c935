"""A Qwen2.5-VL directory's image processor is capped at DEFAULT_MAX_PIXELS (its own config allows 12.8M pixels: 16K
tokens an image), a Qwen3-VL's at as many tokens; a smaller setting is kept; --mm-processor-kwargs' budget wins over
both."""
from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models

from rill.asgi.prompt.vision import ImagePrompts
from rill.ipc.images import DEFAULT_MAX_IMAGE_TOKENS, DEFAULT_MAX_PIXELS
from tests.helpers.tiny_vision import image

QWEN_PROCESSOR = {"min_pixels": 3136, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
                  "image_mean": [0.48, 0.46, 0.41], "image_std": [0.27, 0.26, 0.28],
                  "image_processor_type": "Qwen2VLImageProcessor"}


def grid_of(model_dir, max_pixels, budget=None, width=4000, height=3000, model_type="qwen2_5_vl", patch_size=14):
    """The merged grid [t, h, w] of one photo, through the ImagePrompts of a Qwen2.5-VL (or `model_type`) directory
    whose own max_pixels is `max_pixels`, with --mm-processor-kwargs' `budget`."""
    (model_dir / "config.json").write_text(json.dumps({"model_type": model_type}))
    (model_dir / "preprocessor_config.json").write_text(json.dumps({**QWEN_PROCESSOR, "max_pixels": max_pixels,
                                                                     "patch_size": patch_size}))
    tokenizer = Tokenizer(models.WordLevel({"<|image_pad|>": 0, "[UNK]": 1}, unk_token="[UNK]"))
    prompts = ImagePrompts(model_dir, 8, tokenizer, budget)
    return prompts.image_processor([image(1, width=width, height=height)], return_tensors="np")["image_grid_thw"][0]


@pytest.mark.parametrize("max_pixels,tokens", [(12845056, 1280), (112 * 112, 16)])
def test_qwen_images_are_scaled_to_the_cap(tmp_path, max_pixels, tokens):
    grid = grid_of(tmp_path, max_pixels)
    assert grid.prod() // 4 <= tokens and grid.prod() * 14 * 14 <= min(max_pixels, DEFAULT_MAX_PIXELS)
    assert grid.prod() // 4 > tokens // 2  # scaled to the cap, not far below it


def test_qwen3_vl_images_are_scaled_to_as_many_tokens():
    """Qwen3-VL's patches are 16 pixels a side (merged 2 x 2: 32): its cap is DEFAULT_MAX_IMAGE_TOKENS tokens too,
    more pixels than Qwen2's."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        grid = grid_of(Path(tmp), 16777216, model_type="qwen3_vl", patch_size=16)
    assert DEFAULT_MAX_IMAGE_TOKENS // 2 < grid.prod() // 4 <= DEFAULT_MAX_IMAGE_TOKENS
    assert grid.prod() * 16 * 16 > DEFAULT_MAX_PIXELS  # more pixels than Qwen2's cap at as many tokens


@pytest.mark.parametrize("budget,tokens", [({"max_pixels": 2560 * 28 * 28}, 2560), ({"max_pixels": 224 * 224}, 64)])
def test_the_operators_max_pixels_wins_over_the_cap_and_the_directory(tmp_path, budget, tokens):
    grid = grid_of(tmp_path, 12845056, budget)
    assert tokens // 2 < grid.prod() // 4 <= tokens


def test_the_operators_min_pixels_scales_a_small_image_up(tmp_path):
    assert grid_of(tmp_path, 12845056, width=56, height=56).prod() // 4 == 4  # Qwen's own min_pixels: 56 x 56
    assert grid_of(tmp_path, 12845056, {"min_pixels": 112 * 112}, width=56, height=56).prod() // 4 == 16


def test_smolvlm2s_tokens_a_tile_are_its_processors_or_its_configs(tmp_path):
    """SmolVLM2's processor (which needs num2words) is not loaded: its image_seq_len, else the config's rule."""
    from rill.asgi.prompt.vision import tile_tokens

    config = {"model_type": "smolvlm", "scale_factor": 3, "vision_config": {"image_size": 384, "patch_size": 14}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert tile_tokens(tmp_path) == 81  # SmolVLM2-2.2B's: (384 / 14 = 27)^2 / 3^2
    (tmp_path / "processor_config.json").write_text(json.dumps({"image_seq_len": 64}))
    assert tile_tokens(tmp_path) == 64
