"""The public path of the standalone service's ASGI application: ``gateway.asgi``.

The code is in :mod:`gateway.site.asgi`; this module only hands its public names on,
so that what users import and run keeps working.
"""

from __future__ import annotations

from gateway.site.asgi import application

__all__ = ["application"]
