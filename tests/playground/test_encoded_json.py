"""Step records encoded once: the text a worker makes is what Redis and the row's steps hold."""

from __future__ import annotations

import json
import math

import pytest

from playground import protocol
from playground.encoded_json import EncodedList, Encoder, dumps, loads, without_nul
from playground.models import Generation

from .conftest import make_generation


def test_dumps_is_compact_json_with_non_finite_floats_as_null() -> None:
    text = dumps({"logprob": -math.inf, "entropy": math.nan, "p": 0.5, 3: "three"})
    assert text == '{"logprob":null,"entropy":null,"p":0.5,"3":"three"}'
    assert json.loads(text) == loads(text)


def test_the_encoder_writes_an_encoded_list_as_it_is_and_anything_else_as_json_does() -> None:
    steps = [{"index": 0, "piece": "你"}, {"index": 1, "logprob": None}]
    encoded = EncodedList([dumps(step) for step in steps])
    assert json.loads(json.dumps(encoded, cls=Encoder)) == steps
    assert json.dumps({"a": [1, 2]}, cls=Encoder) == json.dumps({"a": [1, 2]})
    with pytest.raises(TypeError):
        json.dumps({"a": EncodedList([])}, cls=Encoder)  # only a whole field's value


@pytest.mark.django_db
def test_a_row_saved_with_encoded_steps_reads_them_back_as_records(owner: str) -> None:
    steps = [{"index": i, "text_delta": f"t{i}", "logprob": -math.inf if i else -0.25} for i in range(3)]
    generation = make_generation(owner)
    Generation.objects.filter(pk=generation.pk).update(steps=EncodedList([dumps(s) for s in steps]))
    saved = Generation.objects.get(pk=generation.pk).steps
    assert saved == [{"index": 0, "text_delta": "t0", "logprob": -0.25}] + [
        {"index": i, "text_delta": f"t{i}", "logprob": None} for i in (1, 2)
    ]


def test_a_steps_message_crosses_as_its_workers_text_and_reaches_the_browser_as_a_steps_list() -> None:
    steps = [{"index": 0, "piece": '"</script>', "logprob": -math.inf}, {"index": 1, "piece": "你\n"}]
    event = protocol.generation_steps(7, [dumps(step) for step in steps], is_beam=False, segments=[{"kind": "answer"}])
    assert protocol.steps_of(event) == [{**steps[0], "logprob": None}, steps[1]]
    frame = json.loads(protocol.frame_text(event))
    assert frame == {
        "type": "generation.tokens",
        "generation_id": 7,
        "steps": protocol.steps_of(event),
        "segments": [{"kind": "answer"}],
    }
    assert protocol.STEPS_JSON not in frame
    assert json.loads(protocol.frame_text({"type": "generation.waiting", "position": 2})) == {
        "type": "generation.waiting",
        "position": 2,
    }


def test_dumps_writes_nul_as_its_symbol_and_keeps_an_escaped_backslash_before_u0000() -> None:
    step = {"piece": "\x00", "text_delta": "a\x00b", "literal": "\\u0000", "both": "\\\x00"}
    assert loads(dumps(step)) == {"piece": "\u2400", "text_delta": "a\u2400b", "literal": "\\u0000", "both": "\\\u2400"}


@pytest.mark.django_db
def test_a_step_with_a_nul_piece_is_saved(owner: str) -> None:
    """PostgreSQL's jsonb refuses U+0000: a top-k holding the <0x00> token failed the whole save."""
    generation = make_generation(owner)
    step = {"index": 0, "token_bytes": "00", "top_k": [{"token_id": 190, "piece": "\x00"}]}
    Generation.objects.filter(pk=generation.pk).update(steps=EncodedList([dumps(step)]))
    [saved] = Generation.objects.get(pk=generation.pk).steps
    assert saved["top_k"][0]["piece"] == "\u2400" and saved["token_bytes"] == "00"


def test_text_for_a_database_column_holds_no_nul() -> None:
    """A model may sample a token that decodes to U+0000 (SmolLM2's <0x00>): PostgreSQL's text
    columns refuse it, so the saved answer writes it as U+2400, as the JSON does."""
    assert without_nul("a\x00b") == "a\u2400b"
    assert without_nul("plain") == "plain"
