"""Weight precision: which one a model is served in, and putting it into effect.

Owns: the precision names (`auto`, `float32`, `bfloat16`, `float16`, `int8`, `int4`, `gguf`), what
`auto` means on this machine and model, the activation dtype each implies, and replacing a loaded transformers
model's linear layers by `QuantizedLinear`s for int8 / int4, with the report of what each layer
became. The embedding table and the norms stay in the activation dtype: a token reads one
embedding row, not the table; an output layer tied to that table stays that one tensor (no
second, quantized copy of a 262k-row table). Under gguf an untied table is the file's blocks
too (`BlockEmbedding`: only the rows a step reads are dequantized, never the whole table at load);
a table the head is tied to stays the dense matrix the head multiplies (SmolLM2's).

int4 from a GGUF file serves each tensor at least as precisely as the file stores it: its
Q4_0 / Q4_1 / Q4_K blocks exactly (the file's own codes and scales), every other quantized type
(Q5_0, Q6_K, Q8_0 ... in a Q4_K_M file most layers are these) in 8 bits per output channel from
the file's exact values (no int4 kernel reads them exactly), float tensors in the activation
dtype. Without a file, int4 quantizes the float weights (min/max per group of 32) and the output
layer gets 8 bits, as Q4 GGUF files keep it at 6-8.

gguf serves every tensor of a GGUF file in the file's own format (Q4_0 ... Q6_K as `BlockWeight`s:
integer dot products on the file's bytes, the output layer included, as llama.cpp does; the
untied embedding table as a `BlockEmbedding` of its blocks), float tensors in the activation dtype,
and is what `auto` picks for a GGUF model on a CPU whose kernels are built: it reads the fewest
bytes per token with no weight re-quantized.
Must not know: requests, the engine, Django.
"""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from inference.config import VALID_DTYPES as PRECISIONS
from inference.models.quant import (
    BLOCK_TYPES,
    INT4_GROUP_SIZE,
    BlockEmbedding,
    Int8Weight,
    QuantizedLinear,
    quantize,
)

# gguf: 8 is for a file's quantized types the block kernels do not read (IQ*, Q2_K, ...)
QUANTIZED_BITS = {"int8": 8, "int4": 4, "gguf": 8}
# The output layer stays at 8 bits under int4 too (as Q4 GGUF files keep it at 6-8): its errors
# land directly in the next-token distribution.
HEAD_BITS = 8
EXACT_INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")  # GGML types whose blocks int4 serves exactly (gguf_blocks)
FLOAT_FILE_TYPES = ("F32", "F16", "BF16")
FLOAT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@functools.cache
def cpu_has_bf16() -> bool:
    """Whether the CPU multiplies bfloat16 in hardware (AVX512-BF16 or AMX): then bfloat16 prefill
    is about 3x faster than float32 and decode reads half the bytes (measured by inference.bench)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_precision(precision: str, device: torch.device, gguf_path: Path | None = None) -> str:
    """`auto` -> gguf for a GGUF model on a CPU where the block kernels are built; else bfloat16 on
    CUDA (float16 without bf16 support) and on CPUs with bf16 units, float32 on other CPUs. Any
    other name is returned as it is (after checking it: gguf needs a GGUF file and a CPU)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {PRECISIONS}")
    if precision == "gguf" and (gguf_path is None or device.type != "cpu"):
        where = "a model from a GGUF file" if gguf_path is None else "the CPU"
        raise ValueError(f"precision='gguf' (the file's own blocks) needs {where}")
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    if gguf_path is not None and serves_blocks(gguf_path):
        return "gguf"
    return "bfloat16" if cpu_has_bf16() else "float32"


def serves_blocks(gguf_path: Path) -> bool:
    """Whether the block kernels are built here and read most of the file's weight matrices (the
    embedding table aside: a token reads one row of it, and many files keep it in float)."""
    from inference.gguf_file import read_header
    from inference.kernels import cpu as cpu_kernels

    if cpu_kernels.load() is None:
        return False
    matrices = [t for t in read_header(gguf_path).tensors if len(t.shape) == 2 and not t.name.startswith("token_embd")]
    return 2 * sum(t.type_id in BLOCK_TYPES for t in matrices) > len(matrices)


