"""Which model answers when nobody chose one, and whether a model can answer on this host.

Owns: the effective default model (the default row, unless it is a bundled model this host could
not prepare: then the bundled SmolLM2 row, and the reason), and each row's `unavailable_reason`
and one-line `summary` (the catalog's, for bundled models: how big it is, what it speaks), both in
the active language (a page's; English where none is active: the worker, the OpenAI API); and
whether a row is a random-weights demo (`has_random_weights`: its text is noise). Read
from files only (`inference.bundled_models`), so the web process and the worker ask alike.
Must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.utils.translation import gettext, gettext_noop

from inference import sources
from inference.bundled_models import SMOLLM2, BundledModel, bundled_model, preparation_problem
from playground.models import LanguageModel, resolve_source
from playground.protocol import without_server_paths

# The catalog's summaries, marked here for `make messages` (inference/ knows no Django) and looked
# up by their English when a page asks: a test keeps them equal to `BundledModel.summary`.
SUMMARIES = (
    gettext_noop(
        "A very small model (135M parameters): fast, but it often gets facts wrong, drifts into French "
        "and does not speak Chinese."
    ),
    gettext_noop(
        "A small model (0.5B parameters) that answers in English and Chinese (中文); still small: check its facts."
    ),
)


@dataclass(frozen=True)
class DefaultChoice:
    model: LanguageModel | None  # None: no model is configured at all
    fallback_reason: str = ""  # set when the default row cannot answer here and SmolLM2 answers instead


def unavailable_reason(model: LanguageModel) -> str | None:
    """Why `model` cannot answer on this host (a bundled model not prepared here), else None. Said
    to clients (refusals, the model list): a failed preparation's words lose the server's paths."""
    bundled = bundled_model(model.source)
    problem = preparation_problem(bundled, settings.PLAYGROUND_DATA_DIR) if bundled else None
    return None if problem is None else without_server_paths(_translated_problem(bundled, problem))


def _translated_problem(bundled: BundledModel, problem: str) -> str:
    """`preparation_problem`'s sentence in the active language; what a failed preparation wrote
    (pip's or the checksum's words) stays as written. A sentence not known here stays English."""
    failed = f"{bundled.name} could not be prepared: "
    if problem.startswith(failed):
        return gettext("%(name)s could not be prepared: %(reason)s") % {
            "name": bundled.name,
            "reason": problem[len(failed) :],
        }
    if problem.startswith(f"{bundled.name} is not prepared yet: "):
        return gettext(
            "%(name)s is not prepared yet: `python -m inference.models.bundled` (run by `make run`) downloads it"
        ) % {"name": bundled.name}
    return problem


def summary(model: LanguageModel) -> str:
    """One sentence about the model the page shows under its name (bundled models have one)."""
    bundled = bundled_model(model.source)
    return gettext(bundled.summary) if bundled else ""


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


def has_random_weights(model: LanguageModel) -> bool:
    """Whether `model` is one of the random-weights demos (`manage.py demo_model`, `demo_vl_model`):
    its folder's marker says so. A real architecture whose text is noise: never what a client
    that takes the first model should get."""
    path = Path(resolve_source(model.source))
    return path.is_absolute() and sources.has_random_weights(path)
