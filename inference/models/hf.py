"""Generic model runner: any transformers causal LM, one forward pass at a time.

Owns: turning token ids + a cache into next-token logits for architectures the lean
runner does not cover (GPT-2, DeepSeek-V3 MLA+MoE, ...). Must not know: sampling, requests.
"""

from __future__ import annotations

import torch

from inference.kv.cache import HFKVCache


class HFRunner:
    name = "transformers"

    def __init__(self, model) -> None:
        self.model = model
        self.device = next(model.parameters()).device

    def new_cache(self, capacity: int) -> HFKVCache:
        return HFKVCache(self.model.config)

    @torch.inference_mode()
    def forward(
        self, input_ids: torch.Tensor, cache: HFKVCache | None, pixel_values: torch.Tensor | None = None
    ) -> torch.Tensor:
        """input_ids (T,) -> float32 logits (vocab,) of the last position; appends T tokens to `cache`.

        With `cache=None` the whole sequence is recomputed (the "no KV cache" mode). A
        vision-language model takes `pixel_values` (num_images, 3, H, W) for the image tokens
        among `input_ids` (one block per image, in order).
        """
        ids = input_ids.to(self.device)[None]  # (1, T)
        images = {} if pixel_values is None else {"pixel_values": pixel_values}
        if cache is None:
            out = self.model(input_ids=ids, use_cache=False, logits_to_keep=1, **images)
        else:
            out = self.model(input_ids=ids, past_key_values=cache.cache, use_cache=True, logits_to_keep=1, **images)
        return out.logits[0, -1].float()  # (vocab,)
