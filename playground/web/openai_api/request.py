"""Reads and checks an OpenAI request body: every refusal is an `ApiError` naming its field.

Owns: which request fields exist (OpenAI's, plus our extras `top_k`, `min_p`,
`repetition_penalty`, `penalize_prompt`, `preset`, `ignore_eos`, `timings`, `raw_logprobs`,
`max_thinking_tokens`, `speculative`, `num_speculative_tokens`), their types and ranges, and their
translation into the `overrides` of `SamplingParams` (whose own checks then apply, in `submit`):
`response_format` becomes its `grammar`, checked here so a refused schema names `response_format`
and nothing is queued; `prediction` (OpenAI's Predicted Outputs) becomes its `prediction` text.
Must not know: the ORM, the channel layer.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.http import HttpRequest

from inference.sampling.grammar_spec import check as check_grammar
from inference.sampling_params import MAX_PREDICTION_CHARS, MAX_SPECULATIVE_TOKENS, SamplingParams
from playground.web import request_body
from playground.web.openai_api import tool_calls
from playground.web.openai_api.errors import ApiError, from_command_error, invalid

MAX_TOP_LOGPROBS = 20
_SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_CHOICES = 128  # `n`, as OpenAI caps it; a client's concurrency caps it further (`run`)
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
# Accepted and ignored: they change nothing an answer of this server could show.
_IGNORED = {"user", "metadata", "store", "service_tier", "logit_bias"}
_COMMON = {
    "model",
    "stream",
    "stream_options",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "top_k",
    "min_p",
    "repetition_penalty",
    "penalize_prompt",
    "preset",
    "ignore_eos",
    "use_prefix_cache",
    "timings",
    "raw_logprobs",
    "max_thinking_tokens",
    "prediction",
    "speculative",
    "num_speculative_tokens",
    *_IGNORED,
}
CHAT_FIELDS = {
    *_COMMON,
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
}
COMPLETION_FIELDS = {*_COMMON, "prompt", "echo", "suffix", "best_of"}


@dataclass
class ApiRequest:
    """A checked request: what to generate, how, and what to send back."""

    model: str
    overrides: dict[str, Any]  # SamplingParams fields
    preset: str | None = None
    stream: bool = False
    include_usage: bool = False
    num_logprobs: int | None = None  # None: no logprobs; else the top alternatives per token
    timings: bool = False
    raw_logprobs: bool = False
    num_choices: int = 1  # `n`: choices per prompt
    messages: list[dict[str, str]] = field(default_factory=list)  # chat
    tools: list[dict[str, Any]] = field(default_factory=list)  # chat: OpenAI's, as the template renders them
    parses_tool_calls: bool = False  # the answer's `<tool_call>`s become `message.tool_calls`
    prompts: list[tuple[str, list[int]]] = field(default_factory=list)  # completions: (text, token ids) each
    echo: bool = False
    is_score_only: bool = False  # completions with echo and max_tokens=0: the prompt's logprobs only
    has_prediction: bool = False  # `prediction` given: usage reports accepted/rejected prediction tokens


def parse_body(request: HttpRequest) -> dict[str, Any]:
    """The body as an object; a body too large, too deep, not UTF-8 or not JSON is refused with
    its `request_body` code."""
    try:
        data = request_body.json_body(request, empty=b"null")
    except request_body.BodyError as exc:
        raise from_command_error(exc) from None
    if not isinstance(data, dict):
        raise ApiError("the body must be a JSON object", code="bad_json")
    return data


def chat_request(data: dict[str, Any]) -> ApiRequest:
    fields = _Fields(data, CHAT_FIELDS)
    request = _common(fields, scores=False)
    grammar = _response_format(fields.get("response_format", dict))
    tool_grammar = tool_calls.read(fields.data, request)
    if grammar is not None and tool_grammar is not None:
        raise invalid("response_format", "response_format cannot be combined with tool_choice required or named")
    if grammar or tool_grammar:
        request.overrides["grammar"] = grammar or tool_grammar
    max_tokens = fields.integer("max_completion_tokens", 1, _max_new_tokens())
    if max_tokens is not None:
        request.overrides["max_new_tokens"] = max_tokens
    if fields.get("logprobs", bool):
        request.num_logprobs = fields.integer("top_logprobs", 0, MAX_TOP_LOGPROBS) or 0
    elif fields.get("top_logprobs", int) is not None:
        raise invalid("top_logprobs", "top_logprobs needs logprobs: true")
    request.messages = _messages(fields.get("messages", list, required=True))
    tool_calls.check_history(fields.data["messages"], request.messages)
    request.overrides["num_alternatives"] = request.num_logprobs or 0
    return request


def completion_request(data: dict[str, Any]) -> ApiRequest:
    fields = _Fields(data, COMPLETION_FIELDS)
    request = _common(fields, scores=True)
    if fields.get("suffix", str):
        raise invalid("suffix", "suffix (insertion) is not supported by this server", "unsupported_parameter")
    if fields.integer("best_of", 1) not in (None, 1):
        raise invalid("best_of", "only best_of=1 is supported (n gives several choices)", "unsupported_parameter")
    request.num_logprobs = fields.integer("logprobs", 0, MAX_TOP_LOGPROBS)
    request.echo = bool(fields.get("echo", bool))
    if request.echo and request.num_logprobs is not None and request.stream:
        raise invalid(
            "echo",
            "echo with logprobs is answered once the prompt's logprobs are computed: use stream=false",
            "unsupported_parameter",
        )
    if fields.data.get("max_tokens") == 0:  # scoring a text: evaluation tools send echo + logprobs + max_tokens=0
        if not (request.echo and request.num_logprobs is not None):
            raise invalid("max_tokens", "max_tokens=0 needs echo=true and logprobs (scoring the prompt)")
        request.is_score_only = True
        request.overrides["max_new_tokens"] = 1  # the engine generates at least one token; it is not returned
    request.prompts = _prompts(data.get("prompt"))
    request.overrides["num_alternatives"] = request.num_logprobs or 0
    return request


def _common(fields: _Fields, *, scores: bool) -> ApiRequest:
    """The fields chat and completions share; `scores`: `max_tokens: 0` asks to score the prompt
    (legacy completions), which a chat cannot."""
    model = fields.get("model", str, required=True)
    request = ApiRequest(model=model, overrides={}, preset=fields.get("preset", str))
    request.stream = bool(fields.get("stream", bool))
    options = fields.get("stream_options", dict)
    if options is not None:
        if not request.stream:
            raise invalid("stream_options", "stream_options is only allowed with stream: true")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise invalid("stream_options.include_usage", "stream_options.include_usage must be true or false")
        request.include_usage = include_usage
    request.num_choices = fields.integer("n", 1, MAX_CHOICES) or 1
    for name in ("presence_penalty", "frequency_penalty"):
        if fields.number(name, -2.0, 2.0):
            raise invalid(
                name, f"{name} is not supported by this engine; use repetition_penalty", "unsupported_parameter"
            )
    request.timings = bool(fields.get("timings", bool))
    request.raw_logprobs = bool(fields.get("raw_logprobs", bool))
    _sampling(fields, request.overrides, scores=scores)
    _speculation(fields, request)
    return request


def _speculation(fields: _Fields, request: ApiRequest) -> None:
    """`prediction` (OpenAI's) and our extras `speculative`, `num_speculative_tokens`. Which draft
    models exist is the model records' business (`submit`), then the engine's."""
    prediction = _prediction(fields.get("prediction", dict))
    if prediction is not None:
        request.overrides["prediction"] = prediction
        request.has_prediction = True
    speculative = fields.get("speculative", str)
    if speculative is not None:
        if not speculative.strip() or len(speculative) > 200:
            raise invalid("speculative", "speculative must be 'off', 'prompt_lookup' or a draft model's name")
        request.overrides["speculative"] = speculative
    num_tokens = fields.integer("num_speculative_tokens", 1, MAX_SPECULATIVE_TOKENS)
    if num_tokens is not None:
        request.overrides["num_speculative_tokens"] = num_tokens


def _prediction(value: dict[str, Any] | None) -> str | None:
    """`prediction: {"type": "content", "content": text or [text parts]}` -> the predicted text."""
    if value is None:
        return None
    unknown = sorted(set(value) - {"type", "content"})
    if unknown:
        raise invalid(f"prediction.{unknown[0]}", f"prediction has unknown field(s): {', '.join(unknown)}")
    kind = value.get("type")
    if kind != "content":
        raise invalid(
            "prediction.type",
            f"prediction.type={kind!r} must be 'content'",
            "unsupported_parameter" if isinstance(kind, str) else "invalid_value",
        )
    content = value.get("content")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid(
                    f"prediction.content[{j}]",
                    f"prediction.content[{j}] must be a text part ({{'type': 'text', 'text': ...}})",
                )
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise invalid("prediction.content", "prediction.content must be a string or a list of text parts")
    if len(content) > MAX_PREDICTION_CHARS:
        raise invalid(
            "prediction.content",
            f"prediction.content has {len(content)} characters; the limit is {MAX_PREDICTION_CHARS}",
        )
    return content


def _sampling(fields: _Fields, overrides: dict[str, Any], *, scores: bool) -> None:
    """The sampling fields the client sent (absent ones keep the preset's values)."""
    is_scoring = scores and fields.data.get("max_tokens") == 0  # checked by `completion_request`
    values = {
        "max_new_tokens": None if is_scoring else fields.integer("max_tokens", 1, _max_new_tokens()),
        "temperature": fields.number("temperature", 0.0, 2.0),
        "top_p": fields.number("top_p", 0.0, 1.0),
        "seed": fields.integer("seed"),
        "top_k": fields.integer("top_k", 0),
        "min_p": fields.number("min_p", 0.0, 1.0),
        "repetition_penalty": fields.number("repetition_penalty"),
        "penalize_prompt": fields.get("penalize_prompt", bool),
        "ignore_eos": fields.get("ignore_eos", bool),
        "use_prefix_cache": fields.get("use_prefix_cache", bool),
        "stop": _stop(fields.data.get("stop")),
        "max_thinking_tokens": fields.integer("max_thinking_tokens", 0),
    }
    overrides.update({name: value for name, value in values.items() if value is not None})
    overrides.update(SamplingParams.resolve_overrides(overrides))  # a temperature: sampled, whatever the preset


def _response_format(value: dict[str, Any] | None) -> dict[str, Any] | None:
    """`response_format` as OpenAI documents it -> the grammar spec (`grammar_spec`); None: free text."""
    if value is None:
        return None
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        spec: dict[str, Any] = {"type": "json_object"}
    elif kind == "json_schema":
        # As JSON text: its properties keep their order in any store (`grammar_spec`).
        spec = {"type": "json_schema", "schema": json.dumps(_json_schema(value.get("json_schema")))}
    else:
        raise invalid(
            "response_format.type",
            f"response_format.type={kind!r} must be one of text, json_object, json_schema",
            "unsupported_parameter" if isinstance(kind, str) else "invalid_value",
        )
    try:
        check_grammar(spec)
    except ValueError as exc:  # "grammar.schema ...": named as the client wrote it
        message = str(exc).replace("grammar.schema", "response_format.json_schema.schema", 1)
        raise invalid("response_format", message.replace("grammar", "response_format", 1)) from None
    return spec


def _json_schema(value: Any) -> dict[str, Any]:
    """The schema of `response_format.json_schema` ({name, schema, strict, description}). The
    answer is constrained to it whatever `strict` says (strict only asks for it)."""
    param = "response_format.json_schema"
    if not isinstance(value, dict):
        raise invalid(param, f"{param} must be an object with name and schema")
    unknown = sorted(set(value) - {"name", "schema", "strict", "description"})
    if unknown:
        raise invalid(f"{param}.{unknown[0]}", f"{param} has unknown field(s): {', '.join(unknown)}")
    name = value.get("name")
    if not isinstance(name, str) or not _SCHEMA_NAME.match(name):
        raise invalid(f"{param}.name", f"{param}.name={name!r} must be 1-64 letters, digits, _ or -")
    if not isinstance(value.get("strict", False), bool):
        raise invalid(f"{param}.strict", f"{param}.strict must be true or false")
    schema = value.get("schema", {})
    if not isinstance(schema, dict):
        raise invalid(f"{param}.schema", f"{param}.schema must be a JSON Schema object")
    return schema


def _max_new_tokens() -> int:
    """The server's limit, checked here so the refusal names the client's field and states the
    limit docs/openai-api.md states (`SamplingParams` alone would allow up to 1,000,000)."""
    return settings.PLAYGROUND_MAX_NEW_TOKENS


def _stop(value: Any) -> list[str] | None:
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise invalid("stop", "stop must be a non-empty string or a list of non-empty strings")
    return stops


def _messages(raw: list[Any]) -> list[dict[str, str]]:
    if not raw:
        raise invalid("messages", "messages must hold at least one message")
    messages = []
    for i, message in enumerate(raw):
        if not isinstance(message, dict):
            raise invalid(f"messages[{i}]", f"messages[{i}] must be an object with role and content")
        role = message.get("role")
        if role not in _ROLES:
            raise invalid(
                f"messages[{i}].role",
                f"messages[{i}].role={role!r} must be one of {', '.join(_ROLES)}",
            )
        content = _content(message.get("content"), i, role)
        if role == "assistant" and message.get("tool_calls") is not None:
            content = tool_calls.as_text(message["tool_calls"], content, f"messages[{i}].tool_calls")
        messages.append({"role": _ROLES[role], "content": content})
    return messages


def _content(content: Any, i: int, role: str) -> str:
    if isinstance(content, str):
        return content
    if content is None and role == "assistant":
        return ""
    if not isinstance(content, list):
        raise invalid(f"messages[{i}].content", f"messages[{i}].content must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise invalid(
                f"messages[{i}].content[{j}]",
                f"messages[{i}].content[{j}] must be a text part ({{'type': 'text', 'text': ...}}); "
                f"{kind or 'this'} parts are not supported",
            )
        texts.append(part["text"])
    return "".join(texts)


def _prompts(prompt: Any) -> list[tuple[str, list[int]]]:
    """[(text, token ids)] of a string, a list of token ids, or a list of either (several prompts)."""
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(_is_token_id(t) for t in prompt)):
        return [_prompt(prompt, "prompt")]
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return [_prompt(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
    raise invalid(
        "prompt", "prompt must be a non-empty string, a list of token ids, or a list of prompts (strings or token ids)"
    )


def _prompt(prompt: str | list[Any], param: str) -> tuple[str, list[int]]:
    if isinstance(prompt, str):
        if not prompt:
            raise invalid(param, f"{param} must not be empty")
        return prompt, []
    if prompt and all(_is_token_id(t) for t in prompt):
        return "", prompt
    raise invalid(param, f"{param} must be a non-empty string or a non-empty list of token ids (integers >= 0)")


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class _Fields:
    """Typed access to a request body; a wrong type or range is an `ApiError` naming the field."""

    _TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", dict: "an object", list: "a list"}

    def __init__(self, data: dict[str, Any], known: set[str]) -> None:
        unknown = sorted(set(data) - known)
        if unknown:
            raise invalid(unknown[0], f"unrecognized request argument: {', '.join(unknown)}", "unknown_parameter")
        self.data = data

    def get(self, name: str, kind: type, *, required: bool = False) -> Any:
        value = self.data.get(name)
        if value is None:
            if required:
                raise invalid(name, f"{name} is required", "missing_required_parameter")
            return None
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise invalid(name, f"{name}={value!r} must be {self._TYPE_NAMES[kind]}", "invalid_type")
        return value

    def integer(self, name: str, low: int | None = None, high: int | None = None) -> int | None:
        value = self.get(name, int)
        if value is not None and ((low is not None and value < low) or (high is not None and value > high)):
            raise invalid(name, f"{name}={value} must be {_range(low, high)}")
        return value

    def number(self, name: str, low: float | None = None, high: float | None = None) -> float | None:
        value = self.data.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise invalid(name, f"{name}={value!r} must be a number", "invalid_type")
        if (low is not None and value < low) or (high is not None and value > high):
            raise invalid(name, f"{name}={value} must be {_range(low, high)}")
        return float(value)


def _range(low: float | None, high: float | None) -> str:
    if high is None:
        return f"at least {low}"
    return f"at most {high}" if low is None else f"between {low} and {high}"
