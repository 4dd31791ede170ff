"""Structured-outputs benchmark: what a JSON Schema costs and whether the answers hold to it.

`python -m inference.bench structured [--quick]`.

Owns: on the default model (Qwen2.5-Coder, its 151,936-entry vocabulary), through the serving path
(`Engine.add_request`/`step`): `compile_ms` (median time to check a new schema and build a
request's matcher: what an API request with a new schema pays in the worker), `schema_valid_rate`
(greedy answers under each schema that parse as JSON and validate against it: the grammar
ended them, every required key there, no key `additionalProperties: false` forbids, every value of
its type or enum), and `mask_overhead` (decode time per token with the schema over the same
prompt's decode time per token without one, minus 1; interleaved, best of N).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from inference.bench import format_keys
from inference.bundled_models import QWEN_CODER
from inference.config import EngineConfig
from inference.engine import Engine
from inference.events import Finished
from inference.sampling import grammar_spec
from inference.sampling.grammar import GrammarMatcher
from inference.sampling_params import SamplingParams

_STRICT = {"additionalProperties": False}
SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"}},
        "required": ["name", "age"],
        **_STRICT,
    },
    {
        "type": "object",
        "properties": {
            "colours": {"type": "array", "items": {"enum": ["red", "green", "blue", "yellow"]}, "maxItems": 4},
            "favourite": {"enum": ["red", "green", "blue", "yellow"]},
        },
        "required": ["colours", "favourite"],
        **_STRICT,
    },
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "location": {
                "type": "object",
                "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                "required": ["lat", "lon"],
                **_STRICT,
            },
            "facts": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        },
        "required": ["city", "location", "facts"],
        **_STRICT,
    },
]
PROMPTS = [
    "Describe a person as JSON.",
    "Give me colours as JSON.",
    "Tell me about Paris as JSON.",
    "Answer in JSON: a famous scientist.",
    "JSON please: your favourite city.",
    "Reply with JSON about the sea.",
]
_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict}


def is_valid(value: Any, schema: dict[str, Any]) -> bool:
    """The subset of JSON Schema the benchmark's schemas use: type, enum, properties, required,
    additionalProperties false, items, maxItems."""
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    if kind is not None and (not isinstance(value, _TYPES[kind]) or (kind != "boolean" and isinstance(value, bool))):
        return False
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        if any(key not in value for key in schema.get("required", [])):
            return False
        if schema.get("additionalProperties") is False and any(key not in properties for key in value):
            return False
        return all(is_valid(v, properties[k]) for k, v in value.items() if k in properties)
    if isinstance(value, list):
        return len(value) <= schema.get("maxItems", len(value)) and all(
            is_valid(v, schema.get("items", {})) for v in value
        )
    return True


def _run(engine: Engine, prompt_ids: list[int], params: SamplingParams) -> Finished:
    request_id = engine.add_request(prompt_ids, params)
    while True:
        for rid, event in engine.step():
            if rid == request_id and isinstance(event, Finished):
                return event


def compile_ms(engine: Engine, repeats: int) -> float:
    """Median ms to check a schema never seen before and build its matcher."""
    times = []
    for i in range(repeats):
        for schema in SCHEMAS:
            spec = {"type": "json_schema", "schema": {**schema, "title": f"run {i}"}}  # new text: no cache hit
            started = time.perf_counter()
            grammar_spec.check(spec)
            GrammarMatcher(spec, engine.vocab.tokenizer, engine.vocab.num_logits)
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.bench structured", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 prompts per schema, best of 2 (about a minute)")
    parser.add_argument("--source", default=QWEN_CODER.source)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    args = parser.parse_args(argv)
    prompts, repeats = (PROMPTS[:2], 2) if args.quick else (PROMPTS, 3)
    engine = Engine.load(EngineConfig(source=args.source, dtype=args.dtype))
    started = time.perf_counter()
    GrammarMatcher({"type": "json_object"}, engine.vocab.tokenizer, engine.vocab.num_logits)  # the tokenizer, once
    print(f"{engine.info.name}: llguidance's view of the tokenizer built in {time.perf_counter() - started:.1f} s")
    results: dict[str, float | str] = {"compile_ms": compile_ms(engine, 5)}
    valid, total, with_ms, without_ms = 0, 0, [], []
    for schema in SCHEMAS:
        spec = {"type": "json_schema", "schema": json.dumps(schema)}
        for prompt in prompts:
            prompt_ids = engine.prompts.build(messages=[{"role": "user", "content": prompt}]).token_ids
            constrained = SamplingParams(max_new_tokens=args.max_new_tokens, greedy=True, grammar=spec)
            finished = _run(engine, prompt_ids, constrained)
            try:
                ok = finished.finish_reason == "grammar" and is_valid(json.loads(finished.text), schema)
            except ValueError:
                ok = False
            valid, total = valid + ok, total + 1
            n = finished.num_generated_tokens
            free = SamplingParams(max_new_tokens=n, greedy=True, ignore_eos=True)
            best_with, best_without = float("inf"), float("inf")
            for _ in range(repeats):  # interleaved: machine noise hits both
                run = _run(engine, prompt_ids, constrained)
                best_with = min(best_with, run.decode_ms / max(run.num_generated_tokens - 1, 1))
                run = _run(engine, prompt_ids, free)
                best_without = min(best_without, run.decode_ms / max(run.num_generated_tokens - 1, 1))
            with_ms.append(best_with)
            without_ms.append(best_without)
            print(f"  {'valid' if ok else 'INVALID'} {n} tokens: {finished.text[:100]!r}")
    results["schema_valid_rate"] = valid / total
    results["mask_overhead"] = sum(with_ms) / sum(without_ms) - 1
    results["ms_per_token_with_schema"] = statistics.mean(with_ms)
    results["ms_per_token_without"] = statistics.mean(without_ms)
    print(format_keys(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
