"""A socket's outbox: frames waiting to be sent, in order, and the one task that sends them.

Replies are produced by store callbacks, outside any coroutine of the socket,
so they are pushed here without waiting and sent by one writer task per
socket, in the order they were pushed. The writer holds back while the
server's transport buffer is full (daphne's producer pause, design decision
14), so a socket's backlog is counted here, by its
:class:`~gateway.server.transport.SocketWindow`, rather than piling up
uncounted in Twisted; and a close asked for with :meth:`Outbox.close_after`
is sent after the frames before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.server.transport import SocketWindow

__all__ = ["Outbox"]

#: The server's ASGI send.
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Outbox:
    """The frames of one socket on their way to the server.

    Args:
        close: closes the socket with a close code (the consumer's ``close``).
        writable_changed: told when the socket starts (True) or stops taking
            frames: a few are pending already, or the transport is full.
    """

    def __init__(
        self, *, close: Callable[[int], Awaitable[None]], writable_changed: Callable[[bool], None]
    ) -> None:
        self._close = close
        self._frames: list[str] = []
        self._ready = asyncio.Event()
        self._close_code: int | None = None
        self._writer: asyncio.Task[None] | None = None
        #: frames pending and the transport's room: the socket's writability
        self.window = SocketWindow(writable_changed)

    def start(self, send: Send) -> None:
        """Start the writer, sending through the server's ``send``."""
        self._writer = asyncio.create_task(self._write_loop(send))

    def stop(self) -> None:
        """Stop the writer; frames not sent yet are dropped (the socket is gone)."""
        if self._writer is not None:
            self._writer.cancel()

    def push(self, frame: str) -> None:
        """Queue a frame, after everything queued before it."""
        self._frames.append(frame)
        self.window.queued()
        self._ready.set()

    def close_after(self, code: int) -> bool:
        """Close the socket with ``code`` once the frames queued now are sent.

        Returns:
            False if a close was asked for already (the first one wins).
        """
        if self._close_code is not None:
            return False
        self._close_code = code
        self._ready.set()
        return True

    async def _write_loop(self, send: Send) -> None:
        window = self.window
        while True:
            await self._ready.wait()
            self._ready.clear()
            frames, self._frames = self._frames, []
            for frame in frames:
                if window.transport_paused:
                    # daphne's write buffer is full: the rest wait here, counted
                    # by the window, rather than in Twisted's buffer, uncounted.
                    await window.transport_ready.wait()
                await send({"type": "websocket.send", "text": frame})
                window.sent()
            if self._close_code is not None:
                # The close frame too: sent into a full buffer, daphne's close
                # handshake timer would run while the client still has frames
                # to read before it, and drop the connection (1006, not the code).
                await window.transport_ready.wait()
                await self._close(self._close_code)
                return