def activation_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The dtype activations (and unquantized weights) run in. Quantized weights are read by
    kernels that take bfloat16 activations (float16 on GPUs without bf16); gguf's quantize x to
    int8 themselves, so the rest of the pass runs as `auto`'s float would (float32 on a CPU
    without bf16 units, where bfloat16 is only converted, never multiplied)."""
    if precision in FLOAT_DTYPES:
        return FLOAT_DTYPES[precision]
    if precision == "gguf" and device.type == "cpu":
        return torch.bfloat16 if cpu_has_bf16() else torch.float32
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


def load_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The dtype to load weights in: quantizing on a CPU starts from float32 (codes chosen from the
    exact weights); on a GPU from the activation dtype (memory)."""
    if precision in QUANTIZED_BITS and precision != "gguf" and device.type == "cpu":
        return torch.float32  # (gguf's weights are the file's blocks: nothing is quantized from floats)
    return activation_dtype(precision, device)


@dataclass(frozen=True)
class LayerGroup:
    """Linear layers that the file stores alike and that are served alike."""

    file_type: str  # their GGML type in the GGUF file ("Q4_K", "Q6_K", "F16"); "" without a file
    served_as: str  # "int4", "int8", "blocks" (the file's own), or the activation dtype ("bfloat16")
    is_exact: bool  # the served weights are the file's own codes and scales, not a re-quantization
    num_layers: int
    is_head: bool = False  # the output layer (one group of its own)


@dataclass(frozen=True)
class QuantizationReport:
    """What `quantize_model` did, shown with the model (its per-type counts: `groups`)."""

    precision: str
    num_quantized: int  # linear layers now read packed low-bit weights
    num_from_file: int  # of them, the GGUF file's own blocks (not a re-quantization)
    file_types: tuple[str, ...]  # their GGML types, e.g. ("Q4_1",)
    num_kept: int  # linear layers left in the activation dtype (a kernel cannot take the shape, the file
    # holds them in float, or the output layer is tied to the embedding table)
    head_bits: int  # the output layer's bits: 8 (int4 keeps it at 8), or 16 when it stays the tied table
    is_head_tied: bool  # the output layer is the embedding table itself (one tensor, not quantized)
    groups: tuple[LayerGroup, ...]  # every linear layer, by file type and served form
    embedding_type: str = ""  # the table's GGML type when it is served as the file's blocks; "": the activation dtype

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def quantize_model(model: Any, precision: str, dtype: torch.dtype, gguf_path: Path | None = None) -> QuantizationReport:
    """Replace the `nn.Linear`s (attention, MLP, an untied output head) by `QuantizedLinear`s in
    place, each in the form `_layer_form` picks, then cast the remaining parameters to `dtype`."""
    quantizer = LayerQuantizer(model, precision, dtype, next(model.parameters()).device, gguf_path)
    for name in list(quantizer.forms):
        quantizer.module_ready(name)
    return quantizer.finish()


