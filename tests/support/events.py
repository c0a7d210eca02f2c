"""A server-sent events client for the tests: raw HTTP/1.1 over asyncio, parsed by the spec.

:class:`EventStream` opens ``GET /sse/...`` on a plain TCP connection (no
library between the test and the bytes), reads the response head, then the
body (chunked or not) and parses it as the HTML standard's event-stream
format: ``field: value`` lines, blank-line-terminated blocks, ``:`` comments.
A test can stop reading (:meth:`EventStream.stall` keeps the socket's
receive buffer small, so a stalled client holds little in the kernel) to
see the gateway's backpressure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections import deque
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Event", "EventStream", "open_stream"]


@dataclass
class Event:
    """One dispatched event (``event`` defaults to ``message``, as browsers do)."""

    event: str
    data: str
    id: str | None

    def json(self) -> Any:
        return json.loads(self.data)


@dataclass
class EventStream:
    """An open event stream: its status, headers and what has been read of its body."""

    status: int
    headers: dict[str, str]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    chunked: bool
    #: comment lines read so far (without the leading colon)
    comments: list[str] = field(default_factory=list)
    #: the body as text, for a refusal (JSON) once :meth:`read_all` ran
    text: str = ""
    _buffer: str = ""
    _raw: bytes = b""
    _eof: bool = False
    _last_id: str | None = None
    _blocks: deque[str] = field(default_factory=deque)

    async def _more(self, timeout: float) -> bool:
        """Read more of the body into the text buffer; False at its end."""
        if self._eof:
            return False
        if self.chunked:
            line = await asyncio.wait_for(self.reader.readline(), timeout)
            if not line:
                self._eof = True
                return False
            size = int(line.strip().split(b";")[0], 16)
            if size == 0:
                self._eof = True
                return False
            data = await asyncio.wait_for(self.reader.readexactly(size + 2), timeout)
            data = data[:-2]
        else:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                self._eof = True
                return False
        self._raw += data
        # Split only on complete UTF-8: keep a partial sequence for the next read.
        try:
            text, self._raw = self._raw.decode(), b""
        except UnicodeDecodeError:
            return True
        self._buffer += text.replace("\r\n", "\n").replace("\r", "\n")
        return True

    async def next(self, timeout: float = 10.0) -> Event | None:
        """The next dispatched event; None when the stream ended.

        Raises:
            TimeoutError: no event within ``timeout`` seconds (comments do not count).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self._blocks:
                event = self._parse(self._blocks.popleft())
                if event is not None:
                    return event
                continue
            if "\n\n" in self._buffer:
                # Every complete block at once: splitting one at a time would
                # copy the rest of a large buffer for each event.
                *blocks, self._buffer = self._buffer.split("\n\n")
                self._blocks.extend(blocks)
                continue
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"no event within {timeout} s")
            if not await self._more(left):
                return None

    def _parse(self, block: str) -> Event | None:
        name, data, has_data = "", [], False
        for line in block.split("\n"):
            if line.startswith(":"):
                self.comments.append(line[1:].strip())
                continue
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "event":
                name = value
            elif key == "data":
                data.append(value)
                has_data = True
            elif key == "id":
                self._last_id = value
        if not has_data:
            return None  # a comment-only block, or fields without data: nothing dispatched
        return Event(name or "message", "\n".join(data), self._last_id)

    async def events(self, n: int, timeout: float = 10.0) -> list[Event]:
        """The next ``n`` events (fails if the stream ends first)."""
        got: list[Event] = []
        for _ in range(n):
            event = await self.next(timeout)
            assert event is not None, f"the stream ended after {got}"
            got.append(event)
        return got

    async def read_all(self, timeout: float = 10.0) -> str:
        """Read the body to its end; its text (a refusal's JSON)."""
        while await self._more(timeout):
            pass
        self.text = self._buffer
        return self.text

    async def ended(self, timeout: float = 10.0) -> list[Event]:
        """Read on until the stream ends; the events read meanwhile."""
        got: list[Event] = []
        while (event := await self.next(timeout)) is not None:
            got.append(event)
        return got

    def json(self) -> Any:
        return json.loads(self.text)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.writer.wait_closed()


async def open_stream(
    url: str,
    token: str | None = None,
    *,
    headers: dict[str, str] | None = None,
    method: str = "GET",
    receive_buffer: int | None = None,
    timeout: float = 10.0,
    reuse: EventStream | None = None,
) -> EventStream:
    """Open ``url`` and read the response head.

    Args:
        url: ``http://host:port/sse/...`` (query included).
        token: sent as ``Authorization: Bearer``.
        headers: more request headers (``Last-Event-ID``, ``Origin``...).
        method: the request method.
        receive_buffer: the socket's ``SO_RCVBUF`` in bytes, set before it
            connects (small: a client that stops reading stops the server soon).
        reuse: send the request on this finished response's connection
            (HTTP/1.1 keep-alive) instead of a new one.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    if reuse is not None:
        reader, writer = reuse.reader, reuse.writer
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}", "Accept: text/event-stream"]
    if token:
        lines.append(f"Authorization: Bearer {token}")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    status = int(status_line.split()[1])
    found: dict[str, str] = {}
    for line in header_lines:
        if ":" in line:
            key, _, value = line.partition(":")
            found[key.strip().lower()] = value.strip()
    chunked = "chunked" in found.get("transfer-encoding", "").lower()
    stream = EventStream(status, found, reader, writer, chunked)
    if "content-length" in found and not chunked:
        length = int(found["content-length"])
        body = await asyncio.wait_for(reader.readexactly(length), timeout)
        stream._buffer = body.decode()
        stream._eof = True
        stream.text = stream._buffer
    return stream
