"""How many tokens an image becomes, computed from a config alone (no weights, no torch).

Owns: the patch count of a SigLIP-style tower (one token per patch, (image_size / patch_size)^2,
as DeepSeek-VL and the demo use) and DeepSeek-VL2's dynamic tiling, from its published processor
(image_size 384, patch 14, downsample 2, so h = w = ceil(27 / 2) = 14): a global view of
h x (w + 1) tokens (a newline token closes each row), one separator, then the local tiles as one
(nh x h) x (nw x w + 1) grid. Must not know: torch, transformers, Django (the web process runs it).
"""

from __future__ import annotations

import math
from typing import Any

VL2_PROCESSOR = {"image_size": 384, "patch_size": 14, "downsample": 2}
VL2_TILINGS = ((1, 1), (2, 1), (2, 2), (3, 3))  # (tiles across, tiles down), as the README lists them


def vl2_image_tokens(
    tiles_w: int, tiles_h: int, image_size: int = 384, patch_size: int = 14, downsample: int = 2
) -> dict:
    """VL2's image tokens for a `tiles_w` x `tiles_h` tiling: global view, separator, local tiles."""
    if min(tiles_w, tiles_h, image_size, patch_size, downsample) < 1:
        raise ValueError(f"tiles {tiles_w}x{tiles_h}, image_size, patch_size and downsample must be >= 1")
    side = math.ceil(image_size // patch_size / downsample)  # tokens per tile side after the 2x2 merge
    global_view = side * (side + 1)
    local = (tiles_h * side) * (tiles_w * side + 1)
    return {
        "tiles": [tiles_w, tiles_h],
        "global": global_view,
        "separator": 1,
        "local": local,
        "total": global_view + 1 + local,
    }


def patch_grid(vision_config: dict[str, Any]) -> dict[str, Any]:
    """A SigLIP-style tower: one token per patch of its square input."""
    image_size, patch_size = int(vision_config["image_size"]), int(vision_config["patch_size"])
    side = image_size // patch_size
    return {"image_size": image_size, "patch_size": patch_size, "grid": [side, side], "tokens_per_image": side * side}


def vision_section(config: dict[str, Any], kv_bytes_per_token: int) -> dict[str, Any] | None:
    """The card's `vision` part for a vision-language config (None for a text-only one): this
    model's tokens and KV bytes per image, and VL2's tiling counts beside them."""
    vision_config = config.get("vision_config")
    if not isinstance(vision_config, dict):
        return None
    try:
        own = patch_grid(vision_config)
    except (KeyError, TypeError, ValueError):
        own = None  # a tower this card cannot read: VL2's counts still stand
    return {
        "model": own and own | {"kv_bytes_per_image": own["tokens_per_image"] * kv_bytes_per_token},
        "vl2_processor": VL2_PROCESSOR,
        "vl2_tilings": [
            vl2_image_tokens(w, h) | {"kv_bytes": vl2_image_tokens(w, h)["total"] * kv_bytes_per_token}
            for w, h in VL2_TILINGS
        ],
    }
