"""The wire contract (docs/protocol.md) in one place: error codes, command field parsing
and the builders of every event the server sends.

Used by the consumer (web process) and the runner (worker). Must not know: sockets, the
ORM, Celery or the engine; events are plain JSON-ready dicts whose `type` is the wire type
(and, over the channel layer, the consumer handler's name: `generation.tokens` ->
`generation_tokens`).
"""

from __future__ import annotations

import math
import re
from typing import Any

from django.conf import settings

from inference.text.reasoning import prompt_opens_reasoning
from playground import encoded_json

STEPS_JSON = "steps_json"  # a steps event's records, as JSON text, between the worker and the web process

ERROR_CODES = (
    "bad_json",
    "unknown_command",
    "invalid_field",
    "invalid_params",
    "prompt_too_long",
    "too_many_generations",
    "not_found",
    "model_unavailable",
    "worker_lost",
    "internal_error",
    "kv_handoff_failed",
    "no_worker_for_mode",
    "message_too_large",
    "nesting_too_deep",
    "invalid_unicode",
    "request_too_large",
    "server_busy",
    "inspection_timeout",
    "not_moe",
    "not_comparable",
    "invalid_image",
    "image_too_large",
    "image_too_many_pixels",
    "unsupported_image_type",
    "too_many_images",
    "images_not_supported",
    "no_session",
    "session_changed",
    "service_unavailable",
)
TERMINAL_TYPES = ("generation.finished", "generation.error")


class CommandError(Exception):
    """A refused command or request, or a failed generation: a stable `code` from ERROR_CODES
    and a message meant for a person."""

    def __init__(self, code: str, message: str) -> None:
        assert code in ERROR_CODES, code
        message = without_server_paths(message)  # an exception's text may name a file of the server
        super().__init__(message)
        self.code = code
        self.message = message


