"""Helpers for engine tests: an Engine around a tiny random model, transformers' greedy reference."""

from __future__ import annotations

from pathlib import Path

import torch

from inference import EngineConfig, Finished, SamplingParams, Step
from inference.engine import Engine
from inference.models.loader import LoadedModel
from inference.models.precision import QUANTIZED_BITS, quantize_model
from tests.engine.tiny_models import make_tiny_model, make_tiny_tokenizer


def engine_for(arch: str, prefix_cache_bytes: int = 0, seed: int = 0, precision: str = "float32") -> Engine:
    """An Engine over a tiny random `arch` model with the tiny byte-level tokenizer, its linear
    layers quantized for precision int8 / int4 (bfloat16 activations)."""
    model = make_tiny_model(arch, seed=seed)
    tokenizer = make_tiny_tokenizer()
    quantization = None
    if precision in QUANTIZED_BITS:
        quantization = quantize_model(model, precision, torch.bfloat16)
    loaded = LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=f"tiny-{arch}",
        source_path=Path("."),
        dtype=torch.bfloat16 if quantization else torch.float32,
        device=torch.device("cpu"),
        chat_template=None,
        max_context=model.config.max_position_embeddings,
        eos_token_ids=(),
        precision=precision,
        quantization=quantization,
    )
    return Engine(loaded, EngineConfig(prefix_cache_bytes=prefix_cache_bytes))


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int, eos_token_ids) -> list[int]:
    """transformers' own greedy decoding: the reference every runner must reproduce."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids]),
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
    """One request through `add_request`/`step` (the continuous batcher when it takes it): its events."""
    request_id = engine.add_request(prompt_ids, params)
    events = []
    while engine.has_unfinished:
        events += [event for rid, event in engine.step() if rid == request_id]
    return events
