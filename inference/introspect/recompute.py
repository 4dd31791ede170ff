"""A finished generation's every next-token distribution, recomputed by teacher forcing.

Owns: one forward pass of the model over prompt + generated tokens (the model reads the
tokens it actually produced, so position P-1+k predicts step k), and the step logits taken
from its last hidden states one step at a time.
Must not know: sampling settings, requests, Django.

Why recomputed rather than stored: a step's full logits are a vocabulary-sized float vector
(49,152 x 4 bytes = 192 KiB for the bundled model), so keeping them for every step of every
generation would cost far more than the generation itself. One causal forward pass gives all
of them at once, exactly what incremental decoding computed up to float rounding (a
different matrix shape sums in another order: about 1e-5 on float32 logits, more in
bfloat16), and nothing is kept between requests. Only the final hidden states (T x hidden)
stay in memory; each step's logits (the LM head) are computed when asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Recomputed:
    """The sequence (prompt + generated) and the final hidden state before each step."""

    token_ids: torch.Tensor  # (P + n,) prompt + generated
    num_prompt_tokens: int
    hidden: torch.Tensor  # (n, hidden) the final (normed) hidden state that predicts step k
    lm_head: torch.nn.Module

    @property
    def num_steps(self) -> int:
        return self.hidden.shape[0]

    def context(self, step: int) -> torch.Tensor:
        """What the model had read before step `step`: prompt + generated[:step] (T,)."""
        return self.token_ids[: self.num_prompt_tokens + step]

    @torch.inference_mode()
    def logits(self, step: int) -> torch.Tensor:
        """Step `step`'s raw logits (V,) in float32, as the sampler receives them."""
        if not 0 <= step < self.num_steps:
            raise ValueError(f"step {step} is outside the generation (0..{self.num_steps - 1})")
        return self.lm_head(self.hidden[step : step + 1])[0].float()


@torch.inference_mode()
def recompute(model, prompt_ids: list[int], generated_ids: list[int]) -> Recomputed:
    """One forward pass over `prompt_ids + generated_ids[:-1]` (the last token's own
    prediction was never used); `model` is a transformers causal LM."""
    if not prompt_ids or not generated_ids:
        raise ValueError("need at least one prompt token and one generated token")
    device = next(model.parameters()).device
    ids = torch.tensor(prompt_ids + generated_ids, dtype=torch.long, device=device)
    inputs = ids[:-1][None]
    body = model.get_decoder() if hasattr(model, "get_decoder") else None
    if body is not None:
        hidden = body(input_ids=inputs).last_hidden_state[0]  # the decoder applies its final norm
    else:  # no separate decoder: take the last hidden state of the whole model
        hidden = model(input_ids=inputs, output_hidden_states=True).hidden_states[-1][0]
    return Recomputed(
        token_ids=ids,
        num_prompt_tokens=len(prompt_ids),
        hidden=hidden[len(prompt_ids) - 1 :].clone(),
        lm_head=model.get_output_embeddings(),
    )
