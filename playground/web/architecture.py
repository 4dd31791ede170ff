"""HTTP JSON for the architecture card (`/api/architectures/...`, the `/architecture/` page).

Owns: finding a registered model's `config.json` as the web process sees it (the same data dir
and Hugging Face cache as the workers), or its shape in a `.gguf` file's header, the query
parameters `context` and `dtype`, and the list of models that have a card. The numbers come from
`inference.introspect.architecture`, which is pure arithmetic on the config: no weights, no torch.
Must not know: the engine, the worker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.translation import gettext

import inference.introspect.architecture as arch
from inference.bundled_models import bundled_model
from inference.gguf_file import GgufError, read_header
from playground.models import LanguageModel
from playground.protocol import CommandError
from playground.web.endpoints import endpoint

_CONFIG_BYTES = 1 << 20


def _query(request: HttpRequest) -> dict[str, Any]:
    raw_context = request.GET.get("context", "4096")
    try:
        context = int(raw_context)
    except ValueError:
        raise CommandError(
            "invalid_field", gettext("context=%(value)r must be an integer") % {"value": raw_context}
        ) from None
    if not 1 <= context <= arch.MAX_CONTEXT:
        raise CommandError(
            "invalid_field",
            gettext("context must be from 1 to %(max)s, not %(value)s") % {"max": arch.MAX_CONTEXT, "value": context},
        )
    dtype = request.GET.get("dtype") or None
    if dtype is not None and dtype not in arch.DTYPE_BYTES:
        raise CommandError("invalid_field", f"dtype must be one of {', '.join(arch.DTYPE_BYTES)}, not {dtype!r}")
    return {"context": context, "dtype": dtype}


def config_path(source: str) -> Path | None:
    """Where the model's config.json is, if this host has it: a bundled model's converted
    folder, a local folder, or a hub id's snapshot in the Hugging Face cache."""
    bundled = bundled_model(source)
    if bundled is not None:
        return bundled.folder(settings.PLAYGROUND_DATA_DIR) / "config.json"
    path = Path(source)
    try:
        if path.is_absolute():
            return path / "config.json" if path.is_dir() else None
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(source, "config.json")
    except (ValueError, OSError):  # not a hub id (HFValidationError), or not a path this host can have
        return None
    return Path(cached) if isinstance(cached, str) else None


def model_config(model: LanguageModel) -> dict[str, Any]:
    source = model.to_engine_config().source
    if source.lower().endswith(".gguf"):
        return gguf_config(model.name, Path(source))
    path = config_path(source)
    if path is None or not path.is_file():
        where = f" ({path})" if path else ""
        raise CommandError(
            "model_unavailable",
            f"no config.json for {model.name}{where}: the card needs a Hugging Face folder, a cached hub id "
            "or a .gguf file",
        )
    if path.stat().st_size > _CONFIG_BYTES:
        raise CommandError("model_unavailable", f"{path} is larger than a config.json can be")
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CommandError("model_unavailable", f"{path} is not valid JSON: {exc}") from exc


def gguf_config(name: str, path: Path) -> dict[str, Any]:
    """A `.gguf` model's shape from its header (metadata and tensor table; no weight is read)."""
    try:
        return arch.config_from_gguf(read_header(path))
    except GgufError as exc:  # damaged, cut short, unreadable: the reader says which
        raise CommandError("model_unavailable", f"{name}: {exc}") from exc


def accepts_images(model: LanguageModel) -> bool | None:
    """Whether `model` takes images, from its config.json as this host sees it, by the loader's
    rule (`inference.vision.encoder.VisionSpec.of`): a `vision_config` and an `image_token_id`.
    A .gguf source is a text model (its conversion loads text models only). None when this host
    cannot read the config: the worker then decides (`images_not_supported`)."""
    source = model.to_engine_config().source
    if source.lower().endswith(".gguf"):
        return False
    path = config_path(source)
    if path is None or not path.is_file() or path.stat().st_size > _CONFIG_BYTES:
        return None
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(config, dict):
        return None
    return isinstance(config.get("vision_config"), dict) and config.get("image_token_id") is not None


def _card(config: dict[str, Any], name: str, query: dict[str, Any]) -> dict[str, Any]:
    try:
        return arch.card(config, name=name, **query)
    except arch.ArchitectureError as exc:
        raise CommandError("model_unavailable", f"{name}: {exc}") from exc


@endpoint("GET")
def architecture_list(request: HttpRequest) -> HttpResponse:
    """The cards there are: each enabled model and each reference config."""
    models = [
        {"id": m.pk, "name": m.name, "is_default": m.is_default} for m in LanguageModel.objects.filter(is_enabled=True)
    ]
    references = [{"key": key, "name": name} for key, name in arch.REFERENCE_MODELS.items()]
    return JsonResponse({"models": models, "references": references})


@endpoint("GET")
def reference_architecture(request: HttpRequest, key: str) -> HttpResponse:
    query = _query(request)
    if key not in arch.REFERENCE_MODELS:
        raise CommandError("not_found", f"no reference architecture {key!r}; known: {', '.join(arch.REFERENCE_MODELS)}")
    config = arch.reference_config(key)
    if config.get("dtype") == "fp8" and query["dtype"] is None:
        query["dtype"] = "bfloat16"  # the card's default for DeepSeek's fp8 release: as most runtimes load it
    return JsonResponse(_card(config, arch.REFERENCE_MODELS[key], query) | {"key": key})


@endpoint("GET")
def model_architecture(request: HttpRequest, model_id: int) -> HttpResponse:
    query = _query(request)
    model = LanguageModel.objects.filter(pk=model_id, is_enabled=True).first()
    if model is None:
        raise CommandError("not_found", f"no enabled model {model_id}")
    return JsonResponse(_card(model_config(model), model.name, query) | {"model_id": model.pk})
