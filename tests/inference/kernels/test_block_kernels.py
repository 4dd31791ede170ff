"""The GGUF block kernels (`inference/kernels/matmul_blocks.c`, `quant.BlockWeight`): each format
read exactly as the file stores it, products within int8-activation error of the float product,
and one sum in one order: the same bits for a row alone or batched, and on every path the
library has (VNNI, AVX2 `maddubs`, plain C), each built here whatever this CPU is."""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import GGML_QUANT_SIZES, dequantize, quantize

from inference.kernels import cpu as cpu_kernels
from inference.models.quant import BLOCK_TYPES, BlockWeight, Stacked

HAS_COMPILER = bool(shutil.which("cc") or shutil.which("gcc"))
KERNELS = cpu_kernels.load()
# Without a compiler nothing here runs; with one, a library that fails to build fails the tests.
pytestmark = pytest.mark.skipif(not HAS_COMPILER, reason="no C compiler: the block kernels are not built")
HALF_OFFSETS = {2: (0,), 3: (0, 2), 6: (0,), 7: (0, 2), 8: (0,), 12: (0, 2), 13: (0, 2), 14: (208,)}
# march -> the CPU flags it needs to run here ("x86-64" is the plain C path: no AVX2)
PATHS = {"haswell": ("avx2", "fma", "f16c"), "x86-64": ()}


def test_the_library_builds_where_a_compiler_is() -> None:
    assert KERNELS is not None, "a compiler is present, so the kernels must build (see the log's warning)"


