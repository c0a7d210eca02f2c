"""Socket refusals decided in the application, tested in-process (Channels' WebsocketCommunicator).

Who may open a socket is decided by the authentication in front of the
sockets and by the router, before any consumer runs: no server process, no
database and no runtime take part, so these tests drive the ASGI application
itself. The real-server tests (tests/integration/test_bad_input.py,
tests/integration/test_ws_refusals.py) keep what only a server shows: how
daphne and uvicorn turn a handshake closed before it was accepted into an
HTTP 403, and every kind of bad token against a gateway's own database.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator

from gateway.access.auth import PRINCIPAL_KEY
from gateway.core.wire import CloseCode
from gateway.site.routing import websocket_application

ROUTES = ("/ws/queues/jobs/", "/ws/produce/", "/ws/topics/news/", "/ws/dashboard/", "/ws/nowhere/")
UNKNOWN = ("/ws/nothing/", "/ws/queues/", "/ws/queues/a/b/", "/")


async def opened(app: Any, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[Any, ...]:
    """``(False,)`` for a handshake closed before it was accepted, else frames and close code."""
    communicator = WebsocketCommunicator(app, path, headers=headers)
    connected, _ = await communicator.connect(timeout=5)
    if not connected:
        return (False,)
    frames = []
    while True:
        message = await communicator.receive_output(timeout=5)
        if message["type"] == "websocket.close":
            return (message.get("code"), frames)
        frames.append(json.loads(message["text"]))


@pytest.mark.parametrize("path", ROUTES)
async def test_a_program_without_a_token_is_refused_before_the_handshake_completes(
    path: str,
) -> None:
    assert await opened(websocket_application(), path, []) == (False,)


@pytest.mark.parametrize("path", ROUTES)
async def test_a_browser_without_a_token_is_told_unauthorized_and_closed_4401(path: str) -> None:
    code, frames = await opened(
        websocket_application(), path, [(b"origin", b"https://app.example")]
    )
    assert code == CloseCode.UNAUTHORIZED == 4401
    assert [(f["op"], f["code"]) for f in frames] == [("error", "unauthorized")]
    assert "token" in frames[0]["detail"]


@pytest.mark.parametrize("path", UNKNOWN)
async def test_an_unknown_path_is_refused_even_for_a_caller_with_a_principal(path: str) -> None:
    """The router's catch-all refuses it; no consumer of a real socket is reached."""
    router = websocket_application().inner  # the routes behind the authentication

    async def authenticated(scope: dict[str, Any], receive: Any, send: Any) -> Any:
        # Any principal: the refusing consumer never looks at it (a real
        # socket's consumer would, and fail the test).
        return await router({**scope, PRINCIPAL_KEY: object()}, receive, send)

    assert await opened(authenticated, path, []) == (False,)
