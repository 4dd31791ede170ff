"""The chat template a model's conversations use, as the web host sees it, and the system
prompt that template adds by itself (the chat page shows it as the system prompt's placeholder).

Owns: finding the template: the admin's `default_chat_template`, else the model folder's
`chat_template.jinja` or `tokenizer_config.json`'s `chat_template` (the folder that holds its
config.json, `architecture.config_path`). Must not know: the engine, the worker.
"""

from __future__ import annotations

import json
from pathlib import Path

from inference.text.default_system_prompt import default_system_prompt
from playground.models import LanguageModel
from playground.web.architecture import config_path

_MAX_FILE_BYTES = 16 << 20  # a tokenizer_config.json with many added tokens runs to a few MB


def template_source(model: LanguageModel) -> str | None:
    """The template a new conversation with `model` renders with, if this host can read it."""
    if model.default_chat_template is not None:
        return model.default_chat_template.source
    config = config_path(model.to_engine_config().source)
    if config is None:
        return None
    jinja = config.parent / "chat_template.jinja"
    if _is_readable(jinja):
        return jinja.read_text(errors="replace")
    tokenizer_config = config.parent / "tokenizer_config.json"
    if not _is_readable(tokenizer_config):
        return None
    try:
        template = json.loads(tokenizer_config.read_text()).get("chat_template")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
    if isinstance(template, list):  # several named templates: the chat one is "default"
        template = next(
            (t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"), None
        )
    return template if isinstance(template, str) and template else None


def model_default_system_prompt(model: LanguageModel) -> str | None:
    source = template_source(model)
    return default_system_prompt(source) if source else None


def _is_readable(path: Path) -> bool:
    return path.is_file() and path.stat().st_size <= _MAX_FILE_BYTES
