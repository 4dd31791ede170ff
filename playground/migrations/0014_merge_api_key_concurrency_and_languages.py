"""Joins the two migrations 0012 (the API key's concurrency) and 0013 (the languages and the
translatable labels), written on separate branches; max_concurrent takes its translatable
label and help text."""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("playground", "0012_api_key_concurrency_fits_the_worker"),
        ("playground", "0013_user_language_and_labels"),
    ]

    operations = [
        migrations.AlterField(
            model_name="apikey",
            name="max_concurrent",
            field=models.PositiveIntegerField(
                blank=True,
                help_text=(
                    "Generations running at once; more wait for their turn. Empty: PLAYGROUND_API_MAX_CONCURRENT "
                    "(by default the worker slots, one worker's batch)."
                ),
                null=True,
                validators=[django.core.validators.MinValueValidator(1)],
                verbose_name="max concurrent",
            ),
        ),
    ]
