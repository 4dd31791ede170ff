"""Weight precision: int8 / int4 quantized linear layers, a GGUF's own 4-bit blocks, and what
each precision does to the served model.

The packed matmuls equal the float matmul of their dequantized weights (within the bfloat16
activations' rounding); quantization errors stay within half a step; joined (fused QKV) and
sliced weights equal their parts; the GGUF's Q4_1 blocks dequantize to exactly the weights the
converter wrote; the lean runner, transformers' forward and the batching engine agree on a
quantized model; int8 keeps the bundled model's greedy choices and distribution close to float32.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from inference import EngineConfig, SamplingParams, Step
from inference.bench.precision import quality, quality_cases
from inference.engine import Engine
from inference.gguf_file import TensorInfo
from inference.models.bundled import bundled_gguf_path
from inference.models.gguf_blocks import Q4_K, Q4_K_BYTES, QK_K, native_int4_weights, read_q4_blocks
from inference.models.loader import LoadedModel, load_model
from inference.models.precision import cpu_has_bf16, decode_read_bytes, resolve_precision, weight_stats
from inference.models.quant import Int4Weight, Int8Weight, QuantizedLinear, Stacked, linear
from tests.inference.engines import engine_for
from tests.inference.test_batching import alone, run_all, tokens

BF16 = torch.bfloat16


def random_weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05


def close_to_reference(weight, x: torch.Tensor) -> None:
    """The packed matmul equals x @ dequantized.T up to bfloat16 rounding of the output."""
    got = weight.matmul(x).float()
    want = x.float() @ weight.dequantize().t()
    assert torch.allclose(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


def test_int8_codes_are_within_half_a_step_and_the_matmul_matches_the_float_reference() -> None:
    w = random_weight(96, 64)
    q = Int8Weight.quantize(w, BF16)
    assert q.codes.dtype == torch.int8 and q.scales.dtype == BF16 and q.shape == (96, 64)
    step = q.scales.float()[:, None]
    assert ((q.dequantize() - w).abs() <= step / 2 + 1e-6).all()
    assert q.nbytes == 96 * 64 + 96 * 2
    close_to_reference(q, torch.randn(3, 64, dtype=BF16))


def test_int4_groups_are_within_half_a_step_and_the_matmul_matches_the_float_reference() -> None:
    w = random_weight(128, 96, seed=1)
    q = Int4Weight.quantize(w, BF16)
    assert q.shape == (128, 96) and q.scale_zeros.shape == (3, 128, 2)
    scale = q.scale_zeros[..., 0].float().t().repeat_interleave(32, dim=1)  # (N, K)
    # half a step, plus the bfloat16 rounding of the scale, the zero point and the kernel's output
    assert ((q.dequantize() - w).abs() <= scale * (0.5 + 2**-5)).all()
    assert q.nbytes == 128 * 96 // 2 + 3 * 128 * 2 * 2
    close_to_reference(q, torch.randn(5, 96, dtype=BF16))


@pytest.mark.parametrize("kind", [Int8Weight, Int4Weight])
def test_joined_weights_compute_their_parts_and_slice_back_to_them(kind) -> None:
    parts = [kind.quantize(random_weight(n, 64, seed=n), BF16) for n in (128, 64, 64)]
    joined = kind.join(parts)
    x = torch.randn(2, 64, dtype=BF16)
    assert torch.equal(joined.matmul(x), torch.cat([p.matmul(x) for p in parts], dim=-1))
    assert torch.equal(joined.rows(128, 192).matmul(x), parts[1].matmul(x))


def torch_layout(weight: Int4Weight) -> Int4Weight:
    """The same weight packed in torch's CPU int4 layout (where the kernels are built it is in theirs)."""
    n, k = weight.shape
    scale, zero = weight.scale_zeros[..., 0].t(), weight.scale_zeros[..., 1].t()  # (N, G)
    repeated = [t.float().repeat_interleave(32, dim=1) for t in (scale, zero)]  # (N, K)
    codes = torch.round((weight.dequantize() - repeated[1]) / repeated[0] + 8).to(torch.int32)
    return Int4Weight.from_blocks(codes, scale, zero, 32, layout="torch")


