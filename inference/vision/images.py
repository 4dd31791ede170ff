"""One image attached to a prompt: decoded, checked, and named by its content hash.

Owns: turning bytes (or a PIL image) into an RGB image within the size limits, the stable
error codes for bad images (`invalid_image`, `image_too_large`, `image_too_many_pixels`,
`unsupported_image_type`) and the content hash. Must not know: models, token ids, Django
(the web process calls `decode_image` to check an upload before it is stored).

The hash is of the decoded RGB pixels and the size, not of the file: the same picture saved
as PNG or re-encoded hits the same prefix-cache entry, and two files whose pixels differ never do.
"""

from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

# Formats a browser can show as a thumbnail and Pillow decodes without plugins.
MEDIA_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "GIF": "image/gif", "WEBP": "image/webp"}
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_PIXELS = 4096 * 4096


class ImageError(ValueError):
    """An image that cannot be used; `code` is stable (the protocol's error code)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, eq=False)
class PromptImage:
    """A decoded RGB image and its content hash (sha256 hex of size + pixels)."""

    image: Image.Image
    content_hash: str
    media_type: str = "image/png"

    @property
    def width(self) -> int:
        return self.image.width

    @property
    def height(self) -> int:
        return self.image.height

    @classmethod
    def from_pil(cls, image: Image.Image, media_type: str = "image/png") -> "PromptImage":
        rgb = image.convert("RGB")
        digest = hashlib.sha256(f"{rgb.width}x{rgb.height}:".encode())
        digest.update(rgb.tobytes())
        return cls(image=rgb, content_hash=digest.hexdigest(), media_type=media_type)


def decode_image(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES, max_pixels: int = DEFAULT_MAX_PIXELS) -> PromptImage:
    """`data` (PNG, JPEG, GIF or WebP file bytes) as a `PromptImage`; `ImageError` says what is wrong."""
    if max_bytes < 1 or max_pixels < 1:
        raise ValueError(f"max_bytes={max_bytes} and max_pixels={max_pixels} must be >= 1")
    if not data:
        raise ImageError("invalid_image", "the image is empty (0 bytes)")
    if len(data) > max_bytes:
        raise ImageError("image_too_large", f"the image has {len(data):,} bytes; the limit is {max_bytes:,}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            kind = image.format or ""
            if kind not in MEDIA_TYPES:
                raise ImageError(
                    "unsupported_image_type", f"{kind or 'this'} images are not supported; use PNG, JPEG, GIF or WebP"
                )
            if image.width * image.height > max_pixels:  # checked before the pixels are decoded
                raise ImageError(
                    "image_too_many_pixels",
                    f"the image is {image.width}x{image.height} pixels; the limit is {max_pixels:,} pixels",
                )
            image.load()
    except ImageError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError, Warning) as error:
        raise ImageError("invalid_image", f"the data is not a readable image ({type(error).__name__})") from error
    return PromptImage.from_pil(image, MEDIA_TYPES[kind])
