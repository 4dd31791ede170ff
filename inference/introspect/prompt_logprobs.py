"""The prompt's own log-probabilities: how likely the model finds each prompt token after the
ones before it (what evaluation tools score with `echo` + `logprobs`).

Owns: one teacher-forced forward pass over the prompt and the per-token read-out (the chosen
token's logprob and the top alternatives). The first token has no logprob: nothing predicts
it. Must not know: requests, Django.
"""

from __future__ import annotations

from typing import Any

import torch


@torch.inference_mode()
def prompt_logprobs(model, prompt_ids: list[int], top_n: int) -> list[dict[str, Any]]:
    """[{token_id, logprob (None for the first), top: [{token_id, logprob}, ...]}] per prompt token."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    device = next(model.parameters()).device
    logits = model(input_ids=torch.tensor([prompt_ids], device=device)).logits[0].float()  # (T, vocab)
    logprobs = torch.log_softmax(logits[:-1], dim=-1)  # (T - 1, vocab): row i predicts token i + 1
    chosen = logprobs.gather(1, torch.tensor(prompt_ids[1:], device=device)[:, None])[:, 0].tolist()
    values, ids = logprobs.topk(min(top_n, logprobs.shape[-1]), dim=-1) if top_n else (None, None)
    tokens: list[dict[str, Any]] = [{"token_id": prompt_ids[0], "logprob": None, "top": []}]
    for i, token_id in enumerate(prompt_ids[1:]):
        top = [] if ids is None else [{"token_id": int(j), "logprob": float(v)} for v, j in zip(values[i], ids[i])]
        tokens.append({"token_id": token_id, "logprob": chosen[i], "top": top})
    return tokens
