"""No token reaches a server's log (issue 22.3), under daphne and uvicorn.

Real ``python -m gateway.serve`` processes at their default log levels
(access logs on). Clients send stored and signed tokens, valid and refused,
as ``?token=`` on sockets and HTTP requests and as ``Authorization: Bearer``;
afterwards the server's whole output is searched for every token string.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.access.tokens import signed_token
from tests.support.clients import unique
from tests.support.databases import sqlite_database
from tests.support.gateways import SERVERS, GatewayProcess

KEY = "redaction-signing-key-" + "0123456789abcdef" * 3


class ChattyGateway(GatewayProcess):
    """A gateway at the servers' default log levels: every access is logged."""

    def command(self) -> list[str]:
        base = [sys.executable, "-m", "gateway.serve", "-b", "127.0.0.1", "-p", str(self.port)]
        if self.server == "uvicorn":
            return [*base[:3], "--server", "uvicorn", *base[3:], "--log-level", "info"]
        return base


async def _open_and_close(url: str, headers: dict[str, str] | None = None) -> str:
    try:
        async with connect(url, additional_headers=headers or {}, open_timeout=10) as ws:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ws.recv(), 0.2)
            return "open"
    except InvalidStatus as exc:
        return f"refused {exc.response.status_code}"


def _get(url: str, token: str | None = None) -> int:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.parametrize("server", SERVERS)
def test_tokens_never_reach_the_servers_logs(server: str, tmp_path: Path) -> None:
    with sqlite_database(tmp_path) as env:
        env["GATEWAY_SIGNING_KEY"] = KEY
        gateway = ChattyGateway(env, tmp_path, name=f"redact-{server}", server=server)
        queue, topic = unique("redactq"), unique("redactt")
        stored = gateway.issue_token(f"consume:{queue}", f"subscribe:{topic}", name="logged")
        signed = signed_token("user-7", [f"subscribe:{topic}"], ttl=600, key=KEY)
        forged = signed_token("user-7", [f"subscribe:{topic}"], ttl=600, key=KEY + "x")
        unknown = "lc_" + "Z" * 43
        secrets = [stored, signed, forged, unknown]
        gateway.start()
        try:
            ws = gateway.ws
            outcomes = asyncio.run(
                _run_sockets(
                    [
                        f"{ws}/ws/queues/{queue}/?token={stored}",
                        f"{ws}/ws/topics/{topic}/?token={signed}",
                        f"{ws}/ws/topics/{topic}/?token={forged}",
                        f"{ws}/ws/queues/{queue}/?token={unknown}",
                        f"{ws}/ws/queues/other/?token={signed}",
                    ]
                )
            )
            assert outcomes[:2] == ["open", "open"], outcomes
            assert all(o != "open" for o in outcomes[2:4]), outcomes
            for secret in secrets:
                _get(f"{gateway.http}/api/queues/{queue}?token={secret}")
                _get(f"{gateway.http}/api/queues/{queue}", token=secret)
                _get(f"{gateway.http}/healthz?token={secret}&x=1")
        finally:
            gateway.stop()
        log = gateway.log_text()
    leaked = [secret for secret in secrets if secret in log]
    assert not leaked, f"{len(leaked)} token(s) in the {server} log"
    # The accesses were logged, with the token replaced.
    assert log.count("token=[redacted]") >= len(secrets), log[-3000:]


async def _run_sockets(urls: list[str]) -> list[str]:
    return [await _open_and_close(url) for url in urls]
