"""A vision model's images in a chat prompt: each image part rendered as the family's placeholder, then expanded
into the image's tokens, and the tensors the engine's vision tower takes (ipc/images.py). LLaVA's and Gemma 3's own
processors (transformers' AutoProcessor) expand their `<image>` and `<start_of_image>`; Qwen2-VL's processor needs
torchvision for its videos, so its image processor alone makes the pixels (Qwen2.5-VL's) and each `<|image_pad|>`
becomes as many as the image's grid of patches, merged 2 x 2, has cells (the processor's rule). Both run on a
thread, off the event loop. Loaded once per worker."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from rill.asgi.errors import APIError
from rill.asgi.prompt.images import decode_image_url
from rill.ipc.images import (
    BIDIRECTIONAL_MODEL_TYPES,
    DEFAULT_MAX_IMAGE_TOKENS,
    MROPE_MODEL_TYPES,
    VISION_MODEL_TYPES,
    ImageInputs,
    image_inputs,
)

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
TEXT_OUTPUTS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")  # the rest go to the engine
# The families whose image processor alone is used: an image part's text, and the token it expands.
GRID_FAMILIES = {name: ("<|vision_start|><|image_pad|><|vision_end|>", "<|image_pad|>") for name in MROPE_MODEL_TYPES}


# SmolVLM2: its image processor alone tiles an image (the processor's own needs num2words, and torchvision for videos),
# and each `<image>` is written out as its processor writes it, with these tokens (its tokenizer's).
TILE_FAMILIES = ("smolvlm",)
TILE_TOKENS = {"image": "<image>", "around": "<fake_token_around_image>", "global": "<global-img>"}


def tile_tokens(model_dir: Path) -> int:
    """SmolVLM's tokens a tile: its processor's image_seq_len, else its config's (patches a side / scale_factor)^2."""
    processor = model_dir / "processor_config.json"
    if processor.exists() and (count := json.loads(processor.read_text()).get("image_seq_len")):
        return int(count)
    config = json.loads((model_dir / "config.json").read_text())
    vision = config.get("vision_config") or {}
    side = vision.get("image_size", 512) // vision.get("patch_size", 16)
    return int(side * side / config.get("scale_factor", 4) ** 2)