class LayerQuantizer:
    """`quantize_model` one module at a time: the forms are planned from the modules' names and
    shapes (a model on the meta device will do), then each module is put in its served form as
    soon as its weights are real (`module_ready`), so a GGUF load never holds more than one
    layer's float32 weights beside the served model; `finish` casts what is left and reports."""

    def __init__(
        self, model: Any, precision: str, dtype: torch.dtype, device: torch.device, gguf_path: Path | None = None
    ) -> None:
        from inference.models.gguf_blocks import file_weights

        self.model, self.precision, self.dtype = model, precision, dtype
        self.bits, self.is_blocks = QUANTIZED_BITS[precision], precision == "gguf"
        if device.type != "cpu" and (self.bits == 4 or self.is_blocks):
            raise ValueError(f"precision={precision!r} runs on the CPU kernels only: use 'int8' or 'bfloat16' on a GPU")
        if self.is_blocks and gguf_path is None:
            raise ValueError("precision='gguf' (the file's own blocks) needs a model from a GGUF file")
        if device.type != "cpu" and not _int8_kernel_works(device, dtype):
            raise ValueError(f"precision='int8': torch {torch.__version__} has no int8 weight kernel for {device}")
        self.in_file = (
            file_weights(gguf_path, model, dtype, read_int4=self.bits == 4, read_blocks=self.is_blocks)
            if gguf_path
            else {}
        )
        head = model.get_output_embeddings()
        self.is_head_tied = _is_tied(model, head)
        # gguf: the embedding table's module name when it is served as the file's blocks (None: in float)
        self.table_name = _table_in_blocks(model, self.in_file) if self.is_blocks and not self.is_head_tied else None
        linears = {name: module for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)}
        # names, not modules: a module kept here would keep its float32 weight after it is replaced
        self.head_name = next((name for name, module in linears.items() if module is head), None)
        if all(module is head for module in linears.values()):
            raise ValueError(f"the model has no linear layer the {precision} kernel can take (e.g. GPT-2's Conv1D)")
        self.forms = {name: self._form(name, module) for name, module in linears.items()}
        _keep_fused_siblings_alike(self.forms)
        self.groups: Counter[tuple[str, str, bool, bool]] = Counter()  # (file type, form, exact, head) -> layers
        self._done: set[str] = set()

    def _form(self, name: str, module: torch.nn.Linear) -> str:
        file_weight = self.in_file.get(f"{name}.weight")
        if self.is_blocks and file_weight is not None and file_weight.blocks is not None:
            return "blocks"  # the head too, tied or not: it reads the file's own output tensor
        form = _layer_form(
            self.bits, name == self.head_name, self.is_head_tied, file_weight.type_name if file_weight else ""
        )
        if form != "float" and not _fits_kernel(module, 4 if form == "int4" else 8):
            form = "float"  # a shape the kernel cannot take stays in the activation dtype
        return form

    def served_from_file(self) -> frozenset[str]:
        """The weights served as the file's blocks: a loader need not read them as floats."""
        table = {f"{self.table_name}.weight"} if self.table_name is not None else set()
        return frozenset(f"{name}.weight" for name, form in self.forms.items() if form == "blocks") | table

    def module_ready(self, name: str) -> None:
        """Module `name`'s own parameters are real: a linear layer takes its served form, anything
        else (norms, embeddings, a layer kept in float) its activation dtype."""
        module = self.model.get_submodule(name)
        if name in self.forms and name not in self._done:
            self._done.add(name)
            self._serve_linear(name, module)
        elif name not in self.forms:
            for param in module.parameters(recurse=False):
                param.data = param.data.to(self.dtype)

    def _serve_linear(self, name: str, module: torch.nn.Linear) -> None:
        file_weight, form = self.in_file.get(f"{name}.weight"), self.forms[name]
        is_exact = form == "blocks" or (form == "int4" and file_weight is not None and file_weight.int4 is not None)
        if form in ("int4", "int8", "blocks"):
            if form == "blocks":
                weight = file_weight.blocks.repacked()  # in place: the file's bytes are read for this layer only
            elif is_exact:
                weight = file_weight.int4
            else:
                weight = _quantize_rows(module.weight, 4 if form == "int4" else 8, self.dtype)
            source = f"gguf:{file_weight.type_name}" if is_exact else "quantized"
            bias = None if module.bias is None else module.bias.detach().to(self.dtype)
            self.model.set_submodule(name, QuantizedLinear(weight, bias, source))
        else:
            for param in module.parameters(recurse=False):
                param.data = param.data.to(self.dtype)
        self.groups[(file_weight.type_name if file_weight else "", form, is_exact, name == self.head_name)] += 1

    def finish(self) -> QuantizationReport:
        """Serves the table from its blocks (gguf), counts the layers never made ready (a tied
        head), casts every parameter left in float."""
        table_type = self._serve_table() if self.table_name is not None else ""
        for name in [n for n in self.forms if n not in self._done]:
            self.module_ready(name)
        for param in self.model.parameters():  # embeddings, norms, biases, kept layers left in float
            param.data = param.data.to(self.dtype)
        return _report(self.precision, self.groups, self.is_head_tied, self.dtype, table_type)

    def _serve_table(self) -> str:
        """Puts the embedding table's module in the file's blocks (a GGUF load never filled its
        float weight: `served_from_file`); its GGML type."""
        table, weight = self.model.get_submodule(self.table_name), self.in_file[f"{self.table_name}.weight"].blocks
        embed_scale = getattr(table, "embed_scale", None)
        self.model.set_submodule(self.table_name, BlockEmbedding(weight, self.dtype, table.padding_idx, embed_scale))
        return weight.type_name


