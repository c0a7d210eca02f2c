"""Leasecast's WebSocket routes for an ASGI application (protocol: the sockets).

The standalone service's ``gateway.asgi`` serves :func:`websocket_application`.
A Django project that installs Leasecast uses it the same way in its own
``asgi.py``::

    django_asgi_app = get_asgi_application()
    from gateway.routing import websocket_application  # after Django is set up

    application = ProtocolTypeRouter(
        {"http": django_asgi_app, "websocket": websocket_application()}
    )

or, when the project has WebSocket consumers of its own, puts
:func:`websocket_urlpatterns` in its router beside them::

    "websocket": URLRouter([
        *websocket_urlpatterns(),  # /ws/queues/Q/, /ws/produce/, /ws/topics/T/, /ws/dashboard/
        path("ws/chat/", AuthMiddlewareStack(ChatConsumer.as_asgi())),
    ])

Both put Leasecast's authentication (a bearer token, or a staff session
from an allowed origin: ``gateway.access.auth``) in front of its sockets only.
Import this module after ``django.setup()`` (the consumers use models).

Importing it also wires the dashboard in: every gateway process's runtime
then builds the dashboard's live exchange (:func:`gateway.runtime.add_part`),
so each process shares its live state with the dashboards of all of them.
"""

from __future__ import annotations

from typing import Any

from channels.routing import URLRouter
from django.urls import URLPattern, re_path

from consumers.refuse import UnknownSocket
from consumers.routing import websocket_urlpatterns as _routes
from dashboard.live import Exchange
from gateway.access.auth import websocket_auth_stack
from gateway.host.schedule_settings import SettingsSync
from gateway.runtime import add_part
from gateway.server.boot import build_runtime_when_serving

__all__ = ["websocket_application", "websocket_urlpatterns"]

add_part("dashboard", Exchange.for_runtime)
# LEASECAST_SCHEDULES is synced as each gateway process starts.
add_part("schedule_settings", SettingsSync.for_runtime)


def websocket_application() -> Any:
    """Every Leasecast socket behind its authentication; any other path is refused (403).

    Also has the server build this process's runtime as it starts, so its
    background work (schedules' ticks) runs before any request arrives.
    """
    build_runtime_when_serving()
    return websocket_auth_stack(URLRouter(_routes))


def websocket_urlpatterns() -> list[URLPattern]:
    """Leasecast's socket routes, each behind its authentication, for a project's own router.

    Unlike :func:`websocket_application` there is no catch-all route: the
    project's router decides what other paths are. As
    :func:`websocket_application`, it has the server build the runtime as it starts.
    """
    build_runtime_when_serving()
    return [
        re_path(str(route.pattern), websocket_auth_stack(route.callback))
        for route in _routes
        if getattr(route.callback, "consumer_class", None) is not UnknownSocket
    ]
