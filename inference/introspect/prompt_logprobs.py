"""The prompt's own log-probabilities: how likely the model finds each prompt token after the
ones before it (what evaluation tools score with `echo` + `logprobs`).

Owns: the per-token read-out (the chosen token's logprob and the top alternatives) of the
served path's teacher-forced logits over the prompt (`EngineCore.score`: the runner and kernels
that stream a generation, so a prompt scored here equals the same text generated). The first
token has no logprob: nothing predicts it. Must not know: requests, the runner, Django.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# score(token_ids, read): calls read(first_position, logits (n, vocab) float32) over the positions
Score = Callable[[list[int], Callable[[int, torch.Tensor], None]], None]


@torch.inference_mode()
def prompt_logprobs(score: Score, prompt_ids: list[int], top_n: int) -> list[dict[str, Any]]:
    """[{token_id, logprob (None for the first), top: [{token_id, logprob}, ...]}] per prompt token."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    tokens: list[dict[str, Any]] = [{"token_id": prompt_ids[0], "logprob": None, "top": []}]
    if len(prompt_ids) == 1:
        return tokens

    def read(first: int, logits: torch.Tensor) -> None:
        logprobs = torch.log_softmax(logits, dim=-1)  # (n, vocab): row i predicts token first + i + 1
        targets = torch.tensor(prompt_ids[first + 1 : first + 1 + logits.shape[0]], device=logits.device)
        chosen = logprobs.gather(1, targets[:, None])[:, 0].tolist()
        values, ids = logprobs.topk(min(top_n, logprobs.shape[-1]), dim=-1) if top_n else (None, None)
        for i, token_id in enumerate(targets.tolist()):
            top = [] if ids is None else [{"token_id": int(j), "logprob": float(v)} for v, j in zip(values[i], ids[i])]
            tokens.append({"token_id": token_id, "logprob": chosen[i], "top": top})

    score(prompt_ids[:-1], read)  # the last token predicts nothing in the prompt
    return tokens
