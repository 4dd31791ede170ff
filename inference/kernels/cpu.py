"""Fused CPU kernels for the forward pass (`cpu_kernels.c`: norms, rotary, attention, SiLU;
`matmul.c`: the batch-invariant matrix products, on AMX tiles in `matmul_amx.c` and AVX512-BF16
dot products in `matmul_avx512bf16.c` where the CPU has them; `threads.c`: their thread pool) and the
per-step read-outs of the distribution: built once per machine with the system's C compiler,
loaded with ctypes, and called on torch tensors in place.

Owns: compiling (into a cache folder keyed by the sources, flags and CPU, written atomically so
several processes can race), loading, and thin typed wrappers over the C functions. No
compiler, a failed build or `PLAYGROUND_CPU_KERNELS=off`: `load()` returns None and callers
keep their torch ops.
Must not know: models, layers, requests.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCES = tuple(
    HERE / name
    for name in (
        "cpu_kernels.c",
        "matmul.c",
        "matmul_amx.c",
        "matmul_avx512bf16.c",
        "matmul_blocks.c",
        "matmul_blocks_amx.c",
        "matmul_blocks_lanes.c",
        "threads.c",
    )
)
BLOCK_SOURCES = tuple(
    HERE / name for name in ("matmul_blocks.c", "matmul_blocks_amx.c", "matmul_blocks_lanes.c", "threads.c")
)
HEADERS = (HERE / "simd.h", HERE / "threads.h", HERE / "blocks.h")
# -O3 and the host's vector units. No -fassociative-math and no implicit fused multiply-adds
# (-ffp-contract=off): every float sum is added in the order the source writes (simd.h), the
# same for every row whatever shares its call: that is the forward pass's batch invariance.
CFLAGS = ("-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros", "-ffp-contract=off")
LDFLAGS = ("-lm", "-lpthread")
_P, _I, _F, _C = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
SIGNATURES = {
    "pg_add_rms_norm": (_P, _P, _C, _P, _P, _C, _I, _I, _F),
    "pg_silu_mul": (_P, _C, _P, _C, _I, _I, _C),
    "pg_rope_write_kv": (_P, _C, _P, _P, _P, _P, _P, _C, _P, _I, _I, _I, _I, _I, _I),
    "pg_attention": (_P, _P, _P, _C, _P, _P, _P, _I, _I, _I, _I, _I, _I, _F, _P, _C, _C),
    "pg_matmul": (_P, _C, _I, _I, _C, _P, _P, _C, _I, _P, _C, _P, _C, _C),
    "pg_amx": (_C,),
    "pg_avx512bf16": (_C,),
    "pg_top_k": (_P, _I, _I, _P, _P),
    "pg_entropy": (_P, _I),
    "pg_count_greater": (_P, _I, _F),
    "pg_read_outs": (_P, _P, _I, _I, _P, _I, _P, _P, _P, _P, _P, _P, _P, _P, _C),
    "pg_argmax": (_P, _I, _I, _P, _C),
    "pg_matmul_blocks": (_P, _C, _I, _I, _C, _P, _I, _C, _P, _C, _P, _I, _C, _C),
    "pg_dequantize_blocks": (_C, _P, _I, _I, _C, _P),
    "pg_blocks_interleave": (_C,),
    "pg_blocks_repack": (_C, _P, _I, _I),
    "pg_blocks_unpack": (_C, _P, _I, _I, _P),
    "pg_block_row_bytes": (_C, _I),
    "pg_blocks_amx": (_C,),
}
RESTYPES = {
    "pg_entropy": ctypes.c_float,
    "pg_count_greater": ctypes.c_int64,
    "pg_amx": ctypes.c_int,
    "pg_avx512bf16": ctypes.c_int,
    "pg_matmul_blocks": ctypes.c_int,
    "pg_dequantize_blocks": ctypes.c_int,
    "pg_blocks_interleave": ctypes.c_int,
    "pg_blocks_repack": ctypes.c_int,
    "pg_blocks_unpack": ctypes.c_int,
    "pg_block_row_bytes": ctypes.c_int64,
    "pg_blocks_amx": ctypes.c_int,
}


# Weight formats `CpuKernels.matmul` reads (matmul.c's PG_F32 ...).
WEIGHT_F32, WEIGHT_BF16, WEIGHT_INT8, WEIGHT_INT4 = 0, 1, 2, 3


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "llm-playground" / "kernels"


def cpu_flags() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((line for line in lines if line.startswith(("flags", "Features"))), "")


def build(sources: tuple[Path, ...] = SOURCES, out_dir: Path | None = None, march: str = "native") -> Path:
    """Compile `sources` into one shared library (once per sources, flags and compiler); return its
    path. `march` other than native builds another CPU's paths here (tests: the AVX2 path on an
    AVX-512 machine, the plain C one anywhere)."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise RuntimeError("no C compiler (cc/gcc) on PATH")
    # -march=native: the library is for this CPU, so its flags are part of the key too.
    cflags = tuple(f"-march={march}" if flag == "-march=native" else flag for flag in CFLAGS)
    key_text = " ".join((compiler, *cflags, *LDFLAGS, platform.machine(), cpu_flags()))
    text = b"".join(path.read_bytes() for path in (*sources, *HEADERS))
    key = hashlib.sha256(text + key_text.encode()).hexdigest()[:16]
    out_dir = out_dir or cache_dir()
    target = out_dir / f"cpu_kernels-{key}.so"
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        built = Path(tmp) / target.name
        cmd = [compiler, *cflags, "-shared", "-fPIC", "-o", str(built), *map(str, sources), *LDFLAGS]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {result.stderr.strip()[-2000:]}")
        os.replace(built, target)  # atomic: a racing process sees the whole library or none
    return target


