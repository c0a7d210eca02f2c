"""The public path of the WebSocket routes for a host project: ``gateway.routing``.

The code is in :mod:`gateway.site.routing`; this module only hands its public names on,
so that what users import and run keeps working.
"""

from __future__ import annotations

from gateway.site.routing import websocket_application, websocket_urlpatterns

__all__ = ["websocket_application", "websocket_urlpatterns"]
