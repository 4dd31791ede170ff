from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class PlaygroundConfig(AppConfig):
    name = "playground"
    verbose_name = _("LLM playground")
    default_auto_field = "django.db.models.BigAutoField"
