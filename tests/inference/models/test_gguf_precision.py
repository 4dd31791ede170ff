"""Precision `gguf`: a GGUF model served in the file's own formats (`BlockWeight`s on the block
kernels), what `auto` picks for it, and the served model through the engine: close to float32,
the same tokens alone or batched, each layer reported in the format it runs in."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from inference import EngineConfig, SamplingParams
from inference.engine import Engine
from inference.introspect import lens
from inference.models import gguf_load
from inference.models.loader import ModelLoadError, load_model
from inference.models.precision import cpu_has_bf16, decode_read_bytes, resolve_precision
from inference.models.quant import BLOCK_TYPES, BlockEmbedding, BlockWeight, QuantizedLinear
from tests.inference.test_batching import alone, run_all, tokens
from tests.inference.tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler: the block kernels are not built"
)
# A mixed file, like a Q4_K_M one: every type the tiny model's shapes allow, an F16 pair, a Q8_0 head.
TYPES = {
    "attn_q": T.Q4_0,
    "attn_k": T.Q4_1,
    "attn_v": T.Q8_0,
    "attn_output": T.Q5_0,
    "ffn_gate": T.Q5_1,
    "ffn_up": T.Q5_0,
    "ffn_down": T.Q8_0,
    "output": T.Q8_0,
}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf-precision") / "tiny-mixed.gguf"
    write_tiny_gguf(path, tensor_types=TYPES)
    return path


def config(path: Path, dtype: str) -> EngineConfig:
    return EngineConfig(source=str(path), dtype=dtype, device="cpu", data_dir=str(path.parent))


@pytest.fixture(scope="module")
def served(tiny_gguf: Path) -> Engine:
    return Engine(load_model(config(tiny_gguf, "auto")), config(tiny_gguf, "auto"))


def test_auto_serves_a_gguf_model_in_its_own_blocks_and_a_folder_in_float(served: Engine, tiny_gguf: Path) -> None:
    assert served.loaded.precision == "gguf"
    assert served.loaded.dtype == (torch.bfloat16 if cpu_has_bf16() else torch.float32)
    folder_auto = resolve_precision("auto", torch.device("cpu"))
    assert folder_auto == ("bfloat16" if cpu_has_bf16() else "float32")
    assert resolve_precision("auto", torch.device("cpu"), tiny_gguf) == "gguf"
    with pytest.raises(ValueError, match="gguf.*needs the CPU"):
        resolve_precision("gguf", torch.device("cuda"), tiny_gguf)


def test_every_layer_reports_the_format_it_runs_in(served: Engine) -> None:
    report = served.loaded.quantization
    groups = {(g.file_type, g.served_as, g.is_exact, g.is_head): g.num_layers for g in report.groups}
    assert groups == {
        ("Q4_0", "blocks", True, False): 2,
        ("Q4_1", "blocks", True, False): 2,
        ("Q5_0", "blocks", True, False): 4,
        ("Q5_1", "blocks", True, False): 2,
        ("Q8_0", "blocks", True, False): 4,
        ("Q8_0", "blocks", True, True): 1,  # the head: the file's own output tensor
    }
    assert report.head_bits == 8 and not report.is_head_tied
    head = served.model.get_output_embeddings()
    assert isinstance(head, QuantizedLinear) and isinstance(head.qweight, BlockWeight)
    assert served.model_info()["precision"] == "gguf"
    assert served.runner.name == "lean-llama"  # QKV of three types, gate/up of two: stacked, not joined


def test_the_served_model_is_close_to_the_files_values_in_float32(served: Engine, tiny_gguf: Path) -> None:
    exact = Engine(load_model(config(tiny_gguf, "float32")), config(tiny_gguf, "float32"))
    ids = [3 + (7 * j) % 200 for j in range(12)]
    want = torch.log_softmax(exact.passes.teacher_force(ids, ids[:6]).float(), -1)  # (7, V)
    got = torch.log_softmax(served.passes.teacher_force(ids, ids[:6]).float(), -1)
    kl = (want.exp() * (want - got)).sum(-1)  # (7,)
    assert kl.max() < 0.01, kl  # only x's rounding to int8 per 32 (and bfloat16 where it is auto) differs


def test_a_request_gets_the_same_tokens_alone_and_batched(served: Engine) -> None:
    params = SamplingParams(greedy=True, max_new_tokens=8, ignore_eos=True, use_prefix_cache=False)
    requests = [([3 + (i * 7 + j) % 200 for j in range(5 + 9 * i)], params) for i in range(4)]
    batched = run_all(served, requests)
    for i, (prompt_ids, _) in enumerate(requests):
        assert tokens(batched[i]) == tokens(alone(served, prompt_ids, params)), f"request {i}"


def test_gguf_for_a_folder_model_is_refused_by_name(tiny_gguf: Path) -> None:
    folder = next(tiny_gguf.parent.rglob("config.json")).parent  # the GGUF's converted folder
    with pytest.raises(ModelLoadError, match="precision='gguf'.*GGUF file"):
        load_model(config(folder, "gguf"))


# Issue 47: the embedding table stays in the file's blocks too (a Q5_0 table, as Qwen2.5-Coder's).
TABLE_TYPES = {**TYPES, "token_embd": T.Q5_0}


@pytest.fixture(scope="module")
def table_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf-table") / "tiny-q5-table.gguf"
    write_tiny_gguf(path, tensor_types=TABLE_TYPES)
    return path


def test_the_embedding_table_is_never_dense_under_gguf(table_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading reads no float piece of the table, and neither a step, the lens nor the embedding
    view builds the whole dense table (`BlockEmbedding.weight`)."""
    filled: list[str] = []
    fill = gguf_load._fill
    monkeypatch.setattr(
        gguf_load, "_fill", lambda target, piece, path: filled.append(piece.name) or fill(target, piece, path)
    )

    def no_dense_table(self: BlockEmbedding) -> torch.Tensor:
        raise AssertionError("the dense embedding table was built")

    monkeypatch.setattr(BlockEmbedding, "weight", property(no_dense_table))
    engine = Engine(load_model(config(table_gguf, "gguf")), config(table_gguf, "gguf"))
    assert filled and not any("embed_tokens" in name for name in filled)
    table = engine.model.get_input_embeddings()
    assert isinstance(table, BlockEmbedding) and table.qweight.type_name == "Q5_0"
    vocab, hidden = table.num_embeddings, table.embedding_dim
    assert not [name for name, p in engine.model.named_parameters() if tuple(p.shape) == (vocab, hidden)]
    report = engine.loaded.quantization
    assert report.embedding_type == "Q5_0" and not report.is_head_tied
    assert engine.model_info()["quantization"]["embedding_type"] == "Q5_0"
    # a decode token reads one row of the blocks: 32 weights per 22-byte Q5_0 block
    head_and_layers = sum(m.qweight.nbytes for m in engine.model.modules() if isinstance(m, QuantizedLinear))
    assert table.row_bytes == hidden // 32 * 22
    assert decode_read_bytes(engine.model) - table.row_bytes == head_and_layers + sum(
        p.numel() * p.element_size() for p in engine.model.parameters()
    )
    ids = [3 + (5 * j) % 200 for j in range(9)]
    params = SamplingParams(greedy=True, max_new_tokens=4, ignore_eos=True, use_prefix_cache=False)
    assert len(tokens(alone(engine, ids, params))) == 4
    assert engine.passes.read_layers(ids).shape[0] == engine.model.config.num_hidden_layers + 1
    assert lens.embedding_of(engine.model, ids[0], top_n=3)["size"] == hidden


