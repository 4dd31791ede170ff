"""What the differential fuzz runs on: a model, the fuzzed engine's settings, prompt material, and
the second model a "switch" case loads beside it.

Owns: `Subject` (the loaded model, the fuzzed engine's config with a KV pool small enough to
preempt, the cold reference engine's config with room for any request alone, the `Material`
prompts are cut from) for a tiny random model (`tiny-<arch>`: seconds, for the tests) and for a
bundled model (`bundled`, `bundled:<name>`: real text and a real tokenizer), and `switch`: another
precision of the same model, or another model, loaded in this process, run through an engine of
its own and the precision view's recompute, then dropped (what the worker does for the explorer's
precision view and for a model registered from a .gguf). Must not know: cases, comparisons.
"""

from __future__ import annotations

import gc
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from inference.bench.fuzz_cases import Material, shuffled_bases
from inference.config import EngineConfig
from inference.engine import Engine
from inference.introspect.recompute import recompute
from inference.models.loader import LoadedModel, load_model
from inference.models.memory import release_free_memory
from inference.models.precision import quantize_model
from inference.models.tiny import TINY_ARCHITECTURES, make_tiny_model, make_tiny_tokenizer
from inference.sampling_params import SamplingParams

TEXTS = (
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is Rome.",
    "Once upon a time, in a small village by the sea, there lived an old fisherman and his cat.",
    "To make pancakes, mix flour, milk and eggs, then fry thin layers in a hot pan with butter.",
    "The sky is blue because air scatters the short wavelengths of sunlight more than the long ones.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "请给我讲一个故事。从前有一座山，山里有一座庙，庙里有一个老和尚。",
    "Bees make honey from the nectar of flowers, which they store and dry in wax cells of the hive.",
)
STOPS = (".", ",", " the", "\n", " is", "。", "a")


@dataclass
class Subject:
    name: str
    loaded: LoadedModel
    config: EngineConfig  # the fuzzed engine's: a small pool (preemption), a small token budget (chunks)
    reference_config: EngineConfig  # the cold engine's: the same, with room for any request alone
    material: Material
    other: Callable[[int], LoadedModel]  # the `switch` case's second model (by case index)

    def engine(self) -> Engine:
        return Engine(self.loaded, self.config)

    def describe(self, engine: Engine) -> str:
        c = self.config
        return (
            f"{self.name} ({self.loaded.precision}, {engine.runner.name} runner), block_size={c.block_size}, "
            f"{engine.core.block_manager.num_blocks} KV blocks, max_num_batched_tokens={c.max_num_batched_tokens}, "
            f"max_num_seqs={c.max_num_seqs}, batch_invariant={engine.model_info()['batch_invariant']} (bitwise "
            "equality needs it: the fused CPU kernels built)"
        )

    def switch(self, index: int, prompt_ids: list[int]) -> None:
        """Loads the second model, runs it as the precision view does (a transformers forward of
        the path) and as a served model does (an engine of its own), then drops it."""
        other = self.other(index)
        recompute(other.model, prompt_ids[:-1] or prompt_ids, prompt_ids[-1:])
        engine = Engine(other, replace(self.reference_config, kv_cache_bytes=1 << 20))
        list(engine.generate(prompt_ids, SamplingParams(max_new_tokens=2, greedy=True, num_alternatives=20)))
        del engine, other
        gc.collect()
        release_free_memory()


def tiny_subject(arch: str = "llama", seed: int = 0, num_blocks: int = 40) -> Subject:
    """A tiny random `arch` model (float32) on the tiny byte tokenizer: a pool of `num_blocks`
    blocks of 4 tokens (prompts up to 48 tokens: a few requests fill it, so some are preempted)."""
    if arch not in TINY_ARCHITECTURES:
        raise ValueError(f"tiny-{arch}: tiny models are tiny-{', tiny-'.join(TINY_ARCHITECTURES)}")
    loaded = _tiny_loaded(arch, seed, "float32")
    rng = random.Random(seed)
    bases = tuple(tuple(text.encode()[:64]) for text in TEXTS) + tuple(
        tuple(rng.randrange(256) for _ in range(56)) for _ in range(3)
    )
    bases += shuffled_bases(seed, bases, 4, num=8, length=48)
    material = Material(
        bases=bases, tail_ids=tuple(range(32, 127)), stops=("a", "e", " ", "o", "t", "s", "n"), max_prompt_tokens=48
    )
    config, reference = _configs(loaded, num_blocks, block_size=4, max_num_batched_tokens=32)
    others = ("qwen2", arch)  # another model; this one in int8 (the precision view's copy)

    def other(index: int) -> LoadedModel:
        which = others[index % 2]
        return _tiny_loaded(which, seed + 1 if which != arch else seed, "int8" if which == arch else "float32")

    return Subject(f"tiny-{arch}", loaded, config, reference, material, other)


def bundled_subject(source: str = "bundled", dtype: str = "auto", num_blocks: int = 32) -> Subject:
    """A bundled model on its real tokenizer; `switch` loads its int8 copy."""
    loaded = load_model(EngineConfig(source=source, device="cpu", dtype=dtype))
    encode = lambda text: loaded.tokenizer(text, add_special_tokens=False).input_ids
    bases = tuple(tuple(encode(text)) for text in TEXTS)
    bases += shuffled_bases(0, bases, 4, num=8, length=48)
    tail_ids = tuple(sorted({i for base in bases for i in base}))
    material = Material(bases=bases, tail_ids=tail_ids, stops=STOPS, max_prompt_tokens=64)
    config, reference = _configs(loaded, num_blocks, block_size=4, max_num_batched_tokens=48)
    other_dtype = "int8" if loaded.precision != "int8" else "bfloat16"
    return Subject(
        source, loaded, config, reference, material, lambda _: load_model(replace(_source(source), dtype=other_dtype))
    )


def _source(source: str) -> EngineConfig:
    return EngineConfig(source=source, device="cpu")


def _configs(
    loaded: LoadedModel, num_blocks: int, block_size: int, max_num_batched_tokens: int
) -> tuple[EngineConfig, EngineConfig]:
    probe = Engine(loaded, EngineConfig(kv_cache_bytes=1, block_size=block_size))
    per_block = probe.runner.bytes_per_token * block_size
    config = EngineConfig(
        kv_cache_bytes=num_blocks * per_block,
        block_size=block_size,
        max_num_seqs=8,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    return config, replace(config, kv_cache_bytes=max(num_blocks, 512) * per_block)


def _tiny_loaded(arch: str, seed: int, precision: str) -> LoadedModel:
    model = make_tiny_model(arch, seed=seed)
    quantization = quantize_model(model, precision, torch.bfloat16) if precision == "int8" else None
    return LoadedModel(
        model=model,
        tokenizer=make_tiny_tokenizer(),
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
