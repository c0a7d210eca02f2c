"""Clients of a running gateway for the tests: HTTP calls, a WebSocket, unique names.

They speak the wire contract (docs/protocol.md) only, so a test reads as a
user's program would: :func:`http` / :func:`ahttp` for the HTTP API,
:class:`Socket` for a WebSocket whose replies are matched by ``ref``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from websockets.asyncio.client import ClientConnection, connect

from tests.support.databases import ROOT

if TYPE_CHECKING:
    from tests.support.gateways import GatewayProcess

__all__ = ["Socket", "ahttp", "collect", "http", "unique"]

_refs = itertools.count(1)
_names = itertools.count()
_CLOSED: dict[str, Any] = {"op": "<closed>"}


def unique(prefix: str = "q") -> str:
    """A queue name no other test uses."""
    return f"{prefix}{os.getpid()}-{next(_names)}"


def http(
    method: str, url: str, token: str | None = None, body: Any = None, raw: bytes | None = None
) -> tuple[int, Any]:
    """One HTTP request; returns (status, decoded JSON body)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as err:
        text = err.read()
        try:
            return err.code, json.loads(text)
        except ValueError:
            return err.code, text.decode(errors="replace")


async def ahttp(method: str, url: str, token: str | None = None, body: Any = None) -> Any:
    """:func:`http` off the event loop."""
    return await asyncio.to_thread(http, method, url, token, body)


class Socket:
    """A WebSocket client that routes replies by ``ref`` and queues everything else."""

    def __init__(self, conn: ClientConnection) -> None:
        self.conn = conn
        self.waiting: dict[Any, asyncio.Future[dict[str, Any]]] = {}
        self.frames: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, url: str, token: str | None = None, **kwargs: Any) -> Socket:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn = await connect(url, additional_headers=headers, max_size=None, **kwargs)
        return cls(conn)

    async def _read(self) -> None:
        try:
            async for text in self.conn:
                frame = json.loads(text)
                future = self.waiting.pop(frame.get("ref"), None)
                if future is not None and not future.done():
                    future.set_result(frame)
                else:
                    self.frames.put_nowait(frame)
        except Exception:
            pass
        finally:
            for future in self.waiting.values():
                if not future.done():
                    future.set_exception(ConnectionError("socket closed"))
            self.frames.put_nowait(_CLOSED)

    async def send(self, frame: dict[str, Any] | str) -> None:
        await self.conn.send(frame if isinstance(frame, str) else json.dumps(frame))

    async def request(self, frame: dict[str, Any], timeout: float = 10) -> dict[str, Any]:
        """Send with a fresh ``ref``; return the reply carrying that ref."""
        ref = f"r{next(_refs)}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[ref] = future
        await self.send({**frame, "ref": ref})
        reply = await asyncio.wait_for(future, timeout)
        assert reply.get("ref") == ref
        return reply

    async def next(self, timeout: float = 10) -> dict[str, Any]:
        """The next frame that was not a reply to :meth:`request`.

        Raises:
            ConnectionError: the socket closed.
        """
        frame = await asyncio.wait_for(self.frames.get(), timeout)
        if frame is _CLOSED:
            self.frames.put_nowait(_CLOSED)  # every later call fails the same way
            raise ConnectionError(f"socket closed ({self.conn.close_code})")
        return frame

    async def deliveries(self, n: int, timeout: float = 10) -> list[dict[str, Any]]:
        """The next ``n`` frames, each of which must be a ``deliver``."""
        got = [await self.next(timeout) for _ in range(n)]
        assert all(f["op"] == "deliver" for f in got), got
        return got

    async def quiet(self, seconds: float = 0.3) -> None:
        """Assert that no unsolicited frame arrives for ``seconds``."""
        try:
            frame = await asyncio.wait_for(self.frames.get(), seconds)
        except TimeoutError:
            return
        if frame is _CLOSED:
            raise ConnectionError("socket closed")
        raise AssertionError(f"unexpected frame {frame}")

    async def close(self) -> None:
        await self.conn.close()
        self.reader.cancel()

    async def abort(self) -> None:
        """Drop the TCP connection without a closing handshake (a crashed client)."""
        transport = self.conn.transport
        transport.abort()
        self.reader.cancel()

    async def __aenter__(self) -> Socket:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def collect(s: Socket, n: int, timeout: float = 10) -> tuple[list[dict[str, Any]], int]:
    """The next ``n`` items of a subscriber's ``messages`` frames, and the drops they report."""
    items: list[dict[str, Any]] = []
    dropped = 0
    while len(items) < n:
        frame = await s.next(timeout)
        assert frame["op"] == "messages", frame
        items += frame["items"]
        dropped += frame["dropped"]
    return items, dropped


def run_cli(
    gw: GatewayProcess, token: str | None, *args: str, stdin: str = ""
) -> tuple[int, str, str]:
    env = {"PATH": "/usr/bin:/bin", "LEASECAST_URL": gw.http}
    if token:
        env["LEASECAST_TOKEN"] = token
    done = subprocess.run(
        [sys.executable, "-m", "leasecast.cli", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout, done.stderr


async def publish(p: Socket, topic: str, body: Any) -> None:
    """Publish ``body`` on ``topic`` through socket ``p`` and wait for its confirmation."""
    reply = await p.request({"op": "publish", "topic": topic, "body": body}, timeout=20)
    assert reply["op"] == "published", reply


async def b_hears_a(p: Socket, topic: str, listener: Socket) -> None:
    """Wait until ``listener`` (the first subscriber of ``topic`` on B) gets A's publishes.

    B joins the topic's Redis group in the background after its first local
    subscriber; publishes from A before that never reach B. Probes are
    published until one arrives, then a fence: the relay keeps order, so once
    the fence is read no probe is left in flight and later subscribers on B
    see only the test's own messages.
    """
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        await publish(p, topic, {"probe": "ping"})
        try:
            await listener.next(timeout=0.25)
            break
        except TimeoutError:
            assert asyncio.get_running_loop().time() < deadline, "B never joined the topic"
    await publish(p, topic, {"probe": "fence"})
    while True:
        frame = await listener.next(timeout=10)
        assert frame["op"] == "messages" and frame["dropped"] == 0, frame
        if {"probe": "fence"} in [it["body"] for it in frame["items"]]:
            return
