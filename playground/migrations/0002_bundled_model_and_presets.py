"""Ships the bundled model (SmolLM2-135M-Instruct, converted on first use) as the default
model, and five sampling presets (Balanced is the default)."""

from django.db import migrations

PRESETS = [
    {"name": "Greedy", "description": "Always the most likely token: deterministic.", "greedy": True},
    {
        "name": "Balanced",
        "description": "A good default for chat.",
        "temperature": 0.7,
        "top_p": 0.9,
        "is_default": True,
    },
    {
        "name": "Creative",
        "description": "More varied, still coherent.",
        "temperature": 1.1,
        "top_p": 0.95,
        "min_p": 0.05,
    },
    {"name": "Precise", "description": "Focused: low temperature, few candidates.", "temperature": 0.3, "top_k": 20},
    {
        "name": "Beam search",
        "description": "Four beams; deterministic, for short answers.",
        "num_beams": 4,
        "max_new_tokens": 48,
    },
]


def add_defaults(apps, schema_editor):
    LanguageModel = apps.get_model("playground", "LanguageModel")
    SamplingPreset = apps.get_model("playground", "SamplingPreset")
    LanguageModel.objects.get_or_create(
        source="bundled", defaults={"name": "SmolLM2-135M-Instruct (bundled)", "is_default": True}
    )
    for preset in PRESETS:
        SamplingPreset.objects.get_or_create(name=preset["name"], defaults=preset)


def remove_defaults(apps, schema_editor):
    apps.get_model("playground", "LanguageModel").objects.filter(source="bundled").delete()
    apps.get_model("playground", "SamplingPreset").objects.filter(name__in=[p["name"] for p in PRESETS]).delete()


class Migration(migrations.Migration):
    dependencies = [("playground", "0001_initial")]
    operations = [migrations.RunPython(add_defaults, remove_defaults)]