def model_type_of(model_dir: Path) -> str | None:
    try:
        return json.loads((model_dir / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None


def accepts_images(model_dir: Path) -> bool:
    """A family whose images are served (ipc/images.py), with its processor's files beside it."""
    return (model_type_of(model_dir) in VISION_MODEL_TYPES
            and any((model_dir / name).exists() for name in PROCESSOR_FILES))


def whole_image_tokens(model_dir: Path) -> int:
    """The tokens of one image of a served family whose image tokens attend both ways (Gemma 3's 256), which one
    engine step must hold (engine_proc/sched/request.py chunk_end); 0 for any other model."""
    if model_type_of(model_dir) not in BIDIRECTIONAL_MODEL_TYPES or not accepts_images(model_dir):
        return 0
    return int(json.loads((model_dir / "config.json").read_text()).get("mm_tokens_per_image") or 256)


class ImagePrompts:
    def __init__(self, model_dir: Path, max_images: int, tokenizer: Tokenizer,
                 pixel_budget: dict[str, int] | None = None) -> None:
        """`pixel_budget`: --mm-processor-kwargs' min_pixels and max_pixels, for a Qwen family (the launcher checked)."""
        from transformers import AutoImageProcessor, AutoProcessor

        self.max_images, self.tokenizer = max_images, tokenizer
        model_type = model_type_of(model_dir)
        self.bidirectional = model_type in BIDIRECTIONAL_MODEL_TYPES
        family = GRID_FAMILIES.get(model_type)
        self.tile_tokens = 0  # SmolVLM2's tokens a tile (TILE_FAMILIES)
        if model_type in TILE_FAMILIES:  # its processor needs num2words and torchvision, for its videos
            self.processor = None
            self.image_processor = AutoImageProcessor.from_pretrained(model_dir, local_files_only=True)
            self.placeholder = self.image_token = TILE_TOKENS["image"]
            self.tile_tokens = tile_tokens(model_dir)
        elif family is None:
            self.processor = AutoProcessor.from_pretrained(model_dir, local_files_only=True)
            self.placeholder = self.processor.image_token  # LLaVA's "<image>", Gemma 3's "<start_of_image>"
            # The token each feature row takes: LLaVA's placeholder itself; Gemma 3's processor writes its image's
            # soft tokens between the placeholder and "<end_of_image>".
            self.image_token = getattr(self.processor.tokenizer, "image_token", None) or self.placeholder
            self.image_processor = None
        else:
            self.processor = None
            self.image_processor = AutoImageProcessor.from_pretrained(model_dir, local_files_only=True)
            # The directory's own budget unless the operator set one, at most DEFAULT_MAX_IMAGE_TOKENS an image
            # (Qwen2-VL's and Qwen2.5-VL's DEFAULT_MAX_PIXELS)
            budget = dict(pixel_budget or {})
            side = self.image_processor.patch_size * getattr(self.image_processor, "merge_size", 2)
            most = DEFAULT_MAX_IMAGE_TOKENS * side * side
            if "max_pixels" not in budget and (self.image_processor.size.longest_edge or 0) > most:
                budget["max_pixels"] = most
            if budget:
                self.image_processor = AutoImageProcessor.from_pretrained(model_dir, local_files_only=True, **budget)
            self.placeholder, self.image_token = family
        self.token_id: int = tokenizer.token_to_id(self.image_token)

    async def encode(self, text: str, urls: list[tuple[str, str]], add_special_tokens: bool,
                     ) -> tuple[list[int], ImageInputs]:
        """The prompt's ids, each image's placeholder expanded, and its images' tensors. `urls`: (url, its param)."""
        if len(urls) > self.max_images:
            raise APIError(400, f"{len(urls)} images in one request; this server takes at most {self.max_images} "
                                "(--limit-mm-per-prompt).", param=urls[self.max_images][1])
        for token in dict.fromkeys((self.placeholder, self.image_token)):  # one written into a text part
            if found := text.count(token) - (len(urls) if token in self.placeholder else 0):
                raise APIError(400, f"The messages' text holds the image token {token!r} {found} time(s) itself; "
                                    "only an image_url part may.", param="messages")
        return await asyncio.to_thread(self._encode, text, urls, add_special_tokens)

    def _encode(self, text: str, urls: list[tuple[str, str]], add_special_tokens: bool):
        images = [decode_image_url(url, param) for url, param in urls]
        try:
            if self.processor is not None:
                out = self.processor(text=[text], images=images, return_tensors="np",
                                     add_special_tokens=add_special_tokens)
                ids = out["input_ids"][0].tolist()
            elif self.tile_tokens:  # one prompt's images
                out = self.image_processor([images], return_tensors="np", return_row_col_info=True)
                ids = self._expand_tiles(text, out.pop("rows")[0], out.pop("cols")[0], add_special_tokens)
            else:
                out = self.image_processor(images, return_tensors="np")
                ids = self._expand_grid(text, out["image_grid_thw"], add_special_tokens)
        except ValueError as exc:  # what the model's processor refuses of these images (a size it cannot tile)
            raise APIError(400, f"The model's processor refused the images: {exc}", param="messages") from None
        arrays = {name: np.asarray(value) for name, value in out.items() if name not in TEXT_OUTPUTS}
        return ids, image_inputs(arrays, self.token_id, self.bidirectional)

    def _expand_tiles(self, text: str, rows: list[int], cols: list[int], add_special_tokens: bool) -> list[int]:
        """The text's ids, its k-th `<image>` written out as SmolVLM's processor writes image k's tiles: each tile's
        `<row_i_col_j>` and tokens, then the whole image's (transformers' own get_image_prompt_string)."""
        from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

        pieces = text.split(TILE_TOKENS["image"])
        tiles = [get_image_prompt_string(r, c, self.tile_tokens, fake_token_around_image=TILE_TOKENS["around"],
                                         image_token=TILE_TOKENS["image"], global_image_token=TILE_TOKENS["global"])
                 for r, c in zip(rows, cols)]
        text = pieces[0] + "".join(tile + piece for tile, piece in zip(tiles, pieces[1:]))
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def _expand_grid(self, text: str, grids: np.ndarray, add_special_tokens: bool) -> list[int]:
        """The text's ids, its k-th image token repeated as many times as image k's merged grid has cells."""
        merge = getattr(self.image_processor, "merge_size", 2)
        counts = iter(int(np.prod(grid)) // (merge * merge) for grid in grids)
        ids: list[int] = []
        for token in self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids:
            ids.extend([token] * next(counts) if token == self.token_id else [token])
        return ids
