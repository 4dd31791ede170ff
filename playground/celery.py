"""The Celery app (Celery's Django recipe). Settings come from `CELERY_*` in settings.py.

Start a worker (one per GPU; the solo pool keeps one model per process, and the stop flag
lives in Redis, so the pool needs no control channel):

    celery -A playground worker -Q gpu -P solo -n gpu@%h
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")

app = Celery("playground")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
