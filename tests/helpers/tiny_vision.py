"""Tiny random vision-language models with the bundled model's tokenizer plus their image tokens, their processors
saved beside them: a LLaVA (a CLIP vision tower, a projector, a Llama), a Qwen2.5-VL (its windowed vision tower,
3-D rotary positions), a Gemma 3 (image tokens that attend both ways) and an Idefics3 (SmolVLM: images in tiles);
their prompts as the server makes them; images as a client sends them."""
from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import torch

IMAGE_SIZE = 56  # LLaVA's: 4 x 4 patches of 14, 16 image tokens an image
TOKENS_PER_IMAGE = 16
# Served end to end: one of each way of prompting (a processor, Qwen's grid, images that attend both ways). The
# model tests take every family (ROUTE_KINDS), the API worker's side too.
KINDS = ("llava", "qwen2_5_vl", "gemma3")
ROUTE_KINDS = (*KINDS, "qwen2_vl", "qwen3_vl", "qwen3_vl_moe", "idefics3", "smolvlm")
QWEN_KINDS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
PLACEHOLDER = {"llava": "<image>", "gemma3": "<start_of_image>", "idefics3": "<image>", "smolvlm": "<image>",
               **{kind: "<|vision_start|><|image_pad|><|vision_end|>" for kind in QWEN_KINDS}}
QWEN_TOKENS = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
GEMMA3_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
IDEFICS3_TOKENS = {"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
                   "global_image_token": "<global-img>"}
PROCESSOR_KINDS = ("llava", "gemma3", "idefics3")  # whose own processor expands the placeholder (the others' image processor)


def save_tiny_vlm(kind: str, path: Path):
    if kind == "qwen2_vl":
        return save_tiny_qwen2_vl(path)
    if kind == "gemma3":
        return save_tiny_gemma3(path)
    if kind in ("idefics3", "smolvlm"):
        return save_tiny_idefics3(path, smolvlm=kind == "smolvlm")
    if kind == "qwen3_vl":
        return save_tiny_qwen3_vl(path)
    if kind == "qwen3_vl_moe":
        return save_tiny_qwen3_vl_moe(path)
    return save_tiny_llava(path) if kind == "llava" else save_tiny_qwen2_5_vl(path)


def save_tiny_gemma3(path: Path):
    """Gemma 3's shape, tiny: a SigLIP vision tower of 4 x 4 patches, its 16 features an image (pooled 1 x 1), and
    a two-layer text model, one layer sliding over 24 tokens and one global, whose image tokens attend both ways
    within each image (transformers' token_type_ids mask); its processor at 56 x 56 pixels."""
    from transformers import (
        AutoTokenizer,
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3ImageProcessorPil,
        Gemma3Processor,
    )

    from rill.engine_proc.model.bundled import ensure_bundled_model

    # the tokens added by their names, which Gemma 3's processor asks for
    tokenizer = AutoTokenizer.from_pretrained(ensure_bundled_model(), extra_special_tokens=GEMMA3_TOKENS)
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in GEMMA3_TOKENS.items()}
    text = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                sliding_window=24, layer_types=["sliding_attention", "full_attention"], bos_token_id=1,
                eos_token_id=2, pad_token_id=0)
    vision = dict(model_type="siglip_vision_model", image_size=IMAGE_SIZE, patch_size=14, hidden_size=32,
                  intermediate_size=48, num_hidden_layers=2, num_attention_heads=2)
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=TOKENS_PER_IMAGE,
                          boi_token_index=ids["boi_token"], eoi_token_index=ids["eoi_token"],
                          image_token_index=ids["image_token"], tie_word_embeddings=False)
    model = _saved_wide(Gemma3ForConditionalGeneration, config, path)
    tokenizer.save_pretrained(path)
    Gemma3Processor(image_processor=Gemma3ImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}),
                    tokenizer=tokenizer, image_seq_length=TOKENS_PER_IMAGE).save_pretrained(path)
    return model