_QUANTIZE_ROWS = 8192  # rows quantized at once: a 152k-row head's temporaries are a band's, not its own


def _quantize_rows(weight: torch.Tensor, bits: int, dtype: torch.dtype) -> Any:
    """`quantize`, in bands of rows for int8 (its scales are per row: the same codes), each band's
    codes written into one output: codes kept per band and joined at the end interleaved with the
    band's temporaries in the heap, and a 152k-row head took 1.2 GB to quantize instead of 0.2."""
    if bits != 8 or weight.shape[0] <= _QUANTIZE_ROWS:
        return quantize(weight, bits, dtype)
    weight = weight.detach()
    codes = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)  # (N, K)
    scales = torch.empty(weight.shape[0], dtype=dtype, device=weight.device)  # (N,)
    for start in range(0, weight.shape[0], _QUANTIZE_ROWS):
        band = Int8Weight.quantize(weight[start : start + _QUANTIZE_ROWS], dtype)
        codes[start : start + _QUANTIZE_ROWS] = band.codes
        scales[start : start + _QUANTIZE_ROWS] = band.scales
    return Int8Weight(codes, scales)


def _layer_form(bits: int, is_head: bool, is_head_tied: bool, file_type: str) -> str:
    """The form of one linear layer, "int4", "int8" or "float" (the activation dtype): a tied head stays
    the embedding table; with a file, int4 is taken only for the types it reads exactly, float
    types stay float, and every other quantized type gets 8 bits (at least as precise as 5-8-bit
    blocks); without one, int4 layers are re-quantized and the head gets 8 bits."""
    if is_head and is_head_tied:
        return "float"
    if bits == 8:
        return "int8"
    if file_type:
        if file_type in EXACT_INT4_TYPES and not is_head:
            return "int4"
        return "float" if file_type in FLOAT_FILE_TYPES else "int8"
    return "int8" if is_head else "int4"


# Projections the Llama-family runner reads as one fused matmul (QKV, gate/up): it joins packed
# weights of any kinds, but not a float weight with packed ones.
FUSED_SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _keep_fused_siblings_alike(forms: dict[str, str]) -> None:
    """A fused group with one float member stays float as a whole (the more precise choice)."""
    for siblings in FUSED_SIBLINGS:
        for name in [n for n in forms if n.endswith(f".{siblings[0]}")]:
            parent = name.removesuffix(siblings[0])
            members = [parent + s for s in siblings if parent + s in forms]
            if any(forms[m] == "float" for m in members):
                for member in members:
                    forms[member] = "float"


# Embedding modules whose forward is the table's rows (times `embed_scale`, Gemma's): what a
# `BlockEmbedding` of the table's blocks computes the same way.
_PLAIN_EMBEDDINGS = (
    "Embedding",
    "GemmaTextScaledWordEmbedding",
    "Gemma2TextScaledWordEmbedding",
    "Gemma3TextScaledWordEmbedding",
)


def _table_in_blocks(model: Any, in_file: dict[str, Any]) -> str | None:
    """The input embedding's module name when the file holds its table in a block format the
    kernels read, with the table's shape (None: the table stays in the activation dtype). Not for
    a table the head is tied to: the head multiplies the dense table (serving it the blocks
    instead, as llama.cpp does, changed SmolLM2's logits: KL 7e-4, greedy agreement 97%)."""
    table = model.get_input_embeddings()
    if type(table).__name__ not in _PLAIN_EMBEDDINGS or not isinstance(table, torch.nn.Embedding):
        return None
    if table.max_norm is not None:
        return None
    name = next((name for name, module in model.named_modules() if module is table), None)
    file_weight = in_file.get(f"{name}.weight")
    if name is None or file_weight is None or file_weight.blocks is None:
        return None
    return name if tuple(file_weight.blocks.shape) == tuple(table.weight.shape) else None


