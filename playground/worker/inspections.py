"""Inspections of a finished generation, run by the Celery worker: the Django <-> introspect bridge.

Owns: reading the generation's tokens from its row (the prompt as the model saw it, then the
generated path), asking `inference.introspect.inspector` for the view through the engine
loop (the only thread that touches the engine), and sending the one answer to the web
process's reply channel. Nothing is kept between inspections: the logits
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

from inference.introspect.architecture import ArchitectureError
from inference.introspect.inspector import Inspector
from inference.introspect.moe import NotMoE
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
    inspector = Inspector(engine)
    # The engine's thread (the only one that touches its model), paced: the batch steps between its chunks.
    on_loop = loop_for(engine).call_paced
    head = {"view": view, "generation_id": generation_id}
    if view == "prompt_logprobs":
        return {**head, "tokens": on_loop(lambda: inspector.prompt_logprobs(context_ids, checked["top_n"]))}
    if view == "kv":
        num_tokens = len(context_ids) + len(path)
        kv = on_loop(lambda: inspector.kv(num_tokens, row.num_cached_tokens or 0))
        return {**head, "num_prompt_tokens": row.num_prompt_tokens, **kv}
    if view == "moe":
        try:
            trace = on_loop(lambda: inspector.moe(context_ids, path))
        except NotMoE as exc:
            raise CommandError("not_moe", f"{row.model.name} is a dense model: {exc}") from exc
        return {**head, "num_steps": len(path), **trace}
    if view == "roofline":  # on the loop thread: the device is measured with nothing else running
        return {**head, **on_loop(lambda: _roofline(inspector, row))}
    if view == "ab":
        other_id = checked["other_generation_id"]
        b = _side_b(row, other_id, context_ids)
        result = on_loop(lambda: inspector.ab(context_ids, (path, params), b))
        return {**head, "other_generation_id": other_id, **result}
    if view == "precision":
        other = comparison_model(row.model, checked["precision"])
        return {**head, **on_loop(lambda: inspector.precision(other, context_ids, path, checked["top_n"]))}
    if checked["step"] >= len(path):
        raise CommandError("invalid_field", f"step={checked['step']} is past the generation's {len(path)} steps")
    step, layer, top_n = checked["step"], checked.get("layer"), checked["top_n"]
    try:
        result = on_loop(lambda: inspector.view(view, step, layer, top_n, params, context_ids, path))
    except ValueError as exc:  # the introspection refused the input (a layer that does not exist, ...)
        raise CommandError("invalid_field", str(exc)) from exc
    return {**head, "num_steps": len(path), **result}


def _roofline(inspector: Inspector, row: Generation) -> dict[str, Any]:
    stats = row.stats or {}
    if stats.get("prefill_ms") is None or row.num_prompt_tokens is None:
        raise CommandError("invalid_params", f"generation {row.pk} has no timing to place on a roofline")
    try:
        return inspector.roofline(stats, row.steps, row.num_prompt_tokens, row.num_cached_tokens or 0)
    except ArchitectureError as exc:
        raise CommandError("invalid_params", f"no roofline for this model: {exc}") from exc


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
