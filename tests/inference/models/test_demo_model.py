"""The DeepSeek-V3 architecture demo: built once, deterministic, labelled random, runs through the
engine with MLA's compressed cache (measured bytes equal the architecture card's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from inference import EngineConfig, SamplingParams, Step
from inference.engine import Engine
from inference.introspect import architecture as arch
from inference.models import demo
from inference.models.loader import load_model


@pytest.fixture(scope="module")
def demo_dir(data_dir: Path, bundled_model_dir: Path) -> Path:
    return demo.ensure_demo_model(data_dir)


def test_folder_says_random_weights(demo_dir: Path) -> None:
    marker = json.loads((demo_dir / demo.MARKER_NAME).read_text())
    assert marker["random_weights"] is True and "random weights" in marker["name"]
    config = json.loads((demo_dir / "config.json").read_text())
    assert config["model_type"] == "deepseek_v3"
    assert (config["n_group"], config["topk_group"], config["num_experts_per_tok"]) == (4, 2, 4)
    assert demo.ensure_demo_model(demo_dir.parents[1]) == demo_dir  # complete: not rebuilt


def test_same_seed_same_weights(bundled_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_dir)
    first, second = demo.build_demo_model(tokenizer).state_dict(), demo.build_demo_model(tokenizer).state_dict()
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_generates_with_the_latent_cache(demo_dir: Path, data_dir: Path) -> None:
    loaded = load_model(EngineConfig(source=str(demo_dir), device="cpu", dtype="float32", data_dir=str(data_dir)))
    engine = Engine(loaded, EngineConfig(source=str(demo_dir)))
    assert engine.runner.name == "transformers"
    prompt = loaded.tokenizer("The capital of France is")["input_ids"]
    events = list(engine.generate(prompt, SamplingParams(max_new_tokens=6, greedy=True, ignore_eos=True)))
    steps = [e for e in events if isinstance(e, Step)]
    assert len(steps) == 6
    card = arch.card(json.loads((demo_dir / "config.json").read_text()), context=1, dtype="float32")
    # 4 layers x (32 latent + 16 rope key) float32 values per token; after the last step the
    # cache holds the prompt and every generated token but the last
    per_token = card["kv_cache"]["bytes_per_token"]
    assert per_token == 4 * (32 + 16) * 4
    assert steps[-1].kv_cache_bytes == per_token * (len(prompt) + 5)
    assert per_token < card["kv_cache"]["expanded_bytes_per_token"]
