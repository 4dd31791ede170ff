"""A draft model for speculative decoding, loaded by the worker beside the model on first use
(`engines.attach_draft`): an enabled record with the model's tokenizer is attached once and then
proposes; another tokenizer, an unknown name or the model itself are refused naming `speculative`,
and a refused draft is not loaded again to learn the same thing."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference import SamplingParams
from inference.models import loader
from inference.models.tiny import make_tiny_model, make_tiny_tokenizer
from playground.models import LanguageModel
from playground.worker import engines
from tests.inference.engines import engine_for

pytestmark = pytest.mark.django_db
PROMPT = list(range(5, 40)) * 3


def record(tmp_path: Path, name: str, seed: int, tokenizer=None) -> LanguageModel:
    folder = tmp_path / name
    make_tiny_model("llama", seed=seed).save_pretrained(folder)
    (tokenizer or make_tiny_tokenizer()).save_pretrained(folder)
    return LanguageModel.objects.create(name=name, source=str(folder), dtype="float32", device="cpu")


def test_a_draft_with_the_models_tokenizer_is_loaded_once_and_proposes(tmp_path: Path, monkeypatch) -> None:
    engine = engine_for("llama")
    model = record(tmp_path, "the model", seed=0)
    record(tmp_path, "a draft", seed=0)
    loads = []
    load_model = loader.load_model

    def load(config):
        assert not engines._lock.locked(), "a draft's load holds the lock every generation's start takes"
        loads.append(config.source)
        return load_model(config)

    monkeypatch.setattr(loader, "load_model", load)
    engines.attach_draft(engine, model, "a draft")
    engines.attach_draft(engine, model, "a draft")  # attached: not loaded again
    assert list(engine.core.speculator.drafts) == ["a draft"] and len(loads) == 1
    greedy = {"greedy": True, "max_new_tokens": 20}
    plain = list(engine.generate(PROMPT, SamplingParams(**greedy)))[-1]
    drafted = list(engine.generate(PROMPT, SamplingParams(**greedy, speculative="a draft", num_speculative_tokens=4)))
    assert drafted[-1].token_ids == plain.token_ids and drafted[-1].num_accepted_tokens > 0


def test_refusals_name_speculative_and_a_refused_draft_is_not_loaded_again(tmp_path: Path, monkeypatch) -> None:
    engine = engine_for("llama")
    model = record(tmp_path, "the model", seed=0)
    record(tmp_path, "another tokenizer", seed=1, tokenizer=make_tiny_tokenizer(special_tokens=("<a>", "<b>", "<c>")))
    LanguageModel.objects.create(name="switched off", source=str(tmp_path / "the model"), is_enabled=False)
    loads = []
    load_model = loader.load_model
    monkeypatch.setattr(loader, "load_model", lambda config: loads.append(config.source) or load_model(config))
    for _ in range(2):
        with pytest.raises(ValueError, match="speculative='another tokenizer': the draft model's tokenizer is not"):
            engines.attach_draft(engine, model, "another tokenizer")
    assert len(loads) == 1
    with pytest.raises(ValueError, match="speculative='nope': no enabled model"):
        engines.attach_draft(engine, model, "nope")
    with pytest.raises(ValueError, match="speculative='switched off': no enabled model"):
        engines.attach_draft(engine, model, "switched off")
    with pytest.raises(ValueError, match="is the model itself"):
        engines.attach_draft(engine, model, "the model")
    engines.attach_draft(engine, model, "prompt_lookup")  # no model to load
    assert engine.core.speculator.drafts == {} and len(loads) == 1
