from django.urls import path

from playground.web.consumers import GenerationConsumer
from playground.web.serving_consumer import ServingConsumer

websocket_urlpatterns = [
    path("ws/generate/", GenerationConsumer.as_asgi()),
    path("ws/serving/", ServingConsumer.as_asgi()),
]
