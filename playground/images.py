"""Images attached to a message or an explorer prompt: checked on arrival, stored as records.

Owns: the `images` command field (a list of {data: base64 or a data: URL, media_type}), its
limits (settings `PLAYGROUND_MAX_IMAGE_BYTES`, `PLAYGROUND_MAX_IMAGE_PIXELS`,
`PLAYGROUND_MAX_IMAGES`), the stored record ({media_type, data (base64), content_hash, width,
height}) and turning records back into the engine's `PromptImage`s (worker side). Every bad
image is a `CommandError` with the image's code (`invalid_image`, `image_too_large`, ...)
raised before anything is written. Must not know: torch, the engine, sockets.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from django.conf import settings
from django.utils.translation import gettext

from inference.vision.images import ImageError, PromptImage, decode_image
from playground.protocol import CommandError, get_field


def parse_images(content: dict[str, Any], name: str = "images") -> list[dict[str, Any]]:
    """The command's images as records to store ([] when it has none)."""
    items = get_field(content, name, list, default=[])
    limit = settings.PLAYGROUND_MAX_IMAGES
    if len(items) > limit:
        raise CommandError(
            "too_many_images",
            gettext("%(count)s images were attached; the limit is %(limit)s") % {"count": len(items), "limit": limit},
        )
    return [_record(item, number) for number, item in enumerate(items, start=1)]


def _record(item: Any, number: int) -> dict[str, Any]:
    if not isinstance(item, dict) or not isinstance(item.get("data"), str):
        raise CommandError(
            "invalid_image", gettext("image %(number)s must be an object with its base64 data") % {"number": number}
        )
    data = item["data"].partition("base64,")[2] if item["data"].startswith("data:") else item["data"]
    max_bytes = settings.PLAYGROUND_MAX_IMAGE_BYTES
    if len(data) > (max_bytes + 2) // 3 * 4 + 4:  # refuse before decoding megabytes of base64
        raise CommandError(
            "image_too_large",
            gettext("image %(number)s is larger than the limit of %(limit)s bytes")
            % {"number": number, "limit": f"{max_bytes:,}"},
        )
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CommandError(
            "invalid_image",
            gettext("image %(number)s is not valid base64 (%(reason)s)") % {"number": number, "reason": exc},
        ) from exc
    try:
        image = decode_image(raw, max_bytes=max_bytes, max_pixels=settings.PLAYGROUND_MAX_IMAGE_PIXELS)
    except ImageError as exc:
        raise CommandError(
            exc.code, gettext("image %(number)s: %(reason)s") % {"number": number, "reason": exc}
        ) from exc
    return {
        "media_type": image.media_type,
        "data": base64.b64encode(raw).decode("ascii"),
        "content_hash": image.content_hash,
        "width": image.width,
        "height": image.height,
    }


def prompt_images(records: list[dict[str, Any]]) -> list[PromptImage]:
    """Stored records as the engine's images (decoded again: the pixels are not stored twice)."""
    return [decode_image(base64.b64decode(record["data"]), max_bytes=1 << 62, max_pixels=1 << 62) for record in records]


def without_data(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records without their bytes (for lists and events; the page has its own copies)."""
    return [{key: value for key, value in record.items() if key != "data"} for record in records]
