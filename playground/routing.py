from django.urls import path

from playground.consumers import GenerationConsumer

websocket_urlpatterns = [
    path("ws/generate/", GenerationConsumer.as_asgi()),
]
