"""API keys' concurrency follows the worker: `max_concurrent` empty means
PLAYGROUND_API_MAX_CONCURRENT (by default the worker slots). Keys that still hold the old
default of 2 (every key made before: the admin offered 2) become empty; a key's requests beyond
its concurrency now wait for their turn instead of failing with 429 (issue 27)."""

import django.core.validators
from django.db import migrations, models

OLD_DEFAULT = 2


def follow_the_worker(apps, schema_editor):
    apps.get_model("playground", "ApiKey").objects.filter(max_concurrent=OLD_DEFAULT).update(max_concurrent=None)


def back_to_the_old_default(apps, schema_editor):
    apps.get_model("playground", "ApiKey").objects.filter(max_concurrent=None).update(max_concurrent=OLD_DEFAULT)


class Migration(migrations.Migration):
    dependencies = [
        ("playground", "0011_bundled_qwen_is_the_default"),
    ]

    operations = [
        migrations.AlterField(
            model_name="apikey",
            name="max_concurrent",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Generations running at once; more wait for their turn. Empty: PLAYGROUND_API_MAX_CONCURRENT "
                "(by default the worker slots, one worker's batch).",
                null=True,
                validators=[django.core.validators.MinValueValidator(1)],
            ),
        ),
        migrations.RunPython(follow_the_worker, back_to_the_old_default),
    ]
