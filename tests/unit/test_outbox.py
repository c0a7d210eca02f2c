"""A socket's outbox on its own: order, the transport's pause, and a close after the frames.

The server's ``send`` and the socket's ``close`` are recorded; what they
record is what a server would have been handed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from consumers.outbox import Outbox


class Recorded:
    """What the outbox handed the server, and whether the socket was closed."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.closed: int | None = None
        self.writable: list[bool] = []

    async def send(self, message: dict[str, Any]) -> None:
        assert message["type"] == "websocket.send"
        self.sent.append(message["text"])

    async def close(self, code: int) -> None:
        self.closed = code


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_frames_are_sent_in_the_order_pushed_then_the_close() -> None:
    seen = Recorded()
    outbox = Outbox(close=seen.close, writable_changed=seen.writable.append)
    outbox.start(seen.send)
    try:
        for i in range(3):
            outbox.push(f"f{i}")
        assert outbox.close_after(4008)
        assert not outbox.close_after(4409)  # the first close asked for wins
        outbox.push("f3")  # pushed before the writer ran: still before the close
        await turns()
        assert seen.sent == ["f0", "f1", "f2", "f3"]
        assert seen.closed == 4008
        assert outbox.window.pending == 0
    finally:
        outbox.stop()


async def test_a_full_transport_holds_the_frames_in_the_outbox_counted() -> None:
    seen = Recorded()
    outbox = Outbox(close=seen.close, writable_changed=seen.writable.append)
    outbox.start(seen.send)
    try:
        outbox.window.transport_changed(True)  # daphne paused the producer
        outbox.push("a")
        outbox.push("b")
        await turns()
        assert seen.sent == [] and outbox.window.pending == 2
        assert seen.writable == [False]  # told: stop draining into this socket
        outbox.window.transport_changed(False)
        await turns()
        assert seen.sent == ["a", "b"] and outbox.window.pending == 0
        assert seen.writable == [False, True]
    finally:
        outbox.stop()
