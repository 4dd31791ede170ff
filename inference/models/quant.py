"""Weight-only quantized linear layers: int8 per output channel, 4-bit per group of 32.

Owns: turning a float weight (or a GGUF file's own 4-bit blocks, via `Int4Weight.from_blocks`)
into the packed form torch's kernels read (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`),
the matmul, joining packed weights for fused projections (QKV, gate/up) and slicing them back,
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

INT4_GROUP_SIZE = 32  # the group of GGUF's Q4_0/Q4_1 blocks (and Q4_K's sub-blocks): a file's blocks map one to one
INT4_TILE_ROWS = 64  # the CPU int4 layout interleaves rows in tiles of 64: joins/slices keep to them
INT4_INNER_K_TILES = 2  # the CPU packing only accepts 2 here


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

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(x, self.codes, self.scales)  # (T, K) -> (T, N)

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

    packed: torch.Tensor  # (N, K / 2) uint8, the kernel's layout (tiles of 64 rows)
    scale_zeros: torch.Tensor  # (K / group_size, N, 2) in the activation dtype
    group_size: int = INT4_GROUP_SIZE

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
    def from_blocks(cls, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int) -> Int4Weight:
        """codes (N, K) in 0..15; scale and zero (N, K / group_size): pack as the kernel wants."""
        n, k = codes.shape
        if k % group_size or n % 8:
            raise ValueError(f"an int4 weight needs K a multiple of {group_size} and N of 8, not {(n, k)}")
        packed = torch._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), INT4_INNER_K_TILES)
        scale_zeros = torch.stack([scale.t(), zero.t()], dim=-1).contiguous()  # (G, N, 2)
        return cls(packed, scale_zeros, group_size)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.packed.shape[0], self.packed.shape[1] * 2)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scale_zeros.nbytes

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scale_zeros)

    def dequantize(self) -> torch.Tensor:
        n, k = self.shape
        eye = torch.eye(k, dtype=self.scale_zeros.dtype)
        return self.matmul(eye).float().t().contiguous()  # (N, K): the kernel's own reading

    def rows(self, start: int, end: int) -> Int4Weight:
        if start % INT4_TILE_ROWS or (end % INT4_TILE_ROWS and end != self.shape[0]):
            raise ValueError(f"int4 rows {start}:{end} are not on {INT4_TILE_ROWS}-row tiles")
        return Int4Weight(self.packed[start:end], self.scale_zeros[:, start:end].contiguous(), self.group_size)

    @staticmethod
    def can_join(parts: list[Int4Weight]) -> bool:
        return all(p.shape[0] % INT4_TILE_ROWS == 0 for p in parts[:-1])

    @staticmethod
    def join(parts: list[Int4Weight]) -> Int4Weight:
        if not Int4Weight.can_join(parts):
            raise ValueError(f"int4 weights join only on {INT4_TILE_ROWS}-row tiles")
        packed = torch.cat([p.packed for p in parts])
        return Int4Weight(packed, torch.cat([p.scale_zeros for p in parts], dim=1), parts[0].group_size)


@dataclass(frozen=True)
class Stacked:
    """Quantized weights that cannot be joined into one packed tensor, read one after the other."""

    parts: tuple[Int8Weight | Int4Weight, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return (sum(p.shape[0] for p in self.parts), self.parts[0].shape[1])

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p.matmul(x) for p in self.parts], dim=-1)  # (T, sum of N)


QuantizedWeight = Int8Weight | Int4Weight | Stacked


def quantize(weight: torch.Tensor, bits: int, dtype: torch.dtype) -> QuantizedWeight:
    if bits == 8:
        return Int8Weight.quantize(weight, dtype)
    if bits == 4:
        return Int4Weight.quantize(weight, dtype)
    raise ValueError(f"bits={bits} is not 8 or 4")


def linear(x: torch.Tensor, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (T, in) @ weight (out, in).T (+ bias) for a float or a quantized weight."""
    if isinstance(weight, torch.Tensor):
        return F.linear(x, weight, bias)
    out = weight.matmul(x)  # (T, out)
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
