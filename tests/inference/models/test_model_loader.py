"""inference.models.loader: sources, device/dtype, limits, and readable load errors."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

import inference.models.bundled
from inference.config import EngineConfig
from inference.models.loader import ModelLoadError, load_model, resolve_device
from inference.models.precision import activation_dtype, cpu_has_bf16, resolve_precision
from inference.models.tiny import TINY_ARCHITECTURES, make_tiny_model, make_tiny_tokenizer


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama + byte tokenizer saved as an ordinary Hugging Face folder."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    save_tiny(folder)
    return folder


def save_tiny(folder: Path) -> None:
    model = make_tiny_model("llama")
    model.generation_config.eos_token_id = [257, 256]  # a list, and not the tokenizer's eos
    model.save_pretrained(folder)
    make_tiny_tokenizer(
        ["<|bos|>", "<|eos|>", "<|end|>"], eos_token="<|end|>", chat_template="{{ messages[0]['content'] }}"
    ).save_pretrained(folder)


def cpu(source: str | Path, **kwargs) -> EngineConfig:
    return EngineConfig(source=str(source), device="cpu", **kwargs)


def test_bundled_model_loads_with_its_metadata(bundled, bundled_model_dir: Path) -> None:
    assert bundled.name == "SmolLM2-135M-Instruct"
    assert bundled.source_path == bundled_model_dir
    assert bundled.dtype == torch.float32 and bundled.device == torch.device("cpu")
    assert next(bundled.model.parameters()).dtype == torch.float32
    assert not bundled.model.training
    assert bundled.max_context == 8192
    assert bundled.eos_token_ids == (2,)  # <|im_end|>, both in generation config and tokenizer
    assert bundled.tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
    assert "<|im_start|>" in bundled.chat_template


def test_folder_source_reports_progress_and_context(tiny_folder: Path) -> None:
    messages: list[str] = []
    loaded = load_model(cpu(tiny_folder), progress=messages.append)
    assert loaded.name == tiny_folder.name and loaded.source_path == tiny_folder.resolve()
    assert loaded.max_context == 256  # the model's max_position_embeddings
    assert loaded.chat_template == "{{ messages[0]['content'] }}"
    assert len(messages) >= 3 and any("tokenizer" in m for m in messages) and any("weights" in m for m in messages)


@pytest.mark.parametrize("arch", TINY_ARCHITECTURES)
def test_tiny_architectures_load_and_decode_with_a_cache(arch: str, tmp_path: Path) -> None:
    make_tiny_model(arch).save_pretrained(tmp_path)
    make_tiny_tokenizer().save_pretrained(tmp_path)
    model = load_model(cpu(tmp_path)).model
    ids = torch.tensor([[256, 72, 105, 33]])
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        prefill = model(ids, past_key_values=cache, use_cache=True)
        next_id = prefill.logits[:, -1].argmax(-1, keepdim=True)
        step = model(next_id, past_key_values=prefill.past_key_values, use_cache=True)
        full = model(torch.cat([ids, next_id], dim=1))
        generated = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False, pad_token_id=257
        )
    assert cache.get_seq_length() == 5
    torch.testing.assert_close(step.logits[:, -1], full.logits[:, -1], atol=1e-5, rtol=1e-4)
    assert generated.shape == (1, 8) and generated[0, 4].item() == next_id.item()


@pytest.mark.parametrize("asked, expected", [(100, 100), (256, 256), (10_000, 256)])
def test_max_context_is_capped_by_the_model(tiny_folder: Path, asked: int, expected: int) -> None:
    assert load_model(cpu(tiny_folder, max_context=asked)).max_context == expected


def test_eos_ids_are_generation_config_and_tokenizer_together(tiny_folder: Path) -> None:
    loaded = load_model(cpu(tiny_folder))
    assert loaded.model.generation_config.eos_token_id == [257, 256]
    assert loaded.tokenizer.eos_token_id == 258  # "<|end|>"
    assert loaded.eos_token_ids == (257, 256, 258)


def test_dtype_choice(tiny_folder: Path) -> None:
    loaded = load_model(cpu(tiny_folder, dtype="bfloat16"))
    assert loaded.dtype == torch.bfloat16 and next(loaded.model.parameters()).dtype == torch.bfloat16
    cpu_device = torch.device("cpu")
    auto = resolve_precision("auto", cpu_device)
    assert auto == ("bfloat16" if cpu_has_bf16() else "float32")
    assert activation_dtype("float16", cpu_device) == torch.float16
    assert activation_dtype("int8", cpu_device) == torch.bfloat16  # the int8/int4 kernels' activations


def test_int4_weights_of_a_model_folder_are_quantized_from_its_float_weights(tiny_folder: Path) -> None:
    loaded = load_model(cpu(tiny_folder, dtype="int4"))
    assert loaded.precision == "int4" and loaded.dtype == torch.bfloat16
    q = loaded.quantization
    assert q.num_quantized > 0 and q.num_from_file == 0  # no GGUF behind a folder


def test_num_threads_is_applied(tiny_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    load_model(cpu(tiny_folder, num_threads=1))
    assert calls == [1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_without_cuda_is_a_clear_error(device: str) -> None:
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        resolve_device(device)
    assert resolve_device("auto") == torch.device("cpu")


def test_trust_remote_code_is_passed_through(tiny_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForCausalLM

    seen: list[bool] = []
    original = AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.append(kwargs["trust_remote_code"])
        return original(*args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    load_model(cpu(tiny_folder))
    load_model(cpu(tiny_folder, trust_remote_code=True))
    assert seen == [False, True]


def test_custom_code_is_refused_by_default(tiny_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "custom"
    shutil.copytree(tiny_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type="x-custom",
        auto_map={"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XForCausalLM"},
    )
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="trust_remote_code"):
        load_model(cpu(folder))


def test_hub_id_loads_from_the_local_cache_only(
    tiny_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    repo = tmp_path / "models--tiny-org--tiny-llama"
    shutil.copytree(tiny_folder, repo / "snapshots" / "0123abc")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    loaded = load_model(cpu("tiny-org/tiny-llama"))
    assert loaded.name == "tiny-org/tiny-llama"
    assert loaded.source_path == repo / "snapshots" / "0123abc"


def test_gguf_source_is_converted_once_into_the_data_dir(
    tiny_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.inference.tiny_gguf import write_tiny_gguf

    gguf = tmp_path / "My-Model.Q8_0.gguf"
    write_tiny_gguf(gguf)  # the weights are read from it; the (faked) conversion gives config and tokenizer
    conversions: list[Path] = []

    def fake_convert(gguf_path, out_dir, progress=None):  # the real one is tested in test_bundled
        conversions.append(Path(gguf_path))
        shutil.copytree(tiny_folder, out_dir, dirs_exist_ok=True)

    monkeypatch.setattr(inference.models.bundled, "convert_gguf", fake_convert)
    config = cpu(gguf, data_dir=str(tmp_path / "data"))
    first, second = load_model(config), load_model(config)
    assert conversions == [gguf]
    assert first.source_path == second.source_path
    assert first.source_path.parent == tmp_path / "data" / "models"
    assert first.source_path.name.startswith("My-Model.Q8_0-")
    assert first.name == "My-Model.Q8_0"
    # A name given (the playground's record name) is the model's name; the file stem never shows.
    named = load_model(replace(config, name="Mistral small (q8)"))
    assert named.name == "Mistral small (q8)" and conversions == [gguf]


# --- errors: one readable line naming the model, the original chained ---------------------


def assert_load_error(config: EngineConfig, *fragments: str) -> ModelLoadError:
    with pytest.raises(ModelLoadError) as caught:
        load_model(config)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message
    for fragment in fragments:
        assert fragment in message
    return caught.value


def test_missing_folder(tmp_path: Path) -> None:
    assert_load_error(cpu(tmp_path / "nope"), str(tmp_path / "nope"), "does not exist")


def test_folder_without_config(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    assert_load_error(cpu(tmp_path), str(tmp_path), "no config.json")


def test_corrupt_safetensors(tiny_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "corrupt"
    shutil.copytree(tiny_folder, folder)
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    error = assert_load_error(cpu(folder), str(folder), "cannot load the model")
    assert error.__cause__ is not None


def test_unknown_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    error = assert_load_error(
        cpu("no-such-org/no-such-model"),
        "'no-such-org/no-such-model'",
        "nor in the Hugging Face cache",
        "downloads are disabled",
    )
    assert error.__cause__ is not None


def test_missing_gguf(tmp_path: Path) -> None:
    assert_load_error(
        cpu(tmp_path / "absent.gguf", data_dir=str(tmp_path)), str(tmp_path / "absent.gguf"), "does not exist"
    )
    assert not (tmp_path / "models").exists()


def test_a_plain_file_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"x")
    assert_load_error(cpu(tmp_path / "weights.bin"), "is a file, not a model folder")
