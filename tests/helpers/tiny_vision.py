"""A tiny random LLaVA (a CLIP vision tower, a projector, a Llama) with the bundled model's tokenizer plus an
`<image>` token, its processor saved beside it; and images as a client sends them (data URLs)."""
from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import torch

IMAGE_SIZE = 56  # 4 x 4 patches of 14: 16 image tokens an image
TOKENS_PER_IMAGE = 16


def save_tiny_llava(path: Path):
    """The model, its weights drawn wide so that images move the logits, saved at `path`; returned (eval)."""
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessorPil,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    from rill.engine_proc.model.bundled import ensure_bundled_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_bundled_model())
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1,
                       eos_token_id=2, pad_token_id=None, tie_word_embeddings=False)
    vision = CLIPVisionConfig(image_size=IMAGE_SIZE, patch_size=14, hidden_size=32, intermediate_size=48,
                              num_hidden_layers=2, num_attention_heads=2, projection_dim=32)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
                         projector_hidden_act="gelu", vision_feature_layer=-1, vision_feature_select_strategy="default")
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.2)
    model.save_pretrained(path)
    size = {"shortest_edge": IMAGE_SIZE}
    processor = LlavaProcessor(image_processor=CLIPImageProcessorPil(size=size, crop_size={"height": IMAGE_SIZE,
                                                                                           "width": IMAGE_SIZE}),
                               tokenizer=tokenizer, patch_size=14, vision_feature_select_strategy="default",
                               num_additional_image_tokens=1)
    processor.save_pretrained(path)
    return model


def image(seed: int, width: int = 40, height: int = 30):
    """A PIL image of seeded noise."""
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype("uint8")
    return Image.fromarray(pixels)


def data_url(img, fmt: str = "PNG") -> str:
    buffer = io.BytesIO()
    img.save(buffer, format=fmt)
    return f"data:image/{fmt.lower()};base64,{base64.b64encode(buffer.getvalue()).decode()}"
