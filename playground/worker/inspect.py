"""Inspections of a finished generation, run by the Celery worker: the Django <-> introspect bridge.

Owns: reading the generation's tokens from its row (the prompt as the model saw it, then the
generated path), running `inference.introspect` on the loaded engine's model through the
engine loop (the only thread that touches the engine), naming tokens, and sending the one
answer to the web process's reply channel. Nothing is kept between inspections: the logits
are recomputed by one teacher-forced forward pass each time (inference/introspect/recompute.py
says why). Must not know: sockets, HTTP.

The "path" of a row is what the explorer shows as the continuation: the token ids the
request sent after the text (`inputs.token_ids`, earlier requests' tokens) and then the
tokens this request generated. Step k of the path is predicted from the text's tokens plus
path[:k].
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from inference.sampling_params import SamplingParams
from playground import inspection, protocol
from playground.models import Generation, LanguageModel
from playground.protocol import CommandError
from playground.worker.engines import comparison_model, get_engine, loop_for

if TYPE_CHECKING:
    from inference.engine import Engine

logger = logging.getLogger(__name__)


def run_inspection(
    generation_id: int,
    request: dict[str, Any],
    reply_channel: str,
    load_engine: Callable[[LanguageModel], Engine] = get_engine,
    reply: Callable[[str, dict[str, Any]], None] | None = None,
) -> None:
    """Answers one inspection on `reply_channel`: {"ok": true, "result"} or {"ok": false, code, message}."""
    try:
        answer = {"ok": True, "result": protocol.json_safe(inspect(generation_id, request, load_engine))}
    except CommandError as exc:
        answer = {"ok": False, "code": exc.code, "message": exc.message}
    except Exception as exc:
        logger.exception("inspection of generation %s failed", generation_id)
        answer = {"ok": False, "code": "internal_error", "message": f"{type(exc).__name__}: {exc}"}
    (reply or _send)(reply_channel, {"type": "inspection.result", **answer})


def _send(channel: str, message: dict[str, Any]) -> None:
    async_to_sync(get_channel_layer().send)(channel, message)


def inspect(generation_id: int, request: dict[str, Any], load_engine: Callable[[LanguageModel], Engine]) -> dict:
    row = Generation.objects.select_related("model").filter(pk=generation_id).first()
    if row is None:
        raise CommandError("not_found", f"generation {generation_id} does not exist")
    # Checked again here (the task's arguments are input too); `params` came merged with the generation's.
    checked = inspection.parse({k: v for k, v in request.items() if k != "params"}, request.get("params") or {})
    view = checked["view"]
    # The prompt's own logprobs need only its prompt: any ended generation (beam search, none generated).
    context_ids, path = _prompt_of(row) if view == "prompt_logprobs" else tokens_of(row)
    params = SamplingParams.from_dict(checked["params"])
    if row.model is None:
        raise CommandError("model_unavailable", "the generation's model was deleted")
    engine = load_engine(row.model)
    if view == "prompt_logprobs":
        return {
            "view": view,
            "generation_id": generation_id,
            "tokens": loop_for(engine).call(lambda: _prompt_logprobs(engine, context_ids, checked["top_n"])),
        }
    if view == "kv":
        return loop_for(engine).call(lambda: _kv(engine, row, len(context_ids) + len(path)))
    if view == "moe":
        trace = loop_for(engine).call(lambda: _moe(engine, row, context_ids, path))
        return {"view": view, "generation_id": generation_id, "num_steps": len(path), **_named(engine, trace)}
    if view == "roofline":  # on the loop thread: the device is measured with nothing else running
        return loop_for(engine).call(lambda: _roofline(engine, row))
    if view == "ab":
        other_id = checked["other_generation_id"]
        b = _side_b(row, other_id, context_ids)
        result = loop_for(engine).call(lambda: _ab(engine, context_ids, (path, params), b))
        return {"view": view, "generation_id": generation_id, "other_generation_id": other_id, **result}
    if view == "precision":
        return {"view": view, "generation_id": generation_id, **_precision(engine, row, checked, context_ids, path)}
    if checked["step"] >= len(path):
        raise CommandError("invalid_field", f"step={checked['step']} is past the generation's {len(path)} steps")
    try:
        result = loop_for(engine).call(lambda: _run(engine, view, checked, params, context_ids, path))
    except ValueError as exc:  # the introspection refused the input (a layer that does not exist, ...)
        raise CommandError("invalid_field", str(exc)) from exc
    return {"view": view, "generation_id": generation_id, "num_steps": len(path), **result}


def _prompt_logprobs(engine: Engine, prompt_ids: list[int], top_n: int) -> list[dict[str, Any]]:
    from inference.introspect.prompt_logprobs import prompt_logprobs

    tokens = prompt_logprobs(engine.model, prompt_ids, top_n)
    for token in tokens:
        token["token_bytes"] = engine.token_table.bytes_of(token["token_id"]).hex()
    return _named(engine, tokens)


def _prompt_ids(row: Generation) -> list[int]:
    return [int(token["id"]) for token in (row.prompt or {}).get("tokens", [])]


def _prompt_of(row: Generation) -> tuple[list[int], list[int]]:
    """(the whole prompt's token ids, no path) of an ended row."""
    _check_ended(row)
    prompt_ids = _prompt_ids(row)
    if not prompt_ids:
        raise CommandError("invalid_params", f"generation {row.pk} has no prompt to inspect")
    return prompt_ids, []


def _check_ended(row: Generation) -> None:
    if row.is_active:
        raise CommandError("invalid_params", f"generation {row.pk} is still {row.status}: inspect it once it ends")


def tokens_of(row: Generation) -> tuple[list[int], list[int]]:
    """(the text's token ids, the path's token ids) of a finished row."""
    _check_ended(row)
    if any(step.get("type") == "beam_step" for step in row.steps):
        raise CommandError("invalid_params", "beam search keeps several paths: its steps cannot be inspected here")
    prompt_ids = _prompt_ids(row)
    generated = [int(step["token_id"]) for step in row.steps]
    num_sent = len((row.inputs or {}).get("token_ids", []))  # earlier requests' tokens of the path
    if not generated or len(prompt_ids) <= num_sent:
        raise CommandError("invalid_params", f"generation {row.pk} has no generated token to inspect")
    return prompt_ids[: len(prompt_ids) - num_sent], prompt_ids[len(prompt_ids) - num_sent :] + generated


def _side_b(row: Generation, other_id: int, context_ids: list[int]) -> tuple[list[int], SamplingParams]:
    """The "ab" view's side B: its path and its own settings, refused unless it continues the
    same text with the same model (`not_comparable`)."""
    other = Generation.objects.filter(pk=other_id).first()
    if other is None:
        raise CommandError("not_found", f"generation {other_id} does not exist")
    if other.model_id != row.model_id:
        raise CommandError("not_comparable", f"generations {row.pk} and {other_id} ran different models")
    other_context, other_path = tokens_of(other)
    if other_context != context_ids:
        raise CommandError("not_comparable", f"generations {row.pk} and {other_id} continue different prompts")
    return other_path, SamplingParams.from_dict(inspection.settings_of(other.params))


def _ab(
    engine: Engine,
    context_ids: list[int],
    a: tuple[list[int], SamplingParams],
    b: tuple[list[int], SamplingParams],
) -> dict[str, Any]:
    """Side A (path, settings) against side B, each path teacher-forced after the same text."""
    from inference.introspect.ab import Side, compare
    from inference.introspect.recompute import recompute

    side_a, side_b = (Side(recompute(engine.model, context_ids, path), params) for path, params in (a, b))
    return _named(engine, compare(side_a, side_b))


def _run(
    engine: Engine, view: str, checked: dict[str, Any], params: SamplingParams, context_ids: list[int], path: list[int]
) -> dict[str, Any]:
    from inference.introspect import lens
    from inference.introspect.recompute import recompute
    from inference.introspect.waterfall import waterfall
    from inference.introspect.whatif import what_if

    step, top_n = checked["step"], checked["top_n"]
    if view == "lens":
        position = len(context_ids) + step - 1  # the token read last before step `step`: it predicts the step
        ids = context_ids + path
        seen = lens.inspect_position(engine.model, ids, position, layer=checked["layer"], top_n=min(top_n, 10))
        seen["embedding"] = lens.embedding_of(engine.model, ids[position], top_n=min(top_n, 10))
        seen["num_layers"] = engine.model.config.num_hidden_layers
        seen["context"] = [{"token_id": i} for i in ids[: position + 1]]
        return {"step": step, **_named(engine, seen)}
    again = recompute(engine.model, context_ids, path if view == "whatif" else path[: step + 1])
    if view == "waterfall":
        fall = waterfall(again.logits(step), again.context(step), params, sampled_token_id=path[step], top_n=top_n)
        return {"step": step, "params": params.to_dict(), **_named(engine, fall)}
    return _named(engine, what_if(again, params, top_n=min(top_n, 10)))


def _kv(engine: Engine, row: Generation, num_tokens: int) -> dict[str, Any]:
    from inference.introspect import kv

    shape = kv.kv_shape(engine.model)
    # The cache holds every position but the last token's (whose keys were never computed).
    cached = row.num_cached_tokens or 0
    return {
        "view": "kv",
        "generation_id": row.pk,
        "shape": shape,
        "measured_bytes_per_token": engine.kv_bytes_per_token(),
        "request": kv.request_kv(shape, max(num_tokens - 1, 0), cached),
        "num_prompt_tokens": row.num_prompt_tokens,
        "dtype": engine.model_info()["dtype"],
    }


def _moe(engine: Engine, row: Generation, context_ids: list[int], path: list[int]) -> dict[str, Any]:
    """Per step: the routing of the forward pass that predicted it, i.e. of the token read last
    before it (the text's last token for step 0, then path[k-1]). These are exactly the
    positions the real generation computed: the last token written was never read."""
    from inference.introspect.moe import NotMoE, routing_trace

    try:
        trace = routing_trace(engine.model, context_ids + path[:-1], first_position=len(context_ids) - 1)
    except NotMoE as exc:
        raise CommandError("not_moe", f"{row.model.name} is a dense model: {exc}") from exc
    for step, token in enumerate(trace["tokens"]):
        token.update(step=step, sampled_token_id=path[step])
    return trace


def _roofline(engine: Engine, row: Generation) -> dict[str, Any]:
    from inference.introspect import kv
    from inference.introspect.architecture import ArchitectureError, shape_from_config
    from inference.introspect.device_limits import device_limits
    from inference.introspect.roofline import roofline
    from inference.introspect.timeline import timeline

    stats = row.stats or {}
    if stats.get("prefill_ms") is None or row.num_prompt_tokens is None:
        raise CommandError("invalid_params", f"generation {row.pk} has no timing to place on a roofline")
    try:
        shape = shape_from_config(engine.model.config.to_dict())
    except ArchitectureError as exc:
        raise CommandError("invalid_params", f"no roofline for this model: {exc}") from exc
    result = roofline(
        shape,
        device_limits(engine.device, engine.loaded.dtype),
        num_prompt=row.num_prompt_tokens,
        num_cached=row.num_cached_tokens or 0,
        element_bytes=kv.kv_shape(engine.model)["element_bytes"],
        prefill_ms=stats["prefill_ms"],
        decode_steps=[(step["index"], step["latency_ms"]) for step in row.steps if step.get("phase") == "decode"],
    )
    return {"view": "roofline", "generation_id": row.pk, "timeline": timeline(stats, row.steps), **result}


def _precision(
    engine: Engine, row: Generation, checked: dict[str, Any], context_ids: list[int], path: list[int]
) -> dict[str, Any]:
    """The path under the served weights and under `checked["precision"]` (loaded beside the
    served model the first time: seconds), both teacher-forced on the engine loop thread."""
    from inference.introspect.precision import compare_precisions

    other = comparison_model(row.model, checked["precision"])
    result = loop_for(engine).call(
        lambda: compare_precisions(engine.model, other.model, context_ids, path, checked["top_n"])
    )
    served = engine.model_info()["precision"]
    return {"served_precision": served, "other_precision": other.precision, **_named(engine, result)}


def _named(engine: Engine, value: Any) -> Any:
    """Adds each token's piece next to its id, recursively."""
    if isinstance(value, dict):
        named = {key: _named(engine, item) for key, item in value.items()}
        for key in ("token_id", "original_token_id", "sampled_token_id", "a_token_id", "b_token_id"):
            if isinstance(value.get(key), int):
                named[key.replace("token_id", "piece")] = engine.piece(value[key])
        return named
    if isinstance(value, list):
        return [_named(engine, item) for item in value]
    return value