def _is_tied(model: Any, head: Any) -> bool:
    table = model.get_input_embeddings()
    if not isinstance(head, torch.nn.Linear) or table is None or isinstance(table, BlockEmbedding):
        return False  # (a table in blocks is never tied: `_table_in_blocks`)
    if head.weight is table.weight:
        return True
    # A model still being filled (a GGUF load) is tied at the end; it knows which weights it will tie.
    head_name = next((f"{name}.weight" for name, module in model.named_modules() if module is head), None)
    return head_name in (getattr(model, "all_tied_weights_keys", None) or {})


def _report(
    precision: str,
    groups: Counter[tuple[str, str, bool, bool]],
    is_head_tied: bool,
    dtype: torch.dtype,
    embedding_type: str = "",
) -> QuantizationReport:
    counted = [
        LayerGroup(file_type, dtype_name(dtype) if form == "float" else form, is_exact, num, is_head)
        for (file_type, form, is_exact, is_head), num in groups.items()
    ]
    counted.sort(key=lambda g: (g.is_head, not g.is_exact, g.served_as, g.file_type))
    num_quantized = sum(g.num_layers for g in counted if g.served_as in ("int4", "int8", "blocks"))
    exact = [g for g in counted if g.is_exact]
    head = next((g for g in counted if g.is_head), None)
    head_bits = {"int4": 4, "int8": 8}.get(head.served_as, 16) if head else HEAD_BITS
    if head and head.served_as == "blocks":  # the file's own output tensor, untied from the table
        head_bits = next(bits for name, bits in BLOCK_TYPES.values() if name == head.file_type)
        is_head_tied = False
    return QuantizationReport(
        precision=precision,
        num_quantized=num_quantized,
        num_from_file=sum(g.num_layers for g in exact),
        file_types=tuple(sorted({g.file_type for g in exact})),
        num_kept=sum(g.num_layers for g in counted) - num_quantized,
        head_bits=head_bits,
        is_head_tied=is_head_tied,
        groups=tuple(counted),
        embedding_type=embedding_type,
    )


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _int8_kernel_works(device: torch.device, dtype: torch.dtype) -> bool:
    weight = quantize(torch.randn(64, 64), 8, dtype)
    x = torch.randn(2, 64, dtype=dtype)
    try:
        out = torch._weight_int8pack_mm(x.to(device), weight.codes.to(device), weight.scales.to(device))
    except (NotImplementedError, RuntimeError):
        return False
    return torch.allclose(out.float().cpu(), (x.float() @ weight.dequantize().t()), rtol=0.05, atol=0.05)


def _fits_kernel(module: torch.nn.Linear, bits: int) -> bool:
    if bits == 4:
        return module.in_features % INT4_GROUP_SIZE == 0 and module.out_features % 8 == 0
    return True


def weight_stats(model: Any) -> tuple[int, int]:
    """(number of weights, bytes they take as served): a packed int4 weight counts its 2 per byte,
    a table in the file's blocks (gguf) its blocks."""
    num_params = sum(p.numel() for p in model.parameters())
    num_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for module in model.modules():
        if isinstance(module, (QuantizedLinear, BlockEmbedding)):
            rows, columns = module.qweight.shape
            num_params += rows * columns
            num_bytes += module.qweight.nbytes
    return num_params, num_bytes


def decode_read_bytes(model: Any) -> int:
    """Weight bytes one decode step reads: every weight once, except the embedding table, of which a
    token reads one row (unless the output layer is that same table, tied, and reads it all)."""
    _, num_bytes = weight_stats(model)
    table, head = model.get_input_embeddings(), model.get_output_embeddings()
    if isinstance(table, BlockEmbedding):  # the file's blocks (never a tied head's): a token reads one row
        return num_bytes - table.nbytes + table.row_bytes
    table = table.weight
    if isinstance(head, torch.nn.Linear) and head.weight is table:
        return num_bytes
    return num_bytes - table.numel() * table.element_size() + table.shape[1] * table.element_size()
