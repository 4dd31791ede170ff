"""The fused CPU kernels (`inference/kernels/cpu_kernels.c`) against torch's math, and the runners
that use them against the torch path.

Each kernel equals its torch formula (float32: to ~1e-6; bfloat16 outputs: to one rounding step),
on both cache layouts (contiguous and paged, with scattered slots), with grouped-query heads and
head sizes with and without a specialised copy; the read-outs keep torch's tie and -inf rules.
A runner on the kernels gives the torch path's logits (float32) and a sequence the same tokens
alone or batched; without a compiler, or switched off, everything falls back to torch.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812 (torch's own convention)

from inference import SamplingParams
from inference.bench.stack import ENGINE_THREADS
from inference.kernels import cpu as cpu_kernels
from inference.kernels.cpu import KVAddress
from inference.models.matmul import invariant_linear
from inference.models.quant import Int4Weight, Int8Weight
from tests.inference.engines import engine_for
from tests.inference.test_batching import alone, run_all, tokens

BF16 = torch.bfloat16
EPS = 1e-5


@pytest.fixture(scope="module")
def kernels() -> cpu_kernels.CpuKernels:
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("no C compiler here: the runners use torch ops (tested everywhere else)")
    loaded = cpu_kernels.load()
    assert loaded is not None, "a compiler is present, so the kernels must build"
    return loaded


def rand(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def assert_bf16_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal up to one bfloat16 rounding step (the kernels round once, torch's formula may twice)."""
    assert got.dtype == BF16
    assert torch.allclose(got.float(), want.float(), rtol=2**-7, atol=1e-6)


@pytest.mark.parametrize("out_dtype", [torch.float32, BF16])
def test_add_rms_norm_adds_the_residual_in_place_and_norms_it(kernels, out_dtype: torch.dtype) -> None:
    h, delta, weight = rand(3, 96), rand(3, 96, seed=1, dtype=BF16), rand(96, seed=2)
    want_h = h + delta.float()
    want = want_h * torch.rsqrt(want_h.pow(2).mean(-1, keepdim=True) + EPS) * weight
    out = torch.empty(3, 96, dtype=out_dtype)
    kernels.add_rms_norm(h, delta, weight, out, EPS)
    assert torch.equal(h, want_h)
    if out_dtype == BF16:
        assert_bf16_close(out, want)
    else:
        assert torch.allclose(out, want, rtol=1e-5, atol=1e-6)
    kernels.add_rms_norm(h, None, weight, out, EPS)  # no residual: h stays
    assert torch.equal(h, want_h)


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_silu_mul_gates_the_up_projection(kernels, dtype: torch.dtype) -> None:
    gate_up = (rand(2, 2 * 80, seed=3) * 6).to(dtype)  # wide range: the exp's tails matter
    gate, up = gate_up.float().split(80, dim=-1)
    want = F.silu(gate) * up
    out = torch.empty(2, 80, dtype=dtype)
    kernels.silu_mul(gate_up, out)
    if dtype == BF16:
        assert_bf16_close(out, want)
    else:
        assert torch.allclose(out, want, rtol=1e-5, atol=1e-6)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' rotary embedding: x * cos + rotate_half(x) * sin over the last dim."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def rotary_table(num_rows: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    angles = rand(num_rows, head_dim // 2, seed=4) * 3
    angles = torch.cat((angles, angles), dim=-1)  # (T, D): both halves share a frequency
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("kv_dtype", [torch.float32, BF16])
@pytest.mark.parametrize("head_dim", [64, 8])
def test_rope_write_kv_rotates_q_and_k_and_writes_k_and_v_to_their_slots(
    kernels, layout: str, kv_dtype: torch.dtype, head_dim: int
) -> None:
    num_heads, num_kv_heads, num_rows, num_slots = 4, 2, 3, 10
    qkv = rand(num_rows, (num_heads + 2 * num_kv_heads) * head_dim, seed=5, dtype=BF16)
    cos, sin = rotary_table(num_rows, head_dim)
    slots = torch.tensor([7, 2, 5])
    if layout == "contiguous":  # (layers, 2, KVH, capacity, D)
        buffer = torch.full((2, 2, num_kv_heads, num_slots, head_dim), 9.0, dtype=kv_dtype)
        kv = KVAddress.layers(buffer, slot_dim=3, head_dim=2)[1]
        stored = buffer[1].transpose(1, 2)  # (2, slots, KVH, D)
    else:  # (layers, 2, slots, KVH, D)
        buffer = torch.full((2, 2, num_slots, num_kv_heads, head_dim), 9.0, dtype=kv_dtype)
        kv = KVAddress.layers(buffer, slot_dim=2, head_dim=3)[1]
        stored = buffer[1]
    q = torch.empty(num_rows, num_heads, head_dim)
    kernels.rope_write_kv(qkv, cos, sin, q, kv, slots)
    heads = qkv.float().view(num_rows, num_heads + 2 * num_kv_heads, head_dim)
    rotated = rotate(heads[:, : num_heads + num_kv_heads], cos[:, None], sin[:, None])
    assert torch.allclose(q, rotated[:, :num_heads], rtol=1e-6, atol=1e-6)
    assert torch.allclose(stored[0, slots].float(), rotated[:, num_heads:].to(kv_dtype).float(), atol=1e-6)
    assert torch.equal(stored[1, slots], heads[:, num_heads + num_kv_heads :].to(kv_dtype))
    untouched = [s for s in range(num_slots) if s not in slots.tolist()]
    assert (stored[:, untouched] == 9).all() and (buffer[0] == 9).all()  # other slots and layers


