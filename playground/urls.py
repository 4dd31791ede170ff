from django.contrib import admin
from django.urls import path

from playground.web import api, pages

urlpatterns = [
    path("", pages.chat, name="chat"),
    path("explorer/", pages.explorer, name="explorer"),
    path("admin/", admin.site.urls),
    path("api/models/", api.model_list, name="api-models"),
    path("api/presets/", api.preset_list, name="api-presets"),
    path("api/conversations/", api.conversation_list, name="api-conversations"),
    path("api/conversations/<int:conversation_id>/", api.conversation_detail, name="api-conversation"),
    path("api/generations/<int:generation_id>/", api.generation_detail, name="api-generation"),
]
