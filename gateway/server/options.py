"""The serving process's own options, read before Django is set up.

``gateway.server.serve`` passes the grace to uvicorn; ``gateway.server.shutdown``
waits that long under daphne. Both read it here, so neither imports the other
for it. The value, its default and its check are the settings object's
(:func:`gateway.conf.environ_settings`).
"""

from __future__ import annotations

from gateway.conf import environ_settings

__all__ = ["shutdown_grace"]


def shutdown_grace() -> float:
    """Seconds a stopping process waits for its sockets (``GATEWAY_SHUTDOWN_GRACE``, 30).

    Raises:
        ValueError: not a number of seconds, or below 0.
    """
    return environ_settings().shutdown_grace
