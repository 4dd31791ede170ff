"""Where each image sits in a prompt, and the prefix-cache keys that tell images apart.

Owns: finding the image-token runs in token ids (`image_spans`) and each image's prefix-cache
key. Must not know: pixels, models, the prefix cache's internals.

Every image is the same token id repeated, so two different pictures give identical token
ids. The KV blocks are hashed with image positions carrying a negative number made from the
image's content hash instead (`ImageSpan.cache_key`; negative, so never a real token id),
which makes two different images diverge at their first image token and the same image match
(`Sequence.key_overrides`); a chunk or a reused prefix never ends inside an image
(`Sequence.atomic_spans`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class ImageSpan:
    """One image's block of tokens in the prompt: [start, start + num_tokens)."""

    start: int
    num_tokens: int
    content_hash: str  # sha256 hex of the image (`PromptImage.content_hash`)

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def cache_key(self) -> int:
        return -1 - int(self.content_hash, 16)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ImageSpan":
        return cls(start=int(data["start"]), num_tokens=int(data["num_tokens"]), content_hash=str(data["content_hash"]))


def image_spans(
    token_ids: Sequence[int], image_token_id: int, tokens_per_image: int, content_hashes: Sequence[str]
) -> tuple[ImageSpan, ...]:
    """The spans of the images, in order: each run of image tokens is one or more whole images
    of `tokens_per_image` tokens. ValueError when the count does not fit the images given."""
    positions = [i for i, t in enumerate(token_ids) if t == image_token_id]
    expected = tokens_per_image * len(content_hashes)
    if len(positions) != expected:
        raise ValueError(
            f"the prompt has {len(positions)} image tokens but {len(content_hashes)} image(s) need "
            f"{expected} ({tokens_per_image} each)"
        )
    spans = []
    for number, content_hash in enumerate(content_hashes):
        start = positions[number * tokens_per_image]
        if positions[(number + 1) * tokens_per_image - 1] != start + tokens_per_image - 1:
            raise ValueError(f"image {number + 1}'s {tokens_per_image} tokens are not one block in the prompt")
        spans.append(ImageSpan(start=start, num_tokens=tokens_per_image, content_hash=content_hash))
    return tuple(spans)