def save_tiny_qwen2_vl(path: Path):
    """Qwen2-VL's shape, tiny: Qwen2.5-VL's (save_tiny_qwen2_5_vl) but its older vision tower (global attention,
    a LayerNorm'd merger)."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2)
    return _save_tiny_qwen(Qwen2VLConfig, Qwen2VLForConditionalGeneration, vision, path, 64)


def save_tiny_qwen2_5_vl(path: Path, hidden_size: int = 64):
    """Qwen2.5-VL's shape, tiny: two vision blocks (one windowed, one global), 2 x 2 patches merged, a two-layer
    text model whose rotary sections split 16 frequencies 2 / 3 / 3 over time, rows and columns. Images are scaled
    to 12,544 pixels (112 x 112 for a square one): about 16 tokens each. `hidden_size` 256: heads of 64, which the
    CPU decode kernel (and so the compiled decode steps) takes."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    vision = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=hidden_size, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1])
    return _save_tiny_qwen(Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, vision, path, hidden_size)


def save_tiny_qwen3_vl(path: Path, hidden_size: int = 64):
    """Qwen3-VL's shape, tiny: two vision blocks over patches of 16 merged 2 x 2, the first block's features added to
    the text model's first layer's hidden states (DeepStack), interleaved 3-D rotary sections; images scaled to
    128 x 128 pixels, 16 tokens each. `hidden_size` 256: heads of 64, as save_tiny_qwen2_5_vl's."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    vision = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=hidden_size,
                  patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
                  deepstack_visual_indexes=[0])
    return _save_tiny_qwen(Qwen3VLConfig, Qwen3VLForConditionalGeneration, vision, path, hidden_size, patch=16,
                           rope={"mrope_interleaved": True}, text={"head_dim": hidden_size // 4})


def save_tiny_qwen3_vl_moe(path: Path):
    """Qwen3-VL's mixture of experts (Qwen3-VL-30B-A3B's shape, tiny): save_tiny_qwen3_vl's, each text layer's MLP 4
    experts of which 2 are routed to."""
    from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

    vision = dict(depth=2, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=64, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16, deepstack_visual_indexes=[0])
    return _save_tiny_qwen(Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration, vision, path, 64, patch=16,
                           rope={"mrope_interleaved": True},
                           text={"head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                 "decoder_sparse_step": 1})


def _save_tiny_qwen(config_class, model_class, vision: dict, path: Path, hidden_size: int, patch: int = 14,
                    rope: dict | None = None, text: dict | None = None):
    """A tiny Qwen-VL of `vision`'s tower: the bundled tokenizer with Qwen's vision tokens, a two-layer text model
    with 3-D rotary sections, its image processor at 8 x 8 patches (112 x 112 pixels at Qwen2's 14)."""
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

    from rill.engine_proc.model.bundled import ensure_bundled_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_bundled_model())
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_TOKENS})
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in QWEN_TOKENS}
    sections = [2, 3, 3] if hidden_size == 64 else [8, 12, 12]  # of head_dim / 2 frequencies
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1,
                eos_token_id=2, tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections, **(rope or {})},
                **(text or {}))
    config = config_class(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                          video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                          vision_end_token_id=ids["<|vision_end|>"])
    model = _saved_wide(model_class, config, path)
    tokenizer.save_pretrained(path)
    side = 8 * patch
    Qwen2VLImageProcessorPil(min_pixels=side * side, max_pixels=side * side, patch_size=patch, merge_size=2,
                             temporal_patch_size=2).save_pretrained(path)
    return model


