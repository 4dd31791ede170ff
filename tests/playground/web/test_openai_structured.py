"""Structured outputs through `/v1` (issue 50), driven by the official `openai` client over the ASGI
app, with an eager worker running the REAL engine on a tiny random model: whatever the random
model wants, the grammar makes the answer parse and validate. Refused schemas name
`response_format` and queue nothing."""

from __future__ import annotations

import json
from typing import Literal

import openai
import pydantic
import pytest
from asgiref.sync import sync_to_async

from inference.models.tiny import make_tiny_tokenizer
from playground.models import Generation
from tests.inference.engines import tiny_chat_engine

pytestmark = pytest.mark.django_db(transaction=True, serialized_rollback=True)

MODEL = "SmolLM2-135M-Instruct (bundled)"
QUESTION = [{"role": "user", "content": "Describe a colour."}]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city now.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def tiny_engine():
    """A tiny random Llama with the byte-level tokenizer plus Qwen's `<tool_call>` tokens, Qwen2.5's
    own chat template (its tools section) and room for the tools' prompt."""
    tokenizer = make_tiny_tokenizer(plain_tokens=("<tool_call>", "</tool_call>"))
    return tiny_chat_engine(seed=1, tokenizer=tokenizer, max_context=4096)


class Colour(pydantic.BaseModel):
    name: Literal["red", "green", "blue"]
    warm: bool
    shades: list[Literal["light", "dark"]] = pydantic.Field(max_length=2)


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"enum": ["red", "green", "blue"]},
        "hex": {"type": "string", "pattern": "^#[0-9a-f]{6}$"},
        "rgb": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}, "maxItems": 3},
        "meta": {
            "type": "object",
            "properties": {"warm": {"type": "boolean"}},
            "required": ["warm"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "hex", "rgb", "meta"],
    "additionalProperties": False,
}


async def test_a_strict_json_schema_answer_parses_and_validates(openai_client: openai.AsyncOpenAI) -> None:
    for seed in (1, 2):
        completion = await openai_client.chat.completions.create(
            model=MODEL,
            messages=QUESTION,
            max_tokens=200,
            seed=seed,
            temperature=1.0,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "colour", "schema": SCHEMA, "strict": True},
            },
        )
        choice = completion.choices[0]
        value = json.loads(choice.message.content)
        assert set(value) == {"name", "hex", "rgb", "meta"} and value["name"] in ("red", "green", "blue")
        assert len(value["hex"]) == 7 and all(0 <= c <= 255 for c in value["rgb"]) and len(value["rgb"]) <= 3
        assert isinstance(value["meta"]["warm"], bool) and choice.finish_reason == "stop"
    row = await sync_to_async(Generation.objects.latest)("pk")
    assert row.params["grammar"]["type"] == "json_schema" and json.loads(row.params["grammar"]["schema"]) == SCHEMA
    assert list(json.loads(choice.message.content)) == ["name", "hex", "rgb", "meta"]  # the schema's order


async def test_json_object_parses_and_a_stream_carries_it(openai_client: openai.AsyncOpenAI) -> None:
    completion = await openai_client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=120, seed=3, response_format={"type": "json_object"}
    )
    if completion.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(completion.choices[0].message.content), dict)
    else:  # a random model may ramble in a string: the grammar still held every token
        assert completion.choices[0].message.content.startswith("{")
    stream = await openai_client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=120, seed=3, response_format={"type": "json_object"}, stream=True
    )
    text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    assert text == completion.choices[0].message.content


async def test_parse_with_a_pydantic_model_returns_parsed(openai_client: openai.AsyncOpenAI) -> None:
    completion = await openai_client.chat.completions.parse(
        model=MODEL, messages=QUESTION, max_tokens=100, seed=4, response_format=Colour
    )
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Colour) and parsed.name in ("red", "green", "blue") and len(parsed.shades) <= 2


@pytest.mark.parametrize(
    ("response_format", "param", "words"),
    [
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
            "response_format",
            "response_format.json_schema.schema is not supported: Invalid type: strin",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "https://example.com/s.json"}}},
            "response_format",
            "response_format.json_schema.schema is not supported",
        ),
        ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name", "name"),
        ({"type": "yaml"}, "response_format.type", "json_object, json_schema"),
    ],
)
async def test_an_invalid_schema_is_a_400_naming_response_format(
    openai_client: openai.AsyncOpenAI, response_format: dict, param: str, words: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await openai_client.chat.completions.create(model=MODEL, messages=QUESTION, response_format=response_format)
    error = caught.value.body
    assert error["param"] == param and words in error["message"], error
    assert not await sync_to_async(Generation.objects.exists)()  # nothing was queued


async def test_a_schema_too_deep_or_too_large_is_refused(openai_client: openai.AsyncOpenAI) -> None:
    deep: dict = {"type": "integer"}
    for _ in range(12):
        deep = {"type": "object", "properties": {"a": deep}}
    wide = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(1500)}}
    for schema, words in ((deep, "nested more than"), (wide, "characters as JSON")):
        with pytest.raises(openai.BadRequestError) as caught:
            await openai_client.chat.completions.create(
                model=MODEL,
                messages=QUESTION,
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            )
        assert caught.value.body["param"] == "response_format" and words in caught.value.body["message"]
    assert not await sync_to_async(Generation.objects.exists)()