def test_the_tables_rows_are_the_float32_loads_cast_to_the_activation_dtype(table_gguf: Path) -> None:
    """gguf's lookups are the dense table it used to build (the file's values, cast), bit for bit:
    the same logits as that table gave, and the same embedding view."""
    served = load_model(config(table_gguf, "gguf"))
    exact = load_model(config(table_gguf, "float32"))  # the file's dequantized values, dense
    dense = exact.model.get_input_embeddings().weight.detach().to(served.dtype)  # (V, hidden)
    table = served.model.get_input_embeddings()
    ids = torch.tensor([[7, 3, 3, 250], [0, 319, 42, 7]])
    assert torch.equal(table(ids), dense[ids])
    assert torch.equal(table.weight, dense) and torch.equal(table.table_rows(5, 9), dense[5:9])
    view = lens.embedding_of(served.model, 42, top_n=5)
    assert view["norm"] == pytest.approx(float(dense[42].float().norm()), rel=1e-6)
    assert view["head"] == [round(float(x), 4) for x in dense[42].float()[:16]]


@pytest.mark.parametrize("type_id", sorted(BLOCK_TYPES))
@pytest.mark.parametrize("kernels", ["on", "off"])
def test_a_lookup_is_gguf_pys_dequantization_of_its_rows(
    type_id: int, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows in any order, repeated, in any shape of ids: gguf-py's values of those rows, cast to
    the activation dtype (with the kernels, their dequantizer; without, gguf-py's own)."""
    from tests.inference.kernels.test_block_kernels import inner_for, random_blocks

    if kernels == "off":
        monkeypatch.setenv("PLAYGROUND_CPU_KERNELS", "off")
    inner = inner_for(type_id)
    data = random_blocks(type_id, 40, inner, seed=type_id)
    values = dequantize(data, T(type_id)).astype(np.float32).reshape(40, inner)
    ids = torch.tensor([[39, 0, 7], [7, 7, 21]])
    for dtype in (torch.bfloat16, torch.float32):
        table = BlockEmbedding(BlockWeight(torch.from_numpy(data), type_id, inner), dtype)
        want = torch.from_numpy(values)[ids].to(dtype)  # (2, 3, inner)
        assert table(ids).dtype == dtype and torch.equal(table(ids), want)
        assert torch.equal(table.weight, torch.from_numpy(values).to(dtype))
    scaled = BlockEmbedding(
        BlockWeight(torch.from_numpy(data), type_id, inner), torch.bfloat16, None, torch.tensor(5.5)
    )
    assert torch.equal(scaled(ids), want.bfloat16() * torch.tensor(5.5).bfloat16())  # Gemma's scaled embedding


def test_a_table_the_head_is_tied_to_stays_the_dense_one_it_multiplies(tmp_path: Path) -> None:
    """Gemma-3's head is its table (no output tensor in the file): the head multiplies the table
    in the activation dtype as before, so the table stays dense (and the logits what they were)."""
    path = tmp_path / "tiny-gemma3-tied.gguf"
    write_tiny_gguf(path, arch="gemma3", tensor_types={**TABLE_TYPES, "token_embd": T.Q8_0})
    loaded = load_model(config(path, "gguf"))
    table, head = loaded.model.get_input_embeddings(), loaded.model.get_output_embeddings()
    assert not isinstance(table, BlockEmbedding) and head.weight is table.weight
    assert loaded.quantization.is_head_tied and loaded.quantization.embedding_type == ""
