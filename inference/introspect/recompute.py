"""A finished generation's every next-token distribution, recomputed by teacher forcing.

Owns: the step logits of prompt + generated tokens (the model reads the tokens it actually
produced, so position P-1+k predicts step k), computed two ways: `replay` through the engine's
own served path (the prompt in one pass, then one decode step per generated token, the same
runner and kernels that streamed the steps: the numbers the explorer shows next to the
streamed ones are those numbers), and `recompute` with one transformers forward pass over a
bare model (another precision's copy, which no engine serves).
Must not know: sampling settings, requests, Django.

Why recomputed rather than stored: a step's full logits are a vocabulary-sized float vector
(49,152 x 4 bytes = 192 KiB for the bundled model), so keeping them for every step of every
generation would cost far more than the generation itself; nothing is kept between requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Recomputed:
    """The sequence (prompt + generated) and the raw logits before each step."""

    token_ids: torch.Tensor  # (P + n,) prompt + generated
    num_prompt_tokens: int
    step_logits: torch.Tensor  # (n, vocab) float32: the raw logits that predict step k

    @property
    def num_steps(self) -> int:
        return self.step_logits.shape[0]

    def context(self, step: int) -> torch.Tensor:
        """What the model had read before step `step`: prompt + generated[:step] (T,)."""
        return self.token_ids[: self.num_prompt_tokens + step]

    def logits(self, step: int) -> torch.Tensor:
        """Step `step`'s raw logits (V,) in float32, as the sampler receives them."""
        if not 0 <= step < self.num_steps:
            raise ValueError(f"step {step} is outside the generation (0..{self.num_steps - 1})")
        return self.step_logits[step]


def replay(engine, prompt_ids: list[int], generated_ids: list[int]) -> Recomputed:
    """The steps' logits through `engine`'s served path (`InspectionPasses.teacher_force`): equal to
    what the stream computed. Run it on the engine's own thread, between two steps."""
    if not prompt_ids or not generated_ids:
        raise ValueError("need at least one prompt token and one generated token")
    logits = engine.passes.teacher_force(list(prompt_ids), list(generated_ids[:-1]))  # (n, V)
    ids = torch.tensor(prompt_ids + generated_ids, dtype=torch.long, device=logits.device)
    return Recomputed(token_ids=ids, num_prompt_tokens=len(prompt_ids), step_logits=logits)


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
    step_hidden = hidden[len(prompt_ids) - 1 :]  # (n, hidden): the states that predict each step
    logits = model.get_output_embeddings()(step_hidden).float()
    return Recomputed(token_ids=ids, num_prompt_tokens=len(prompt_ids), step_logits=logits)
