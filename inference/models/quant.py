"""Weight-only quantized linear layers: int8 per output channel, 4-bit per group of 32.

Owns: turning a float weight (or a GGUF file's own 4-bit blocks, via `Int4Weight.from_blocks`)
into the packed form the matmul reads, the matmul (on a CPU the fused kernels' batch-invariant
`matmul.c`, which also gains from more rows; elsewhere, or without a C compiler, torch's
`_weight_int8pack_mm` / `_weight_int4pack_mm_for_cpu`), joining packed weights for fused
projections (QKV, gate/up) and slicing them back,
and `QuantizedLinear`, the module that takes `nn.Linear`'s place in the transformers model so
every path (lean runner, transformers' forward, inspections) reads the same served weights.
Decode is memory-bound: a token reads every weight once, so 1 byte (int8) or half a byte (int4)
per weight instead of 4 (float32) is what makes it faster.
Must not know: layer names, GGUF files, requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812 (torch's own convention)

from inference.kernels import cpu as cpu_kernels

INT4_GROUP_SIZE = 32  # the group of GGUF's Q4_0/Q4_1 blocks (and Q4_K's sub-blocks): a file's blocks map one to one
INT4_TILE_ROWS = 64  # torch's CPU int4 layout interleaves rows in tiles (32 or 64): joins/slices keep to 64
INT4_INNER_K_TILES = 2  # the CPU packing only accepts 2 here
# Packed int4 layouts: "groups" (the fused kernels': per row, each group of 32 weights in 16
# bytes, weights 0-15 in the low nibbles, 16-31 in the high ones, a GGUF Q4 block's order) or
# "torch" (torch's CPU kernel's tiles, which depend on the CPU's vector width). "groups" where
# the kernels are built, so every path that reads the weight (runners, transformers' forward,
# inspections) runs the same kernel.
INT4_LAYOUTS = ("groups", "torch")


def _kernels_for(x: torch.Tensor) -> cpu_kernels.CpuKernels | None:
    """The fused kernels, when they can take x (a float32/bfloat16 CPU tensor) and are built."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16):
        return None
    return cpu_kernels.load()


