from django.urls import path

from playground.web.consumers import GenerationConsumer

websocket_urlpatterns = [
    path("ws/generate/", GenerationConsumer.as_asgi()),
]
