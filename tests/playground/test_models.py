"""Rows -> engine settings, their validation, and what the data migration ships."""

from __future__ import annotations

import importlib
from dataclasses import fields

import pytest
from django.apps import apps as django_apps
from django.core.exceptions import ValidationError

from inference.sampling_params import PER_REQUEST_FIELDS, SamplingParams
from playground.models import LanguageModel, SamplingPreset

pytestmark = pytest.mark.django_db


def test_every_sampling_setting_is_a_preset_field() -> None:
    preset_fields = {f.name for f in SamplingPreset._meta.get_fields()}
    missing = {f.name for f in fields(SamplingParams)} - preset_fields - set(PER_REQUEST_FIELDS)
    assert not missing


def test_a_preset_converts_with_overrides_winning() -> None:
    preset = SamplingPreset.objects.get(name="Precise")
    params = preset.to_sampling_params(top_k=5, stop=["###"])
    assert (params.temperature, params.top_k, params.stop) == (0.3, 5, ("###",))


def test_a_bad_override_is_a_value_error_naming_it() -> None:
    preset = SamplingPreset.objects.get(name="Balanced")
    with pytest.raises(ValueError, match="min_p=2"):
        preset.to_sampling_params(min_p=2)
    with pytest.raises(ValueError, match="bogus"):
        preset.to_sampling_params(bogus=1)


def test_clean_puts_the_error_on_the_field_it_names() -> None:
    preset = SamplingPreset(name="x", repetition_penalty=0.0)
    with pytest.raises(ValidationError) as refused:
        preset.full_clean()
    assert "repetition_penalty=0.0" in refused.value.message_dict["repetition_penalty"][0]


def test_the_migrations_ship_both_bundled_models_and_five_presets_with_one_default_each() -> None:
    default_model = LanguageModel.default()  # by measurement: 0011, docs/presets.md
    assert (default_model.source, default_model.is_enabled) == ("bundled:qwen2.5-coder-0.5b-instruct", True)
    smollm2 = LanguageModel.objects.get(source="bundled")
    assert smollm2.is_enabled and not smollm2.is_default  # still selectable everywhere
    names = set(SamplingPreset.objects.values_list("name", flat=True))
    assert names == {"Greedy", "Greedy, no loops", "Balanced", "Creative", "Precise", "Beam search"}
    assert SamplingPreset.default().name == "Greedy, no loops"  # by measurement: 0014, docs/presets.md
    params = SamplingPreset.default().to_sampling_params()
    assert params.is_greedy and params.repetition_penalty == 1.15 and not params.penalize_prompt  # 0015
    for preset in SamplingPreset.objects.all():
        preset.full_clean()  # every shipped preset is valid
    assert SamplingPreset.objects.get(name="Beam search").to_sampling_params().is_beam_search


def _no_loops_migration():
    return importlib.import_module("playground.migrations.0014_greedy_no_loops_is_the_default")


def _default_preset_migration():
    """0008, on the presets as they were before 0014 (which moved the flag on from Greedy)."""
    _no_loops_migration().greedy_by_default(django_apps, None)
    return importlib.import_module("playground.migrations.0008_greedy_is_the_default_preset")


def test_greedy_no_loops_becomes_the_default_both_ways_while_greedy_is_as_shipped() -> None:
    migration = _no_loops_migration()
    migration.greedy_by_default(django_apps, None)
    assert SamplingPreset.default().name == "Greedy"
    assert not SamplingPreset.objects.filter(name=migration.PRESET).exists()
    SamplingPreset.objects.filter(name="Greedy").update(repetition_penalty=1.3)  # an admin's edit
    migration.no_loops_by_default(django_apps, None)
    assert SamplingPreset.default().name == "Greedy"  # kept: the admin's choice
    SamplingPreset.objects.filter(name="Greedy").update(repetition_penalty=1.0)
    SamplingPreset.objects.filter(name=migration.PRESET).delete()
    migration.no_loops_by_default(django_apps, None)
    assert SamplingPreset.default().name == migration.PRESET


