"""GGUF -> float32 safetensors, tensor by tensor, and the checks that need transformers.

Owns: what can be known about converting a GGUF file from its header alone (an architecture
transformers maps, a tokenizer, tensor types gguf-py can dequantize), and the streaming
conversion of the weights into one `model.safetensors` with memory bounded by the largest
tensor. The header itself is `inference.gguf_file`.
Must not know: where converted folders live, locking, engine settings, Django.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inference.gguf_file import GgufError, GgufHeader, TensorInfo

# --- checks that need only the header -------------------------------------------------


def check_convertible(header: GgufHeader) -> None:
    """Everything about converting `header`'s file that can be known without dequantizing:
    an architecture transformers maps, a tokenizer, tensor types that can be dequantized."""
    from gguf import GGMLQuantizationType
    from gguf.quants import _type_traits
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    path, arch = header.path, header.architecture
    if not arch:
        raise GgufError(f"{path} does not name its architecture (general.architecture)")
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        raise GgufError(
            f"{path}: architecture {arch!r} cannot be converted by transformers' GGUF support; "
            f"supported: {', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}"
        )
    if "tokenizer.ggml.model" not in header.metadata or not header.vocab_size:
        raise GgufError(f"{path} carries no tokenizer (tokenizer.ggml.model / tokenizer.ggml.tokens)")
    plain = {GGMLQuantizationType.F32, GGMLQuantizationType.F16}
    unsupported = sorted(
        {t.type_name for t in header.tensors if t.type_id not in {int(q) for q in (*_type_traits, *plain)}}
    )
    if unsupported:
        raise GgufError(f"{path}: tensor types {', '.join(unsupported)} cannot be dequantized by gguf-py")
    if not header.tensors:
        raise GgufError(f"{path} holds no tensors")


# --- streaming conversion ------------------------------------------------------------------

TensorProgress = Callable[[int, int, str], None]  # (done, total, tensor name)


def stream_safetensors(
    header: GgufHeader,
    model_config: Any,
    out_file: Path,
    on_tensor: TensorProgress | None = None,
) -> bool:
    """Write every weight of the GGUF into `out_file` (float32 safetensors), one tensor in
    memory at a time. False (nothing written) when the architecture's tensor processor is one
    that merges or renames tensors across the file (MoE experts): the caller falls back."""
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        LlamaTensorProcessor,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    processor_class = TENSOR_PROCESSORS.get(header.architecture or "", TensorProcessor)
    if processor_class not in (TensorProcessor, LlamaTensorProcessor):
        return False
    processor = processor_class(config=model_config.to_dict())
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(model_config)
    name_map = get_gguf_hf_weights_map(skeleton, processor)
    expected = set(skeleton.state_dict())
    if getattr(model_config.get_text_config(), "tie_word_embeddings", False):
        expected -= {k for k in expected if k.endswith("lm_head.weight")}
    plan = [(t, name_map[t.name]) for t in header.tensors if t.name in name_map]
    missing = sorted(expected - {hf for _, hf in plan})
    if missing:
        raise GgufError(f"{header.path}: no tensor in the file for {', '.join(missing[:5])}")
    _write_streamed(header, plan, out_file, processor, on_tensor, np, dequantize, GGMLQuantizationType)
    return True


def _write_streamed(
    header: GgufHeader,
    plan: list[tuple[TensorInfo, str]],
    out_file: Path,
    processor: Any,
    on_tensor: TensorProgress | None,
    np: Any,
    dequantize: Any,
    quant_type: Any,
) -> None:
    index, offset = {}, 0
    for tensor, hf_name in plan:
        nbytes = 4 * _count(tensor.shape)
        index[hf_name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    meta = json.dumps({"__metadata__": {"format": "pt"}, **index}, separators=(",", ":")).encode()
    meta += b" " * (-len(meta) % 8)  # safetensors pads the header to 8 bytes
    with header.path.open("rb") as source, mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) as data:
        with out_file.open("wb") as out:
            out.write(struct.pack("<Q", len(meta)) + meta)
            for done, (tensor, hf_name) in enumerate(plan, 1):
                raw = np.frombuffer(data, dtype=np.uint8, count=tensor.nbytes, offset=tensor.offset)
                weights = dequantize(_rows(raw, tensor, np, quant_type), quant_type(tensor.type_id))
                weights = processor.process(weights=weights.reshape(tensor.shape), name=tensor.name).weights
                weights = np.ascontiguousarray(weights, dtype=np.float32)
                if weights.shape != tensor.shape:
                    raise GgufError(
                        f"{header.path}: tensor {tensor.name!r} came out {weights.shape}, not {tensor.shape}"
                    )
                out.write(weights.tobytes())
                del weights, raw
                if on_tensor is not None:
                    on_tensor(done, len(plan), hf_name)


def _rows(raw: Any, tensor: TensorInfo, np: Any, quant_type: Any) -> Any:
    """The tensor's bytes shaped as gguf-py's reader shapes them: one row of blocks per row."""
    if tensor.type_id == quant_type.F32:
        return raw.view(np.float32)
    if tensor.type_id == quant_type.F16:
        return raw.view(np.float16)
    rows = _count(tensor.shape[:-1]) if len(tensor.shape) > 1 else 1
    return raw.reshape(rows, -1)


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count
