"""The Celery app (Celery's Django recipe). Settings come from `CELERY_*` in settings.py.

Start a worker (one per GPU: one model per process; its thread pool feeds the one engine loop
that batches every generation it runs, see playground/worker/serve_loop.py):

    celery -A playground worker -Q gpu -P threads --concurrency 16 -n gpu@%h
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")

app = Celery("playground")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