def reference_attention(q: torch.Tensor, pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """torch's attention of one row q (H, D) over the paged pool's (layers, 2, S, KVH, D) `slots`."""
    keys, values = (pool[0, i, slots].float().transpose(0, 1) for i in (0, 1))  # (KVH, L, D)
    return F.scaled_dot_product_attention(q[:, None], keys, values, enable_gqa=True)[:, 0]  # (H, D)


@pytest.mark.parametrize("kv_dtype", [torch.float32, BF16])
@pytest.mark.parametrize("head_dim", [64, 128, 16])
def test_attention_reads_each_row_from_its_own_slots(kernels, kv_dtype, head_dim: int) -> None:
    """Decode rows (one per sequence) and a prompt chunk's rows (sharing its slots, each up to its
    own position) in one call, each equal to torch's attention over its positions."""
    num_heads, num_kv_heads, num_slots = 6, 2, 64
    pool = rand(1, 2, num_slots, num_kv_heads, head_dim, seed=6).to(kv_dtype)  # paged: (layers, 2, S, KVH, D)
    perm = torch.randperm(num_slots, generator=torch.Generator().manual_seed(7))
    # two decodes (5 and 1 positions), then a chunk of three prompt rows at positions 14, 15, 16
    slots = torch.cat([perm[:5], perm[5:6], perm[6:23]])
    starts, lengths = torch.tensor([0, 5, 6, 6, 6]), torch.tensor([5, 1, 15, 16, 17])
    q = rand(5, num_heads, head_dim, seed=8)
    out = torch.empty(5, num_heads, head_dim, dtype=kv_dtype)
    kernels.attention(q, KVAddress.layers(pool, slot_dim=2, head_dim=3)[0], num_kv_heads, lengths, slots, starts, out)
    for b, (start, length) in enumerate(zip(starts.tolist(), lengths.tolist())):
        want = reference_attention(q[b], pool, slots[start : start + length])
        if kv_dtype == BF16:
            assert_bf16_close(out[b], want)
        else:
            assert torch.allclose(out[b], want, rtol=1e-5, atol=1e-6), f"row {b}"


def test_attention_on_a_contiguous_cache_reads_positions_in_order(kernels) -> None:
    buffer = rand(3, 2, 2, 40, 64, seed=9)  # (layers, 2, KVH, capacity, D)
    q, out = rand(1, 4, 64, seed=10), torch.empty(1, 4, 64)
    kernels.attention(q, KVAddress.layers(buffer, 3, 2)[2], 2, torch.tensor([23]), None, None, out)
    want = F.scaled_dot_product_attention(q[0][:, None], buffer[2, 0, :, :23], buffer[2, 1, :, :23], enable_gqa=True)
    assert torch.allclose(out[0], want[:, 0], rtol=1e-5, atol=1e-6)


def test_a_rows_attention_is_bitwise_the_same_whatever_else_is_in_the_call(kernels) -> None:
    """A prompt row equals the same position attended as a decode row, alone or among others, on
    one thread or several: the property the batch-invariant forward pass rests on."""
    pool = rand(1, 2, 300, 3, 64, seed=11).to(BF16)
    kv = KVAddress.layers(pool, slot_dim=2, head_dim=3)[0]
    slots = torch.randperm(300, generator=torch.Generator().manual_seed(12))[:250]
    q = rand(250, 9, 64, seed=13)
    lengths = torch.arange(1, 251)
    prompt = torch.empty(250, 9, 64, dtype=BF16)  # every row of a 250-token prompt in one call
    kernels.attention(q, kv, 3, lengths, slots, torch.zeros(250, dtype=torch.long), prompt)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for row in (0, 3, 101, 249):  # each as a lone decode row, on one thread
            alone = torch.empty(1, 9, 64, dtype=BF16)
            kernels.attention(
                q[row : row + 1], kv, 3, lengths[row : row + 1], slots, torch.zeros(1, dtype=torch.long), alone
            )
            assert torch.equal(alone[0], prompt[row]), f"row {row}"
    finally:
        torch.set_num_threads(threads)


def quantized_or_float(kind: str, num_outputs: int, num_inputs: int):
    """(weight as the runners hold it, its float32 reading, the activations' dtype)."""
    w = rand(num_outputs, num_inputs, seed=14) * 0.05
    if kind == "float32":
        return w, w, torch.float32
    if kind == "bfloat16":
        return w.to(BF16), w.to(BF16).float(), BF16
    weight = Int8Weight.quantize(w, BF16) if kind == "int8" else Int4Weight.quantize(w, BF16)
    return weight, weight.dequantize(), BF16


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "int8", "int4"])
def test_matmul_gives_each_row_the_same_bits_whatever_rows_share_the_call(kernels, kind: str) -> None:
    """The products equal x @ w.T, and a row's output is bitwise the same alone, among 2..40
    rows (other tile shapes, int4's unpacked panels past 8 rows), on one thread or several.
    torch's float32 matmul does not promise this (one row and several round differently)."""
    num_inputs = 96 if kind == "int4" else 100  # 100: a tail past the vector width
    weight, reference, dtype = quantized_or_float(kind, 104, num_inputs)  # 104 outputs: partial tiles
    assert weight.layout == "groups" if kind == "int4" else True
    x = rand(40, num_inputs, seed=15).to(dtype)  # 32 rows and more: int4 unpacks panels
    full = invariant_linear(x, weight)
    want = x.float() @ reference.t()
    assert torch.allclose(
        full.float(), want, rtol=2e-2 if dtype == BF16 else 1e-5, atol=1e-2 if dtype == BF16 else 1e-5
    )
    for num_rows in (1, 2, 3, 4, 5, 8, 9, 17, 31, 32):
        assert torch.equal(invariant_linear(x[:num_rows], weight), full[:num_rows]), f"{num_rows} rows"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for row in (0, 6, 39):
            assert torch.equal(invariant_linear(x[row : row + 1], weight)[0], full[row]), f"row {row} alone"
        assert torch.equal(invariant_linear(x, weight), full)
    finally:
        torch.set_num_threads(threads)