def test_int4_weights_off_torchs_64_row_tiles_are_stacked_not_joined() -> None:
    parts = [torch_layout(Int4Weight.quantize(random_weight(n, 64, seed=n), BF16)) for n in (32, 16, 16)]
    assert not Int4Weight.can_join(parts)
    with pytest.raises(ValueError, match="64-row tiles"):
        Int4Weight.join(parts)
    x = torch.randn(2, 64, dtype=BF16)
    assert torch.equal(Stacked(tuple(parts)).matmul(x), torch.cat([p.matmul(x) for p in parts], dim=-1))


def test_int4_in_the_kernels_layout_joins_and_slices_on_any_row_and_reads_as_torchs() -> None:
    """The kernels' packing (groups of 32 per row) has no tiles: any parts join, any rows slice;
    both layouts dequantize to the same weights and compute the same products within rounding."""
    parts = [Int4Weight.quantize(random_weight(n, 64, seed=n), BF16) for n in (32, 16, 16)]
    if parts[0].layout != "groups":
        pytest.skip("no C compiler here: int4 is packed in torch's layout")
    joined = Int4Weight.join(parts)
    x = torch.randn(3, 64, dtype=BF16)
    assert torch.equal(joined.rows(32, 48).matmul(x), parts[1].matmul(x))
    assert torch.equal(joined.matmul(x), torch.cat([p.matmul(x) for p in parts], dim=-1))
    theirs = torch_layout(joined)  # torch reads its layout through its matmul: bfloat16-rounded weights
    assert torch.allclose(theirs.dequantize(), joined.dequantize(), rtol=2**-8, atol=0)
    close_to_reference(theirs, x)
    close_to_reference(joined, x)


def test_quantized_linear_takes_any_leading_shape_and_adds_its_bias() -> None:
    weight, bias = Int8Weight.quantize(random_weight(32, 64), BF16), torch.randn(32, dtype=BF16)
    module = QuantizedLinear(weight, bias, "quantized")
    x = torch.randn(2, 3, 64, dtype=BF16)
    assert torch.equal(module(x), linear(x.reshape(6, 64), weight, bias).view(2, 3, 32))
    assert dict(module.named_buffers()).keys() == {"codes", "scales"}


def test_auto_is_bfloat16_on_cpus_with_bfloat16_units_and_bad_names_are_refused(monkeypatch) -> None:
    cpu = torch.device("cpu")
    expected = "bfloat16" if cpu_has_bf16() else "float32"
    assert resolve_precision("auto", cpu) == expected
    assert resolve_precision("int4", cpu) == "int4"
    with pytest.raises(ValueError, match="precision='int3'"):
        resolve_precision("int3", cpu)
    with pytest.raises(ValueError, match="dtype='int3'"):
        EngineConfig(dtype="int3")


# --- the GGUF's own blocks ------------------------------------------------------------------


def test_the_bundled_gguf_q4_1_blocks_are_served_as_they_are(bundled: LoadedModel) -> None:
    """In float32 scales the file's blocks dequantize to exactly what the converter wrote (Q and K
    rows included, which llama.cpp stores permuted); in bfloat16 the matmul stays within rounding."""
    exact = native_int4_weights(bundled_gguf_path(), bundled.model, torch.float32)
    assert len(exact) == 210 and {kind for _, kind in exact.values()} == {"Q4_1"}
    state = bundled.model.state_dict()
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.3.self_attn.k_proj.weight"):
        assert torch.equal(exact[name][0].dequantize(), state[name].float())
    served = native_int4_weights(bundled_gguf_path(), bundled.model, BF16)
    name = "model.layers.5.mlp.down_proj.weight"
    x = torch.randn(4, 1536, dtype=BF16)
    want = x.float() @ state[name].float().t()  # dequantize-then-matmul
    got = served[name][0].matmul(x).float()
    assert torch.allclose(got, want, atol=0.05 * want.abs().max().item())


