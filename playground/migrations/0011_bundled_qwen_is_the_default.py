"""Ships the second bundled model, Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, prepared by
`python -m inference.models.bundled`), and makes it the default model, by measurement
(`python -m inference.bench quality`, docs/presets.md): it answers everyday questions coherently
in English and Chinese, where SmolLM2-135M answers Chinese not at all and English facts often
wrongly. The row's precision and the default preset are the measured choice too (the constants
below; the benchmark reads them from this file, so the table's "default" is what this sets).

Only a site still as shipped changes: the flag moves only while the bundled SmolLM2 row is the
default with its shipped settings (an admin's other choice is kept). The reverse removes the
Qwen row and gives the flag back to SmolLM2 if Qwen had it. SmolLM2 stays, selectable
everywhere. When Qwen could not be prepared on a host, the site answers with SmolLM2 and says
why (`playground.model_choice`).
"""

from django.db import migrations, models

MODEL_SOURCE = "bundled:qwen2.5-coder-0.5b-instruct"
MODEL_NAME = "Qwen2.5-Coder-0.5B-Instruct (bundled)"
MODEL_DTYPE = "auto"  # the worker's PLAYGROUND_DTYPE: bfloat16 on GPUs and on CPUs with bf16 units
PRESET = "Greedy"  # the default preset, as 0008 made it: measured again with this model, and kept
SMOLLM2 = {"source": "bundled", "dtype": "auto", "device": "auto", "is_enabled": True}  # as 0002 shipped it


def qwen_by_default(apps, schema_editor):
    LanguageModel = apps.get_model("playground", "LanguageModel")
    qwen, _ = LanguageModel.objects.get_or_create(
        source=MODEL_SOURCE, defaults={"name": MODEL_NAME, "dtype": MODEL_DTYPE, "is_default": False}
    )
    smollm2 = LanguageModel.objects.filter(**SMOLLM2, is_default=True, max_context=None).first()
    if smollm2 is None or smollm2.trust_remote_code or smollm2.eos_token_ids is not None:
        return  # another default, or an edited SmolLM2 row: the admin's choice stays
    if smollm2.default_chat_template_id is not None:
        return
    # Unset first: at most one default row at any moment (one_default_model).
    LanguageModel.objects.filter(pk=smollm2.pk).update(is_default=False)
    LanguageModel.objects.filter(pk=qwen.pk).update(is_default=True)


def smollm2_by_default(apps, schema_editor):
    LanguageModel = apps.get_model("playground", "LanguageModel")
    qwen = LanguageModel.objects.filter(source=MODEL_SOURCE).first()
    if qwen is None:
        return
    was_default = qwen.is_default
    qwen.delete()
    if was_default:
        LanguageModel.objects.filter(source="bundled").update(is_default=True)


class Migration(migrations.Migration):
    dependencies = [
        ("playground", "0010_owner"),
    ]

    operations = [
        migrations.AlterField(
            model_name="languagemodel",
            name="dtype",
            field=models.CharField(
                choices=[
                    ("auto", "auto"),
                    ("float32", "float32"),
                    ("bfloat16", "bfloat16"),
                    ("float16", "float16"),
                    ("int8", "int8"),
                    ("int4", "int4"),
                ],
                default="auto",
                help_text="float32/bfloat16/float16, or weight-only int8 (per channel) / int4 (groups of 32; from a GGUF: its Q4_0/Q4_1/Q4_K blocks exactly, its other quantized types in 8 bits) with bfloat16 activations. Fewer bytes per weight: faster decode (it is memory-bound), at a small cost in accuracy (the benchmark reports the KL divergence). auto: the worker's PLAYGROUND_DTYPE, which by default is bfloat16 on GPUs and on CPUs with bfloat16 units, float32 on other CPUs.",
                max_length=16,
                verbose_name="weight precision",
            ),
        ),
        migrations.AlterField(
            model_name="languagemodel",
            name="source",
            field=models.CharField(
                help_text='A Hugging Face model folder, a hub id already in the local cache, a .gguf file, or a bundled model: "bundled" (SmolLM2-135M-Instruct) or "bundled:qwen2.5-coder-0.5b-instruct". Relative paths are resolved against PLAYGROUND_DATA_DIR.',
                max_length=500,
            ),
        ),
        migrations.RunPython(qwen_by_default, smollm2_by_default),
    ]