@cache
def load() -> CpuKernels | None:
    """The kernels, or None when they are switched off or cannot be built here (logged once)."""
    if os.environ.get("PLAYGROUND_CPU_KERNELS", "on").lower() in ("0", "off", "false", "no"):
        return None
    try:
        try:
            path = build()
        except OSError:  # no usable cache folder (a container's read-only home ...): a private temp one
            path = build(out_dir=Path(tempfile.gettempdir()) / f"llm-playground-kernels-{os.getuid()}")
        return CpuKernels(ctypes.CDLL(str(path)))
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        log.warning("fused CPU decode kernels unavailable, using torch ops: %s", error)
        return None


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _is_bf16(t: torch.Tensor) -> int:
    return int(t.dtype == torch.bfloat16)


@dataclass(frozen=True)
class KVAddress:
    """Where one layer's keys and values of a cache live, as the kernels address them: head `j`
    of the token in slot `s` starts `s * slot_stride + j * head_stride` elements after `keys`
    (or `values`). Any cache layout with a slot dim and a head dim fits (contiguous or paged)."""

    keys: int  # address of the layer's first key element
    values: int
    slot_stride: int
    head_stride: int
    is_bf16: int

    @classmethod
    def layers(cls, buffer: torch.Tensor, slot_dim: int, head_dim: int) -> list[KVAddress]:
        """Every layer of a (layers, 2, ...) cache buffer whose slot and head dims are given."""
        step, strides, is_bf16 = buffer.element_size(), buffer.stride(), _is_bf16(buffer)
        first, layer_bytes, values_offset = buffer.data_ptr(), strides[0] * step, strides[1] * step
        return [
            cls(keys, keys + values_offset, strides[slot_dim], strides[head_dim], is_bf16)
            for keys in range(first, first + buffer.shape[0] * layer_bytes, layer_bytes)
        ]