def _to(out: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return out if dtype is None else out.to(dtype)


@dataclass(frozen=True)
class Int8Weight:
    """w[n, k] = codes[n, k] * scales[n] (symmetric, one scale per output channel)."""

    codes: torch.Tensor  # (N, K) int8
    scales: torch.Tensor  # (N,) in the activation dtype

    bits = 8

    @classmethod
    def quantize(cls, weight: torch.Tensor, dtype: torch.dtype) -> Int8Weight:
        w = weight.detach().float()  # (N, K)
        # Round the scale to the activation dtype first, so the codes are chosen for the scale used.
        scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).to(dtype)  # (N,)
        codes = torch.round(w / scales.float()[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(codes.contiguous(), scales.contiguous())

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes

    def matmul(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """(T, K) -> (T, N) in `out_dtype` (None: x's): on the kernels each output is summed in
        float32 and written once in out_dtype (the 8-bit output head writes float32 logits)."""
        kernels = _kernels_for(x)
        if kernels is None or self.scales.dtype not in (torch.float32, torch.bfloat16):
            return _to(torch._weight_int8pack_mm(x, self.codes, self.scales), out_dtype)
        return kernels.matmul(x, cpu_kernels.WEIGHT_INT8, self.codes, self.scales, None, out_dtype)

    def dequantize(self) -> torch.Tensor:
        return self.codes.float() * self.scales.float()[:, None]  # (N, K)

    def rows(self, start: int, end: int) -> Int8Weight:
        return Int8Weight(self.codes[start:end], self.scales[start:end])  # views: no copy

    @staticmethod
    def can_join(parts: list[Int8Weight]) -> bool:
        return True

    @staticmethod
    def join(parts: list[Int8Weight]) -> Int8Weight:
        return Int8Weight(torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]))


@dataclass(frozen=True)
class Int4Weight:
    """w[n, k] = (q[n, k] - 8) * scale[g, n] + zero[g, n] for k in group g (asymmetric, groups of 32
    along the input): the convention of torch's int4 kernels, into which GGUF's Q4_0 (zero 0) and
    Q4_1 (zero = min + 8 * scale) map exactly."""

    packed: torch.Tensor  # (N, K / 2) uint8 in `layout` (INT4_LAYOUTS)
    scale_zeros: torch.Tensor  # (K / group_size, N, 2) in the activation dtype
    group_size: int = INT4_GROUP_SIZE
    layout: str = "torch"

    bits = 4

    @classmethod
    def quantize(cls, weight: torch.Tensor, dtype: torch.dtype, group_size: int = INT4_GROUP_SIZE) -> Int4Weight:
        """Min/max per group (the 16 levels span each group's range)."""
        w = weight.detach().float()
        n, k = w.shape
        groups = w.view(n, k // group_size, group_size)  # (N, G, group)
        low, high = groups.amin(-1), groups.amax(-1)  # (N, G)
        scale = ((high - low) / 15).clamp(min=1e-12)
        return cls.from_codes_affine(groups, scale, low + 8 * scale, dtype)

    @classmethod
    def from_codes_affine(
        cls, groups: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype
    ) -> Int4Weight:
        """Codes chosen for `scale`/`zero` (N, G) as the kernel will see them (rounded to `dtype`)."""
        scale, zero = scale.to(dtype), zero.to(dtype)
        codes = torch.round((groups - zero.float()[..., None]) / scale.float()[..., None] + 8).clamp(0, 15)
        return cls.from_blocks(codes.flatten(1).to(torch.int32), scale, zero, groups.shape[-1])

    @classmethod
    def from_blocks(
        cls, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int, layout: str | None = None
    ) -> Int4Weight:
        """codes (N, K) in 0..15; scale and zero (N, K / group_size): pack as the matmul wants
        (`layout` None: "groups" where the fused kernels are built and the groups are of 32)."""
        n, k = codes.shape
        if k % group_size or n % 8:
            raise ValueError(f"an int4 weight needs K a multiple of {group_size} and N of 8, not {(n, k)}")
        if layout is None:
            usable = group_size == INT4_GROUP_SIZE and _kernels_for(scale.float()) is not None
            layout = "groups" if usable else "torch"
        if layout not in INT4_LAYOUTS or (layout == "groups" and group_size != INT4_GROUP_SIZE):
            raise ValueError(f"layout={layout!r} is not one of {INT4_LAYOUTS} (groups: of {INT4_GROUP_SIZE})")
        scale_zeros = torch.stack([scale.t(), zero.t()], dim=-1).contiguous()  # (G, N, 2)
        if layout == "groups":
            halves = codes.to(torch.uint8).view(n, k // group_size, 2, group_size // 2)  # (N, G, low/high, 16)
            packed = (halves[:, :, 0] | (halves[:, :, 1] << 4)).reshape(n, k // 2).contiguous()
        else:
            packed = torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), INT4_INNER_K_TILES)
        return cls(packed, scale_zeros, group_size, layout)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.packed.shape[0], self.packed.shape[1] * 2)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scale_zeros.nbytes

    def matmul(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """(T, K) -> (T, N) in `out_dtype` (None: x's)."""
        if self.layout == "torch":
            return _to(torch._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scale_zeros), out_dtype)
        kernels = _kernels_for(x)
        if kernels is None:  # only when the kernels stopped being usable after packing (switched off)
            return _to(x @ self.dequantize().to(x.dtype).t(), out_dtype)
        return kernels.matmul(x, cpu_kernels.WEIGHT_INT4, self.packed, self.scale_zeros, None, out_dtype)

    def dequantize(self) -> torch.Tensor:
        """(N, K) float32: the matmul's own reading of the weights."""
        n, k = self.shape
        if self.layout == "torch":
            eye = torch.eye(k, dtype=self.scale_zeros.dtype)
            return self.matmul(eye).float().t().contiguous()
        groups = self.packed.view(n, k // self.group_size, self.group_size // 2)  # (N, G, 16) bytes
        codes = torch.cat([groups & 15, groups >> 4], dim=-1).double() - 8  # (N, G, group): low nibbles first
        scale, zero = (self.scale_zeros[..., i].float().t()[..., None] for i in (0, 1))  # (N, G, 1)
        # (q - 8) * scale + zero rounded once, as the kernel computes it
        return torch.addcmul(zero.double(), codes, scale.double()).float().reshape(n, k)

    def rows(self, start: int, end: int) -> Int4Weight:
        torch_tiles = self.layout == "torch"
        if torch_tiles and (start % INT4_TILE_ROWS or (end % INT4_TILE_ROWS and end != self.shape[0])):
            raise ValueError(f"int4 rows {start}:{end} are not on {INT4_TILE_ROWS}-row tiles")
        scale_zeros = self.scale_zeros[:, start:end].contiguous()
        return Int4Weight(self.packed[start:end], scale_zeros, self.group_size, self.layout)

    @staticmethod
    def can_join(parts: list[Int4Weight]) -> bool:
        if len({p.layout for p in parts}) != 1:
            return False
        return parts[0].layout == "groups" or all(p.shape[0] % INT4_TILE_ROWS == 0 for p in parts[:-1])

    @staticmethod
    def join(parts: list[Int4Weight]) -> Int4Weight:
        if not Int4Weight.can_join(parts):
            raise ValueError(f"int4 weights join only in one layout, torch's on {INT4_TILE_ROWS}-row tiles")
        packed = torch.cat([p.packed for p in parts])
        scale_zeros = torch.cat([p.scale_zeros for p in parts], dim=1)
        return Int4Weight(packed, scale_zeros, parts[0].group_size, parts[0].layout)


# GGML block formats the kernels read as the file stores them (matmul_blocks.c): type id -> (name,
# bits of a weight's code). A row of K weights is K / 32 (K-quants: K / 256) whole blocks.
BLOCK_TYPES = {2: ("Q4_0", 4), 3: ("Q4_1", 4), 6: ("Q5_0", 5), 7: ("Q5_1", 5), 8: ("Q8_0", 8)}
BLOCK_TYPES |= {12: ("Q4_K", 4), 13: ("Q5_K", 5), 14: ("Q6_K", 6)}


@dataclass(frozen=True)
class BlockWeight:
    """A weight as a GGUF file stores it: each row's bytes in GGML block format `type_id` (Q4_0 ...
    Q6_K), multiplied by integer dot products on those very bytes (`matmul_blocks.c`: x quantized
    per 32 to int8, each block's exact integer sum scaled once), so decode reads the file's
    4.5-8.5 bits per weight and nothing is re-quantized. CPU kernels only. `interleave`: 0, the
    rows as the file has them, or 16: the same bytes repacked 16 rows at a time (`repacked`:
    `matmul_blocks_lanes.c`, where a batch's products run several times faster, the same numbers)."""

    blocks: torch.Tensor  # (N, row bytes) uint8
    type_id: int
    in_features: int
    interleave: int = 0

    @property
    def type_name(self) -> str:
        return BLOCK_TYPES[self.type_id][0]

    @property
    def bits(self) -> int:
        return BLOCK_TYPES[self.type_id][1]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.blocks.shape[0], self.in_features)

    @property
    def nbytes(self) -> int:
        return self.blocks.nbytes

    def matmul(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """(T, K) -> (T, N) in `out_dtype` (None: x's; float32 or bfloat16)."""
        kernels = _kernels_for(x)
        if kernels is None:  # the kernels switched off after loading: the same weights, through torch
            return _to(x @ self.dequantize().to(x.dtype).t(), out_dtype)
        out = torch.empty(x.shape[0], self.blocks.shape[0], dtype=out_dtype or x.dtype)
        return kernels.matmul_blocks(x, self.type_id, self.blocks, None, out, self.interleave)

    def repacked(self) -> BlockWeight:
        """This weight in the layout the kernels built here multiply fastest: its own bytes
        repacked in place (nothing copied), or itself where they take the file's layout."""
        kernels = cpu_kernels.load()
        interleave = kernels.blocks_interleave(self.type_id) if kernels is not None and not self.interleave else 0
        if not interleave or self.blocks.shape[0] % interleave or not self.blocks.is_contiguous():
            return self
        kernels.repack_blocks(self.type_id, self.blocks, self.in_features)
        return BlockWeight(self.blocks, self.type_id, self.in_features, interleave)

    def in_file_layout(self) -> BlockWeight:
        """The rows as the file has them (a copy when repacked)."""
        if not self.interleave:
            return self
        blocks = _block_kernels().unpack_blocks(self.type_id, self.blocks, self.in_features)
        return BlockWeight(blocks, self.type_id, self.in_features)

    def dequantize(self) -> torch.Tensor:
        """(N, K) float32: the file's exact values."""
        if self.interleave or cpu_kernels.load() is not None:
            return _block_kernels().dequantize_blocks(self.type_id, self.blocks, self.in_features, self.interleave)
        from gguf import GGMLQuantizationType, quants

        values = quants.dequantize(self.blocks.numpy(), GGMLQuantizationType(self.type_id))
        return torch.from_numpy(values.astype("float32")).reshape(self.shape)

    def rows(self, start: int, end: int) -> BlockWeight:
        """Rows start..end: a view (repacked: at multiples of `interleave`)."""
        if self.interleave and (start % self.interleave or end % self.interleave):
            raise ValueError(f"rows {start}..{end} of a weight repacked {self.interleave} rows at a time")
        return BlockWeight(self.blocks[start:end], self.type_id, self.in_features, self.interleave)

    def take(self, ids: torch.Tensor) -> BlockWeight:
        """Rows `ids` (1-D int64, in any order, repeats allowed): their bytes copied, as the file
        has them (repacked: the blocks of 16 that hold them are unpacked)."""
        if not self.interleave:
            return BlockWeight(self.blocks.index_select(0, ids), self.type_id, self.in_features)
        size = self.interleave
        bands = self.blocks.view(-1, size * self.blocks.shape[1]).index_select(0, ids // size)  # (n, 16 rows)
        unpacked = _block_kernels().unpack_blocks(self.type_id, bands.view(-1, self.blocks.shape[1]), self.in_features)
        picked = unpacked.view(-1, size, self.blocks.shape[1])[torch.arange(ids.numel()), ids % size]
        return BlockWeight(picked, self.type_id, self.in_features)

    @staticmethod
    def can_join(parts: list[BlockWeight]) -> bool:
        return len({(p.type_id, p.interleave) for p in parts}) == 1

    @staticmethod
    def join(parts: list[BlockWeight]) -> BlockWeight:
        if not BlockWeight.can_join(parts):
            raise ValueError("block weights join only within one GGML type and layout")
        blocks = torch.cat([p.blocks for p in parts])
        return BlockWeight(blocks, parts[0].type_id, parts[0].in_features, parts[0].interleave)


def _block_kernels() -> cpu_kernels.CpuKernels:
    """The library that repacked a weight (only it reads that layout back)."""
    kernels = cpu_kernels.load()
    if kernels is None:
        raise RuntimeError("a repacked block weight needs the CPU kernels that repacked it")
    return kernels


@dataclass(frozen=True)
class Stacked:
    """Quantized weights that cannot be joined into one packed tensor, read one after the other."""

    parts: tuple[Int8Weight | Int4Weight | BlockWeight, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.shape[0] for p in self.parts), self.parts[0].shape[1])

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def matmul(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.cat([p.matmul(x, out_dtype) for p in self.parts], dim=-1)  # (T, sum of N)


QuantizedWeight = Int8Weight | Int4Weight | BlockWeight | Stacked


def quantize(weight: torch.Tensor, bits: int, dtype: torch.dtype) -> QuantizedWeight:
    if bits == 8:
        return Int8Weight.quantize(weight, dtype)
    if bits == 4:
        return Int4Weight.quantize(weight, dtype)
    raise ValueError(f"bits={bits} is not 8 or 4")


def linear(
    x: torch.Tensor,
    weight: torch.Tensor | QuantizedWeight,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """x (T, in) @ weight (out, in).T (+ bias) for a float or a quantized weight, in `out_dtype`
    (None: x's). Float weights go to torch (`models/matmul.py` has the batch-invariant kind)."""
    if isinstance(weight, torch.Tensor):
        return _to(F.linear(x, weight, bias), out_dtype)
    out = weight.matmul(x, out_dtype)  # (T, out)
    return out + bias if bias is not None else out


class QuantizedLinear(torch.nn.Module):
    """`nn.Linear` with a quantized weight. The packed tensors are buffers, so `.to()`, state
    and byte counts see them; `source` says where the codes came from (shown with the model)."""

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None, source: str) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.source = source  # "quantized" (from float weights) or "gguf:Q4_1" (the file's own blocks)
        self.set_weight(weight)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach(), requires_grad=False)

    def set_weight(self, weight: QuantizedWeight) -> None:
        """Point at `weight` (a view into a fused weight, for instance): no copy is kept."""
        self.qweight = weight
        for name, tensor in vars(weight).items():
            if isinstance(tensor, torch.Tensor):
                self.register_buffer(name, tensor, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        out = linear(x.reshape(-1, self.in_features), self.qweight, self.bias)  # (T, out)
        return out.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        bits = self.qweight.bits
        return f"in_features={self.in_features}, out_features={self.out_features}, bits={bits}, source={self.source}"


EMBEDDING_BAND_ROWS = 8192  # rows dequantized at once when something reads the whole table


class BlockEmbedding(torch.nn.Module):
    """`nn.Embedding` whose table stays as the GGUF file stores it (a `BlockWeight`): a lookup
    dequantizes only the rows it reads, to the file's exact values (gguf-py's), rounded to `dtype`
    as the dense table's copy was, so its rows are that table's, bit for bit, at a fraction of its
    memory (Qwen2.5-Coder-0.5B's Q5_0 table: 94 MB instead of 272 in bfloat16). `embed_scale`:
    what a scaled embedding (Gemma's) multiplies its rows by, as its own forward does. Nothing
    keeps the dense table: `weight` (for code that reads the whole table) builds it anew at
    each call, `table_rows` one band of it."""

    def __init__(
        self,
        weight: BlockWeight,
        dtype: torch.dtype,
        padding_idx: int | None = None,
        embed_scale: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.dtype, self.padding_idx = dtype, padding_idx
        self.source = f"gguf:{weight.type_name}"
        self.qweight = weight
        self.register_buffer("blocks", weight.blocks, persistent=False)
        self.register_buffer("embed_scale", embed_scale, persistent=False)

    @property
    def nbytes(self) -> int:
        return self.qweight.nbytes

    @property
    def row_bytes(self) -> int:
        """What one token's lookup reads."""
        return self.qweight.blocks.shape[1]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (any shape) -> their rows (*ids.shape, embedding_dim) in `dtype`, unscaled."""
        flat = ids.reshape(-1).to(device=self.qweight.blocks.device, dtype=torch.long)
        values = self.qweight.take(flat).dequantize().to(self.dtype)  # (n, dim): the dense table's cast
        return values.view(*ids.shape, self.embedding_dim)

    def table_rows(self, start: int, end: int) -> torch.Tensor:
        """Rows start..end of the table (end - start, embedding_dim) in `dtype`, unscaled."""
        return self.qweight.rows(start, end).dequantize().to(self.dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = self.rows(ids)
        return out if self.embed_scale is None else out * self.embed_scale.to(out.dtype)

    @property
    def weight(self) -> torch.Tensor:
        """The whole table (num_embeddings, embedding_dim) in `dtype`, dequantized now, a band at a
        time (never kept: read rows with `rows` / `table_rows` instead where you can)."""
        table = torch.empty(self.num_embeddings, self.embedding_dim, dtype=self.dtype)
        for start in range(0, self.num_embeddings, EMBEDDING_BAND_ROWS):
            end = min(start + EMBEDDING_BAND_ROWS, self.num_embeddings)
            table[start:end] = self.table_rows(start, end)
        return table

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, bits={self.qweight.bits}, source={self.source}"