# An absolute path in a message: a "/" that starts a word (not the "/" of "a/b", of a URL or of
# "~/"), up to a space, a quote, a bracket or a colon (what an exception's text puts around one).
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~/:\\-])/[^\s'\"`()<>\[\]{},;:|*?]+")


def without_server_paths(text: str) -> str:
    """`text` with each absolute path of the server shortened, for a client's eyes: one under
    `PLAYGROUND_DATA_DIR` to its path relative to it (`models/x/config.json`: what a model's
    source may say), any other to its file name. A one-part path (`/v1`, `/tmp`) stays: it
    says nothing about this host. The server's own log keeps the full paths."""
    if "/" not in text:
        return text
    data_dir = str(getattr(settings, "PLAYGROUND_DATA_DIR", "")).rstrip("/")
    return _ABSOLUTE_PATH.sub(lambda match: _shortened(match.group(0), data_dir), text)


def _shortened(path: str, data_dir: str) -> str:
    stripped = path.rstrip(".")  # a sentence's full stop is no part of the path
    end = path[len(stripped) :]
    if data_dir and (stripped == data_dir or stripped.startswith(data_dir + "/")):
        return (stripped[len(data_dir) + 1 :] or "<data dir>") + end
    if stripped.rstrip("/").count("/") < 2:
        return path
    return stripped.rstrip("/").rsplit("/", 1)[-1] + end


# Command fields --------------------------------------------------------------------------

_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", dict: "an object", list: "a list"}


def get_field(content: dict[str, Any], name: str, kind: type, *, required: bool = False, default: Any = None) -> Any:
    """`content[name]` checked to be of `kind` (bool is not an int here), else invalid_field."""
    if name not in content or content[name] is None:
        if required:
            raise CommandError("invalid_field", f"{name} is required")
        return default
    value = content[name]
    is_bool = isinstance(value, bool)
    if not isinstance(value, kind) or (is_bool and kind is not bool):
        raise CommandError("invalid_field", f"{name}={value!r} must be {_TYPE_NAMES[kind]}")
    return value


def get_id_list(content: dict[str, Any], name: str) -> list[int]:
    """A list of non-negative integers (e.g. token ids), else invalid_field."""
    values = get_field(content, name, list, default=[])
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CommandError("invalid_field", f"{name} must hold non-negative integers, not {value!r}")
    return values


def json_safe(value: Any) -> Any:
    """`value` with non-finite floats (e.g. the -inf logprob of a filtered token) as None.

    Browsers' JSON.parse and PostgreSQL's jsonb both reject NaN and Infinity.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


# Events ----------------------------------------------------------------------------------


def error(code: str, message: str, request_id: str | None = None) -> dict[str, Any]:
    """A refused command: nothing was started."""
    return {"type": "error", "request_id": request_id, "code": code, "message": without_server_paths(message)}


def generation_attached(
    request_id: str | None,
    generation_id: int,
    status: str,
    text: str,
    steps: list[dict[str, Any]],
    segments: list[dict[str, Any]],
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Answer to `attach` (a reloaded page following a generation it started before): the text
    and every step published so far (the saved row and the steps published since,
    coord/recent_steps.py), and the sampling `params`; later steps follow as usual and may
    repeat these (the page keeps each step index once)."""
    return {
        "type": "generation.attached",
        "request_id": request_id,
        "generation_id": generation_id,
        "status": status,
        "text": text,
        "steps": steps,
        "segments": segments,
        "params": params or {},
    }


def generation_queued(
    request_id: str | None,
    generation_id: int,
    conversation_id: int | None,
    user_message_id: int | None,
    message_id: int | None,
) -> dict[str, Any]:
    return {
        "type": "generation.queued",
        "request_id": request_id,
        "generation_id": generation_id,
        "conversation_id": conversation_id,
        "user_message_id": user_message_id,
        "message_id": message_id,
    }


def generation_started(
    generation_id: int, worker: str, model: dict[str, Any], params: dict[str, Any], prompt: dict[str, Any]
) -> dict[str, Any]:
    """`prompt` is {text, spans, tokens, dropped_reasoning} (see `prompt_record`)."""
    return {
        "type": "generation.started",
        "generation_id": generation_id,
        "worker": worker,
        "model": model,
        "params": params,
        "prompt": prompt,
    }


def prompt_record(
    text: str,
    spans: list[dict[str, Any]],
    tokens: list[dict[str, Any]],
    images: list[dict[str, Any]] | None = None,
    dropped_reasoning: list[int] | None = None,
    num_dropped_messages: int = 0,
) -> dict[str, Any]:
    """`tokens` are `inference.text.tokenization.TokenInfo.to_dict()`s: {id, piece, bytes (hex), ...};
    `images` the blocks of image tokens among them (`image_block`); `dropped_reasoning`: the
    messages whose reasoning the template left out (`RenderedPrompt`); `num_dropped_messages`:
    the oldest messages of a chat left out because it no longer fits the limits; `opens_reasoning`:
    the prompt leaves a `<think>` open, so the answer begins inside it (R1's template; the one
    place the rule is applied, the row keeps it with the prompt)."""
    return {
        "text": text,
        "opens_reasoning": prompt_opens_reasoning(text),
        "spans": spans,
        "tokens": tokens,
        "images": images or [],
        "dropped_reasoning": dropped_reasoning or [],
        "num_dropped_messages": num_dropped_messages,
    }


def image_block(span: dict[str, Any], grid: tuple[int, int], record: dict[str, Any], kv_bytes: int) -> dict[str, Any]:
    """One image in the prompt: tokens [start, start + num_tokens), a (rows, columns) patch
    grid of one token each, the image's size and hash, and the KV cache bytes its tokens take."""
    return {
        "start": span["start"],
        "num_tokens": span["num_tokens"],
        "grid": list(grid),
        "content_hash": span["content_hash"],
        "width": record["width"],
        "height": record["height"],
        "media_type": record["media_type"],
        "kv_bytes": kv_bytes,
    }


def generation_waiting(generation_id: int, position: int, num_waiting: int, waited_ms: float) -> dict[str, Any]:
    """The worker's batch has no room for the generation yet: its place (1 = next) and wait so far."""
    return {
        "type": "generation.waiting",
        "generation_id": generation_id,
        "position": position,
        "num_waiting": num_waiting,
        "waited_ms": waited_ms,
    }


def generation_prefilled(generation_id: int, prefilled: dict[str, Any]) -> dict[str, Any]:
    """`prefilled` is `inference.Prefilled.to_dict()`."""
    fields = (
        "num_prompt_tokens",
        "num_cached_tokens",
        "num_prefilled_tokens",
        "prefill_ms",
        "kv_cache_bytes",
        "queue_ms",
    )
    return {
        "type": "generation.prefilled",
        "generation_id": generation_id,
        **{name: prefilled[name] for name in fields},
    }


def generation_steps(
    generation_id: int, step_texts: list[str], *, is_beam: bool, segments: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Coalesced token steps (`generation.tokens`) or beam steps (`generation.beams`), given as
    each step record's JSON text. They cross the channel layer as that text (`STEPS_JSON`, one
    JSON list), spliced into the browser's frame as `steps` (`frame_text`) and parsed only where
    they are read (`steps_of`): unpacking a message's nested records and encoding them again was
    a third of the web process's CPU under 8 streams (docs/continuous-batching.md, a ninth pass).
    `segments`: the reasoning split of the whole answer so far (`inference.text.reasoning`)."""
    kind = "generation.beams" if is_beam else "generation.tokens"
    event = {"type": kind, "generation_id": generation_id, STEPS_JSON: encoded_json.EncodedList(step_texts).to_json()}
    return event if segments is None else {**event, "segments": segments}


def steps_of(event: dict[str, Any]) -> list[dict[str, Any]]:
    """The step records of a `generation_steps` event."""
    return encoded_json.loads(event[STEPS_JSON])


def frame_text(event: dict[str, Any]) -> str:
    """An event as the JSON text of its WebSocket frame: a steps message's `steps` as the worker
    encoded them (docs/protocol.md: the browser reads a `steps` list)."""
    steps_json = event.get(STEPS_JSON)
    if steps_json is None:
        return encoded_json.dumps(event)
    head = encoded_json.dumps({key: value for key, value in event.items() if key != STEPS_JSON})
    return f'{head[:-1]},"steps":{steps_json}}}'


def generation_finished(
    generation_id: int,
    message_id: int | None,
    finish_reason: str,
    text: str,
    stats: dict[str, Any],
    segments: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "type": "generation.finished",
        "generation_id": generation_id,
        "message_id": message_id,
        "finish_reason": finish_reason,
        "text": text,
        "stats": stats,
        "segments": segments if segments is not None else [],
    }


def generation_error(generation_id: int, code: str, message: str) -> dict[str, Any]:
    assert code in ERROR_CODES, code
    message = without_server_paths(message)  # a row saved before this rule may hold one
    return {"type": "generation.error", "generation_id": generation_id, "code": code, "message": message}


# Prefill/decode disaggregation (docs/pd-disaggregation.md): the handoff's workers, size,
# timings (ms) and `timeline` (Unix epoch ms of each phase boundary).
HANDOFF_FIELDS = (
    "prefill_worker",
    "decode_worker",
    "kv_transfer_bytes",
    "serialize_ms",
    "store_ms",
    "fetch_ms",
    "transfer_ms",
    "load_ms",
    "timeline",
)


def generation_handoff(generation_id: int, handoff: dict[str, Any]) -> dict[str, Any]:
    """The decode worker loaded the KV cache the prefill worker stored; decoding goes on."""
    return {
        "type": "generation.handoff",
        "generation_id": generation_id,
        **{name: handoff.get(name) for name in HANDOFF_FIELDS},
    }


_STATS_FIELDS = (
    "num_prompt_tokens",
    "num_cached_tokens",
    "num_generated_tokens",
    "prefill_ms",
    "ttft_ms",
    "decode_ms",
    "decode_tok_s",
    "kv_cache_bytes",
    "queue_ms",
    "seed",
    "finish_reason",
    "num_reasoning_tokens",
    "thinking_ended_by_budget",
    # Speculative decoding (`inference.events.Finished`): 0, 0 and 1.0 for a request without.
    "num_proposed_tokens",
    "num_accepted_tokens",
    "speculative_speedup",
)


def stats_record(finished: dict[str, Any], worker: str) -> dict[str, Any]:
    """`stats` of `generation.finished` from `inference.Finished.to_dict()`; beam search adds
    its returned `sequences`."""
    stats = {name: finished[name] for name in _STATS_FIELDS}
    stats["worker"] = worker
    if finished.get("sequences"):
        stats["sequences"] = finished["sequences"]
    return stats


SERVING_GROUP = "serving"  # every worker's batch steps, for the serving page
MODELS_GROUP = "worker-models"  # every worker's model state, for every page's /ws/generate/ socket
MODEL_STATES = ("loading", "ready", "error")


def worker_model(
    worker: str,
    state: str,
    model_id: int | None,
    model_name: str,
    elapsed_ms: float,
    load_ms: float | None = None,
    error: str = "",
) -> dict[str, Any]:
    """A worker's model: `loading` (for `elapsed_ms` so far), `ready` (loaded in `load_ms`) or
    `error` (the load failed: `error` says why). Sent when it changes and, on connect, for every
    live worker; `elapsed_ms` is measured by the server when the event is built."""
    assert state in MODEL_STATES, state
    return {
        "type": "worker.model",
        "worker": worker,
        "state": state,
        "model_id": model_id,
        "model_name": model_name,
        "elapsed_ms": elapsed_ms,
        "load_ms": load_ms,
        "error": without_server_paths(error),
    }


def serving_step(worker: str, step: dict[str, Any], num_skipped: int) -> dict[str, Any]:
    """One engine step of a worker's continuous batch (`inference.engine_core.BatchStep.to_dict()`,
    request ids mapped to generation ids); `num_skipped` steps since the last one were not sent."""
    return {"type": "serving.step", "worker": worker, "step": step, "num_skipped": num_skipped}


def serving_workers(workers: list[str]) -> dict[str, Any]:
    """The worker processes alive when the serving page connected (an idle one sends no steps)."""
    return {"type": "serving.workers", "workers": workers}


def group_name(generation_id: int) -> str:
    """The channel-layer group a generation's events go to (worker -> consumer)."""
    return f"generation-{generation_id}"


def is_terminal(event: dict[str, Any]) -> bool:
    return event.get("type") in TERMINAL_TYPES
