"""A request's images as the engine gets them: the model's processor's tensors (pixel values, and what else
its vision tower takes), the prompt's image token that their features replace, and a digest of them for the
prefix cache. Made in the API worker (asgi/prompt/vision.py), read by the runner (engine_proc/model/hf_vision.py)."""
from __future__ import annotations

import hashlib

import msgspec
import numpy as np


class NamedArray(msgspec.Struct, array_like=True, gc=False):
    name: str  # the keyword the model's get_image_features takes it by (pixel_values, image_sizes, ...)
    dtype: str  # numpy's name of it
    shape: list[int]
    data: bytes  # C order


class ImageInputs(msgspec.Struct, array_like=True, gc=False):
    arrays: list[NamedArray]
    token_id: int  # each of the prompt's `token_id` tokens takes the next row of the images' features
    # 16 bytes over every array: a prompt's ids are alike for any image, so this enters its prefix-cache salt
    # (asgi/engine_link/generate.py) and a block is found again only for the same images.
    digest: bytes
    # Each image's tokens attend to each other both ways (BIDIRECTIONAL_MODEL_TYPES): a prompt chunk holds an image
    # whole (engine_proc/sched/request.py), and its tokens see the image's later ones (engine_proc/model/hf_vision.py).
    bidirectional: bool = False


def image_inputs(arrays: dict[str, np.ndarray], token_id: int, bidirectional: bool = False) -> ImageInputs:
    named, digest = [], hashlib.sha256(b"rill-images")
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        named.append(NamedArray(name, array.dtype.str, list(array.shape), array.tobytes()))
        digest.update(f"\0{name}\0{array.dtype.str}\0{array.shape}\0".encode())
        digest.update(named[-1].data)
    return ImageInputs(named, token_id, digest.digest()[:16], bidirectional)


def arrays_of(images: ImageInputs) -> dict[str, np.ndarray]:
    return {a.name: np.frombuffer(a.data, dtype=np.dtype(a.dtype)).reshape(a.shape) for a in images.arrays}


def image_runs(prompt_ids: list[int], token_id: int) -> list[tuple[int, int]]:
    """[start, end) of each run of consecutive image tokens in the prompt: one image each (the processors put a
    token of their own between two images)."""
    is_image = np.concatenate(([0], np.asarray(prompt_ids) == token_id, [0])).astype(np.int8)
    edges = np.flatnonzero(np.diff(is_image)).tolist()
    return list(zip(edges[0::2], edges[1::2]))


# Families whose images are served: one image token per feature row. Each is checked against transformers' forward
# (tests/model/test_vision_route.py).
VISION_MODEL_TYPES = ("llava", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "gemma3", "idefics3", "smolvlm")
# Of them, those whose image tokens attend both ways within each image (Gemma 3's token_type_ids mask); the others'
# mask is causal over the images too.
BIDIRECTIONAL_MODEL_TYPES = ("gemma3",)
# Of them, those whose rotary positions are 3-D (time, height, width) over an image (engine_proc/model/hf_vision.py)
MROPE_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")
# Qwen2-VL's and Qwen2.5-VL's image processors scale an image to a budget of pixels (--mm-processor-kwargs'
# min_pixels and max_pixels): patches of 14 merged 2 x 2, so at least one merged patch of 28 x 28 and at most the
# models' own bound, 16,384 of them; 1,280 of them unless the operator says otherwise (Qwen's suggested
# max_pixels: the model's 12.8M made 15,301 tokens of a 4000 x 3000 photo, minutes of its vision tower on a CPU).
PIXEL_BUDGET_TYPES = ("qwen2_vl", "qwen2_5_vl")
MIN_PIXELS, MAX_PIXELS, DEFAULT_MAX_PIXELS = 28 * 28, 16384 * 28 * 28, 1280 * 28 * 28
# An image's tokens unless the operator says otherwise, for any of the 3-D rotary families (Qwen3-VL's merged
# patches are 32 pixels a side): DEFAULT_MAX_PIXELS for Qwen2-VL's and Qwen2.5-VL's 28.
DEFAULT_MAX_IMAGE_TOKENS = 1280
