"""Chat templates: messages -> prompt text, rendered the way `transformers` renders it.

Owns: sandboxed Jinja2 rendering with the same environment as transformers'
`apply_chat_template` (same globals, filters and variables, so the text is identical), the
message validation, the spans that say which characters are special tokens, role markers or
message content, and template validation for the admin. (The `<think>` split of a reasoning
model's output is `reasoning`'s.)
Must not know: models, token ids (it works on text; the tokenizer is only read for its
special-token strings), Django.
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from inference.text.reasoning import split_reasoning

VALID_ROLES = ("system", "user", "assistant", "tool")
SpanKind = str  # "special" | "role" | "content"

# Names the template itself binds; `extra` variables may not shadow them.
_RESERVED_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt"})
_SENTINEL_OPEN, _SENTINEL_CLOSE = "\ue000", "\ue001"  # private-use: no template or user text has them
_SAMPLE_CONVERSATION = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello!"},
    {"role": "assistant", "content": "Hi! How can I help?"},
    {"role": "user", "content": "What is 2 + 2?"},
)
_PLACEHOLDER_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
# A template is user code run in the web process (admin validation) and the worker: one render
# may take at most this long and produce at most this many characters (a real prompt renders
# in milliseconds and is bounded by the token limit long before this).
MAX_RENDER_SECONDS = 2.0
MAX_RENDER_CHARS = 2_000_000


class ChatTemplateError(ValueError):
    """A template that does not compile or render; the message is meant for a person."""


@dataclass(frozen=True)
class Span:
    start: int
    end: int
    kind: SpanKind
    role: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "kind": self.kind, "role": self.role}


@dataclass(frozen=True)
class RenderedPrompt:
    """The prompt text and spans that cover it in order, without gaps or overlap.
    `dropped_reasoning`: indices of the messages whose `<think>` reasoning the template left
    out (DeepSeek-R1's drops earlier turns' reasoning from the history)."""

    text: str
    spans: tuple[Span, ...]
    dropped_reasoning: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "spans": [s.to_dict() for s in self.spans],
            "dropped_reasoning": list(self.dropped_reasoning),
        }


@dataclass(frozen=True)
class TemplateTokens:
    """What a template needs from the tokenizer.

    `variables` are the named special tokens templates read (`bos_token`, `eos_token`, ...);
    `strings` are the texts that tokenize to one added token (marked as "special" spans).
    """

    variables: Mapping[str, str] = field(default_factory=dict)
    strings: tuple[str, ...] = ()

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> "TemplateTokens":
        # whitespace-only added tokens (Gemma's "\n" runs) are ordinary text in a template
        strings = {t.content for t in tokenizer.added_tokens_decoder.values() if t.content.strip()}
        return cls(dict(tokenizer.special_tokens_map), tuple(sorted(strings)))


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    template: str,
    *,
    special_tokens: TemplateTokens | None = None,
    add_generation_prompt: bool = True,
    tools: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> RenderedPrompt:
    """Render `messages` with `template`; equals `tokenizer.apply_chat_template(messages,
    tokenize=False, add_generation_prompt=...)` for a tokenizer with these special tokens.

    `tools`: function definitions (OpenAI's `{"type": "function", "function": {...}}`), the
    template's `tools` as `apply_chat_template(tools=...)` passes them; None: no tools.
    `extra` become template variables (e.g. `enable_thinking=False`, `date_string=...`).
    Bad messages are a `ValueError`; a template that fails is a `ChatTemplateError`.
    """
    chat = validate_messages(messages)
    tokens = special_tokens or TemplateTokens()
    shadowed = sorted(_RESERVED_VARIABLES & set(extra))
    if shadowed:
        raise ValueError(f"template variable(s) {', '.join(shadowed)} are set by render_chat itself")
    for name, value in {**extra, "tools": tools}.items():
        _check_plain(name, value)
    compiled = _compile(template)
    context = {
        **tokens.variables,
        **extra,
        "tools": tools,
        "documents": None,
        "add_generation_prompt": bool(add_generation_prompt),
    }
    text = _render(compiled, {**context, "messages": chat})
    spans = _spans(compiled, context, chat, text, tokens.strings, add_generation_prompt)
    return RenderedPrompt(text, tuple(spans), _dropped_reasoning(chat, text))


def _dropped_reasoning(chat: list[dict[str, str]], text: str) -> tuple[int, ...]:
    """Assistant messages with reasoning (`reasoning`'s rule) that the rendered text lacks."""
    dropped = []
    for i, message in enumerate(chat):
        if message["role"] == "assistant":
            reasoning, _ = split_reasoning(message["content"])
            if reasoning and reasoning not in text:
                dropped.append(i)
    return tuple(dropped)


def validate_messages(messages: Any) -> list[dict[str, str]]:
    """A fresh list of plain `{"role", "content"}` dicts, or a ValueError naming the problem."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError("messages must be a non-empty list of {role, content} objects")
    chat = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ValueError(f"messages[{i}] must be an object with role and content, not {type(message).__name__}")
        unknown = sorted(set(message) - {"role", "content"})
        if unknown:
            raise ValueError(f"messages[{i}] has unknown field(s): {', '.join(map(str, unknown))}")
        role, content = message.get("role"), message.get("content")
        if role not in VALID_ROLES:
            raise ValueError(f"messages[{i}].role={role!r} must be one of {', '.join(VALID_ROLES)}")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string, not {type(content).__name__}")
        chat.append({"role": role, "content": content})
    return chat


def _check_plain(name: str, value: Any) -> None:
    """Template variables must be plain JSON data: the sandbox cannot know which methods
    of a richer object are dangerous."""
    if value is None or type(value) in (str, int, float, bool):
        return
    if type(value) in (list, tuple):
        for item in value:
            _check_plain(name, item)
    elif type(value) is dict:
        for key, item in value.items():
            _check_plain(name, key)
            _check_plain(name, item)
    else:
        raise ValueError(f"template variable {name} holds a {type(value).__name__}; only JSON data is allowed")


def validate_template(source: str, special_tokens: TemplateTokens | None = None) -> str:
    """Compile `source` and render a sample conversation (system, user, assistant, user).

    Returns the rendered sample; raises `ChatTemplateError` with a readable message for a
    syntax error (with its line), a sandbox violation, an undefined value or a template
    that raises. Templates that refuse system messages (strict user/assistant alternation)
    are tried once more without one.
    """
    tokens = special_tokens or TemplateTokens(_PLACEHOLDER_TOKENS, tuple(_PLACEHOLDER_TOKENS.values()))
    try:
        return render_chat(_SAMPLE_CONVERSATION, source, special_tokens=tokens).text
    except ChatTemplateError as error:
        if not isinstance(error.__cause__, _TemplateRaised):
            raise
        return render_chat(_SAMPLE_CONVERSATION[1:], source, special_tokens=tokens).text


# --- rendering -------------------------------------------------------------------------


class _TemplateRaised(jinja2.TemplateError):
    """`raise_exception(...)` called by the template itself."""


class _TemplateTooBig(jinja2.TemplateError):
    """The template exceeded a resource limit (time, output size, one value's size)."""


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """The transformers sandbox, except that touching an unsafe attribute fails at once
    (the stock sandbox renders `{{ ''.__class__ }}` as an empty string), and no single
    operation may build a value larger than MAX_RENDER_CHARS (`'x' * 10**9`, `'x'.center(10**9)`,
    `10 ** 10**9`): these run in C, where the time limit cannot interrupt them."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise jinja2.exceptions.SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _check_binop(operator, left, right)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja's signature)
        _check_sizes(args, kwargs.values())
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """`'...'.format` / `format_map` (the sandbox wraps them; checked as they are looked up)."""
        spec = getattr(value, "__self__", None)
        if isinstance(spec, str):
            _check_format(spec)
        return super().wrap_str_format(value)


def _too_big(what: str) -> _TemplateTooBig:
    return _TemplateTooBig(f"{what} exceeds the limit of {MAX_RENDER_CHARS:,} characters")


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (str, list, tuple)) else 0


def _check_binop(operator: str, left: Any, right: Any) -> None:
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            if _size(seq) and isinstance(times, int) and _size(seq) * times > MAX_RENDER_CHARS:
                raise _too_big(f"repeating a value {times:,} times")
        if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > 100_000:
            raise _too_big("the product")
    elif operator == "+" and _size(left) + _size(right) > MAX_RENDER_CHARS:
        raise _too_big("the concatenation")
    elif operator == "%" and isinstance(left, str):
        _check_format(left)
        _check_sizes(right if isinstance(right, tuple) else (right,))
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
        if right * math.log2(abs(left)) > 100_000:
            raise _too_big(f"{left} ** {right}")


def _check_format(spec: str) -> None:
    """A width in a format string (`'%999999999d'`, `'{:>999999999}'`) builds the value in C."""
    if any(len(digits) > 6 and int(digits) > MAX_RENDER_CHARS for digits in re.findall(r"\d+", spec)):
        raise _too_big("a width in the format string")


def _check_sizes(*groups: Any) -> None:
    """Arguments of a call or filter: a width or count beyond the output limit can only build
    a value too large to keep (`center`, `ljust`, `indent`, `wordwrap`, ...)."""
    for group in groups:
        for value in group:
            if isinstance(value, int) and not isinstance(value, bool) and value > MAX_RENDER_CHARS:
                raise _too_big(f"the argument {value:,}")


def _bounded_filter(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)  # keeps jinja's pass_context/pass_eval_context markers
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _check_sizes(args, kwargs.values())
        return fn(*args, **kwargs)

    return bounded


class _Deadline:
    """Interrupts a render that runs longer than `seconds`: a line tracer on the template's
    own frames (Jinja compiles a template to Python code named "<template>"; a loop's every
    iteration is a line event there). Other frames keep whatever tracer they had."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.outer = sys.gettrace()

    def __enter__(self) -> "_Deadline":
        sys.settrace(self._on_call)
        return self

    def __exit__(self, *exc: Any) -> None:
        sys.settrace(self.outer)

    def _on_call(self, frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename == "<template>":
            self._check()
            return self._on_line
        return self.outer(frame, event, arg) if self.outer else None

    def _on_line(self, frame: Any, event: str, arg: Any) -> Any:
        self._check()
        return self._on_line

    def _check(self) -> None:
        if time.monotonic() > self.at:
            raise _TemplateTooBig(f"rendering took longer than {self.seconds:g} s (a loop that runs too long?)")


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (assistant-mask markers): renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class _TemplateNamespace(jinja2.utils.Namespace):
    """`namespace()` that refuses underscore attributes (CPython internals), as transformers'."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _check_namespace_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_namespace_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _check_namespace_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} may not start with '_'")


class _TemplateDict:
    """`dict(...)` without exposing the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters; transformers' does not.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@lru_cache(maxsize=64)
def _compile(source: str) -> jinja2.Template:
    if not isinstance(source, str) or not source.strip():
        raise ChatTemplateError("the chat template is empty")
    env = _StrictSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters.update({name: _bounded_filter(fn) for name, fn in env.filters.items()})
    env.globals.update(
        raise_exception=_raise_exception, strftime_now=_strftime_now, dict=_TemplateDict(), namespace=_TemplateNamespace
    )
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise ChatTemplateError(f"syntax error on line {error.lineno}: {error.message}") from error


def _render(compiled: jinja2.Template, context: dict[str, Any]) -> str:
    try:
        return _bounded_render(compiled, context)
    except Exception as error:  # a template is user code: any failure is its failure
        raise ChatTemplateError(_describe_render_error(error)) from error


def _bounded_render(compiled: jinja2.Template, context: dict[str, Any]) -> str:
    """`compiled.render(context)` within MAX_RENDER_SECONDS and MAX_RENDER_CHARS."""
    parts, size = [], 0
    with _Deadline(MAX_RENDER_SECONDS):
        for part in compiled.generate(context):
            size += len(part)
            if size > MAX_RENDER_CHARS:
                raise _too_big("the rendered prompt")
            parts.append(part)
    return "".join(parts)


def _describe_render_error(error: Exception) -> str:
    where = _template_line(error)
    where = f" on line {where}" if where else ""
    if isinstance(error, _TemplateRaised):
        return f"the template raised an error{where}: {error}"
    if isinstance(error, _TemplateTooBig):
        return f"the template is too expensive{where}: {error}"
    if isinstance(error, OverflowError):  # the sandbox's range() bound
        return f"the template is too expensive{where}: {error}"
    if isinstance(error, jinja2.exceptions.SecurityError):
        return f"forbidden by the sandbox{where}: {error}"
    if isinstance(error, jinja2.UndefinedError):
        return f"undefined value{where}: {error}"
    return f"rendering failed{where}: {type(error).__name__}: {error}"


def _template_line(error: BaseException) -> int | None:
    """The template line a render error came from (Jinja rewrites tracebacks to point there)."""
    line, tb = None, error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


# --- spans -----------------------------------------------------------------------------


def _spans(
    compiled: jinja2.Template,
    context: dict[str, Any],
    chat: list[dict[str, str]],
    text: str,
    special_strings: tuple[str, ...],
    add_generation_prompt: bool,
) -> list[Span]:
    """Find where each message's content landed by rendering once more with a unique
    sentinel in place of each content; what lies between contents is template text."""
    longest_first = sorted(special_strings, key=len, reverse=True)  # "<|im_end|>" before "<|im"
    special_re = re.compile("|".join(map(re.escape, longest_first))) if longest_first else None
    located = _locate_contents(compiled, context, chat, text)
    if located is None:  # the template treated sentinels unlike real content: no roles known
        return _split_special(0, len(text), text, special_re, "content", None)
    tail_role = "assistant" if add_generation_prompt else chat[-1]["role"]
    spans: list[Span] = []
    pos = 0
    for start, end, index in located + [(len(text), len(text), None)]:
        role = chat[index]["role"] if index is not None else tail_role
        spans += _split_special(pos, start, text, special_re, "role", role)
        spans += _split_special(start, end, text, special_re, "content", role)
        pos = end
    return spans


def _locate_contents(
    compiled: jinja2.Template, context: dict[str, Any], chat: list[dict[str, str]], text: str
) -> list[tuple[int, int, int]] | None:
    """(start, end, message index) of every rendered content, in order, or None."""
    sentinels = [f"{_SENTINEL_OPEN}{i}{_SENTINEL_CLOSE}" for i in range(len(chat))]
    try:
        skeleton = _bounded_render(
            compiled, {**context, "messages": [{"role": m["role"], "content": s} for m, s in zip(chat, sentinels)]}
        )
    except Exception:  # e.g. a template that inspects content; the real render worked
        return None
    parts = re.split(f"{_SENTINEL_OPEN}(\\d+){_SENTINEL_CLOSE}", skeleton)
    literals, indices = parts[0::2], [int(i) for i in parts[1::2]]
    if any(_SENTINEL_OPEN in s or _SENTINEL_CLOSE in s for s in literals):
        return None
    contents = [chat[i]["content"] for i in indices]
    if "".join(lit + c for lit, c in zip(literals, contents + [""])) == text:
        located, pos = [], 0
        for lit, content, index in zip(literals, contents, indices):
            pos += len(lit)
            located.append((pos, pos + len(content), index))
            pos += len(content)
        return located
    return _align(literals, contents, indices, text)


def _align(
    literals: list[str], contents: list[str], indices: list[int], text: str
) -> list[tuple[int, int, int]] | None:
    """Contents the template rewrote (trimmed, reasoning cut out): find the template text
    around them in order; each content is what lies between."""
    if not text.startswith(literals[0]) or not text.endswith(literals[-1]):
        return None
    located, pos = [], len(literals[0])
    last = len(contents) - 1
    for n, (content, index, lit) in enumerate(zip(contents, indices, literals[1:])):
        end = len(text) - len(lit) if n == last else _content_end(text, pos, content, lit)
        if end is None or end < pos:
            return None
        located.append((pos, end, index))
        pos = end + len(lit)
    return located


def _content_end(text: str, pos: int, content: str, next_literal: str) -> int | None:
    # prefer the content as written (or trimmed) when the template text follows it, so a
    # content that itself contains the next template text is not cut short
    for candidate in (content, content.strip(), content.lstrip(), content.rstrip()):
        end = pos + len(candidate)
        if text.startswith(candidate, pos) and text.startswith(next_literal, end):
            return end
    found = text.find(next_literal, pos)
    return None if found < 0 else found


def _split_special(
    start: int, end: int, text: str, special_re: re.Pattern | None, kind: SpanKind, role: str | None
) -> list[Span]:
    """Spans for text[start:end]: special-token strings as "special", the rest as `kind`."""
    spans, pos = [], start
    if special_re is not None:
        for match in special_re.finditer(text, start, end):
            if match.start() > pos:
                spans.append(Span(pos, match.start(), kind, role))
            spans.append(Span(match.start(), match.end(), "special", role))
            pos = match.end()
    if end > pos:
        spans.append(Span(pos, end, kind, role))
    return spans
