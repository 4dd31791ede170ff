"""Which model answers when nobody chose one, and whether a model can answer on this host.

Owns: the effective default model (the default row, unless it is a bundled model this host could
not prepare: then the bundled SmolLM2 row, and the reason), and each row's `unavailable_reason`
and one-line `summary` (the catalog's, for bundled models: how big it is, what it speaks). Read
from files only (`inference.bundled_models`), so the web process and the worker ask alike.
Must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings

from inference.bundled_models import SMOLLM2, bundled_model, preparation_problem
from playground.models import LanguageModel


@dataclass(frozen=True)
class DefaultChoice:
    model: LanguageModel | None  # None: no model is configured at all
    fallback_reason: str = ""  # set when the default row cannot answer here and SmolLM2 answers instead


def unavailable_reason(model: LanguageModel) -> str | None:
    """Why `model` cannot answer on this host (a bundled model not prepared here), else None."""
    bundled = bundled_model(model.source)
    return preparation_problem(bundled, settings.PLAYGROUND_DATA_DIR) if bundled else None


def summary(model: LanguageModel) -> str:
    """One sentence about the model the page shows under its name (bundled models have one)."""
    bundled = bundled_model(model.source)
    return bundled.summary if bundled else ""


def default_model() -> DefaultChoice:
    """The model a request without a choice gets: the default row, or, when that is a bundled
    model this host could not prepare, the enabled bundled SmolLM2 row (with the reason)."""
    chosen = LanguageModel.default()
    reason = unavailable_reason(chosen) if chosen is not None else None
    if reason is None:
        return DefaultChoice(chosen)
    fallback = LanguageModel.objects.filter(source=SMOLLM2.source, is_enabled=True).first()
    if fallback is None:  # nothing to fall back to: the request is refused with the reason
        return DefaultChoice(chosen)
    return DefaultChoice(fallback, f"{reason}; {fallback.name} answers instead")