def test_matmul_adds_the_bias_and_writes_float32_logits_from_bfloat16(kernels) -> None:
    weight, bias = rand(64, 96, seed=16).to(BF16), rand(64, seed=17).to(BF16)
    x = rand(3, 96, seed=18).to(BF16)
    got = invariant_linear(x, weight, bias, out_dtype=torch.float32)
    assert got.dtype == torch.float32
    want = x.float() @ weight.float().t() + bias.float()
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)  # summed in float32, rounded once
    head = Int8Weight.quantize(rand(64, 96, seed=19), BF16)  # int4 models' 8-bit output head
    logits = head.matmul(x, torch.float32)
    assert logits.dtype == torch.float32
    assert torch.allclose(logits, x.float() @ head.dequantize().t(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("path", ["amx", "avx512_bf16"])
@pytest.mark.parametrize("kind", ["bfloat16", "int8", "int4"])
def test_products_on_bfloat16_instructions_keep_each_rows_bits_and_round_once(kernels, path: str, kind: str) -> None:
    """Where the CPU has AMX, bfloat16 x runs on tiles (`matmul_amx.c`); without AMX, on
    AVX512-BF16 dot products where it has those (`matmul_avx512bf16.c`), with bfloat16, int8 and
    int4 weights: sums in float32 (int8: times the scale; int4: per group on tiles, of weights
    rounded to bfloat16 on dot products), plus the bias, rounded once (bitwise torch's rounding of
    the float32 result); a row's bits the same among 1..40 rows (tiles: one, two and a part of a
    block of 16; dot products: a step's rows unpack weights in registers, more rows into a panel)
    and on one thread; the vector kernels give the same products (to float32 rounding, or to the
    bfloat16 reading of int4 weights)."""
    switch = getattr(kernels, path)
    if not switch():
        pytest.skip(f"{path} does not run on this CPU: the vector kernels (tested above) do")
    weight, reference, _ = quantized_or_float(kind, 112, 96)  # 112 outputs: a last tile of 16
    rounds_int4 = path == "avx512_bf16" and kind == "int4"
    if rounds_int4:
        reference = reference.to(BF16).float()
    args = {
        "bfloat16": (cpu_kernels.WEIGHT_BF16, weight, None),
        "int8": (cpu_kernels.WEIGHT_INT8, getattr(weight, "codes", None), getattr(weight, "scales", None)),
        "int4": (cpu_kernels.WEIGHT_INT4, getattr(weight, "packed", None), getattr(weight, "scale_zeros", None)),
    }[kind]
    bias = rand(112, seed=21).to(BF16)
    x = rand(40, 96, seed=22).to(BF16)

    def product(rows: torch.Tensor, out_dtype: torch.dtype = BF16) -> torch.Tensor:
        return kernels.matmul(rows, *args, bias, out_dtype)

    logits = product(x, torch.float32)
    assert torch.allclose(logits, x.float() @ reference.t() + bias.float(), rtol=1e-5, atol=1e-4)
    full = product(x)
    assert torch.equal(full, logits.to(BF16))
    for num_rows in (1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33):
        assert torch.equal(product(x[:num_rows]), full[:num_rows]), f"{num_rows} rows"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(product(x), full)
        switch(False)
        kernels.avx512_bf16(False)  # with AMX off, a CPU that has both would take the dot products
        on_vectors = product(x, torch.float32)
    finally:
        kernels.avx512_bf16(True)
        switch(True)
        torch.set_num_threads(threads)
    assert not torch.equal(on_vectors, logits)  # the switches took the vector path
    assert torch.allclose(on_vectors, logits, rtol=1e-2 if rounds_int4 else 1e-5, atol=1e-2 if rounds_int4 else 1e-4)


def test_top_k_keeps_torch_order_with_ties_in_id_order_and_minus_inf_last(kernels) -> None:
    x = torch.tensor([0.5, 2.0, -torch.inf, 2.0, 1.0, -1.0, 2.0, -torch.inf] * 40)  # 320: spans 64-blocks
    values, ids = kernels.top_k(x, 7)
    assert values.tolist() == [2.0] * 7
    assert ids.tolist() == [1, 3, 6, 9, 11, 14, 17]
    big = rand(49152, seed=11)
    values, ids = kernels.top_k(big, 20)
    want = torch.topk(big, 20)
    assert torch.equal(values, want.values) and torch.equal(ids, want.indices)
    values, ids = kernels.top_k(x[:8], 8)  # k = n: the -inf entries come last
    assert ids.tolist() == [1, 3, 6, 4, 0, 5, 2, 7] and values[-2:].tolist() == [-torch.inf, -torch.inf]


def test_argmax_is_torchs_index_with_ties_nan_and_infinities(kernels) -> None:
    rows = rand(9, 49157, seed=14)  # V not a multiple of the vector width: a scalar tail
    rows[1, [40, 7000, 49156]] = 5.0  # ties: the first wins
    rows[2, 49155] = 9.0  # the largest in the tail
    rows[3, [10, 300]] = torch.nan  # the first NaN wins over any number
    rows[3, 5] = torch.inf
    rows[4] = -torch.inf  # nothing above -inf: index 0
    rows[5, 77] = torch.inf
    rows[6] = 0.0
    rows[6, 12] = -0.0  # -0 == 0: still the first zero
    rows[7, 49156] = torch.nan  # a NaN in the tail only
    rows[8, 3] = 1e30
    got, want = kernels.argmax(rows), rows.argmax(dim=-1)
    assert got.tolist() == want.tolist() == [int(want[0]), 40, 49155, 10, 0, 77, 0, 49156, 3]
    short = rows[:2, :5].contiguous()  # shorter than a vector: the scalar tail only
    assert kernels.argmax(short).tolist() == short.argmax(dim=-1).tolist()


def test_entropy_and_rank_read_outs_match_torch(kernels) -> None:
    logprobs = torch.log_softmax(rand(5000, seed=12) * 4, -1)
    logprobs[::7] = -torch.inf  # filtered tokens contribute nothing
    logprobs = torch.log_softmax(logprobs, -1)
    p = logprobs.exp()
    want = -(torch.where(p > 0, p * logprobs, 0.0)).sum()
    assert kernels.entropy(logprobs) == pytest.approx(float(want), rel=1e-5)
    assert kernels.count_greater(logprobs, float(logprobs[3])) == int((logprobs > logprobs[3]).sum())


def test_a_steps_read_outs_in_one_call_equal_the_vectorized_torch_ones(kernels, monkeypatch) -> None:
    """sample_rows' one kernel call for every row (rank, entropy, chosen logprobs, both top-k)
    against the torch path other devices take, on rows with and without processors, a forced
    token and a token outside the vocabulary (that row alone is invalid)."""
    from inference.sampling import sampler

    vocab_size = 3000
    logits = rand(5, vocab_size, seed=13) * 3  # (S, V)
    plain = sampler.Sampler(SamplingParams(greedy=True), "cpu")
    filtered = sampler.Sampler(SamplingParams(temperature=0.7, top_k=5, repetition_penalty=1.3, seed=1), "cpu")
    rows = [
        sampler.Row(plain, [1, 2], num_alternatives=20),
        sampler.Row(filtered, [4, 5, 6], num_alternatives=8),
        sampler.Row(plain, [7], forced_token_id=42, num_alternatives=3),
        sampler.Row(filtered, [1], num_alternatives=0),
        sampler.Row(plain, [1], forced_token_id=vocab_size + 5, num_alternatives=4),
    ]
    fused = sampler.sample_rows(logits, rows)
    raw = torch.log_softmax(logits, -1)
    for i in range(4):  # the read-outs' one pass gives the separate kernels' numbers, bit for bit
        assert fused[i].entropy == kernels.entropy(raw[i])
        assert fused[i].rank == kernels.count_greater(raw[i], float(raw[i, fused[i].token_id])) + 1
    filtered.generator.manual_seed(1)  # the torch path draws the same numbers again
    monkeypatch.setattr(sampler, "_kernels_for", lambda logprobs, ndim: None)
    vectorized = sampler.sample_rows(logits, rows)
    assert fused[4].error is not None and vectorized[4].error is not None
    assert fused[2].token_id == 42 and len(fused[1].top_processed) == 5  # top_k=5 leaves five
    for got, want in zip(fused[:4], vectorized[:4]):
        assert (got.token_id, got.rank) == (want.token_id, want.rank)
        assert got.logprob == pytest.approx(want.logprob, abs=1e-6)
        assert got.raw_logprob == pytest.approx(want.raw_logprob, abs=1e-6)
        assert got.entropy == pytest.approx(want.entropy, rel=1e-5)
        for got_top, want_top in ((got.top_raw, want.top_raw), (got.top_processed, want.top_processed)):
            assert (got_top is None) == (want_top is None)
            if got_top is not None:
                assert [i for i, _ in got_top] == [i for i, _ in want_top]
                assert [v for _, v in got_top] == pytest.approx([v for _, v in want_top], abs=1e-6)


def test_vsum_in_registers_adds_the_same_pairs_as_its_scalar_tree(tmp_path) -> None:
    """simd.h's `vsum` ends every output's sum; on x86 it runs in registers, and must stay the
    fixed tree the batch invariance is written in (the same additions, so the same bits), for
    values of every size and sign."""
    library = ctypes.CDLL(str(cpu_kernels.build((Path(__file__).with_name("lane_sums.c"),), out_dir=tmp_path)))
    lanes = library.pg_test_lanes()
    generator = torch.Generator().manual_seed(23)
    num_groups = 20_000
    scale = torch.pow(2.0, torch.randint(-30, 30, (num_groups * lanes,), generator=generator).float())
    v = (torch.randn(num_groups * lanes, generator=generator) * scale).contiguous()
    sums, tree = torch.empty(num_groups), torch.empty(num_groups)
    library.pg_test_lane_sums(
        ctypes.c_void_p(v.data_ptr()),
        ctypes.c_int64(num_groups),
        ctypes.c_void_p(sums.data_ptr()),
        ctypes.c_void_p(tree.data_ptr()),
    )
    assert torch.equal(sums.view(torch.int32), tree.view(torch.int32))
    assert not torch.equal(sums, v.view(num_groups, lanes).double().sum(-1).float())  # the order shows


def test_vsum8_and_masked_stores_end_sums_as_vsum_and_store_at_do(tmp_path) -> None:
    """The dot-product tiles end 8 outputs' sums at once (`vsum8`) and store a row's outputs in
    one masked store (`store_lanes`): the same bits as `vsum` on each and `store_at` on each
    (bfloat16: round to nearest even, a NaN kept quiet; ties, infinities, subnormals, NaNs), and
    nothing written past the outputs asked for."""
    library = ctypes.CDLL(str(cpu_kernels.build((Path(__file__).with_name("lane_sums.c"),), out_dir=tmp_path)))
    if not library.pg_test_has_vsum8():
        pytest.skip("no AVX-512 here: the tiles that use them do not run on this CPU")
    generator = torch.Generator().manual_seed(29)
    num_groups = 5_000
    scale = torch.pow(2.0, torch.randint(-30, 30, (num_groups * 8 * 16,), generator=generator).float())
    v = (torch.randn(num_groups * 8 * 16, generator=generator) * scale).contiguous()
    sums, each, tree = torch.empty(num_groups * 8), torch.empty(num_groups * 8), torch.empty(num_groups * 8)
    library.pg_test_vsum8(ctypes.c_void_p(v.data_ptr()), ctypes.c_int64(num_groups), ctypes.c_void_p(sums.data_ptr()))
    library.pg_test_lane_sums(
        ctypes.c_void_p(v.data_ptr()),
        ctypes.c_int64(num_groups * 8),
        ctypes.c_void_p(each.data_ptr()),
        ctypes.c_void_p(tree.data_ptr()),
    )
    assert torch.equal(sums.view(torch.int32), each.view(torch.int32))

    special = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), torch.inf, -torch.inf, torch.nan, 1e-40, -0.0])
    values = torch.cat([special, torch.randn(16 * 64 - len(special), generator=generator) * 1e3])  # (1024,)
    values[100] = torch.tensor(0x7FA00000, dtype=torch.int32).view(torch.float32)  # a signalling NaN's bits
    stored = {}
    for bias in (torch.zeros(len(values)), torch.randn(len(values), generator=generator).to(BF16)):
        for out_dtype in (BF16, torch.float32):
            for count in (1, 3, 8, 16):
                out = torch.full((len(values),), 7.0, dtype=out_dtype)
                want = out.clone()
                library.pg_test_store_lanes(
                    ctypes.c_void_p(values.data_ptr()),
                    ctypes.c_void_p(bias.data_ptr()),
                    ctypes.c_int(bias.dtype == BF16),
                    ctypes.c_int64(len(values)),
                    ctypes.c_int(count),
                    ctypes.c_int(out_dtype == BF16),
                    ctypes.c_void_p(out.data_ptr()),
                    ctypes.c_void_p(want.data_ptr()),
                )
                bits = torch.int16 if out_dtype == BF16 else torch.int32
                assert torch.equal(out.view(bits), want.view(bits)), (bias.dtype, out_dtype, count)
                stored[bias.dtype, out_dtype, count] = out
    rounded = stored[torch.float32, BF16, 16][: len(special)]  # ties to even; a NaN stays one
    assert rounded[:5].tolist() == [1.0, 1.015625, -1.0, torch.inf, -torch.inf] and rounded[5].isnan()
    assert stored[torch.float32, BF16, 16][100].isnan()
    assert stored[BF16, BF16, 3].view(-1, 16)[:, 3:].eq(7).all()  # lanes past `count` are not written


