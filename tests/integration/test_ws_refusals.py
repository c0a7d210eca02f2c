"""A browser can tell a refused token from a network failure (issue 21, item 4).

Protocol 1.2, "General": a WebSocket request with an ``Origin`` header whose
token is missing, unknown, revoked, expired or forged is accepted, sent
``{"op": "error", "code": "unauthorized", ...}`` and closed with 4401; without
``Origin`` (a program) the handshake is refused with HTTP 403 as before. The
Python client reports such a refusal as :class:`leasecast.errors.Unauthorized`
instead of reconnecting, unless it was given a token callable, which it asks
again.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from leasecast.errors import TokenExpired, Unauthorized
from leasecast.link import Link
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.access.tokens import signed_token
from tests.support.clients import unique
from tests.support.databases import sqlite_database
from tests.support.gateways import GatewayProcess, both_servers

KEY = "refusal-signing-key-" + "0123456789abcdef" * 3
ROUTES = ("/ws/queues/jobs/", "/ws/produce/", "/ws/topics/news/", "/ws/dashboard/", "/ws/nowhere/")


@pytest.fixture(scope="module")
def gw(gateway_server: str) -> Iterator[GatewayProcess]:
    var = Path(tempfile.mkdtemp(prefix="leasecast-refusals-"))
    with sqlite_database(var) as env:
        process = GatewayProcess(
            {**env, "GATEWAY_SIGNING_KEY": KEY}, var, name="refusals", server=gateway_server
        )
        process.start()
        yield process
        process.stop()


def bad_tokens(gw: GatewayProcess) -> dict[str, str]:
    """Every kind of token the protocol says is refused."""
    name = unique("revoked")
    revoked = gw.issue_token("admin", name=name)
    gw.manage("revoke_token", name)
    return {
        "unknown": "lc_not-a-token",
        "revoked": revoked,
        "expired": signed_token("page", ["admin"], 1, key=KEY, now=time.time() - 60),
        "forged": signed_token("page", ["admin"], 60, key="another-key-" + "x" * 40),
    }


async def outcome(url: str, headers: dict[str, str]) -> tuple[Any, ...]:
    """``(403,)`` for a refused handshake, else the frames received and the close code."""
    try:
        conn = await connect(url, additional_headers=headers, open_timeout=10)
    except InvalidStatus as exc:
        return (exc.response.status_code,)
    frames: list[Any] = []
    try:
        async with asyncio.timeout(10):
            async for text in conn:
                frames.append(json.loads(text))
    except ConnectionClosed:
        pass
    return (conn.close_code, [(f["op"], f["code"]) for f in frames])


@both_servers
async def test_a_refused_token_with_an_origin_is_told_and_closed_4401_without_one_403(
    gw: GatewayProcess,
) -> None:
    origin = {"Origin": "https://app.example"}
    told = (4401, [("error", "unauthorized")])
    tokens = bad_tokens(gw)
    seen: dict[str, tuple[Any, ...]] = {}
    for route in ROUTES:
        url = gw.ws + route
        seen[f"{route} no token, origin"] = await outcome(url, origin)
        seen[f"{route} no token, no origin"] = await outcome(url, {})
        for kind, secret in tokens.items():
            bearer = {"Authorization": f"Bearer {secret}"}
            seen[f"{route} {kind}, origin"] = await outcome(url, {**bearer, **origin})
            seen[f"{route} {kind} in the query, origin"] = await outcome(
                f"{url}?token={secret}", origin
            )
            seen[f"{route} {kind}, no origin"] = await outcome(url, bearer)
    expected = {key: told if key.endswith(", origin") else (403,) for key in seen}
    assert seen == expected
    # A good token still gets in, with or without an Origin (so the test can fail).
    admin = gw.issue_token("admin", name=unique("admin"))
    for headers in ({}, origin):
        async with connect(
            f"{gw.ws}/ws/produce/",
            additional_headers={"Authorization": f"Bearer {admin}", **headers},
        ) as conn:
            await conn.send(json.dumps({"op": "enqueue", "queue": unique(), "body": 1, "ref": 1}))
            assert json.loads(await conn.recv())["op"] == "enqueued"


async def test_the_refusal_frame_says_why_and_names_no_token(gw: GatewayProcess) -> None:
    secret = "lc_not-a-token-but-secret-looking"
    async with connect(
        f"{gw.ws}/ws/produce/",
        additional_headers={"Authorization": f"Bearer {secret}", "Origin": "https://a.example"},
    ) as conn:
        frame = json.loads(await conn.recv())
        with pytest.raises(ConnectionClosed):
            await conn.recv()
    assert frame["op"] == "error" and frame["code"] == "unauthorized"
    assert "token" in frame["detail"] and secret not in frame["detail"]
    assert conn.close_code == 4401


# -- the Python client


async def test_python_link_raises_unauthorized_for_the_4401_refusal(gw: GatewayProcess) -> None:
    link = await Link.open(f"{gw.ws}/ws/produce/", "lc_not-a-token", origin="https://a.example")
    with pytest.raises(Unauthorized) as caught:
        await link.next()
    assert not isinstance(caught.value, TokenExpired)
    with pytest.raises(Unauthorized):
        await link.request({"op": "enqueue", "queue": "q", "body": 1})
    await link.close()


async def test_python_link_with_a_token_callable_reconnects_for_a_fresh_token(
    gw: GatewayProcess,
) -> None:
    good = gw.issue_token("enqueue:*", name=unique("good"))
    asked: list[int] = []

    def tokens() -> str:
        asked.append(1)
        return "lc_not-a-token" if len(asked) == 1 else good

    link = await Link.open(f"{gw.ws}/ws/produce/", tokens, origin="https://a.example")
    # Not final with a callable: the owner reconnects and asks it again.
    with pytest.raises(TokenExpired):
        await link.next()
    link = await Link.open(f"{gw.ws}/ws/produce/", tokens, origin="https://a.example")
    reply = await link.request({"op": "enqueue", "queue": unique(), "body": 1})
    assert reply["op"] == "enqueued" and len(asked) == 2
    await link.close()
