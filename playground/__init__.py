"""The Django app: records (models), the admin, the WebSocket consumer, the Celery task.

Loading the Celery app here makes `@shared_task` bind to it in every process (Celery's
Django recipe).
"""

from playground.celery import app as celery_app

__all__ = ["celery_app"]
