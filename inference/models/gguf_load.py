"""A transformers model straight from a GGUF file, one tensor at a time.

Owns: building the model empty (parameters on the meta device, buffers such as the rotary
tables real), giving each parameter its storage in its final dtype and device when the file's
first piece of it arrives and filling it piece by piece (`gguf_tensors`), saying when a module
has all its own parameters (a quantized precision serves that layer at once: `on_module`), tying
the tied ones and refusing a file that leaves a parameter empty.

Memory: the final model plus one piece (a band of rows, or one small tensor, or one layer's
merged experts). Before, a GGUF was loaded from its converted float32 folder, whose whole file
was mapped while the bfloat16 copy was made (Qwen2.5-Coder-0.5B in bfloat16 peaked at 3.1x its
final weights), or, for architectures whose tensors the converter could not stream, through
transformers' `from_pretrained(gguf_file=...)`, which dequantizes every tensor into one dict
before copying it into the model (Gemma-3-270M: +4.3 GB for a 253 MB file).
Must not know: where converted folders live, what a module becomes once it is complete, the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from inference.gguf_file import GgufError, read_header
from inference.models.gguf_tensors import GgufTensors, Piece, TensorProgress
from inference.models.memory import release_free_memory

ModuleReady = Callable[[str], None]  # called with a module's name once all its own parameters are filled


def load_gguf_model(
    gguf_path: Path,
    config: Any,
    dtype: torch.dtype,
    device: torch.device,
    model_class: Any = None,
    on_tensor: TensorProgress | None = None,
) -> torch.nn.Module:
    """The model of `config` (the file's, as converted) with the weights of `gguf_path`, in
    `dtype` on `device`, in eval mode. `GgufError` when the file does not fill the model."""
    model = empty_model(config, dtype, model_class)
    fill_from_gguf(model, gguf_path, device, on_tensor)
    return model


def fill_from_gguf(
    model: torch.nn.Module,
    gguf_path: Path,
    device: torch.device,
    on_tensor: TensorProgress | None = None,
    on_module: ModuleReady | None = None,
    skip: frozenset[str] = frozenset(),
) -> None:
    """Fills `empty_model`'s parameters from `gguf_path` piece by piece, then ties the tied ones;
    `on_module` may replace a module as soon as it is complete (a quantized layer: its float32
    weights are then freed before the next layer's are read). The weights in `skip` are left
    empty (the caller serves them from the file's blocks). Eval mode, on `device`."""
    filling = _Filling(model, device, on_module)
    for piece in GgufTensors(read_header(gguf_path), model).pieces(_trimming(on_tensor), skip):
        filling.add(piece, gguf_path)
        del piece  # its float32 values: one band, gone before the next is read
    model.tie_weights()
    empty = [name for name, param in model.named_parameters() if param.device.type == "meta" and name not in skip]
    if empty:
        raise GgufError(f"{gguf_path}: no tensor in the file for {', '.join(empty[:5])}")
    if not skip:
        model.to(device).eval()  # the buffers (the parameters are there already)
    else:  # the skipped weights are still on the meta device: only the buffers move
        for module in model.modules():
            for key, buffer in module._buffers.items():
                if buffer is not None and buffer.device != device:
                    module._buffers[key] = buffer.to(device)
        model.eval()


class _Filling:
    """Where each parameter's pieces go, and which modules have all their own parameters."""

    def __init__(self, model: torch.nn.Module, device: torch.device, on_module: ModuleReady | None) -> None:
        self.model, self.device, self.on_module = model, device, on_module
        self.storage: dict[str, torch.Tensor | None] = {}  # parameters being filled (None: not in the model)
        self.rows_left: dict[str, int] = {}
        self.waiting: dict[str, set[str]] = {}  # module -> its parameters not filled yet
        for module_name, module in model.named_modules():
            params = {leaf for leaf, param in module._parameters.items() if param is not None}
            if params:
                self.waiting[module_name] = params

    def add(self, piece: Piece, gguf_path: Path) -> None:
        if piece.name not in self.storage:
            self.storage[piece.name] = target = _storage_for(self.model, piece.name, self.device)
            self.rows_left[piece.name] = target.shape[0] if target is not None and target.dim() else 1
        target = self.storage[piece.name]
        if target is None:
            return
        self.rows_left[piece.name] -= _fill(target, piece, gguf_path)
        if self.rows_left[piece.name] <= 0:
            del self.storage[piece.name]  # complete: the model holds it (a quantizer may replace it)
            self._parameter_done(piece.name)

    def _parameter_done(self, name: str) -> None:
        module_name, _, leaf = name.rpartition(".")
        left = self.waiting.get(module_name)
        if left is None:
            return
        left.discard(leaf)
        if not left:
            del self.waiting[module_name]
            if self.on_module is not None:
                self.on_module(module_name)


TRIM_EVERY_TENSORS = 16  # a trim per tensor made the heap hand back pages the next tensor faulted in again


def _trimming(on_tensor: TensorProgress | None) -> TensorProgress:
    """`on_tensor`, giving the freed temporaries back to the OS every few tensors: below glibc's
    mmap threshold they sit between the parameters allocated since, so without a trim the heap
    kept about a third of the final model (380 MB for Qwen2.5-Coder-0.5B in bfloat16) until
    the end of the load."""

    def report(done: int, total: int, name: str) -> None:
        if done % TRIM_EVERY_TENSORS == 0:
            release_free_memory()
        if on_tensor is not None:
            on_tensor(done, total, name)

    return report


def empty_model(config: Any, dtype: torch.dtype, model_class: Any = None) -> torch.nn.Module:
    """`config`'s model with its parameters on the meta device (no memory) and its buffers real."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        return (model_class or AutoModelForCausalLM).from_config(config, dtype=dtype)


def _storage_for(model: torch.nn.Module, name: str, device: torch.device) -> torch.Tensor | None:
    """The tensor `name`'s pieces go into: a new parameter in the meta one's dtype and shape (a
    module kept in float32 stays so), or a real buffer; None for a name the model lacks (skipped,
    as transformers skips a checkpoint's unexpected keys)."""
    module_name, _, leaf = name.rpartition(".")
    try:
        module = model.get_submodule(module_name)
    except AttributeError:
        return None
    param = module._parameters.get(leaf)
    if param is None:
        return module._buffers.get(leaf)
    storage = torch.empty(param.shape, dtype=param.dtype, device=device)
    setattr(module, leaf, torch.nn.Parameter(storage, requires_grad=param.requires_grad))
    return storage


def _fill(target: torch.Tensor, piece: Piece, gguf_path: Path) -> int:
    """Copies `piece` into `target` (casting on the way); how many of its rows it filled."""
    rows = piece.rows
    num_rows = (target.shape[0] if target.dim() else 1) if rows is None else _num_rows(rows, target)
    wanted = tuple(target.shape) if rows is None else (num_rows, *target.shape[1:])
    if tuple(piece.values.shape) != wanted:
        raise GgufError(
            f"{gguf_path}: {piece.name} came out of the file as {tuple(piece.values.shape)}, the model wants {wanted}"
        )
    if rows is None:
        target.copy_(piece.values)  # copy_ casts: no float32 copy on the way
    elif isinstance(rows, slice):
        target[rows].copy_(piece.values)
    else:  # rows the processor reordered (Q and K)
        target[torch.from_numpy(rows).to(target.device)] = piece.values.to(device=target.device, dtype=target.dtype)
    return num_rows


def _num_rows(rows: Any, target: torch.Tensor) -> int:
    return len(range(*rows.indices(target.shape[0]))) if isinstance(rows, slice) else len(rows)
