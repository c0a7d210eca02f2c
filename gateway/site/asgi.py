"""The standalone service's ASGI application: Django for HTTP, Channels consumers for WebSockets.

A Django project that installs Leasecast writes its own, with
``gateway.routing.websocket_application()`` for the sockets.
"""

from __future__ import annotations

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
django_asgi_app = get_asgi_application()

# Imported after Django is set up: they use models.
from channels.routing import ProtocolTypeRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from gateway.conf import gateway_settings  # noqa: E402
from gateway.server.cors import CrossOrigin  # noqa: E402
from gateway.site.routing import websocket_application  # noqa: E402

# Pages of GATEWAY_ALLOWED_ORIGINS may import the JavaScript client (and read
# event streams) from here.
http_app = CrossOrigin(
    ASGIStaticFilesHandler(django_asgi_app) if gateway_settings().serve_static else django_asgi_app
)

application = ProtocolTypeRouter(
    {
        "http": http_app,
        "websocket": websocket_application(),
    }
)


def _tune_gc(threshold: int) -> None:
    """Make the cyclic garbage collector cheap for a long-running gateway.

    Under a work-queue load it took 9% of the process's CPU (perf, about 13 us
    of a 134 us cycle; docs/benchmarks.md, "Efficiency"): at Python's default
    it runs every 700 allocations, each time walking what is alive in flight
    (pending ops, futures, frames), and its full collections walked everything
    Django and the URL conf built at startup. Almost everything the gateway
    frees is freed by reference counting, so collecting less often costs
    little memory; what startup built is frozen out of the collections.
    """
    if threshold <= 0:
        return
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(threshold, older, oldest)


_tune_gc(gateway_settings().gc_threshold)
