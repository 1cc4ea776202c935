"""A chat message's `image_url` part -> a decoded RGB image, bounded: a base64 data URL only (the server fetches
nothing), of a few common formats, checked for its pixel count before its pixels are decoded."""
from __future__ import annotations

import base64
import binascii
import io
import re

from rill.asgi.errors import APIError

# 16 megapixels (48 MiB as RGB): a 4096 x 4096 photo. The header gives the size, so a larger one (a
# decompression bomb of a small file) is refused before a pixel is decoded; the processor then resizes it.
MAX_IMAGE_PIXELS = 4096 * 4096
# A processor scales an image's short side to its size (336) before it crops or tiles: a 1 x 16M image would
# become 336 x 5.4G. Qwen2-VL's processor refuses past the same ratio.
MAX_ASPECT_RATIO = 200
# The decoders opened: the formats clients send. PIL's rarer ones are never reached from a request.
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
_DATA_URL = re.compile(r"data:image/[a-zA-Z0-9.+-]+;base64,", re.ASCII)


def decode_image_url(url: str, param: str):
    """The image of a data URL (`data:image/png;base64,...`); a 400 naming `param` for anything else."""
    if not (match := _DATA_URL.match(url)):
        if url.startswith(("http://", "https://", "file:")):
            raise APIError(400, "This server fetches no image URLs: send the image inline as a base64 data URL "
                                "(data:image/png;base64,...).", param=param)
        raise APIError(400, "An image URL must be a base64 data URL (data:image/png;base64,...).", param=param)
    try:
        data = base64.b64decode(url[match.end():], validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, "The image's base64 data is not valid.", param=param) from None
    return decode_image(data, param)


def decode_image(data: bytes, param: str):
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as img:
            width, height = img.size
            if width * height > MAX_IMAGE_PIXELS:
                raise APIError(400, f"The image is {width} x {height} pixels, more than the {MAX_IMAGE_PIXELS:,} "
                                    "this server takes.", param=param)
            if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
                raise APIError(400, f"The image is {width} x {height} pixels: its sides differ by more than "
                                    f"{MAX_ASPECT_RATIO} times.", param=param)
            return img.convert("RGB")
    except APIError:
        raise
    except Exception as exc:  # PIL raises what its decoders raise: any of them is the image's fault
        raise APIError(400, f"The image could not be decoded ({type(exc).__name__}); send a PNG, JPEG, WebP, GIF "
                            "or BMP image.", param=param) from None
