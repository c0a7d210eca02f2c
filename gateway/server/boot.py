"""Build a gateway process's runtime when its server starts, not at its first request.

A runtime is otherwise built by the first socket or API call that needs it
(``gateway.runtime.current_runtime``). Its background work must not wait for
one: every gateway process fires schedules' ticks (protocol 1.2: Schedules,
"while at least one gateway process runs"), including a process that has
served nothing yet, such as one just restarted behind a load balancer.

:func:`build_runtime_when_serving` is called while the server imports the
ASGI application (``gateway.site.routing.websocket_application``):

- under uvicorn (``uvicorn.run`` imports the application before it starts
  its loop) the runtime is built when the server has started (its
  ``Server.startup``); where the import runs inside a running loop (a worker
  process of ``--workers``), on that loop's next turn;
- under daphne the import runs before Twisted's asyncio reactor starts its
  loop: the runtime is built by the reactor's first call.

Anywhere else (a management command, a test importing the application with
no server) nothing happens, and the runtime is built on first use as before.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any, cast

__all__ = ["build_runtime_when_serving"]

log = logging.getLogger("leasecast.boot")


def build_runtime_when_serving() -> None:
    """Have the serving event loop build this process's runtime as soon as it runs."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is not None:
        loop.call_soon(_build)
        return
    # No loop yet: the server imports the application before it runs one.
    # Both hooks below are harmless if their server is not the one that runs.
    if "uvicorn.server" in sys.modules:
        _build_after_uvicorn_startup()
    if "twisted.internet.reactor" in sys.modules and "daphne.server" in sys.modules:
        # daphne installed Twisted's asyncio reactor; callLater runs on its loop.
        from twisted.internet import reactor

        # Typed through its zope interface, whose methods mypy reads without self.
        cast(Any, reactor).callLater(0, _build)


def _build_after_uvicorn_startup() -> None:
    """Have uvicorn's server build the runtime once it has started (its loop runs).

    ``uvicorn.run`` imports the application before ``asyncio.run``; its
    ``Server.startup`` is the first code of the server's own loop.
    """
    from uvicorn.server import Server

    original = Server.startup
    if getattr(original, "_leasecast_boot", False):
        return

    async def startup(self: Server, sockets: Any = None) -> None:
        await original(self, sockets)
        asyncio.get_running_loop().call_soon(_build)

    startup._leasecast_boot = True  # type: ignore[attr-defined]
    Server.startup = startup  # type: ignore[method-assign]


def _build() -> None:
    from gateway.runtime import current_runtime

    try:
        current_runtime()
    except Exception:  # built again on first use; say why it failed now
        log.exception("the gateway runtime could not be built at start")