@pytest.fixture
def fresh_load() -> Iterator[None]:
    """`cpu_kernels.load()` looks again (it is cached per process), before and after the test."""
    cpu_kernels.load.cache_clear()
    yield
    cpu_kernels.load.cache_clear()


def test_without_a_working_compiler_the_kernels_are_unavailable(monkeypatch, tmp_path, fresh_load) -> None:
    monkeypatch.setenv("CC", "/bin/false")
    with pytest.raises(RuntimeError, match="failed"):
        cpu_kernels.build(out_dir=tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing built there yet
    assert cpu_kernels.load() is None
    cpu_kernels.load.cache_clear()
    monkeypatch.delenv("CC")
    monkeypatch.setenv("PLAYGROUND_CPU_KERNELS", "off")
    assert cpu_kernels.load() is None


def test_an_unusable_cache_folder_falls_back_to_a_private_temp_one(kernels, monkeypatch, tmp_path, fresh_load) -> None:
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("a file where the cache folder would go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(not_a_folder))
    monkeypatch.setattr(cpu_kernels.tempfile, "gettempdir", lambda: str(tmp_path))
    assert cpu_kernels.load() is not None
    assert list(tmp_path.glob("llm-playground-kernels-*/cpu_kernels-*.so"))


def test_a_runner_on_the_kernels_gives_the_torch_paths_logits(kernels) -> None:
    fused_engine, torch_engine = engine_for("qwen2"), engine_for("qwen2")  # qwen2: q/k/v biases
    assert fused_engine.runner.llama.lean.fused is not None
    torch_engine.runner.llama.lean.fused = None  # as on a machine without a compiler
    assert fused_engine.model_info()["kernels"] == "fused CPU kernels"
    assert torch_engine.runner.kernels == "torch ops"
    prompt, answer = [5, 70, 3, 199, 42, 8, 1], [17, 250, 3, 4, 9]
    got, want = fused_engine.passes.teacher_force(prompt, answer), torch_engine.passes.teacher_force(prompt, answer)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-5)  # a prompt pass, then one decode step per token


@pytest.mark.parametrize("on_kernels", [True, False])
@pytest.mark.parametrize("precision", ["float32", "int4"])
def test_a_sequence_gets_the_same_tokens_alone_or_batched(kernels, precision: str, on_kernels: bool) -> None:
    """On the kernels and on the torch ops (a machine without a compiler) alike."""
    engine = engine_for("llama", precision=precision)
    assert engine.runner.llama.lean.fused is not None
    if not on_kernels:
        engine.runner.llama.lean.fused = None  # the batched runner reads it from the lean runner
    params = SamplingParams(greedy=True, max_new_tokens=8, ignore_eos=True, use_prefix_cache=False)
    # different lengths: prefill chunks and decodes share steps
    requests = [([3 + (i * 5 + j) % 250 for j in range(4 + 11 * i)], params) for i in range(4)]
    batched = run_all(engine, requests)
    for i, (prompt_ids, _) in enumerate(requests):
        assert tokens(batched[i]) == tokens(alone(engine, prompt_ids, params)), f"request {i}"


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads Linux's /proc")
def test_the_kernels_helper_threads_are_named_for_the_os(kernels) -> None:
    """`top -H` and the stack benchmark (`ENGINE_THREADS`) count their CPU as the engine's."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # a helper even on a one-core machine
        q, kv, slots = rand(64, 9, 64), KVAddress.layers(rand(1, 2, 300, 3, 64).to(BF16), 2, 3)[0], torch.arange(300)
        kernels.attention(
            q, kv, 3, torch.arange(1, 65), slots, torch.zeros(64, dtype=torch.long), torch.empty(64, 9, 64, dtype=BF16)
        )
    finally:
        torch.set_num_threads(threads)
    deadline = time.monotonic() + 10  # a helper names itself once it runs, maybe after the call
    while "pg-kernels" not in (names := thread_names()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "pg-kernels" in names
    assert "pg-kernels" in ENGINE_THREADS


def thread_names() -> list[str]:
    names = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            names.append((task / "comm").read_text().strip())
    return names
