"""A GGUF's weights are read one tensor at a time, whatever the architecture (issue 46, part 3).

The loader builds the model empty and fills it from the GGUF piece by piece (not from the
converted float32 copy, whose whole file was mapped while the bfloat16 copy was made); the
conversion streams every architecture (Gemma-3 went through transformers' whole-model GGUF
loader: +4.3 GB for a 253 MB file); MoE experts that the file splits come out merged; and at
no time are more than a couple of dequantized tensors alive. Tiny GGUFs come from `tiny_gguf`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any

import gguf
import pytest
import torch
from gguf import quants
from transformers import AutoModelForCausalLM
from transformers import modeling_gguf_pytorch_utils as transformers_gguf

from inference.config import EngineConfig
from inference.gguf_file import read_header
from inference.models import gguf_tensors
from inference.models.bundled import convert_gguf
from inference.models.gguf_load import load_gguf_model
from inference.models.loader import load_model
from inference.models.precision import LayerQuantizer
from tests.inference.tiny_gguf import write_tiny_gguf, write_tiny_moe_gguf

REPO = Path(__file__).resolve().parents[3]
Q8_0 = gguf.GGMLQuantizationType.Q8_0


class DequantizedAlive:
    """Counts the float32 arrays gguf-py's decoders return while they are alive (weak references:
    a band dropped after its copy into the model is gone at once)."""

    def __init__(self) -> None:
        self.alive: list[weakref.ref] = []
        self.calls = 0
        self.most_alive = 0

    def seen(self, values: Any) -> Any:
        self.calls += 1
        self.alive = [ref for ref in self.alive if ref() is not None] + [weakref.ref(values)]
        self.most_alive = max(self.most_alive, len(self.alive))
        return values


@pytest.fixture
def dequantized(monkeypatch: pytest.MonkeyPatch) -> DequantizedAlive:
    """Every way gguf-py dequantizes (its `dequantize`, each type's row decoder) counted; and
    transformers' whole-model GGUF loader refused (it dequantizes every tensor into one dict)."""
    counter = DequantizedAlive()
    whole = quants.dequantize
    monkeypatch.setattr(quants, "dequantize", lambda data, kind: counter.seen(whole(data, kind)))
    monkeypatch.setattr(gguf, "dequantize", quants.dequantize)
    for decoder in set(quants._type_traits.values()):
        rows = decoder.dequantize_rows
        monkeypatch.setattr(
            decoder, "dequantize_rows", classmethod(lambda cls, raw, rows=rows: counter.seen(rows(raw)))
        )
    checkpoint = transformers_gguf.load_gguf_checkpoint

    def refuse_whole_model(path: str, return_tensors: bool = False, **kwargs: Any) -> Any:
        assert not return_tensors, "transformers' whole-model GGUF loader ran"
        return checkpoint(path, return_tensors=False, **kwargs)

    monkeypatch.setattr(transformers_gguf, "load_gguf_checkpoint", refuse_whole_model)
    return counter


@pytest.fixture
def small_bands(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bands of a few rows, so every weight of a tiny model is read in several (Q and K rows
    reordered across them)."""
    monkeypatch.setattr(gguf_tensors, "ROW_BAND_BYTES", 512)


def cpu(path: Path, data_dir: Path, dtype: str = "float32") -> EngineConfig:
    return EngineConfig(source=str(path), device="cpu", dtype=dtype, data_dir=str(data_dir))


def assert_same_weights(model: torch.nn.Module, original: torch.nn.Module) -> None:
    weights, expected = model.state_dict(), original.state_dict()
    assert set(weights) == set(expected)
    for name, tensor in expected.items():
        assert weights[name].dtype == tensor.dtype, name
        assert torch.equal(weights[name], tensor), name


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_gguf_model_is_read_from_the_file_one_tensor_at_a_time(
    arch: str, tmp_path: Path, dequantized: DequantizedAlive, small_bands: None
) -> None:
    path = tmp_path / f"tiny-{arch}.gguf"
    original = write_tiny_gguf(path, arch=arch)
    folder = load_model(cpu(path, tmp_path)).source_path  # converted once: config and tokenizer
    (folder / "model.safetensors").unlink()  # the folder's float32 copy is not what serves
    calls_before = dequantized.calls

    loaded = load_model(cpu(path, tmp_path))

    assert_same_weights(loaded.model, original)  # Q/K rows, Gemma's 1 + w norms, the tied head
    assert dequantized.calls - calls_before >= len(read_header(path).tensors)  # every tensor, from the file
    assert dequantized.most_alive <= 2


def test_quantized_tensors_load_as_transformers_dequantizes_them(tmp_path: Path, small_bands: None) -> None:
    path = tmp_path / "tiny-q8.gguf"
    write_tiny_gguf(path, tensor_types={"attn_q": Q8_0, "attn_k": Q8_0, "ffn_down": Q8_0, "token_embd": Q8_0})
    loaded = load_model(cpu(path, tmp_path, dtype="bfloat16"))
    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32)
    assert_same_weights(loaded.model, reference.to(torch.bfloat16))  # transformers' own GGUF loader, rounded once


def test_int8_layers_are_quantized_as_they_are_read(
    tmp_path: Path, small_bands: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    float32_weights: list[int] = []  # linear weights in float32 when a layer is quantized
    ready = LayerQuantizer.module_ready

    def counting(self: LayerQuantizer, name: str) -> None:
        linears = [m for m in self.model.modules() if isinstance(m, torch.nn.Linear)]
        float32_weights.append(sum(m.weight.device.type != "meta" and m.weight.dtype == torch.float32 for m in linears))
        ready(self, name)

    monkeypatch.setattr(LayerQuantizer, "module_ready", counting)
    streamed = load_model(cpu(path, tmp_path, dtype="int8"))
    assert max(float32_weights) == 1  # each layer served as soon as it is read, before the next one
    whole = load_model(cpu(streamed.source_path, tmp_path, dtype="int8"))  # the float32 folder, quantized after
    served, expected = dict(streamed.model.named_buffers()), dict(whole.model.named_buffers())
    assert served.keys() == expected.keys() and any(name.endswith(".codes") for name in served)
    assert all(torch.equal(served[name], expected[name]) for name in expected)
    assert_same_weights(streamed.model, whole.model)  # embeddings and norms: bfloat16 alike


def test_every_architecture_converts_one_piece_at_a_time(tmp_path: Path, dequantized: DequantizedAlive) -> None:
    path = tmp_path / "tiny-gemma3.gguf"
    original = write_tiny_gguf(path, arch="gemma3")  # before: transformers' whole-model loader, then a copy
    convert_gguf(path, tmp_path / "converted")
    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "converted", dtype=torch.float32)
    assert_same_weights(converted, original)
    assert dequantized.most_alive <= 2


def test_moe_experts_split_in_the_file_come_out_merged(tmp_path: Path, dequantized: DequantizedAlive) -> None:
    path = tmp_path / "tiny-moe.gguf"
    original = write_tiny_moe_gguf(path)  # gate and up of each layer's experts: two tensors in the file
    model = load_gguf_model(path, original.config, torch.float32, torch.device("cpu"))
    assert_same_weights(model, original)
    assert dequantized.most_alive <= 2


def test_a_file_that_leaves_a_weight_empty_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    original = write_tiny_gguf(path)
    config = original.config
    config.num_hidden_layers = 3  # the file has two layers' tensors
    with pytest.raises(ValueError, match=r"no tensor in the file for model\.layers\.2\."):
        load_gguf_model(path, config, torch.float32, torch.device("cpu"))


MEASURE_LOAD = """
import gc, json, sys
from inference.config import EngineConfig
from inference.models.loader import load_model
from inference.models.precision import LayerQuantizer
from inference.models.memory import peak_rss_mb, release_free_memory, rss_mb

config = EngineConfig(source=sys.argv[1], device="cpu", dtype="bfloat16", data_dir=sys.argv[2])
load_model(config)  # converts once, imports everything: the second load is the one measured
gc.collect(); release_free_memory()
before = rss_mb()
with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")  # the peak (VmHWM) starts again from here
loaded = load_model(config)
weights = sum(p.numel() * p.element_size() for p in loaded.model.parameters()) / 2**20
print(json.dumps({"weights_mb": weights, "peak_mb": peak_rss_mb() - before, "after_mb": rss_mb() - before}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="reads and resets the peak RSS in /proc")
def test_loading_peaks_near_the_final_weights(tmp_path: Path) -> None:
    """A 100 MB float32 file served in bfloat16 (51 MB): the load's peak RSS is the weights and a
    band, not the float32 file mapped beside its bfloat16 copy (3x the weights before)."""
    path = tmp_path / "wide.gguf"
    write_tiny_gguf(path, scale=32)
    run = subprocess.run(
        [sys.executable, "-c", MEASURE_LOAD, str(path), str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    assert measured["weights_mb"] > 40
    assert measured["peak_mb"] < 1.4 * measured["weights_mb"], measured
    assert measured["after_mb"] < 1.2 * measured["weights_mb"], measured