def save_tiny_idefics3(path: Path, smolvlm: bool = False):
    """Idefics3's shape (SmolVLM's: the bundled model's vision sibling), tiny: a SigLIP tower of 4 x 4 patches of 14
    whose features are shuffled 2 x 2 into 4 tokens a tile, a two-layer Llama; its processor splits an image into
    tiles of 56 pixels (longest edge 112: up to 4 tiles and the whole image, each a tile of tokens). `smolvlm`:
    SmolVLM2's (model_type smolvlm), whose processor needs num2words: its image processor and processor_config.json's
    image_seq_len, as its hub directories have them."""
    from transformers import (
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
        SmolVLMConfig,
        SmolVLMForConditionalGeneration,
        SmolVLMImageProcessorPil,
    )

    from rill.engine_proc.model.bundled import ensure_bundled_model

    tokenizer = AutoTokenizer.from_pretrained(ensure_bundled_model(), extra_special_tokens=IDEFICS3_TOKENS)
    tokenizer.add_tokens([f"<row_{r}_col_{c}>" for r in (1, 2) for c in (1, 2)], special_tokens=True)  # as SmolVLM's
    text = dict(model_type="llama", vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    vision = dict(image_size=IMAGE_SIZE, patch_size=14, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=2)
    config_class, model_class = (SmolVLMConfig, SmolVLMForConditionalGeneration) if smolvlm else \
        (Idefics3Config, Idefics3ForConditionalGeneration)
    config = config_class(text_config=text, vision_config=vision, scale_factor=2, tie_word_embeddings=False,
                          image_token_id=tokenizer.convert_tokens_to_ids(IDEFICS3_TOKENS["image_token"]))
    model = _saved_wide(model_class, config, path)
    tokenizer.save_pretrained(path)
    sizes = dict(size={"longest_edge": 2 * IMAGE_SIZE}, max_image_size={"longest_edge": IMAGE_SIZE})
    if smolvlm:
        SmolVLMImageProcessorPil(**sizes).save_pretrained(path)
        (path / "processor_config.json").write_text(json.dumps({"image_seq_len": 4, "processor_class": "SmolVLMProcessor"}))
    else:
        Idefics3Processor(image_processor=Idefics3ImageProcessorPil(**sizes), tokenizer=tokenizer,
                          image_seq_len=4).save_pretrained(path)
    return model


def _saved_wide(model_class, config, path: Path):
    """The model of `config`, its weights drawn wide (seeded) so that images move the logits, saved at `path`."""
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.2)
    model.save_pretrained(path)
    return model


def vlm_prompt(kind: str, model_dir: Path, text: str, images: list) -> tuple[list[int], dict]:
    """`text` (with PLACEHOLDER[kind] for each image) as the model's prompt ids, and its images' tensors
    (transformers' forward takes them as keywords): LLaVA's processor's, or Qwen's image processor's with each
    image token repeated once per merged 2 x 2 patch."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    if kind in PROCESSOR_KINDS:
        out = AutoProcessor.from_pretrained(model_dir)(text=[text], images=images or None, return_tensors="np")
        return out["input_ids"][0].tolist(), {k: v for k, v in out.items() if k == "pixel_values"}
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if kind == "smolvlm":  # as SmolVLM's processor writes an image's tiles (its own needs num2words)
        return _smolvlm_prompt(model_dir, tokenizer, text, images)
    ids = tokenizer(text)["input_ids"]
    if not images:
        return ids, {}
    arrays = dict(AutoImageProcessor.from_pretrained(model_dir)(images, return_tensors="np"))
    counts = iter(int(np.prod(grid)) // 4 for grid in arrays["image_grid_thw"])
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    return [t for token in ids for t in ([token] * next(counts) if token == pad else [token])], arrays


def _smolvlm_prompt(model_dir: Path, tokenizer, text: str, images: list) -> tuple[list[int], dict]:
    from transformers import AutoImageProcessor
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    if not images:
        return tokenizer(text)["input_ids"], {}
    out = dict(AutoImageProcessor.from_pretrained(model_dir)([images], return_tensors="np", return_row_col_info=True))
    tiles = [get_image_prompt_string(r, c, 4, fake_token_around_image=IDEFICS3_TOKENS["fake_image_token"],
                                     image_token="<image>", global_image_token=IDEFICS3_TOKENS["global_image_token"])
             for r, c in zip(out.pop("rows")[0], out.pop("cols")[0])]
    pieces = text.split("<image>")
    text = pieces[0] + "".join(tile + piece for tile, piece in zip(tiles, pieces[1:]))
    return tokenizer(text)["input_ids"], out


def forward_kwargs(model, ids: list[int], arrays: dict) -> dict:
    """The keywords of transformers' forward (or generate) over `ids` with `arrays`: the images' tensors and the
    image tokens' types: Qwen's, without which it takes 1-D positions (or the last call's offsets); Gemma 3's,
    without which its image tokens attend causally."""
    kwargs = {k: torch.from_numpy(v) for k, v in arrays.items() if k != "num_crops"}
    types = (torch.tensor([ids]) == model.config.image_token_id).int()
    if arrays and model.config.model_type == "gemma3":
        kwargs["token_type_ids"] = types
    elif arrays and model.config.model_type in QWEN_KINDS:
        kwargs["mm_token_type_ids"] = types
    return kwargs


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
    model = _saved_wide(LlavaForConditionalGeneration, config, path)
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
