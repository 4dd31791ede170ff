"""The ASGI entry point: Django for HTTP, the generation consumer for WebSockets.

Run with `daphne playground.asgi:application` (or `manage.py runserver`, which is daphne's).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "playground.settings")
django_asgi_app = get_asgi_application()  # sets Django up before the consumer's imports

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.sessions import SessionMiddlewareStack  # noqa: E402

from playground.routing import websocket_urlpatterns  # noqa: E402
from playground.web.origin import SameOriginValidator  # noqa: E402
from playground.web.socket_failures import close_failing_sockets  # noqa: E402
from playground.web.status_lines import complete_reason_phrases  # noqa: E402

complete_reason_phrases()  # daphne wrote "429 Unknown Status"
close_failing_sockets()  # daphne dropped a socket with invalid UTF-8 or an oversized frame, no close code

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": SameOriginValidator(SessionMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
