"""The architecture card against the models transformers builds from the same configs.

Every count of `inference.introspect.architecture` is checked against `model.parameters()` of a
meta-device model (shapes only, no memory), and the KV numbers against a real cache of a tiny
DeepSeek-V3 after a forward pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, DeepseekV3Config

from inference.introspect import architecture as arch
from inference.models.tiny import make_tiny_model, tiny_config
from tests.inference.engines import engine_for


def meta_model(config_dict: dict) -> torch.nn.Module:
    if "dim" in config_dict:
        config_dict = arch.hf_config_from_deepseek_repo(config_dict)
    fields = {k: v for k, v in config_dict.items() if k not in ("model_type", "architectures", "torch_dtype")}
    if config_dict["model_type"] == "deepseek_v3":
        config = DeepseekV3Config(**fields)
    else:
        config = AutoConfig.for_model(config_dict["model_type"], **fields)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def counted(model: torch.nn.Module) -> tuple[int, int]:
    """(total, active per token) from the module tree: a MoE layer uses k of its n experts."""
    total = sum(p.numel() for p in model.parameters())
    unused = 0
    for module in model.modules():
        experts, gate = getattr(module, "experts", None), getattr(module, "gate", None)
        if experts is not None and gate is not None and hasattr(gate, "top_k"):
            per_expert = sum(p.numel() for p in experts.parameters()) // gate.num_experts
            unused += (gate.num_experts - gate.top_k) * per_expert
    return total, total - unused


@pytest.mark.parametrize("key", list(arch.REFERENCE_MODELS))
def test_reference_counts_equal_meta_models(key: str) -> None:
    config = arch.reference_config(key)
    params = arch.parameter_counts(arch.shape_from_config(config))
    assert (params["total"], params["active"]) == counted(meta_model(config))


def test_deepseek_v3_published_figures() -> None:
    card = arch.reference_card("deepseek_v3_671b", context=4096)
    assert 670e9 < card["parameters"]["total"] < 672e9  # "671B"
    assert 37.0e9 < card["parameters"]["active"] < 38.0e9  # "37B activated"
    kv = card["kv_cache"]
    assert (kv["form"], kv["values_per_token"]) == ("mla_latent", 61 * (512 + 64))
    assert kv["bytes_per_token"] == 70_272  # bf16
    assert kv["expanded_bytes_per_token"] == 61 * 128 * (128 + 64 + 128) * 2 == 4_997_120  # ~5.0 MB
    assert kv["bytes_at_context"] == 70_272 * 4096


def test_r1_distill_published_sizes() -> None:
    published = {"qwen_1_5b": 1.78e9, "qwen_7b": 7.62e9, "qwen_14b": 14.8e9, "qwen_32b": 32.8e9, "llama_8b": 8.03e9}
    for suffix, size in published.items():
        total = arch.reference_card(f"deepseek_r1_distill_{suffix}")["parameters"]["total"]
        assert abs(total - size) / size < 0.01, suffix


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2", "deepseek_v3"])
def test_tiny_configs_equal_their_models(name: str) -> None:
    config = tiny_config(name).to_dict()
    params = arch.parameter_counts(arch.shape_from_config(config))
    assert (params["total"], params["active"]) == counted(make_tiny_model(name))


def test_bundled_model_card(bundled_model_dir: Path, bundled) -> None:
    config = json.loads((bundled_model_dir / "config.json").read_text())
    card = arch.card(config, context=100, dtype="float32")
    assert card["parameters"]["total"] == sum(p.numel() for p in bundled.model.parameters())
    assert card["kv_cache"]["form"] == "gqa"
    s = arch.shape_from_config(config)
    assert card["kv_cache"]["bytes_per_token"] == s.layers * 2 * s.kv_heads * s.head_dim * 4
    # the prefill computes the logits of its last position only, as the runners do
    head = 2 * s.vocab * s.hidden
    assert card["flops"]["prefill_total"] == arch.prefill_flops(s, 100) - 99 * head


def test_mla_cache_bytes_are_the_latent() -> None:
    """The engine's pool stores MLA compressed: its bytes per token equal the card's latent bytes."""
    engine = engine_for("deepseek_v3")
    card = arch.card(engine.model.config.to_dict(), context=10, dtype="float32")
    assert 10 * engine.info.kv_bytes_per_token == card["kv_cache"]["bytes_at_context"]
    assert card["kv_cache"]["bytes_at_context"] < card["kv_cache"]["expanded_bytes_at_context"]


def test_flops_and_bytes_read_grow_as_they_should() -> None:
    s = arch.shape_from_config(arch.reference_config("deepseek_v3_671b"))
    short, long = arch.decode_flops(s, 1), arch.decode_flops(s, 1001)
    assert short["as_run"] == 2 * arch.matmul_parameters(s) + arch.attention_flops_per_key(s)
    # re-expanding every cached latent costs 2 * kv_b FLOPs per cached token per layer
    expand = 2 * s.layers * arch.kv_b_parameters(s) * 1000
    assert long["as_run"] - short["as_run"] == expand + arch.attention_flops_per_key(s) * 1000
    assert long["absorbed"] < long["as_run"]
    assert arch.prefill_flops(s, 2) == 4 * arch.matmul_parameters(s) + 3 * arch.attention_flops_per_key(s)
    read = arch.decode_bytes_read(s, 4096, 2, 2)
    assert read["kv_cache"] == 70_272 * 4096
    assert read["weights"] < 2 * 38e9  # batch 1 reads only the chosen experts


def test_bad_configs_say_why() -> None:
    with pytest.raises(arch.ArchitectureError, match="model_type 'bert'"):
        arch.card({"model_type": "bert"})
    with pytest.raises(arch.ArchitectureError, match="hidden_size"):
        arch.card({"model_type": "llama", "vocab_size": 10})
    with pytest.raises(arch.ArchitectureError, match="context"):
        arch.reference_card("deepseek_v3_671b", context=0)
    with pytest.raises(arch.ArchitectureError, match="dtype"):
        arch.reference_card("deepseek_v3_671b", dtype="int3")


def test_the_card_says_when_a_sliding_window_limits_the_cache() -> None:
    from inference.introspect.architecture import card

    mistral = {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "max_position_embeddings": 256,
        "sliding_window": 32,
    }
    assert card(mistral)["kv_cache"]["sliding_window"] == 32
    assert card({**mistral, "sliding_window": None})["kv_cache"]["sliding_window"] is None
    qwen2_off = {**mistral, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": False}
    assert card(qwen2_off)["kv_cache"]["sliding_window"] is None
