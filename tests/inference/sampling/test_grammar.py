"""The grammar stage (`inference/sampling/grammar.py`, `grammar_spec.py`): a request's grammar masks
the processed distribution only, advances with each token, ends the answer when complete, shares a
batch step with free requests and keeps the same tokens cold, warm and batched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from inference import Finished, SamplingParams, Step
from inference.bundled_models import QWEN_CODER
from inference.models.bundled import prepare
from inference.models.tiny import make_tiny_tokenizer
from inference.sampling import grammar_spec
from inference.sampling.grammar import GrammarMatcher, apply_masks, removed_mass
from inference.sampling.sampler import Row, Sampler, sample_rows
from tests.inference.engines import engine_for
from tests.inference.test_batching import run_to_ends

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "colour": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        "inner": {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "colour", "tags", "inner"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"type": "json_schema", "schema": SCHEMA}


def _run(engine, prompts: list[list[int]], params: list[SamplingParams]) -> list[tuple[list[Step], Finished]]:
    return run_to_ends(engine, list(zip(prompts, params)))


def _valid(text: str) -> dict:
    value = json.loads(text)
    assert set(value) == {"name", "colour", "tags", "inner"}
    assert isinstance(value["name"], str) and len(value["name"]) <= 8
    assert value["colour"] in ("red", "green", "blue")
    assert all(isinstance(t, int) for t in value["tags"]) and len(value["tags"]) <= 3
    assert set(value["inner"]) == {"ok"} and isinstance(value["inner"]["ok"], bool)
    return value


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_random_model_under_a_schema_writes_valid_json_and_the_grammar_ends_it(seed: int) -> None:
    engine = engine_for("llama", seed=seed)
    params = SamplingParams(max_new_tokens=300, seed=seed, grammar=JSON_SCHEMA, num_alternatives=5)
    [(steps, finished)] = _run(engine, [[72, 105]], [params])
    _valid(finished.text)
    assert finished.finish_reason == "grammar"
    # The raw distribution is the model's own; the processed one only holds allowed tokens.
    assert all(s.masked_prob is not None and 0.0 <= s.masked_prob <= 1.0 for s in steps)
    assert steps[0].top_processed[0].token_id == ord("{") and steps[0].top_processed[0].prob == pytest.approx(1.0)
    assert steps[0].masked_prob > 0.5  # a random 258-token model puts little mass on "{"
    assert len(steps[0].top_raw) == 5 and steps[0].top_raw != steps[0].top_processed


def test_free_and_constrained_requests_share_a_step_and_keep_their_tokens() -> None:
    prompt = [72, 105]
    constrained = SamplingParams(max_new_tokens=200, seed=3, grammar=JSON_SCHEMA)
    free = SamplingParams(max_new_tokens=20, seed=4)
    alone_c = _run(engine_for("llama"), [prompt], [constrained])[0][1]
    alone_f = _run(engine_for("llama"), [prompt], [free])[0][1]
    engine = engine_for("llama")
    batched = _run(engine, [prompt, prompt, prompt], [free, constrained, free])
    assert batched[1][1].token_ids == alone_c.token_ids
    assert batched[0][1].token_ids == alone_f.token_ids == batched[2][1].token_ids
    assert all(s.masked_prob is None for s in batched[0][0])  # the free request is not masked
    warm = _run(engine, [prompt], [constrained])[0][1]  # the prompt's KV now cached
    assert warm.token_ids == alone_c.token_ids
    _valid(alone_c.text)


def test_greedy_under_a_grammar_and_a_grammar_that_cannot_finish_ends_by_length() -> None:
    params = SamplingParams(max_new_tokens=5, greedy=True, grammar=JSON_SCHEMA)
    [(steps, finished)] = _run(engine_for("qwen2"), [[1, 2, 3]], [params])
    assert finished.finish_reason == "length" and finished.text.startswith('{"')
    assert len(steps) == 5


def test_eos_is_allowed_only_where_the_grammar_is_complete() -> None:
    tokenizer = make_tiny_tokenizer()
    eos = tokenizer.eos_token_id
    matcher = GrammarMatcher({"type": "json_object"}, tokenizer, 260)
    logits = torch.zeros(1, 260)
    logits[0, eos] = 10.0  # the model wants to stop at once
    masked = apply_masks(logits, [matcher])
    removed = removed_mass(torch.log_softmax(logits, -1), torch.log_softmax(masked, -1), masked.argmax(-1))
    assert masked[0, eos] == -torch.inf and masked[0, ord("{")] == 0.0
    assert torch.isinf(masked[0]).sum() == 259  # only "{" may start an object
    expected = 1 - 1 / (torch.exp(torch.tensor(10.0)) + 259)
    assert removed[0] == pytest.approx(float(expected), rel=1e-5)
    assert logits[0, eos] == 10.0  # the input is not modified
    for byte in b'{"a": 1}':
        matcher.advance(byte)
    masked = apply_masks(logits, [matcher])
    assert masked[0, eos] == 10.0 and matcher.is_accepting
    with pytest.raises(ValueError, match="does not fit the grammar"):
        GrammarMatcher({"type": "json_object"}, tokenizer, 260).advance(ord("x"))


def test_sample_rows_masks_only_the_processed_distribution() -> None:
    tokenizer = make_tiny_tokenizer()
    torch.manual_seed(0)
    logits = torch.randn(1, 260).repeat(2, 1)  # (2, V): one distribution, masked and not
    params = SamplingParams(seed=1, temperature=0.7, top_k=50, num_alternatives=5)
    rows = [
        Row(Sampler(params, "cpu"), [1], None, 5, GrammarMatcher({"type": "json_object"}, tokenizer, 260)),
        Row(Sampler(params, "cpu"), [1], None, 5),
    ]
    masked, plain = sample_rows(logits, rows)
    assert masked.token_id == ord("{") and masked.logprob == pytest.approx(0.0, abs=1e-6)
    assert masked.top_processed == ((ord("{"), masked.logprob),)
    assert masked.top_raw == plain.top_raw  # the raw read-outs are the model's own
    assert plain.masked_prob is None and 0 < masked.masked_prob < 1


def test_grammar_specs_are_checked_and_bounded() -> None:
    assert SamplingParams.from_dict(SamplingParams(grammar=JSON_SCHEMA).to_dict()).grammar == JSON_SCHEMA
    bad = [
        ({"type": "regexp"}, "grammar.type='regexp'"),
        ({"type": "regex"}, "grammar.pattern must be"),
        ({"type": "regex", "pattern": "(ab"}, "grammar.pattern is not supported: unclosed group$"),
        ({"type": "choice", "choices": []}, "grammar.choices must be"),
        ({"type": "choice", "choices": ["a", ""]}, r"grammar.choices\[1\]=''"),
        ({"type": "choice", "choices": ["a"], "pattern": "a"}, "unknown field"),
        ({"type": "json_schema", "schema": {"type": "strin"}}, "grammar.schema is not supported: Invalid type"),
        ({"type": "json_schema", "schema": {"$ref": "http://x/y"}}, "grammar.schema is not supported"),
        ({"type": "json_schema"}, "grammar.schema must be"),
        ({"type": "json_object", "x": 1}, "unknown field"),
        ({"type": "tool_calls", "tools": []}, "grammar.tools must be"),
        ({"type": "tool_calls", "tools": [{"name": "a b", "parameters": {}}]}, r"grammar.tools\[0\].name"),
        (
            {"type": "tool_calls", "tools": [{"name": "f", "parameters": {"type": "nope"}}]},
            r"grammar.tools\[0\].parameters is not supported",
        ),
    ]
    for spec, message in bad:
        with pytest.raises(ValueError, match=message):
            SamplingParams(grammar=spec)
    deep: dict = {"type": "string"}
    for _ in range(20):
        deep = {"type": "object", "properties": {"a": deep}}
    with pytest.raises(ValueError, match="nested more than 16 levels"):
        SamplingParams(grammar={"type": "json_schema", "schema": deep})
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)}}
    with pytest.raises(ValueError, match="at most 32000 are allowed"):
        SamplingParams(grammar={"type": "json_schema", "schema": wide})
    with pytest.raises(ValueError, match="beam search"):
        SamplingParams(grammar=JSON_SCHEMA, num_beams=2)


@pytest.mark.parametrize(
    ("spec", "good", "bad"),
    [
        ({"type": "regex", "pattern": r"[0-9]{3}-[a-z]+"}, "123-abc", "12a"),
        ({"type": "choice", "choices": ["yes", "no", 'say "hi"\\', "中文"]}, 'say "hi"\\', "maybe"),
        ({"type": "choice", "choices": ["yes", "no", 'say "hi"\\', "中文"]}, "中文", "yes!"),
    ],
)
def test_a_regex_or_a_list_of_choices_takes_only_its_text(spec: dict, good: str, bad: str) -> None:
    tokenizer = make_tiny_tokenizer()  # one token per byte
    grammar_spec.check(spec)
    matcher = GrammarMatcher(spec, tokenizer, 260)
    for byte in good.encode():
        matcher.advance(byte)
    assert matcher.is_accepting
    wrong = GrammarMatcher(spec, tokenizer, 260)
    with pytest.raises(ValueError, match="does not fit the grammar"):
        for byte in bad.encode():
            wrong.advance(byte)
        # all of it fitted: only the end of sequence may be refused
        wrong.advance(tokenizer.eos_token_id) if not wrong.is_accepting else wrong.advance(ord("!"))


def test_a_choice_grammar_ends_the_answer_on_one_choice_and_reports_what_it_removed() -> None:
    params = SamplingParams(max_new_tokens=40, seed=5, grammar={"type": "choice", "choices": ["red", "green"]})
    [(steps, finished)] = _run(engine_for("llama"), [[72, 105]], [params])
    assert finished.text in ("red", "green") and finished.finish_reason in ("grammar", "eos")
    first = steps[0]
    allowed = {ord("r"), ord("g")}
    # Removed: each listed raw alternative but "r" and "g", with the raw probabilities.
    assert [a.token_id for a in first.top_masked] == [a.token_id for a in first.top_raw if a.token_id not in allowed]
    assert {a.prob for a in first.top_masked} <= {a.prob for a in first.top_raw}
    listed = sum(a.prob for a in first.top_masked)
    assert listed <= first.masked_prob + 1e-6 and first.masked_prob > 0.9
    assert first.to_dict()["top_masked"][0]["token_id"] == first.top_masked[0].token_id
    [(free_steps, _)] = _run(engine_for("llama"), [[72, 105]], [SamplingParams(max_new_tokens=2, seed=5)])
    assert free_steps[0].top_masked == () and free_steps[0].masked_prob is None


@pytest.fixture(scope="module")
def qwen_tokenizer(data_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(prepare(QWEN_CODER, data_dir, progress=print))


def test_qwen_tool_calls_use_its_special_tokens(qwen_tokenizer) -> None:
    tokenizer = qwen_tokenizer
    tools = [
        {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
        {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
    ]
    spec = {"type": "tool_calls", "tools": tools, "parallel": True}
    grammar_spec.check(spec)
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    matcher = GrammarMatcher(spec, tokenizer, 151936)
    for token in tokenizer.encode(text, add_special_tokens=False):
        matcher.advance(token)
    assert matcher.is_accepting and not matcher.is_finished  # a second call may follow
    wrong = GrammarMatcher(spec, tokenizer, 151936)
    with pytest.raises(ValueError):
        for token in tokenizer.encode('<tool_call>\n{"name": "get_news"', add_special_tokens=False):
            wrong.advance(token)


def test_parallel_choices_each_follow_the_grammar_from_one_prefill() -> None:
    engine = engine_for("llama")
    params = SamplingParams(max_new_tokens=300, seed=11, grammar={"type": "json_schema", "schema": json.dumps(SCHEMA)})
    ids = engine.add_choices([72, 105], params, 3)
    finished: dict[int, Finished] = {}
    while engine.has_unfinished:
        finished.update((i, e) for i, e in engine.step() if isinstance(e, Finished))
    texts = [finished[i].text for i in ids]
    assert all(finished[i].finish_reason == "grammar" for i in ids)
    assert len({json.dumps(_valid(t)) for t in texts}) > 1  # three valid answers, not one copied


def test_a_grammar_request_handed_from_prefill_to_decode_continues_with_the_same_tokens() -> None:
    from inference.kv.transfer import KVSpec, deserialize, serialize

    params = SamplingParams(max_new_tokens=200, seed=21, grammar=JSON_SCHEMA, use_prefix_cache=False)
    prefill_engine, decode_engine = engine_for("llama"), engine_for("llama")  # two "workers", same weights
    [(_, expected)] = _run(prefill_engine, [[72, 105]], [params])
    handoff = prefill_engine.prefill_for_handoff([72, 105], params)
    blob = bytes(serialize(handoff, prefill_engine.loaded.name))
    loaded = deserialize(blob, KVSpec.from_model_info(decode_engine.model_info()))
    events = list(decode_engine.generate([72, 105], params, handoff=loaded))
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.token_ids == expected.token_ids
    assert finished.finish_reason == "grammar" and loaded.first_step.masked_prob is not None
    _valid(finished.text)


def test_prefix_ids_are_taken_before_the_first_step() -> None:
    """A path continued one request at a time: the grammar goes on from the tokens it already took."""
    tokenizer = make_tiny_tokenizer()
    spec = {"type": "choice", "choices": ["red", "rose"]}
    matcher = GrammarMatcher({**spec, "prefix_ids": [ord("r"), ord("o")]}, tokenizer, 260)
    masked = apply_masks(torch.zeros(1, 260), [matcher])
    assert torch.isfinite(masked[0]).nonzero().flatten().tolist() == [ord("s")]  # only "rose" is left
    with pytest.raises(ValueError, match="does not fit the grammar"):
        GrammarMatcher({**spec, "prefix_ids": [ord("x")]}, tokenizer, 260)
    grammar_spec.check({**spec, "prefix_ids": []})
    for bad in ([-1], ["3"], 3, [True]):
        with pytest.raises(ValueError, match="grammar.prefix_ids must be a list of token ids"):
            grammar_spec.check({**spec, "prefix_ids": bad})
    assert grammar_spec.to_llguidance(grammar_spec.canonical(grammar_spec.without_prefix({**spec, "prefix_ids": [1]})))
