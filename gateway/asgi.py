"""The standalone service's ASGI application: Django for HTTP, Channels consumers for WebSockets.

A Django project that installs Leasecast writes its own, with
``gateway.routing.websocket_application()`` for the sockets.
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
django_asgi_app = get_asgi_application()

# Imported after Django is set up: they use models.
from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from gateway.conf import gateway_settings  # noqa: E402
from gateway.routing import websocket_application  # noqa: E402

http_app = (
    ASGIStaticFilesHandler(django_asgi_app) if gateway_settings().serve_static else django_asgi_app
)

application = ProtocolTypeRouter(
    {
        "http": http_app,
        "websocket": websocket_application(),
    }
)