class CpuKernels:
    """Thin typed wrappers, called per layer: no checks here (each would cost as much as the
    kernel). Callers pass contiguous CPU tensors of the documented shapes and dtypes (float32 or
    bfloat16 where not said); `tests/inference/kernels/test_cpu_kernels.py` holds each kernel to torch's math."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        for name, argtypes in SIGNATURES.items():
            getattr(lib, name).argtypes = argtypes
            getattr(lib, name).restype = RESTYPES.get(name)
        self.lib = lib

    def add_rms_norm(
        self, h: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, out: torch.Tensor, eps: float
    ) -> None:
        """h += delta (if given), then out = rms_norm(h) * weight: h (T, dim) and weight (dim,) float32."""
        rows, dim = h.shape
        delta_bf16 = 0 if delta is None else _is_bf16(delta)
        self.lib.pg_add_rms_norm(
            h.data_ptr(), _ptr(delta), delta_bf16, weight.data_ptr(), out.data_ptr(), _is_bf16(out), rows, dim, eps
        )

    def silu_mul(self, gate_up: torch.Tensor, out: torch.Tensor) -> None:
        """out (T, I) = silu(gate) * up of gate_up (T, 2I) = [gate | up]."""
        rows, inter = out.shape
        self.lib.pg_silu_mul(
            gate_up.data_ptr(), _is_bf16(gate_up), out.data_ptr(), _is_bf16(out), rows, inter, torch.get_num_threads()
        )

    def rope_write_kv(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q: torch.Tensor, kv: KVAddress, slots
    ) -> None:
        """The rotary embedding of qkv (T, (H + 2 KVH) D) at cos/sin (T, D) float32: q into q (T, H, D)
        float32, k and v of row t into slot slots[t] (int64) of the cache."""
        num_rows, num_heads, head_dim = q.shape
        num_kv_heads = (qkv.shape[1] // head_dim - num_heads) // 2
        self.lib.pg_rope_write_kv(
            qkv.data_ptr(),
            _is_bf16(qkv),
            cos.data_ptr(),
            sin.data_ptr(),
            q.data_ptr(),
            kv.keys,
            kv.values,
            kv.is_bf16,
            slots.data_ptr(),
            kv.slot_stride,
            kv.head_stride,
            num_rows,
            num_heads,
            num_kv_heads,
            head_dim,
        )

    def attention(
        self,
        q: torch.Tensor,
        kv: KVAddress,
        num_kv_heads: int,
        lengths: torch.Tensor,
        slots: torch.Tensor | None,
        starts: torch.Tensor | None,
        out: torch.Tensor,
    ) -> None:
        """q (B, H, D) float32: row b attends to its lengths[b] cached positions, position p in slot
        slots[starts[b] + p] (int64 each), or in slot p when `slots` is None -> out (B, H, D).
        Decode rows and prompt rows alike (a prompt chunk's rows share its slots, with lengths
        start + 1, start + 2 ...): one row's result never depends on the others."""
        batch, num_heads, head_dim = q.shape
        self.lib.pg_attention(
            q.data_ptr(),
            kv.keys,
            kv.values,
            kv.is_bf16,
            _ptr(slots),
            _ptr(starts),
            lengths.data_ptr(),
            kv.slot_stride,
            kv.head_stride,
            batch,
            num_heads,
            num_kv_heads,
            head_dim,
            head_dim**-0.5,
            out.data_ptr(),
            _is_bf16(out),
            torch.get_num_threads(),
        )

    def matmul(
        self,
        x: torch.Tensor,
        kind: int,
        weight: torch.Tensor,
        scales: torch.Tensor | None,
        bias: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """x (M, K) @ w (N, K)^T (+ bias (N,)) -> (M, N) in `out_dtype` (None: x's), each output
        element summed in one order whatever M is (`matmul.c`). `kind` says what `weight` and
        `scales` hold: WEIGHT_F32 / WEIGHT_BF16 (N, K); WEIGHT_INT8 (N, K) int8 codes, scales (N,);
        WEIGHT_INT4 (N, K / 2) uint8, groups of 32 along K (low nibbles weights 0-15, high ones
        16-31), scales (K / 32, N, 2) = (scale, zero). x, scales, bias: float32 or bfloat16; the
        weights' rows contiguous."""
        x = x.contiguous()
        rows, inner = x.shape
        out = torch.empty(rows, weight.shape[0], dtype=out_dtype or x.dtype)
        self.lib.pg_matmul(
            x.data_ptr(),
            _is_bf16(x),
            rows,
            inner,
            kind,
            weight.data_ptr(),
            _ptr(scales),
            0 if scales is None else _is_bf16(scales),
            weight.shape[0],
            _ptr(bias),
            0 if bias is None else _is_bf16(bias),
            out.data_ptr(),
            _is_bf16(out),
            torch.get_num_threads(),
        )
        return out

    def matmul_blocks(
        self,
        x: torch.Tensor,
        type_id: int,
        blocks: torch.Tensor,
        bias: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        interleave: int = 0,
    ) -> torch.Tensor:
        """x (M, K) @ w (N, K)^T (+ bias (N,)) where `blocks` (N, row bytes) uint8 holds each row of
        w in the GGML block format `type_id` (Q4_0 ... Q6_K: `matmul_blocks.c`), as the file does
        (`interleave` 0) or repacked (`repack_blocks`) -> out (M, N) in x's dtype, or written into
        `out` (M, >= N, a column slice of a wider output allowed: its row stride is kept)."""
        x = x.contiguous()
        rows, inner = x.shape
        if out is None:
            out = torch.empty(rows, blocks.shape[0], dtype=x.dtype)
        status = self.lib.pg_matmul_blocks(
            x.data_ptr(),
            _is_bf16(x),
            rows,
            inner,
            type_id,
            blocks.data_ptr(),
            blocks.shape[0],
            interleave,
            _ptr(bias),
            0 if bias is None else _is_bf16(bias),
            out.data_ptr(),
            out.stride(0),
            _is_bf16(out),
            torch.get_num_threads(),
        )
        if status != 0:
            raise ValueError(
                f"GGML type {type_id} with K={inner} (interleave {interleave}) is not a block format the kernels read"
            )
        return out

    def blocks_interleave(self, type_id: int) -> int:
        """Rows per block this build multiplies GGML type `type_id` in when repacked (16: outputs
        as vector lanes, `matmul_blocks_lanes.c`), or 0: it reads the file's layout."""
        return self.lib.pg_blocks_interleave(type_id)

    def repack_blocks(self, type_id: int, blocks: torch.Tensor, inner: int) -> None:
        """`blocks` (N, row bytes), N a multiple of `blocks_interleave`, repacked in place."""
        if not blocks.is_contiguous() or self.lib.pg_blocks_repack(type_id, blocks.data_ptr(), blocks.shape[0], inner):
            raise ValueError(f"GGML type {type_id} with K={inner}, {blocks.shape[0]} rows: not a layout to repack")

    def unpack_blocks(self, type_id: int, blocks: torch.Tensor, inner: int) -> torch.Tensor:
        """Repacked `blocks` back in the file's layout (a new tensor)."""
        out = torch.empty_like(blocks)
        if self.lib.pg_blocks_unpack(type_id, blocks.data_ptr(), blocks.shape[0], inner, out.data_ptr()):
            raise ValueError(f"GGML type {type_id} with K={inner}, {blocks.shape[0]} rows: not a repacked layout")
        return out

    def blocks_amx(self, on: bool | None = None) -> bool:
        """Whether block products of 9 rows and more run on AMX-INT8 tiles here (the same numbers as
        the vector path: `on` switches them for this process, for tests and benchmarks)."""
        return bool(self.lib.pg_blocks_amx(-1 if on is None else int(on)))

    def block_row_bytes(self, type_id: int, inner: int) -> int:
        """Bytes of one row of `inner` weights in GGML block format `type_id`; -1 if not readable."""
        return self.lib.pg_block_row_bytes(type_id, inner)

    def dequantize_blocks(self, type_id: int, blocks: torch.Tensor, inner: int, interleave: int = 0) -> torch.Tensor:
        """(N, inner) float32: the exact values of `blocks` (N, row bytes) in format `type_id`,
        laid out as `matmul_blocks`' (`interleave`)."""
        out = torch.empty(blocks.shape[0], inner)
        status = self.lib.pg_dequantize_blocks(
            type_id, blocks.data_ptr(), blocks.shape[0], inner, interleave, out.data_ptr()
        )
        if status != 0:
            raise ValueError(f"GGML type {type_id} with K={inner} is not a block format the kernels read")
        return out

    def amx(self, on: bool | None = None) -> bool:
        """Whether bfloat16 products run on AMX tiles here (`matmul_amx.c`); `on` switches them
        for this process (benchmarks compare both paths: never mid-generation, or the same token
        could get other logits)."""
        return bool(self.lib.pg_amx(-1 if on is None else int(on)))

    def avx512_bf16(self, on: bool | None = None) -> bool:
        """Whether bfloat16, int8 and int4 products with bfloat16 x run on AVX512-BF16 dot
        products here (`matmul_avx512bf16.c`: CPUs without AMX, or with AMX switched off); `on`
        switches them for this process, as `amx`."""
        return bool(self.lib.pg_avx512bf16(-1 if on is None else int(on)))

    def top_k(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The k (<= len) largest of x (V,) float32, largest first, ties in index order -> (values, ids)."""
        values, ids = torch.empty(k), torch.empty(k, dtype=torch.long)
        self.lib.pg_top_k(x.data_ptr(), x.shape[0], k, ids.data_ptr(), values.data_ptr())
        return values, ids

    def entropy(self, logprobs: torch.Tensor) -> float:
        """-sum p log p in nats of logprobs (V,) float32 (-inf terms count 0)."""
        return self.lib.pg_entropy(logprobs.data_ptr(), logprobs.shape[0])

    def count_greater(self, x: torch.Tensor, value: float) -> int:
        """How many of x (V,) float32 are greater than `value`."""
        return self.lib.pg_count_greater(x.data_ptr(), x.shape[0], value)

    def argmax(self, x: torch.Tensor) -> torch.Tensor:
        """(S,) int64: each row's argmax of x (S, V) contiguous float32, as torch.argmax (the first
        NaN, else the first of the largest)."""
        ids = torch.empty(x.shape[0], dtype=torch.long)
        self.lib.pg_argmax(x.data_ptr(), x.shape[0], x.shape[1], ids.data_ptr(), torch.get_num_threads())
        return ids

    def read_outs(self, raw: torch.Tensor, processed: torch.Tensor | None, token_ids: torch.Tensor, k: int) -> ReadOuts:
        """A step's read-outs in one call: `raw` and `processed` (S, V) contiguous float32 logprobs
        (None: no processor, only the raw top-k), `token_ids` (S,) int64 (contiguous), `k` <= V."""
        num_rows, vocab_size = raw.shape
        out = ReadOuts(
            is_valid=torch.empty(num_rows, dtype=torch.long),
            chosen=torch.empty(num_rows, 2),
            ranks=torch.empty(num_rows, dtype=torch.long),
            entropies=torch.empty(num_rows),
            top_raw_ids=torch.empty(num_rows, k, dtype=torch.long),
            top_raw_values=torch.empty(num_rows, k),
            top_processed_ids=None if processed is None else torch.empty(num_rows, k, dtype=torch.long),
            top_processed_values=None if processed is None else torch.empty(num_rows, k),
        )
        self.lib.pg_read_outs(
            raw.data_ptr(),
            _ptr(processed),
            num_rows,
            vocab_size,
            token_ids.data_ptr(),
            k,
            out.is_valid.data_ptr(),
            out.chosen.data_ptr(),
            out.ranks.data_ptr(),
            out.entropies.data_ptr(),
            out.top_raw_ids.data_ptr(),
            out.top_raw_values.data_ptr(),
            _ptr(out.top_processed_ids),
            _ptr(out.top_processed_values),
            torch.get_num_threads(),
        )
        return out


@dataclass(frozen=True)
class ReadOuts:
    """`CpuKernels.read_outs`' answer, one row per sampled row (top-k: most likely first)."""

    is_valid: torch.Tensor  # (S,) 1: the token is in the vocabulary and something was finite to draw from
    chosen: torch.Tensor  # (S, 2) the token's processed and raw logprobs (NaN when not valid)
    ranks: torch.Tensor  # (S,) 1-based rank of the token in the raw distribution (0 when not valid)
    entropies: torch.Tensor  # (S,) of the raw distribution, nats
    top_raw_ids: torch.Tensor  # (S, k)
    top_raw_values: torch.Tensor  # (S, k) raw logprobs
    top_processed_ids: torch.Tensor | None  # (S, k), None without processed logprobs
    top_processed_values: torch.Tensor | None
