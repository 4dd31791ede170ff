"""Precision `gguf`: a GGUF model served in the file's own formats (`BlockWeight`s on the block
kernels), what `auto` picks for it, and the served model through the engine: close to float32,
the same tokens alone or batched, each layer reported in the format it runs in."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as T

from inference import EngineConfig, SamplingParams
from inference.engine import Engine
from inference.models.loader import ModelLoadError, load_model
from inference.models.precision import cpu_has_bf16, resolve_precision
from inference.models.quant import BlockWeight, QuantizedLinear
from tests.engine.test_batching import alone, run_all, tokens
from tests.engine.tiny_gguf import write_tiny_gguf

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
