"""EngineConfig -> a loaded model and tokenizer (`LoadedModel`).

Owns: resolving `EngineConfig.source` (a bundled model, a Hugging Face folder, a `.gguf`
file converted once into the data dir, or a hub id already in the local HF cache; nothing
is ever downloaded here: a bundled model that needs a download is prepared beforehand), where
the weights come from (a GGUF source's from the GGUF itself, one tensor at a time; a folder's
through transformers),
choosing device and dtype, and turning every way a load can fail into one `ModelLoadError`
that names the model and what is wrong.
Must not know: generation, sampling, chat rendering, Django.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from inference.bundled_models import bundled_model
from inference.config import EngineConfig
from inference.models.bundled import (
    ConversionError,
    Progress,
    ensure_bundled_model,
    ensure_converted,
    gguf_path_of,
    say,
    tensor_progress,
)
from inference.models.gguf_load import empty_model, fill_from_gguf
from inference.models.memory import release_free_memory
from inference.models.precision import (
    QUANTIZED_BITS,
    LayerQuantizer,
    QuantizationReport,
    activation_dtype,
    dtype_name,
    load_dtype,
    quantize_model,
    resolve_precision,
)
from inference.sources import SourceError, check_tokenizer_files


class ModelLoadError(ValueError):
    """The model could not be loaded; the message names the model and the reason."""


@dataclass(frozen=True)
class LoadedModel:
    """A model ready for inference (eval mode, on `device`) and everything read with it."""

    model: Any  # transformers PreTrainedModel
    tokenizer: Any  # transformers tokenizer
    name: str
    source_path: Path
    dtype: torch.dtype  # of activations (and of the weights, unless quantized)
    device: torch.device
    chat_template: str | None  # the model's own; None when it ships without one
    max_context: int  # min(EngineConfig.max_context, the model's position limit)
    eos_token_ids: tuple[int, ...]
    precision: str = ""  # the resolved weight precision: float32, bfloat16, float16, int8, int4 or gguf
    quantization: QuantizationReport | None = None  # int8 / int4: what was quantized, from where
    image_processor: Any = None  # vision-language models: the checkpoint's image processor


def architecture_of(model: Any) -> str:
    """The checkpoint's architecture name (config.architectures[0]), else the model class's."""
    return (getattr(model.config, "architectures", None) or [type(model).__name__])[0]


def load_model(config: EngineConfig, progress: Progress | None = None) -> LoadedModel:
    """Load `config.source` (slow: do it once per process)."""
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    device = resolve_device(config.device)
    folder, source_name = resolve_source(config, progress)
    gguf_path = gguf_source(config)
    try:
        precision = resolve_precision(config.dtype, device, gguf_path)
    except ValueError as error:
        raise ModelLoadError(f"cannot serve {config.source}: {error}") from error
    dtype = activation_dtype(precision, device)
    name = config.name or source_name
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"{folder} has no config.json, so it is not a Hugging Face model folder")
    if not config.trust_remote_code:  # custom tokenizer code may keep its vocabulary anywhere
        try:
            check_tokenizer_files(folder)
        except SourceError as error:
            raise ModelLoadError(str(error)) from error
    tokenizer = _load_tokenizer(folder, config.trust_remote_code, progress)
    if gguf_path is not None:  # the file's own tensors, one at a time (not the folder's float32 copy)
        model, quantization = _load_gguf_weights(gguf_path, folder, precision, device, config, progress)
    else:
        model = _load_weights(folder, load_dtype(precision, device), device, config.trust_remote_code, progress)
        quantization = _quantize(model, precision, dtype, config, progress)
    _check_tokenizer_size(folder, tokenizer, model)
    chat_template = _chat_template(tokenizer)
    loaded = LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        source_path=folder,
        dtype=dtype,
        device=device,
        chat_template=chat_template,
        max_context=_max_context(model, config, folder),
        eos_token_ids=stop_token_ids(model, tokenizer, chat_template, config.eos_token_ids, folder),
        precision=precision,
        quantization=quantization,
        image_processor=_load_image_processor(folder, model, progress),
    )
    release_free_memory()  # the load's temporaries (bands, float32 copies) sat between the weights
    say(progress, f"{name} ready on {device} in {precision}")
    return loaded


def resolve_device(device: str) -> torch.device:
    """ "auto" is CUDA when available, else CPU; asking for CUDA without it is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            build = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ModelLoadError(
                f"device={device!r} was asked for but CUDA is not available (torch {torch.__version__} is {build})"
            )
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ModelLoadError(f"device={device!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    return resolved


def _quantize(
    model: Any, precision: str, dtype: torch.dtype, config: EngineConfig, progress: Progress | None
) -> QuantizationReport | None:
    if precision not in QUANTIZED_BITS:
        return None
    say(progress, f"quantizing the linear layers to {precision}")
    try:
        return quantize_model(model, precision, dtype, gguf_source(config))
    except ValueError as error:
        raise ModelLoadError(f"cannot serve {config.source} in {precision}: {error}") from error


def gguf_source(config: EngineConfig) -> Path | None:
    """The GGUF file behind `config.source` (its blocks can be served as they are), if any."""
    bundled = bundled_model(config.source)
    if bundled is not None:
        try:
            return gguf_path_of(bundled, config.resolved_data_dir)
        except ConversionError as error:
            raise ModelLoadError(str(error)) from error
    path = Path(config.source).expanduser()
    return path if config.source.lower().endswith(".gguf") and path.is_file() else None


def resolve_source(config: EngineConfig, progress: Progress | None = None) -> tuple[Path, str]:
    """(a local Hugging Face model folder, a display name) for `config.source`."""
    source = config.source
    bundled = bundled_model(source)
    try:
        if bundled is not None:
            return ensure_bundled_model(config.resolved_data_dir, progress, bundled), bundled.name
        path = Path(source).expanduser()
        if source.lower().endswith(".gguf"):
            return _converted_gguf(path, config.resolved_data_dir, progress), path.stem
    except ConversionError as error:
        raise ModelLoadError(str(error)) from error
    if path.is_dir():
        return path.resolve(), path.resolve().name
    if path.exists():
        raise ModelLoadError(f"model source {source} is a file, not a model folder or a .gguf file")
    if _looks_like_path(source):
        raise ModelLoadError(f"model folder {source} does not exist")
    return _cached_hub_snapshot(source), source


def _converted_gguf(gguf_path: Path, data_dir: Path, progress: Progress | None) -> Path:
    if not gguf_path.is_file():
        raise ModelLoadError(f"GGUF file {gguf_path} does not exist")
    stat = gguf_path.stat()
    # a changed file (path, size or mtime) gets a fresh folder; the old one stays valid for its file
    key = f"{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return ensure_converted(gguf_path, data_dir / "models" / f"{gguf_path.stem}-{digest}", progress)


def _looks_like_path(source: str) -> bool:
    # hub ids are "name" or "org/name"; anything else is meant as a path
    return os.path.isabs(source) or source.startswith((".", "~")) or source.count("/") > 1


def _cached_hub_snapshot(repo_id: str) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id=repo_id, local_files_only=True))
    except Exception as error:  # not cached, or not even a valid id
        detail = "" if isinstance(error, LocalEntryNotFoundError) else f" ({_summary(error)})"
        raise ModelLoadError(
            f"model {repo_id!r} is neither a local folder nor in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); downloads are disabled, so fetch it first "
            f"(e.g. `hf download {repo_id}`) or give a folder path{detail}"
        ) from error