def test_no_loops_penalizes_the_answer_only_both_ways_while_as_shipped() -> None:
    migration = importlib.import_module("playground.migrations.0015_penalize_prompt_and_answer_only_no_loops")

    def settings() -> dict:
        fields = ("repetition_penalty", "penalize_prompt", "is_default")
        return SamplingPreset.objects.filter(name=migration.PRESET).values(*fields)[0]

    migration.prompt_too(django_apps, None)
    assert settings() == {"repetition_penalty": 1.1, "penalize_prompt": True, "is_default": True}  # as 0014 left it
    migration.answer_only(django_apps, None)
    assert settings() == {"repetition_penalty": 1.15, "penalize_prompt": False, "is_default": True}
    migration.prompt_too(django_apps, None)
    SamplingPreset.objects.filter(name=migration.PRESET).update(repetition_penalty=1.3)  # an admin's edit
    migration.answer_only(django_apps, None)
    assert settings() == {"repetition_penalty": 1.3, "penalize_prompt": True, "is_default": True}  # kept


def test_the_default_preset_moves_both_ways_while_the_rows_are_as_shipped() -> None:
    migration = _default_preset_migration()
    migration.balanced_by_default(django_apps, None)
    assert SamplingPreset.default().name == "Balanced"
    assert SamplingPreset.objects.get(name="Balanced").description == "A good default for chat."
    migration.greedy_by_default(django_apps, None)
    assert SamplingPreset.default().name == "Greedy"
    assert "docs/presets.md" in SamplingPreset.objects.get(name="Greedy").description


@pytest.mark.parametrize("edit", [{"temperature": 0.8}, {"stop": ["###"]}, {"description": "mine"}])
def test_an_edited_balanced_default_stays_the_default(edit) -> None:
    migration = _default_preset_migration()
    migration.balanced_by_default(django_apps, None)
    SamplingPreset.objects.filter(name="Balanced").update(**edit)
    migration.greedy_by_default(django_apps, None)
    balanced = SamplingPreset.objects.get(name="Balanced")
    is_setting = "description" not in edit
    assert SamplingPreset.default().name == ("Balanced" if is_setting else "Greedy")
    assert balanced.description == edit.get("description", "A good default for chat.")


def test_another_chosen_default_is_kept() -> None:
    migration = _default_preset_migration()
    migration.balanced_by_default(django_apps, None)
    creative = SamplingPreset.objects.get(name="Creative")
    creative.is_default = True
    creative.save()
    migration.greedy_by_default(django_apps, None)
    assert SamplingPreset.default().name == "Creative"


def _default_model_migration():
    return importlib.import_module("playground.migrations.0011_bundled_qwen_is_the_default")


def test_the_default_model_moves_both_ways_while_smollm2_is_as_shipped() -> None:
    migration = _default_model_migration()
    migration.smollm2_by_default(django_apps, None)
    assert LanguageModel.default().source == "bundled"
    assert not LanguageModel.objects.filter(source=migration.MODEL_SOURCE).exists()
    migration.qwen_by_default(django_apps, None)
    assert LanguageModel.default().source == migration.MODEL_SOURCE
    assert LanguageModel.default().dtype == migration.MODEL_DTYPE
    assert LanguageModel.objects.filter(source="bundled", is_enabled=True).exists()


@pytest.mark.parametrize("edit", [{"dtype": "int8"}, {"max_context": 2048}, {"eos_token_ids": [2]}])
def test_an_edited_smollm2_default_stays_the_default(edit) -> None:
    migration = _default_model_migration()
    migration.smollm2_by_default(django_apps, None)
    LanguageModel.objects.filter(source="bundled").update(**edit)
    migration.qwen_by_default(django_apps, None)
    assert LanguageModel.default().source == "bundled"
    assert LanguageModel.objects.filter(source=migration.MODEL_SOURCE, is_default=False).exists()


def test_saving_a_new_default_model_unsets_the_old_one() -> None:
    old = LanguageModel.default()
    new = LanguageModel.objects.create(name="other", source="/models/other", is_default=True)
    old.refresh_from_db()
    assert LanguageModel.default() == new and not old.is_default


def test_auto_device_and_dtype_defer_to_the_worker_settings(settings) -> None:
    settings.PLAYGROUND_DEVICE, settings.PLAYGROUND_DTYPE = "cpu", "bfloat16"
    config = LanguageModel(name="m", source="bundled").to_engine_config()
    assert (config.device, config.dtype, config.data_dir) == ("cpu", "bfloat16", str(settings.PLAYGROUND_DATA_DIR))
    config = LanguageModel(name="m", source="bundled", device="cuda:1", dtype="float16").to_engine_config()
    assert (config.device, config.dtype) == ("cuda:1", "float16")


def test_the_engine_is_named_after_the_record() -> None:
    """The record's name is what generation.started, metrics labels and errors show, never a file stem."""
    config = LanguageModel(name="Qwen small (q4)", source="/models/q.gguf").to_engine_config()
    assert config.name == "Qwen small (q4)"
