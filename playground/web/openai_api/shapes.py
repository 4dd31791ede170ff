"""OpenAI's response shapes, built from our step records and stats (pure functions).

Owns: logprobs (chat: `{token, logprob, bytes, top_logprobs}`; legacy: `tokens`,
`token_logprobs`, `top_logprobs`, `text_offset`), `usage`, the `timings` extra, finish
reasons, and the completion / chunk objects. A step record is `inference.Step.to_dict()`
after `protocol.json_safe`: `token_bytes` in hex, `top_processed` the alternatives of the
distribution the token was sampled from, a filtered token's logprob None (-inf).
Must not know: HTTP, the channel layer, the ORM.
"""

from __future__ import annotations

import codecs
from typing import Any

# OpenAI's stand-in for a probability that is (numerically) zero.
MIN_LOGPROB = -9999.0
_FINISH_REASONS = {
    "eos": "stop",
    "grammar": "stop",
    "stop_string": "stop",
    "cancelled": "stop",
    "length": "length",
    "context": "length",
}


def finish_reason(ours: str | None) -> str:
    return _FINISH_REASONS.get(ours or "", "stop")


def _logprob(value: float | None) -> float:
    return MIN_LOGPROB if value is None else max(value, MIN_LOGPROB)


def _token_bytes(step: dict[str, Any]) -> list[int]:
    return list(bytes.fromhex(step["token_bytes"]))


def _alternatives(step: dict[str, Any], k: int) -> list[dict[str, Any]]:
    return [
        {"token": alt["piece"], "logprob": _logprob(alt["logprob"]), "bytes": list(alt["piece"].encode())}
        for alt in step.get("top_processed", [])[:k]
    ]


def chat_logprob(step: dict[str, Any], k: int, raw: bool = False) -> dict[str, Any]:
    """One token of `choices[].logprobs.content`; `raw` adds our pre-sampler extras."""
    entry = {
        "token": step["piece"],
        "logprob": _logprob(step["logprob"]),
        "bytes": _token_bytes(step),
        "top_logprobs": _alternatives(step, k),
    }
    if raw:
        entry.update(raw_logprob=_logprob(step["raw_logprob"]), rank=step["rank"], entropy=step["entropy"])
    return entry


def chat_logprobs(
    content_steps: list[dict[str, Any]], reasoning_steps: list[dict[str, Any]], k: int, raw: bool = False
) -> dict[str, Any]:
    """`choices[].logprobs`; the reasoning's tokens go apart, under `reasoning_content`."""
    logprobs: dict[str, Any] = {"content": [chat_logprob(s, k, raw) for s in content_steps], "refusal": None}
    if reasoning_steps:
        logprobs["reasoning_content"] = [chat_logprob(s, k, raw) for s in reasoning_steps]
    return logprobs


def completion_logprobs(steps: list[dict[str, Any]], k: int, text_offset: int, raw: bool = False) -> dict[str, Any]:
    """The legacy `choices[].logprobs`; `text_offset` is where the first step's text starts."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    for step in steps:
        tokens.append(step["piece"])
        token_logprobs.append(_logprob(step["logprob"]))
        top.append({alt["token"]: alt["logprob"] for alt in _alternatives(step, k)})
        offsets.append(text_offset)
        text_offset += len(step.get("text_delta") or "")
    logprobs = {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}
    if raw:
        logprobs["raw_logprobs"] = [_logprob(s["raw_logprob"]) for s in steps]
        logprobs["ranks"] = [s["rank"] for s in steps]
        logprobs["entropies"] = [s["entropy"] for s in steps]
    return logprobs


def prompt_completion_logprobs(tokens: list[dict[str, Any]]) -> dict[str, Any]:
    """The legacy logprobs shape for the prompt's tokens (`echo`): the first token's logprob is
    null, as in OpenAI's API; offsets count the characters the tokens' bytes decode to."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    offsets, offset = [], 0
    for token in tokens:
        offsets.append(offset)
        offset += len(decoder.decode(bytes.fromhex(token["token_bytes"])))
    return {
        "tokens": [t["piece"] for t in tokens],
        "token_logprobs": [None if t["logprob"] is None else _logprob(t["logprob"]) for t in tokens],
        "top_logprobs": [
            None if t["logprob"] is None else {a["piece"]: _logprob(a["logprob"]) for a in t["top"]} for t in tokens
        ],
        "text_offset": offsets,
    }


def join_logprobs(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """The prompt's logprobs followed by the answer's; lists only the answer has (our raw
    extras) get null for the prompt's tokens, so every list stays aligned with `tokens`."""
    pad = [None] * len(first["tokens"])
    return {key: first.get(key, pad) + value for key, value in second.items()}


def usage(
    *,
    num_prompt_tokens: int,
    num_completion_tokens: int,
    num_cached_tokens: int,
    num_reasoning_tokens: int,
    prediction: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """`prediction` (a request with one): (accepted, rejected) prediction tokens: the proposed
    tokens the model chose, and those it did not (proposed - accepted)."""
    details: dict[str, Any] = {"reasoning_tokens": num_reasoning_tokens}
    if prediction is not None:
        details["accepted_prediction_tokens"], details["rejected_prediction_tokens"] = prediction
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
        "prompt_tokens_details": {"cached_tokens": num_cached_tokens},
        "completion_tokens_details": details,
    }


def timings(stats: dict[str, Any], queue_ms: float) -> dict[str, Any]:
    """In the spirit of llama.cpp's `timings`: prompt = prefill, predicted = decode, as this
    stream got it (the worker's clock from its first token to its last, whoever shared the
    steps; `stream_decode_*` of the stats), not the engine's compute time."""
    prompt_n = (stats.get("num_prompt_tokens") or 0) - (stats.get("num_cached_tokens") or 0)
    prompt_ms = stats.get("prefill_ms") or 0.0
    return {
        "queue_ms": queue_ms,
        "cache_n": stats.get("num_cached_tokens") or 0,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_second": prompt_n / prompt_ms * 1000 if prompt_ms else None,
        "predicted_n": stats.get("num_generated_tokens") or 0,
        "predicted_ms": stats.get("stream_decode_ms", stats.get("decode_ms")),
        "predicted_per_second": stats.get("stream_decode_tok_s", stats.get("decode_tok_s")),
        "ttft_ms": stats.get("ttft_ms"),
        "worker": stats.get("worker"),
    }


def envelope(object_type: str, completion_id: str, created: int, model: str) -> dict[str, Any]:
    return {"id": completion_id, "object": object_type, "created": created, "model": model, "system_fingerprint": None}


def chat_message(content: str, reasoning: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if reasoning:
        message["reasoning_content"] = reasoning
    return message


def chunk_delta(delta_content: str | None, delta_reasoning: str | None, role: bool = False) -> dict[str, Any]:
    delta: dict[str, Any] = {"role": "assistant"} if role else {}
    if delta_reasoning:
        delta["reasoning_content"] = delta_reasoning
    if delta_content or role:
        delta["content"] = delta_content or ""
    return delta