def _check_tokenizer_size(folder: Path, tokenizer: Any, model: Any) -> None:
    vocab_size = getattr(model.config.get_text_config(), "vocab_size", None)
    size = len(tokenizer)
    if vocab_size and size < vocab_size // 2:
        raise ModelLoadError(
            f"the tokenizer in {folder} has {size:,} tokens but config.json says vocab_size={vocab_size:,}: "
            "the tokenizer files are incomplete or belong to another model"
        )


def _load_tokenizer(folder: Path, trust_remote_code: bool, progress: Progress | None) -> Any:
    from transformers import AutoTokenizer

    say(progress, f"loading the tokenizer from {folder}")
    try:
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code, local_files_only=True)
    except Exception as error:
        raise ModelLoadError(f"cannot load the tokenizer from {folder}: {_summary(error)}") from error


def _model_class(folder: Path) -> Any:
    """The auto class for the checkpoint: causal LM, or image-text-to-text for a vision-language
    model that has no causal-LM class (DeepSeek-VL)."""
    import json

    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    try:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return AutoModelForCausalLM  # its own error message comes from from_pretrained
    if model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES and model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def _load_image_processor(folder: Path, model: Any, progress: Progress | None) -> Any:
    """The image processor of a vision-language checkpoint (None for a text-only model)."""
    if getattr(model.config, "vision_config", None) is None:
        return None
    if not (folder / "preprocessor_config.json").is_file():
        raise ModelLoadError(f"{folder} is a vision-language model without preprocessor_config.json")
    from transformers import AutoImageProcessor

    say(progress, f"loading the image processor from {folder}")
    try:
        return AutoImageProcessor.from_pretrained(folder, local_files_only=True)
    except Exception as error:
        raise ModelLoadError(f"cannot load the image processor from {folder}: {_summary(error)}") from error


def _load_weights(
    folder: Path, dtype: torch.dtype, device: torch.device, trust_remote_code: bool, progress: Progress | None
) -> Any:
    say(progress, f"loading the weights from {folder} ({str(dtype).removeprefix('torch.')}, {device})")
    try:
        model = _model_class(folder).from_pretrained(
            folder, dtype=dtype, device_map=str(device), trust_remote_code=trust_remote_code, local_files_only=True
        )
    except Exception as error:
        raise ModelLoadError(f"cannot load the model from {folder}: {_summary(error)}") from error
    return model.eval()


