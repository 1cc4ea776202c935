"""A vision model's images in a chat prompt. The model's own processor (transformers' AutoProcessor, loaded once
per worker) expands each image's placeholder in the rendered prompt into its image tokens and makes the tensors
the engine's vision tower takes (ipc/images.py); decoding and processing run on a thread, off the event loop."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

from rill.asgi.errors import APIError
from rill.asgi.prompt.images import decode_image_url
from rill.ipc.images import VISION_MODEL_TYPES, ImageInputs, image_inputs

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
TEXT_OUTPUTS = ("input_ids", "attention_mask", "token_type_ids")  # the processor's; the rest go to the engine


def accepts_images(model_dir: Path) -> bool:
    """A family whose images are served (ipc/images.py), with its processor's files beside it."""
    try:
        model_type = json.loads((model_dir / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return False
    return model_type in VISION_MODEL_TYPES and any((model_dir / name).exists() for name in PROCESSOR_FILES)


class ImagePrompts:
    def __init__(self, model_dir: Path, max_images: int) -> None:
        from transformers import AutoProcessor

        self.processor = AutoProcessor.from_pretrained(model_dir, local_files_only=True)
        self.placeholder: str = self.processor.image_token  # what an image part renders as: "<image>"
        self.token_id: int = self.processor.tokenizer.convert_tokens_to_ids(self.placeholder)
        self.max_images = max_images

    async def encode(self, text: str, urls: list[tuple[str, str]], add_special_tokens: bool,
                     ) -> tuple[list[int], ImageInputs]:
        """The prompt's ids, each image's placeholder expanded, and its images' tensors. `urls`: (url, its param)."""
        if len(urls) > self.max_images:
            raise APIError(400, f"{len(urls)} images in one request; this server takes at most {self.max_images} "
                                "(--limit-mm-per-prompt).", param=urls[self.max_images][1])
        if (found := text.count(self.placeholder)) != len(urls):  # one written into a text part by the client
            raise APIError(400, f"The messages' text holds the image placeholder {self.placeholder!r} {found - len(urls)} "
                                "time(s) itself; only an image_url part may.", param="messages")
        return await asyncio.to_thread(self._encode, text, urls, add_special_tokens)

    def _encode(self, text: str, urls: list[tuple[str, str]], add_special_tokens: bool):
        images = [decode_image_url(url, param) for url, param in urls]
        try:
            out = self.processor(text=[text], images=images, return_tensors="np", add_special_tokens=add_special_tokens)
        except ValueError as exc:  # what the model's processor refuses of these images (a size it cannot tile)
            raise APIError(400, f"The model's processor refused the images: {exc}", param="messages") from None
        arrays = {name: value for name, value in out.items() if name not in TEXT_OUTPUTS}
        return out["input_ids"][0].tolist(), image_inputs(arrays, self.token_id)
