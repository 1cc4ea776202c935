"""A Qwen2.5-VL directory's image processor is capped at MAX_GRID_PIXELS (its own config allows 12.8M pixels: 16K
tokens an image); a smaller setting is kept."""
from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models

from rill.asgi.prompt.vision import MAX_GRID_PIXELS, ImagePrompts
from tests.helpers.tiny_vision import image

QWEN_PROCESSOR = {"min_pixels": 3136, "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
                  "image_mean": [0.48, 0.46, 0.41], "image_std": [0.27, 0.26, 0.28],
                  "image_processor_type": "Qwen2VLImageProcessor"}


@pytest.mark.parametrize("max_pixels,tokens", [(12845056, 1280), (112 * 112, 16)])
def test_qwen_images_are_scaled_to_the_cap(tmp_path, max_pixels, tokens):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**QWEN_PROCESSOR, "max_pixels": max_pixels}))
    tokenizer = Tokenizer(models.WordLevel({"<|image_pad|>": 0, "[UNK]": 1}, unk_token="[UNK]"))
    prompts = ImagePrompts(tmp_path, 8, tokenizer)
    grid = prompts.image_processor([image(1, width=4000, height=3000)], return_tensors="np")["image_grid_thw"][0]
    assert grid.prod() // 4 <= tokens and grid.prod() * 14 * 14 <= min(max_pixels, MAX_GRID_PIXELS)
    assert grid.prod() // 4 > tokens // 2  # scaled to the cap, not far below it