async def test_tool_choice_required_returns_a_call_and_a_tool_result_continues_the_chat(
    openai_client: openai.AsyncOpenAI,
) -> None:
    question = {"role": "user", "content": "Weather in Paris?"}
    first = await openai_client.chat.completions.create(
        model=MODEL,
        messages=[question],
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=200,
        seed=5,
    )
    choice = first.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", None)
    [call] = choice.message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and call.id.startswith("call_") and call.type == "function"
    assert set(arguments) == {"city", "unit"} and len(arguments["city"]) <= 12 and arguments["unit"] in ("C", "F")
    row = await sync_to_async(Generation.objects.latest)("pk")
    assert "# Tools" in row.prompt_text and '"name": "get_weather"' in row.prompt_text  # the template's tools
    result = {"role": "tool", "tool_call_id": call.id, "content": '{"celsius": 21}'}
    second = await openai_client.chat.completions.create(
        model=MODEL,
        messages=[question, choice.message.model_dump(exclude_none=True), result],
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=4,
        seed=6,
    )
    assert second.choices[0].finish_reason in ("stop", "length") and second.choices[0].message.tool_calls is None
    row = await sync_to_async(Generation.objects.latest)("pk")
    # Qwen2.5's template rendered the earlier call and its result as the model writes and reads them.
    call_text = json.dumps({"name": "get_weather", "arguments": arguments}, ensure_ascii=False)
    assert f"<|im_start|>assistant\n<tool_call>\n{call_text}\n</tool_call><|im_end|>" in row.prompt_text
    assert '<|im_start|>user\n<tool_response>\n{"celsius": 21}\n</tool_response><|im_end|>' in row.prompt_text


async def test_a_named_tool_choice_streams_tool_call_deltas_as_openai_does(openai_client: openai.AsyncOpenAI) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What time is it?"}],
        "tools": [WEATHER, TIME],
        "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        "max_tokens": 100,
        "seed": 7,
    }
    whole = (await openai_client.chat.completions.create(**body)).choices[0]
    [call] = whole.message.tool_calls
    assert call.function.name == "get_time" and isinstance(json.loads(call.function.arguments), dict)
    chunks = [chunk async for chunk in await openai_client.chat.completions.create(**body, stream=True)]
    deltas = [c.choices[0].delta for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert deltas[0].tool_calls[0].id.startswith("call_") and deltas[0].tool_calls[0].function.name == "get_time"
    arguments = "".join(d.tool_calls[0].function.arguments or "" for d in deltas)
    assert arguments == call.function.arguments
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)  # the call is not content
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]},
            "tools[0].function.parameters",
            "tools[0].function.parameters is not supported",
        ),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice", "'g'"),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice", "none, auto, required"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        ({"tools": [WEATHER, WEATHER]}, "tools", "twice"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name", "letters"),
        (
            {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
            "cannot be combined",
        ),
    ],
)
async def test_bad_tools_are_a_clear_400(
    openai_client: openai.AsyncOpenAI, extra: dict, param: str, words: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await openai_client.chat.completions.create(model=MODEL, messages=QUESTION, **extra)
    assert caught.value.body["param"] == param and words in caught.value.body["message"], caught.value.body
    assert not await sync_to_async(Generation.objects.exists)()


def test_auto_parses_the_calls_a_model_wrote_and_leaves_other_text_alone() -> None:
    from playground.web.openai_api import tool_calls

    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    )
    content, calls = tool_calls.parse(text, ["get_weather", "get_time"])
    assert content == "Let me check."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "C"}),
        ("get_time", {}),
    ]
    assert len({c["id"] for c in calls}) == 2
    unknown = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    assert tool_calls.parse(unknown, ["get_time"]) == (unknown, [])  # a call to no tool stays text
    assert tool_calls.parse("<tool_call>\n{broken", ["get_time"]) == ("<tool_call>\n{broken", [])
    assert tool_calls.may_become_a_call("  <tool_") and tool_calls.may_become_a_call("<tool_call>\n{")
    assert not tool_calls.may_become_a_call("Hello")
