"""The serving process's own options, read before Django is set up.

``gateway.server.serve`` passes the grace to uvicorn; ``gateway.server.shutdown``
waits that long under daphne. Both read it here, so neither imports the other
for it.
"""

from __future__ import annotations

import os

__all__ = ["DEFAULT_GRACE", "shutdown_grace"]

DEFAULT_GRACE = 30.0


def shutdown_grace() -> float:
    """Seconds a stopping process waits for its sockets (``GATEWAY_SHUTDOWN_GRACE``, 30)."""
    value = os.environ.get("GATEWAY_SHUTDOWN_GRACE", "")
    try:
        grace = float(value) if value else DEFAULT_GRACE
    except ValueError:
        raise ValueError(f"GATEWAY_SHUTDOWN_GRACE={value!r}: not a number of seconds") from None
    if grace < 0:
        raise ValueError(f"GATEWAY_SHUTDOWN_GRACE={value!r}: must be 0 or more")
    return grace
