"""Function calling as OpenAI documents it (`tools`, `tool_choice`, `parallel_tool_calls`, `role: "tool"`
messages, `message.tool_calls`), in the text format of Qwen2.5's template (Hermes'):
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, several calls one per line.

Owns: reading and checking the tool fields (each refusal an `ApiError` naming its field), the grammar a
`required` or named `tool_choice` decodes under (constrained from the first token; `auto` is left
free and its text parsed after), an earlier assistant turn's `tool_calls` as the text the model
wrote (what the template renders for them), and the answer's calls parsed back with their ids.
Must not know: the ORM, the channel layer, torch.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from inference.sampling.grammar_spec import MAX_SPEC_CHARS, MAX_TOOLS
from inference.sampling.grammar_spec import check as check_grammar
from playground.web.openai_api.errors import invalid

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
OPEN_TAG = "<tool_call>"
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


def read(data: dict[str, Any], request: Any) -> dict[str, Any] | None:
    """Checks `tools`, `tool_choice` and `parallel_tool_calls`; sets `request.tools` (what the
    template renders) and `request.parses_tool_calls`; the grammar spec of a required or named
    choice (None: the answer is free text)."""
    raw, choice, parallel = data.get("tools"), data.get("tool_choice"), data.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid("parallel_tool_calls", "parallel_tool_calls must be true or false", "invalid_type")
    if not raw:
        if choice not in (None, "none"):
            raise invalid("tool_choice", "tool_choice needs tools")
        return None
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise invalid("tools", f"tools must be a list of at most {MAX_TOOLS} functions")
    tools = [_tool(tool, i) for i, tool in enumerate(raw)]
    names = [t["function"]["name"] for t in tools]
    duplicate = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if duplicate:
        raise invalid("tools", f"tools defines function {duplicate!r} twice")
    if len(json.dumps(tools)) > MAX_SPEC_CHARS:
        raise invalid("tools", f"tools are more than {MAX_SPEC_CHARS} characters as JSON")
    request.tools = tools
    choice = "auto" if choice is None else choice
    if choice == "none":
        return None
    request.parses_tool_calls = True
    if choice == "auto":
        return None
    if choice == "required":
        chosen, parallel = tools, parallel is not False
    elif isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        chosen = [t for t in tools if t["function"]["name"] == name]
        if not chosen:
            raise invalid("tool_choice", f"tool_choice names function {name!r}, which tools does not define")
        parallel = False
    else:
        raise invalid(
            "tool_choice",
            "tool_choice must be none, auto, required or {'type': 'function', 'function': {'name': ...}}",
        )
    # Each schema as JSON text: its properties keep their order in any store (`grammar_spec`).
    spec_tools = [
        {"name": t["function"]["name"], "parameters": json.dumps(t["function"]["parameters"])} for t in chosen
    ]
    return {"type": "tool_calls", "tools": spec_tools, "parallel": parallel}


def _tool(tool: Any, i: int) -> dict[str, Any]:
    param = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise invalid(param, f"{param} must be {{'type': 'function', 'function': {{name, description, parameters}}}}")
    function = tool["function"]
    unknown = sorted(set(function) - {"name", "description", "parameters", "strict"})
    if unknown:
        raise invalid(f"{param}.function", f"{param}.function has unknown field(s): {', '.join(unknown)}")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise invalid(f"{param}.function.name", f"{param}.function.name={name!r} must be 1-64 letters, digits, _ or -")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid(f"{param}.function.description", f"{param}.function.description must be a string")
    parameters = function.get("parameters", _EMPTY_PARAMETERS)
    if not isinstance(parameters, dict):
        raise invalid(f"{param}.function.parameters", f"{param}.function.parameters must be a JSON Schema object")
    try:
        check_grammar({"type": "tool_calls", "tools": [{"name": name, "parameters": parameters}]})
    except ValueError as exc:
        message = str(exc).replace("grammar.tools[0].parameters", f"{param}.function.parameters", 1)
        raise invalid(f"{param}.function.parameters", message) from None
    function = {"name": name, **({"description": description} if description else {}), "parameters": parameters}
    return {"type": "function", "function": function}


def as_text(calls: Any, content: str, param: str) -> str:
    """An earlier assistant turn's `tool_calls` as the text the model wrote: what Qwen2.5's
    template renders for them (`content`, then each call on its own lines)."""
    if not isinstance(calls, list) or not calls:
        raise invalid(param, f"{param} must be a non-empty list of function calls")
    texts = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise invalid(
                f"{param}[{j}]", f"{param}[{j}] must be {{'type': 'function', 'function': {{name, arguments}}}}"
            )
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (TypeError, ValueError):
            raise invalid(f"{param}[{j}].function.arguments", f"{param}[{j}].function.arguments must be JSON") from None
        body = json.dumps({"name": function["name"], "arguments": arguments}, ensure_ascii=False)
        texts.append(f"{OPEN_TAG}\n{body}\n</tool_call>")
    calls_text = "\n".join(texts)
    return f"{content}\n{calls_text}" if content else calls_text


def check_history(raw: list[Any], messages: list[dict[str, str]]) -> None:
    """A `tool` message answers a call: it carries its `tool_call_id`."""
    for i, (message, checked) in enumerate(zip(raw, messages)):
        if checked["role"] == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise invalid(f"messages[{i}].tool_call_id", f"messages[{i}] (role tool) needs its tool_call_id")


def parse(text: str, names: list[str]) -> tuple[str | None, list[dict[str, Any]]]:
    """The answer's content (None when only calls) and its calls in OpenAI's shape, each with a fresh
    id; a call that does not parse or names no tool stays in the content."""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    position = 0
    for match in _CALL.finditer(text):
        call = _call(match.group(1), names)
        if call is None:
            continue
        kept.append(text[position : match.start()])
        position = match.end()
        calls.append(call)
    kept.append(text[position:])
    content = "".join(kept).strip()
    return (content or None) if calls else text, calls


def _call(body: str, names: list[str]) -> dict[str, Any] | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("name") not in names or not isinstance(value.get("arguments"), dict):
        return None
    arguments = json.dumps(value["arguments"], ensure_ascii=False)
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": value["name"], "arguments": arguments},
    }


def may_become_a_call(text: str) -> bool:
    """Whether a stream's text so far may still be (or is) the start of a tool call: held back."""
    stripped = text.lstrip()
    return stripped.startswith(OPEN_TAG) or OPEN_TAG.startswith(stripped)
