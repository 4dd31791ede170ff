"""GGUF -> float32 safetensors, piece by piece, and the checks that need transformers.

Owns: what can be known about converting a GGUF file from its header alone (an architecture
transformers maps, a tokenizer, tensor types gguf-py can dequantize), and writing the weights
into one `model.safetensors` as `gguf_tensors` reads them (a band of rows or one small tensor at
a time, every architecture), each at its place in the file. The header itself is
`inference.gguf_file`.
Must not know: where converted folders live, locking, engine settings, Django.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from inference.gguf_file import GgufError, GgufHeader
from inference.models.gguf_tensors import GgufTensors, Piece, TensorProgress

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


def stream_safetensors(
    header: GgufHeader,
    model_config: Any,
    out_file: Path,
    on_tensor: TensorProgress | None = None,
) -> None:
    """Write every weight of the GGUF into `out_file` (float32 safetensors) piece by piece, for
    every architecture (`gguf_tensors`: MoE experts merged, GPT-2's matrices transposed, Gemma's
    norms shifted): memory is one piece, never the model. `GgufError` when the file leaves a
    weight of the model empty (nothing is then left to trust in `out_file`)."""
    import torch

    from inference.models.gguf_load import empty_model

    skeleton = empty_model(model_config, torch.float32)  # names, shapes and the processor's config
    tied = set(getattr(skeleton, "all_tied_weights_keys", None) or {})
    layout = {name: tuple(p.shape) for name, p in skeleton.named_parameters(remove_duplicate=False) if name not in tied}
    offsets, meta = _safetensors_header(layout)
    rows_written = dict.fromkeys(layout, 0)
    with out_file.open("wb") as out:
        out.write(meta)
        for piece in GgufTensors(header, skeleton).pieces(on_tensor):
            if piece.name in layout:
                rows_written[piece.name] += _write_piece(
                    out, len(meta) + offsets[piece.name], layout[piece.name], piece
                )
    missing = [name for name, shape in layout.items() if rows_written[name] < (shape[0] if shape else 1)]
    if missing:
        raise GgufError(f"{header.path}: no tensor in the file for {', '.join(missing[:5])}")


def _safetensors_header(layout: dict[str, tuple[int, ...]]) -> tuple[dict[str, int], bytes]:
    """Each tensor's offset in the data section, and the file's header (length + JSON)."""
    index, offsets, offset = {}, {}, 0
    for name, shape in layout.items():
        nbytes = 4 * _count(shape)
        index[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offsets[name], offset = offset, offset + nbytes
    meta = json.dumps({"__metadata__": {"format": "pt"}, **index}, separators=(",", ":")).encode()
    meta += b" " * (-len(meta) % 8)  # safetensors pads the header to 8 bytes
    return offsets, struct.pack("<Q", len(meta)) + meta


def _write_piece(out: Any, start: int, shape: tuple[int, ...], piece: Piece) -> int:
    """Writes `piece` where its rows go in the tensor that starts at byte `start`; how many rows."""
    values = piece.values.numpy()
    wanted = shape if piece.rows is None else (len(values), *shape[1:])
    if values.shape != wanted:
        raise GgufError(f"{piece.name} came out of the file as {values.shape}, the model wants {wanted}")
    if piece.rows is None:
        out.seek(start)
        out.write(values.tobytes())
        return shape[0] if shape else 1
    row_bytes = 4 * _count(shape[1:])
    rows = range(*piece.rows.indices(shape[0])) if isinstance(piece.rows, slice) else piece.rows
    if isinstance(piece.rows, slice):  # contiguous: one write
        out.seek(start + rows.start * row_bytes)
        out.write(values.tobytes())
    else:  # rows the processor reordered (Q and K): each where it goes
        for row, value in zip(rows, values):
            out.seek(start + int(row) * row_bytes)
            out.write(value.tobytes())
    return len(values)


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count
