"""The shop's ASGI application: Django for HTTP; Leasecast's sockets and one of the shop's.

Serve it with daphne: ``daphne shop.asgi:application``, or with Leasecast's
daphne defaults: ``python -m gateway.serve shop.asgi:application``.
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
django_asgi_app = get_asgi_application()

# Imported after Django is set up: the consumers use models.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.urls import path  # noqa: E402
from orders.consumers import OrderCountSocket  # noqa: E402

from gateway.site.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # Static files (the admin's, the dashboard's) straight from the apps,
        # with DEBUG on or off (docs/tasks.md, "Static files").
        "http": ASGIStaticFilesHandler(django_asgi_app),
        "websocket": URLRouter(
            [
                # Leasecast: /ws/queues/Q/, /ws/produce/, /ws/topics/T/, /ws/dashboard/,
                # each behind Leasecast's token (or staff session) check.
                *websocket_urlpatterns(),
                # The shop's own socket, behind Channels' usual session auth.
                path("ws/orders/count/", AuthMiddlewareStack(OrderCountSocket.as_asgi())),
            ]
        ),
    }
)