def random_blocks(type_id: int, rows: int, inner: int, seed: int = 0) -> np.ndarray:
    """(rows, row bytes) of random codes with sane fp16 scales (random bytes there would be NaN/inf)."""
    rng = np.random.default_rng(seed)
    block_weights, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    data = rng.integers(0, 256, size=(rows, inner // block_weights, block_bytes), dtype=np.uint8)
    for offset in HALF_OFFSETS[type_id]:
        halves = (rng.standard_normal(data.shape[:2]) * 0.01).astype(np.float16)
        data[:, :, offset : offset + 2] = halves.view(np.uint8).reshape(*data.shape[:2], 2)
    return data.reshape(rows, -1)


def inner_for(type_id: int) -> int:
    return 1024 if type_id >= 12 else 800  # 800: 25 units, a last group of one


@pytest.mark.parametrize("type_id", sorted(BLOCK_TYPES))
def test_each_format_reads_the_files_exact_values(type_id: int) -> None:
    inner = inner_for(type_id)
    data = random_blocks(type_id, 24, inner)
    expected = dequantize(data, GGMLQuantizationType(type_id)).astype(np.float32).reshape(24, inner)
    got = KERNELS.dequantize_blocks(type_id, torch.from_numpy(data), inner)
    assert torch.equal(got, torch.from_numpy(expected))


@pytest.mark.parametrize("type_id", sorted(BLOCK_TYPES))
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
def test_products_are_the_float_product_within_int8_activation_error_and_batch_invariant(type_id, x_dtype) -> None:
    inner = inner_for(type_id)
    weight = BlockWeight(torch.from_numpy(random_blocks(type_id, 40, inner)), type_id, inner)
    x = torch.randn(7, inner, generator=torch.Generator().manual_seed(1)).to(x_dtype)
    out = weight.matmul(x, torch.float32)  # (7, 40)
    reference = x.float() @ weight.dequantize().t()
    # x rounded to int8 per 32: each product is off by about |w| * max|x| / 254 per weight
    assert (out - reference).abs().max() <= 0.02 * reference.abs().max()
    for row in range(7):  # a row alone, or in any batch: the same bits
        assert torch.equal(weight.matmul(x[row : row + 1], torch.float32), out[row : row + 1])
    assert torch.equal(weight.matmul(x[2:5], torch.float32), out[2:5])


def _library(march: str) -> cpu_kernels.CpuKernels:
    lib = ctypes.CDLL(str(cpu_kernels.build(cpu_kernels.BLOCK_SOURCES, march=march)))
    for name in ("pg_matmul_blocks", "pg_dequantize_blocks", "pg_block_row_bytes"):
        getattr(lib, name).argtypes = cpu_kernels.SIGNATURES[name]
        getattr(lib, name).restype = cpu_kernels.RESTYPES[name]
    kernels = cpu_kernels.CpuKernels.__new__(cpu_kernels.CpuKernels)
    kernels.lib = lib
    return kernels


@pytest.mark.parametrize("march", sorted(PATHS))
def test_every_path_gives_the_same_bits(march: str) -> None:
    """The AVX2 path (built on AVX-512 machines too) and the plain C one equal this CPU's own."""
    flags = cpu_kernels.cpu_flags().split()
    if not all(flag in flags for flag in PATHS[march]):
        pytest.skip(f"this CPU cannot run the {march} build")
    other = _library(march)
    for type_id in sorted(BLOCK_TYPES):
        inner = inner_for(type_id)
        blocks = torch.from_numpy(random_blocks(type_id, 33, inner, seed=type_id))
        x = torch.randn(5, inner, generator=torch.Generator().manual_seed(type_id)).bfloat16()
        theirs, ours = other.matmul_blocks(x, type_id, blocks), KERNELS.matmul_blocks(x, type_id, blocks)
        assert torch.equal(theirs, ours), BLOCK_TYPES[type_id]


def test_gguf_py_quantized_weights_multiply_like_their_floats() -> None:
    """Blocks as llama.cpp's quantizer writes them (not random bytes): the product tracks the float one."""
    gen = torch.Generator().manual_seed(3)
    weights = torch.randn(64, 512, generator=gen)
    x = torch.randn(3, 512, generator=gen)
    for type_id in (2, 3, 6, 7, 8):  # the types gguf-py can write
        data = quantize(weights.numpy(), GGMLQuantizationType(type_id))
        out = BlockWeight(torch.from_numpy(data), type_id, 512).matmul(x)
        reference = x @ weights.t()
        assert (out - reference).norm() / reference.norm() < {8: 0.01, 6: 0.05, 7: 0.05}.get(type_id, 0.1)


def test_bias_output_slices_and_bad_shapes() -> None:
    blocks = torch.from_numpy(random_blocks(8, 16, 256))
    x = torch.randn(2, 256)
    bias = torch.randn(16)
    wide = torch.zeros(2, 40)
    KERNELS.matmul_blocks(x, 8, blocks, bias, wide[:, 8:24])  # a column slice: its row stride is kept
    expected = KERNELS.matmul_blocks(x, 8, blocks) + bias
    assert torch.equal(wide[:, 8:24], expected)
    assert not wide[:, :8].any() and not wide[:, 24:].any()
    with pytest.raises(ValueError, match="GGML type 8 with K=250"):
        KERNELS.matmul_blocks(torch.randn(2, 250), 8, blocks)
    with pytest.raises(ValueError, match="GGML type 10"):  # Q2_K: not a format the kernels read
        KERNELS.matmul_blocks(x, 10, blocks)


def test_block_weights_join_within_a_type_and_stack_across_types() -> None:
    q8 = BlockWeight(torch.from_numpy(random_blocks(8, 16, 256, seed=1)), 8, 256)
    q8b = BlockWeight(torch.from_numpy(random_blocks(8, 8, 256, seed=2)), 8, 256)
    q5 = BlockWeight(torch.from_numpy(random_blocks(6, 8, 256, seed=3)), 6, 256)
    x = torch.randn(3, 256)
    joined = BlockWeight.join([q8, q8b])
    assert torch.equal(joined.matmul(x), torch.cat([q8.matmul(x), q8b.matmul(x)], -1))
    assert torch.equal(joined.rows(16, 24).blocks, q8b.blocks)
    assert not BlockWeight.can_join([q8, q5])
    with pytest.raises(ValueError, match="one GGML type"):
        BlockWeight.join([q8, q5])
    stacked = Stacked((q8, q5))
    assert stacked.shape == (24, 256)
    assert torch.equal(stacked.matmul(x), torch.cat([q8.matmul(x), q5.matmul(x)], -1))


def test_a_prompts_rows_on_amx_tiles_give_the_vector_paths_bits() -> None:
    """9 rows and more take AMX-INT8 tiles where the CPU has them (a last block of 16 rows padded,
    the outputs past the last whole 32 on the vector path): the same numbers, so a prompt position
    equals the same token's decode step."""
    if not KERNELS.blocks_amx():
        pytest.skip("no AMX-INT8 tiles on this CPU")
    try:
        for type_id in sorted(BLOCK_TYPES):
            inner = inner_for(type_id)
            weight = BlockWeight(torch.from_numpy(random_blocks(type_id, 72, inner, seed=type_id)), type_id, inner)
            x = torch.randn(40, inner, generator=torch.Generator().manual_seed(type_id)).bfloat16()
            on_tiles = weight.matmul(x, torch.float32)  # outputs 0-63 on tiles (rows 32-39 padded), 64-71 not
            ten_rows = weight.matmul(x[:10], torch.float32)
            KERNELS.blocks_amx(False)
            assert torch.equal(on_tiles, weight.matmul(x, torch.float32)), BLOCK_TYPES[type_id]
            assert torch.equal(ten_rows, weight.matmul(x[:10], torch.float32)), BLOCK_TYPES[type_id]
            KERNELS.blocks_amx(True)
            assert torch.equal(on_tiles[17:18], weight.matmul(x[17:18], torch.float32))
    finally:
        KERNELS.blocks_amx(True)


REPACKABLE = [type_id for type_id in sorted(BLOCK_TYPES) if KERNELS is not None and KERNELS.blocks_interleave(type_id)]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)


def test_the_formats_a_vnni_build_repacks() -> None:
    flags = cpu_kernels.cpu_flags().split()
    expected = [2, 6, 8, 12, 14] if {"avx512f", "avx512bw", "avx512_vnni"} <= set(flags) else []
    assert REPACKABLE == expected  # AVX2 builds read every format as the file stores it


@pytest.mark.parametrize("type_id", REPACKABLE)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_repacked_weights_give_the_file_layouts_bits_on_every_path(type_id: int, out_dtype: torch.dtype) -> None:
    """16 rows at a time, outputs as vector lanes (matmul_blocks_lanes.c), AMX tiles from 32 rows of
    x: each output the same bits as the file's layout gives, alone, batched or in a prompt."""
    inner = inner_for(type_id)
    weight = BlockWeight(torch.from_numpy(random_blocks(type_id, 48, inner, seed=type_id)), type_id, inner)
    repacked = BlockWeight(weight.blocks.clone(), type_id, inner).repacked()
    assert repacked.interleave == 16 and not torch.equal(repacked.blocks, weight.blocks)
    assert torch.equal(repacked.dequantize(), weight.dequantize())
    assert torch.equal(repacked.in_file_layout().blocks, weight.blocks)
    bias = torch.randn(48, generator=torch.Generator().manual_seed(2))
    x = torch.randn(37, inner, generator=torch.Generator().manual_seed(type_id)).bfloat16()
    try:
        for amx in (True, False):  # 37 rows: on AMX tiles (a last tile of 5 rows) where the CPU has them
            KERNELS.blocks_amx(amx)
            for rows in (slice(0, 1), slice(3, 11), slice(0, 37)):
                outs = [torch.empty(rows.stop - rows.start, 48, dtype=out_dtype) for _ in range(2)]
                expected = KERNELS.matmul_blocks(x[rows], type_id, weight.blocks, bias, outs[0])
                got = KERNELS.matmul_blocks(x[rows], type_id, repacked.blocks, bias, outs[1], 16)
                assert torch.equal(_bits(got), _bits(expected)), (BLOCK_TYPES[type_id], amx, rows)
            wide = torch.zeros(2, 64, dtype=out_dtype)
            KERNELS.matmul_blocks(x[:2], type_id, repacked.blocks, None, wide[:, 8:56], 16)  # a column slice
            assert torch.equal(_bits(wide[:, 8:56]), _bits(weight.matmul(x[:2], out_dtype)))
    finally:
        KERNELS.blocks_amx(True)


@pytest.mark.skipif(6 not in REPACKABLE, reason="this build reads Q5_0 as the file stores it")
def test_a_repacked_weights_rows_joins_and_lookups() -> None:
    parts = [BlockWeight(torch.from_numpy(random_blocks(6, 32, 256, seed=s)), 6, 256) for s in (1, 2)]
    repacked = [BlockWeight(p.blocks.clone(), 6, 256).repacked() for p in parts]
    joined = BlockWeight.join(repacked)
    assert joined.interleave == 16 and torch.equal(joined.dequantize(), BlockWeight.join(parts).dequantize())
    assert torch.equal(joined.rows(32, 64).dequantize(), parts[1].dequantize())
    with pytest.raises(ValueError, match="rows 8..40 of a weight repacked 16 rows at a time"):
        joined.rows(8, 40)
    ids = torch.tensor([63, 0, 17, 17, 40])
    assert torch.equal(joined.take(ids).blocks, BlockWeight.join(parts).take(ids).blocks)
    assert not BlockWeight.can_join([repacked[0], parts[1]])  # one layout per join
    odd = BlockWeight(torch.from_numpy(random_blocks(6, 24, 256)), 6, 256)
    assert odd.repacked() is odd  # 24 rows: not whole blocks of 16, kept as the file has them
    with pytest.raises(ValueError, match="interleave 16"):
        KERNELS.matmul_blocks(torch.randn(1, 256), 6, odd.blocks, None, None, 16)
