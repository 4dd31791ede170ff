"""The system prompt a chat template adds by itself when the conversation has none.

Owns: finding it by rendering the template twice, once with a marker system message and once
without any, and reading off what stands where the marker stood (SmolLM2's and Qwen's
templates inject a default; Llama's adds only a date header, which is not a system prompt).
Must not know: models, tokenizers, Django.
"""

from __future__ import annotations

from functools import lru_cache

from inference.text.chat_template import render_chat

# Private-use characters: no template writes them, so where they land is unambiguous.
_SYSTEM_MARK, _USER_MARK = "\ue010", "\ue011"


@lru_cache(maxsize=32)
def default_system_prompt(template: str) -> str | None:
    """The text the template puts in the system turn of a conversation without one; None when
    it adds none (or the template cannot render a plain user turn)."""
    user = {"role": "user", "content": _USER_MARK}
    try:
        marked = render_chat([{"role": "system", "content": _SYSTEM_MARK}, user], template).text
        plain = render_chat([user], template).text
    except ValueError:  # ChatTemplateError included: then the placeholder stays generic
        return None
    if marked.count(_SYSTEM_MARK) != 1 or _USER_MARK not in marked:
        return None
    before, after = marked.split(_SYSTEM_MARK)
    between = after[: after.index(_USER_MARK)]  # the system turn's end up to the user's content
    if not plain.startswith(before):
        return None
    end = plain.find(between, len(before))
    injected = plain[len(before) : end].strip() if end >= 0 else ""
    return injected or None