def test_q4_k_super_blocks_map_exactly_onto_groups_of_32() -> None:
    """Q4_K (the 4-bit tensors of Q4_K_S/M files): each group's 6-bit scale and minimum become its
    scale and zero; served as they are, the weights are what gguf-py's own dequantizer reads."""
    rng = np.random.default_rng(0)
    n, k = 64, 512
    blocks = rng.integers(0, 256, size=(n, k // QK_K, Q4_K_BYTES), dtype=np.uint8)  # any nibbles, 6-bit fields
    blocks[..., 0:2] = np.float16(0.017).reshape(1).view(np.uint8)  # d and dmin: finite fp16 values
    blocks[..., 2:4] = np.float16(0.003).reshape(1).view(np.uint8)
    raw = blocks.tobytes()
    codes, scale, zero = read_q4_blocks(raw, TensorInfo("blk.0.ffn_up.weight", (n, k), Q4_K, 0, len(raw)))
    want = gguf_dequantize(np.frombuffer(raw, dtype=np.uint8).reshape(n, -1), GGMLQuantizationType.Q4_K)
    weight = Int4Weight.from_blocks(codes, scale, zero, 32)
    assert torch.equal(weight.dequantize(), torch.from_numpy(want))
    assert len(set(scale[0, :8].tolist())) > 1  # the groups of a super-block really differ


# --- the quantized model through the engine ---------------------------------------------------


@pytest.mark.parametrize("precision", ["int8", "int4"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_lean_runner_and_transformers_read_the_same_quantized_weights(arch: str, precision: str) -> None:
    engine = engine_for(arch, precision=precision)
    assert engine.runner.name == "lean-llama"
    assert engine.loaded.quantization.num_quantized == 7 * 2 + 1  # q k v o gate up down per layer + head
    ids = [3 + (7 * j) % 200 for j in range(9)]
    lean = engine.passes.teacher_force(ids, [])[0]  # (vocab,): the prompt through the lean runner
    with torch.inference_mode():
        hf = engine.model(torch.tensor([ids])).logits[0, -1].float()
    assert torch.allclose(lean, hf, atol=0.05 * hf.abs().max().item())
    info = engine.model_info()
    assert info["precision"] == precision and info["dtype"] == "bfloat16"
    assert info["quantization"]["head_bits"] == 8


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_every_precision_runs_through_the_batching_engine(precision: str) -> None:
    engine = engine_for("llama", precision=precision)
    params = SamplingParams(greedy=True, max_new_tokens=8, ignore_eos=True, use_prefix_cache=False)
    requests = [([3 + (i * 7 + j) % 200 for j in range(5 + 9 * i)], params) for i in range(4)]
    batched = run_all(engine, requests)
    for i, (prompt_ids, _) in enumerate(requests):
        assert len(tokens(batched[i])) == 8
        assert tokens(batched[i]) == tokens(alone(engine, prompt_ids, params)), f"request {i}"


@pytest.fixture(scope="module")
def bundled_int8(data_dir) -> Engine:
    return Engine(load_model(EngineConfig(dtype="int8", device="cpu", data_dir=str(data_dir))), EngineConfig())


@pytest.mark.slow
def test_int8_keeps_the_bundled_models_greedy_choices_and_distribution(bundled: LoadedModel, bundled_int8) -> None:
    reference = Engine(bundled, EngineConfig(dtype="float32"))
    kl, agreement = quality(quality_cases(reference, num_tokens=16), bundled_int8)
    assert kl < 0.02 and agreement >= 0.9, (kl, agreement)
    q = bundled_int8.loaded.quantization
    # the 7 linear layers of each of the 30 blocks; the output layer is SmolLM2's embedding table (tied):
    # it stays that one bfloat16 tensor rather than getting an 8-bit copy of its own
    assert q.num_quantized == 30 * 7 and q.num_from_file == 0 and q.num_kept == 1
    assert q.is_head_tied and q.head_bits == 16
    assert bundled_int8.model.lm_head.weight is bundled_int8.model.model.embed_tokens.weight
    _, num_bytes = weight_stats(bundled_int8.model)
    # int8 linear layers + the bfloat16 table, read whole by the output layer
    assert decode_read_bytes(bundled_int8.model) < 0.35 * decode_read_bytes(bundled.model)
    assert num_bytes < 0.35 * weight_stats(bundled.model)[1]
    steps = [e for e in bundled_int8.generate(bundled_int8.prompts.encode("The capital of France is"), _greedy(8))]
    assert len([e for e in steps if isinstance(e, Step)]) == 8


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(greedy=True, max_new_tokens=n, ignore_eos=True, num_alternatives=20)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_int8_on_cuda_serves_close_to_bfloat16_or_is_refused_by_name(bundled_model_dir) -> None:
    from inference.models.loader import ModelLoadError

    try:
        loaded = load_model(EngineConfig(source=str(bundled_model_dir), device="cuda", dtype="int8"))
    except ModelLoadError as error:
        assert "no int8 weight kernel for cuda" in str(error)
        pytest.skip(str(error))
    engine = Engine(loaded, EngineConfig(device="cuda"))
    reference = Engine(
        load_model(EngineConfig(source=str(bundled_model_dir), device="cuda", dtype="bfloat16")), EngineConfig()
    )
    kl, agreement = quality(quality_cases(reference, num_tokens=8), engine)
    assert kl < 0.05 and agreement >= 0.85, (kl, agreement)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_int4_on_cuda_is_refused_by_name(bundled_model_dir) -> None:
    from inference.models.loader import ModelLoadError

    with pytest.raises(ModelLoadError, match="int4.*CPU kernel only"):
        load_model(EngineConfig(source=str(bundled_model_dir), device="cuda", dtype="int4"))


def test_a_model_without_linear_layers_is_refused_by_name() -> None:
    from inference.models.precision import quantize_model
    from inference.models.tiny import make_tiny_model

    with pytest.raises(ValueError, match="no linear layer the int8 kernel can take"):
        quantize_model(make_tiny_model("gpt2"), "int8", BF16)


# --- a mixed GGUF (as Q4_K_M files are): each type served at least as precisely as the file -------

MIXED_TYPES = {
    "attn_q": GGMLQuantizationType.Q4_0,
    "attn_k": GGMLQuantizationType.Q4_0,
    "attn_v": GGMLQuantizationType.Q8_0,
    "attn_output": GGMLQuantizationType.Q5_0,
    "ffn_gate": GGMLQuantizationType.Q5_0,
    "ffn_up": GGMLQuantizationType.F16,
    "ffn_down": GGMLQuantizationType.Q4_1,
    "output": GGMLQuantizationType.Q8_0,
}


@pytest.fixture(scope="module")
def mixed_int4(tmp_path_factory: pytest.TempPathFactory) -> tuple[Engine, LoadedModel]:
    """The tiny Llama written as a mixed GGUF, served in int4, and its float32 conversion."""
    from tests.inference.tiny_gguf import write_tiny_gguf

    folder = tmp_path_factory.mktemp("mixed")
    path = folder / "tiny-mixed.gguf"
    write_tiny_gguf(path, tensor_types=MIXED_TYPES)
    config = EngineConfig(source=str(path), dtype="int4", device="cpu", data_dir=str(folder))
    exact = load_model(EngineConfig(source=str(path), dtype="float32", device="cpu", data_dir=str(folder)))
    return Engine(load_model(config), config), exact


def test_int4_of_a_mixed_gguf_reports_each_file_type_and_how_it_is_served(mixed_int4) -> None:
    engine, _ = mixed_int4
    q = engine.loaded.quantization
    groups = {(g.file_type, g.served_as, g.is_exact, g.is_head): g.num_layers for g in q.groups}
    assert groups == {
        ("Q4_0", "int4", True, False): 4,  # q and k of 2 layers: the file's own blocks
        ("Q4_1", "int4", True, False): 2,
        ("Q5_0", "int8", False, False): 2,  # no exact int4 form: 8 bits from the file's values
        ("Q8_0", "int8", False, False): 2,
        ("F16", "bfloat16", False, False): 2,  # float in the file: not re-quantized
        # gate is fused with up into one matmul: a float sibling keeps the pair in float
        ("Q5_0", "bfloat16", False, False): 2,
        ("Q8_0", "int8", False, True): 1,  # the untied output layer
    }
    assert (q.num_quantized, q.num_from_file, q.file_types, q.num_kept) == (11, 6, ("Q4_0", "Q4_1"), 4)
    assert engine.model_info()["quantization"]["groups"][0]["file_type"] == "Q4_0"
    assert engine.runner.name == "lean-llama"  # it joins int4 with int8 siblings (QKV) and serves them
    ids = [3 + (7 * j) % 200 for j in range(9)]
    lean = engine.passes.teacher_force(ids, [])[0]  # (vocab,): the prompt through the lean runner
    with torch.inference_mode():
        hf = engine.model(torch.tensor([ids])).logits[0, -1].float()
    assert torch.allclose(lean, hf, atol=0.05 * hf.abs().max().item())


@pytest.mark.parametrize(
    ("name", "kind"),
    [("self_attn.o_proj", GGMLQuantizationType.Q5_0), ("self_attn.v_proj", GGMLQuantizationType.Q8_0)],
)
def test_8_bit_serving_is_closer_to_the_files_values_than_the_files_own_step(mixed_int4, name: str, kind) -> None:
    """Served in 8 bits per output channel from the file's exact values: every weight lands within
    half of its own 8-bit step of them, and that is finer than the file's own grid (the step of
    its blocks), so nothing the file says is lost to a coarser re-quantization."""
    engine, exact = mixed_int4
    want = exact.model.get_submodule(f"model.layers.1.{name}").weight.float()  # (N, K): the file's values
    served = engine.model.get_submodule(f"model.layers.1.{name}")
    assert isinstance(served, QuantizedLinear) and served.qweight.bits == 8 and served.source == "quantized"
    got = served.qweight.dequantize()
    step = served.qweight.scales.float()[:, None]  # (N, 1)
    assert ((got - want).abs() <= step / 2 + 1e-6).all()
    levels = {GGMLQuantizationType.Q5_0: 16, GGMLQuantizationType.Q8_0: 127}[kind]
    file_step = want.view(want.shape[0], -1, 32).abs().amax(-1) / levels  # (N, blocks): ~ each block's d
    assert (step / 2 < file_step.amin(-1, keepdim=True)).float().mean() > 0.95


def test_a_tied_output_layer_stays_the_embedding_table_so_int8_is_smaller_than_bfloat16() -> None:
    """No second, quantized copy of a tied table (Gemma-3's 262k rows made int4 bigger than bfloat16)."""
    from transformers import AutoModelForCausalLM

    from inference.models.precision import quantize_model
    from inference.models.tiny import tiny_config

    config = tiny_config("llama")
    config.tie_word_embeddings = True
    config.vocab_size = 4096  # the table dominates, as in a small model with a large vocabulary
    sizes = {}
    for precision in ("bfloat16", "int8", "int4"):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        assert model.lm_head.weight is model.model.embed_tokens.weight
        if precision == "bfloat16":
            model.to(BF16)
        else:
            report = quantize_model(model, precision, BF16)
            assert report.is_head_tied and report.num_kept == 1 and report.head_bits == 16
            assert model.lm_head.weight is model.model.embed_tokens.weight and model.lm_head.weight.dtype == BF16
        sizes[precision] = weight_stats(model)[1]
    assert sizes["int4"] < sizes["int8"] < sizes["bfloat16"]
