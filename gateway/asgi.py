"""The ASGI application: Django for HTTP, Channels consumers for WebSockets."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
django_asgi_app = get_asgi_application()

# Imported after Django is set up: they use models.
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from consumers.routing import websocket_urlpatterns  # noqa: E402
from gateway.auth import websocket_auth_stack  # noqa: E402
from gateway.conf import gateway_settings  # noqa: E402

http_app = (
    ASGIStaticFilesHandler(django_asgi_app) if gateway_settings().serve_static else django_asgi_app
)

application = ProtocolTypeRouter(
    {
        "http": http_app,
        "websocket": websocket_auth_stack(URLRouter(websocket_urlpatterns)),
    }
)
