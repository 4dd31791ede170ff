"""A loaded model's vision side: what an image becomes before the language model sees it.

Owns: reading a vision-language checkpoint's image token, tokens per image and patch grid from
its config (SigLIP-style: one token per patch, (image_size / patch_size)^2), running its image
processor, and expanding one placeholder token per image into the image's block of tokens (the
DeepSeek-VL processor's convention: `<image_placeholder>` x num_image_tokens).
Must not know: requests, caches, Django.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from inference.vision.images import PromptImage


@dataclass(frozen=True)
class VisionSpec:
    image_token_id: int
    image_token: str
    image_size: int  # pixels per side after the processor's resize and pad
    patch_size: int
    grid: tuple[int, int]  # (rows, columns) of patches: one image token each
    processor: Any  # the checkpoint's image processor (PIL backend)

    @property
    def tokens_per_image(self) -> int:
        return self.grid[0] * self.grid[1]

    @classmethod
    def of(cls, model: Any, tokenizer: Any, processor: Any) -> "VisionSpec | None":
        """The spec of a vision-language model, None for a text-only one (or without a processor)."""
        vision = getattr(model.config, "vision_config", None)
        image_token_id = getattr(model.config, "image_token_id", None)
        if vision is None or image_token_id is None or processor is None:
            return None
        side = vision.image_size // vision.patch_size
        return cls(
            image_token_id=int(image_token_id),
            image_token=tokenizer.convert_ids_to_tokens(int(image_token_id)),
            image_size=int(vision.image_size),
            patch_size=int(vision.patch_size),
            grid=(side, side),
            processor=processor,
        )

    def to_dict(self) -> dict[str, Any]:
        """For `Engine.model_info()`: plain numbers the token view draws its patch grid from."""
        return {
            "image_token_id": self.image_token_id,
            "image_token": self.image_token,
            "image_size": self.image_size,
            "patch_size": self.patch_size,
            "grid": list(self.grid),
            "tokens_per_image": self.tokens_per_image,
        }

    def pixel_values(self, images: Sequence[PromptImage], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """(num_images, 3, image_size, image_size), as the vision tower takes them."""
        batch = self.processor(images=[image.image for image in images], return_tensors="pt")
        return batch["pixel_values"].to(device=device, dtype=dtype)

    def expand_placeholders(self, token_ids: Sequence[int]) -> list[int]:
        """Every image token in `token_ids` (one per image, as a chat template writes it)
        becomes the image's block of `tokens_per_image` image tokens."""
        expanded: list[int] = []
        for token_id in token_ids:
            expanded += [token_id] * (self.tokens_per_image if token_id == self.image_token_id else 1)
        return expanded
