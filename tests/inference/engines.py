"""Helpers for engine tests: an Engine around a tiny random model, transformers' greedy reference."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from inference import EngineConfig, Finished, SamplingParams, Step
from inference.engine import Engine
from inference.models.loader import LoadedModel
from inference.models.precision import QUANTIZED_BITS, quantize_model
from inference.models.tiny import make_tiny_model, make_tiny_tokenizer, tiny_config

TEST_KV_BYTES = 8 * 1024 * 1024  # the tiny models' KV pool: thousands of tokens
CHAT_TEMPLATES = Path(__file__).parent / "text" / "chat_templates"


def engine_for(arch: str, seed: int = 0, precision: str = "float32", **config) -> Engine:
    """An Engine over a tiny random `arch` model with the tiny byte-level tokenizer, its linear
    layers quantized for precision int8 / int4 (bfloat16 activations). `config`: EngineConfig fields."""
    model = make_tiny_model(arch, seed=seed)
    quantization = None
    if precision in QUANTIZED_BITS:
        quantization = quantize_model(model, precision, torch.bfloat16)
    return engine_around(model, precision=precision, quantization=quantization, name=f"tiny-{arch}", **config)


def engine_around(
    model,
    *,
    tokenizer=None,
    eos_token_ids: tuple[int, ...] = (),
    max_context: int | None = None,
    precision: str = "float32",
    quantization=None,
    name: str = "tiny",
    chat_template: str | None = None,
    **config,
) -> Engine:
    """An Engine over `model` as it is (no loading): the tiny tokenizer unless one is given."""
    loaded = LoadedModel(
        model=model,
        tokenizer=tokenizer or make_tiny_tokenizer(),
        name=name,
        source_path=Path("."),
        dtype=torch.bfloat16 if quantization else next(model.parameters()).dtype,
        device=torch.device("cpu"),
        chat_template=chat_template,
        max_context=max_context or model.config.get_text_config().max_position_embeddings,
        eos_token_ids=eos_token_ids,
        precision=precision,
        quantization=quantization,
    )
    return Engine(loaded, EngineConfig(**{"kv_cache_bytes": TEST_KV_BYTES, **config}))


def tiny_chat_engine(seed: int, *, tokenizer=None, max_context: int | None = None) -> Engine:
    """An Engine over a tiny random Llama (weights from `seed`) with the byte-level tokenizer (or
    `tokenizer`), Qwen2.5's chat template and `<|eos|>` (257) as its end."""
    config = tiny_config("llama")
    if max_context is not None:
        config.max_position_embeddings = max_context
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    template = (CHAT_TEMPLATES / "qwen2_5.jinja").read_text()
    return engine_around(
        model, tokenizer=tokenizer or make_tiny_tokenizer(), eos_token_ids=(257,), chat_template=template
    )


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int, eos_token_ids, logits_processor=None) -> list[int]:
    """transformers' own greedy decoding (after `logits_processor`, a list of transformers
    processors, if given): the reference every runner must reproduce."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids]),
            logits_processor=logits_processor,
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=list(eos_token_ids) or None,
            pad_token_id=0,
            temperature=None,
            top_p=None,
            top_k=None,
        )
    return out[0, len(prompt_ids) :].tolist()


def run(engine: Engine, prompt_ids: list[int], **params) -> tuple[list, list[Step], Finished]:
    events = list(engine.generate(prompt_ids, SamplingParams(**params)))
    return events, [e for e in events if isinstance(e, Step)], events[-1]


def batched(engine: Engine, prompt_ids: list[int], params: SamplingParams) -> list:
    """One request through `add_request`/`step` (the continuous batch): its events."""
    request_id = engine.add_request(prompt_ids, params)
    events = []
    while engine.has_unfinished:
        events += [event for rid, event in engine.step() if rid == request_id]
    return events
