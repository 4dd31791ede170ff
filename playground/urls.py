from django.contrib import admin
from django.templatetags.static import static
from django.urls import path
from django.views.generic import RedirectView
from django.views.i18n import JavaScriptCatalog

from playground.web import api, architecture, export, inspect_api, language, metrics, pages
from playground.web.openai_api import views as openai_api

urlpatterns = [
    path("", pages.chat, name="chat"),
    path("explorer/", pages.explorer, name="explorer"),
    path("explorer/ab/", pages.explorer_ab, name="explorer-ab"),
    path("serving/", pages.serving, name="serving"),
    path("architecture/", pages.architecture, name="architecture"),
    path("learn/", pages.learn, name="learn"),
    path("i18n/setlang/", language.set_language, name="set-language"),
    # The JavaScript catalog (locale/*/LC_MESSAGES/djangojs.po) as a script file: the pages load
    # it with <script src>, so the strict CSP (no inline script) holds.
    path("jsi18n/", JavaScriptCatalog.as_view(packages=["playground"]), name="javascript-catalog"),
    path("metrics", metrics.metrics, name="metrics"),
    # Browsers ask for /favicon.ico where a page names no icon (the admin's did not: a 404 on each).
    path("favicon.ico", RedirectView.as_view(url=static("favicon.ico")), name="favicon"),
    path("admin/", admin.site.urls),
    path("api/models/", api.model_list, name="api-models"),
    path("api/presets/", api.preset_list, name="api-presets"),
    path("api/architectures/", architecture.architecture_list, name="api-architectures"),
    path("api/architectures/<str:key>/", architecture.reference_architecture, name="api-architecture"),
    path("api/models/<int:model_id>/architecture/", architecture.model_architecture, name="api-model-architecture"),
    path("api/conversations/", api.conversation_list, name="api-conversations"),
    path("api/conversations/<int:conversation_id>/", api.conversation_detail, name="api-conversation"),
    path("api/generations/<int:generation_id>/", api.generation_detail, name="api-generation"),
    path("api/generations/<int:generation_id>/inspect/", inspect_api.inspect_generation, name="api-inspect"),
    path("api/generations/<int:generation_id>/steps.<str:fmt>", export.generation_steps, name="api-generation-steps"),
    path("v1/models", openai_api.models, name="openai-models"),
    path("v1/chat/completions", openai_api.chat_completions, name="openai-chat-completions"),
    path("v1/completions", openai_api.completions, name="openai-completions"),
]