def _load_gguf_weights(
    gguf_path: Path,
    folder: Path,
    precision: str,
    device: torch.device,
    config: EngineConfig,
    progress: Progress | None,
) -> tuple[Any, QuantizationReport | None]:
    """The model of the converted `folder`'s config with the weights read from `gguf_path` one
    tensor at a time (`gguf_load`), int8 / int4 layers quantized as each is read: the peak is
    the served model plus one piece or one layer. Loading the folder's float32 copy mapped all of
    it while the bfloat16 copy was made, and quantized a whole float32 model."""
    from transformers import AutoConfig, GenerationConfig

    weights_dtype, dtype = load_dtype(precision, device), activation_dtype(precision, device)
    say(
        progress,
        f"loading the weights from {gguf_path.name} one tensor at a time ({dtype_name(weights_dtype)}, {device})",
    )
    try:
        model_config = AutoConfig.from_pretrained(folder, local_files_only=True)
        model = empty_model(model_config, weights_dtype, _model_class(folder))
    except Exception as error:
        raise ModelLoadError(f"cannot load the model from {gguf_path}: {_summary(error)}") from error
    quantizer = None
    if precision in QUANTIZED_BITS:
        say(progress, f"quantizing each linear layer to {precision} as it is read")
        try:
            quantizer = LayerQuantizer(model, precision, dtype, device, gguf_path)
        except ValueError as error:
            raise ModelLoadError(f"cannot serve {config.source} in {precision}: {error}") from error
    try:
        on_module = quantizer.module_ready if quantizer is not None else None
        skip = quantizer.served_from_file() if quantizer is not None else frozenset()
        fill_from_gguf(model, gguf_path, device, tensor_progress(progress), on_module, skip)
        if (folder / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(folder, local_files_only=True)
    except Exception as error:
        raise ModelLoadError(f"cannot load the model from {gguf_path}: {_summary(error)}") from error
    return model, quantizer.finish() if quantizer is not None else None


def _chat_template(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates: the default one is the chat one
        template = template.get("default")
    return template or None


def _max_context(model: Any, config: EngineConfig, folder: Path) -> int:
    text_config = model.config.get_text_config()
    model_limit = next(
        (
            getattr(text_config, name)
            for name in ("max_position_embeddings", "n_positions")
            if getattr(text_config, name, None)
        ),
        None,
    )
    limits = [limit for limit in (config.max_context, model_limit) if limit]
    if not limits:
        raise ModelLoadError(f"{folder} does not state its context length; set max_context")
    return int(min(limits))


def stop_token_ids(
    model: Any, tokenizer: Any, chat_template: str | None, override: tuple[int, ...] | None, folder: Path
) -> tuple[int, ...]:
    """The ids that end a generation: `override` when given (checked against the vocabulary),
    else the generation config's, the tokenizer's EOS and the chat template's end-of-turn
    token (an instruction model stops at `<|im_end|>` / `<end_of_turn>` even when its
    generation config forgot it)."""
    if override is not None:
        vocab = len(tokenizer)
        outside = [i for i in override if not 0 <= i < vocab]
        if outside:
            raise ModelLoadError(f"eos_token_ids {outside} are outside the vocabulary of {folder} ({vocab} tokens)")
        return tuple(dict.fromkeys(override))
    generation_config = getattr(model, "generation_config", None)
    from_generation = getattr(generation_config, "eos_token_id", None)
    if from_generation is None:
        from_generation = []
    elif isinstance(from_generation, int):
        from_generation = [from_generation]
    ids = [*from_generation, tokenizer.eos_token_id, end_of_turn_id(tokenizer, chat_template)]
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


_TURN_PROBE = "\x00turn-probe\x00"


def end_of_turn_id(tokenizer: Any, chat_template: str | None) -> int | None:
    """The special token the template writes right after an assistant message, if any: the
    template is rendered with a probe answer and the text after it is tokenized."""
    from inference.text.chat_template import TemplateTokens, render_chat

    if not chat_template:
        return None
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _TURN_PROBE}]
    try:
        text = render_chat(
            messages,
            chat_template,
            special_tokens=TemplateTokens.from_tokenizer(tokenizer),
            add_generation_prompt=False,
        ).text
    except Exception:  # a template that refuses this conversation simply names no end of turn
        return None
    after = text.partition(_TURN_PROBE)[2].lstrip()
    if not after:
        return None
    ids = tokenizer.encode(after, add_special_tokens=False)
    special = set(tokenizer.all_special_ids) | {
        i for i, token in tokenizer.added_tokens_decoder.items() if token.special
    }
    return int(ids[0]) if ids and ids[0] in special else None


def _summary(error: BaseException) -> str:
    """The error's type and message on one line: enough to act on, without the traceback."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    if len(text) > 800:
        text = text[:797] + "..."
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
