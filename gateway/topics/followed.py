"""A topic this process dispatches: where its offsets stand, and who waits on them.

``dispatched`` is the last offset offered to every local buffer (the seam a
resuming subscriber is replayed up to), ``complete`` the last one every
local buffer took or dropped (a publish is confirmed once its offset is
complete); see ``gateway.topics.dispatch``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gateway.core.history import Entry

__all__ = ["Followed", "release"]


@dataclass(eq=False, slots=True)
class Followed:
    """A topic this process dispatches: its epoch and the last offset dispatched.

    One per topic in use, thousands when publishers use ever-new names: the
    events are made only when something waits on them.
    """

    epoch: str
    #: offered to every local buffer but the full ``block`` ones (the resume seam)
    dispatched: int
    #: taken by every local buffer, the full ``block`` ones too (publishes
    #: up to here are confirmed); equals ``dispatched`` unless a message waits
    #: for room. Starts at ``dispatched``.
    complete: int = -1
    #: publishes made here waiting for their offset to be dispatched here
    waiters: list[tuple[int, asyncio.Future[None]]] = field(default_factory=list)
    #: entries received out of order, waiting for the offsets before them
    pending: dict[int, Entry] = field(default_factory=dict)
    #: offsets up to this are gone from the stream: not held means lost
    gone_to: int = 0
    #: a deliver() is dispatching (maybe waiting for room): others only add
    draining: bool = False
    #: publishes of this process whose offsets are not known yet
    appending: int = 0
    _moved: asyncio.Event | None = None
    _drained: asyncio.Event | None = None

    def __post_init__(self) -> None:
        if self.complete < 0:
            self.complete = self.dispatched

    def completed(self, offset: int) -> None:
        """Every local buffer took (or dropped) the messages up to ``offset``:
        the publishes waiting for them are done."""
        self.complete = max(self.complete, offset)
        if not self.waiters:
            return
        still = []
        for waited, done in self.waiters:
            if waited <= self.complete:
                if not done.done():
                    done.set_result(None)
            else:
                still.append((waited, done))
        self.waiters = still

    def notify_moved(self) -> None:
        """``dispatched`` moved (resuming subscribers wait for it)."""
        if self._moved is not None:
            self._moved.set()

    async def wait_moved(self) -> None:
        """Until ``dispatched`` moves next (or the topic is released)."""
        if self._moved is None:
            self._moved = asyncio.Event()
        self._moved.clear()
        await self._moved.wait()

    def notify_drained(self) -> None:
        """A drain ended (the stream reader waits for it)."""
        if self._drained is not None:
            self._drained.set()

    async def wait_drained(self) -> None:
        """Until the running drain ends."""
        if self._drained is None:
            self._drained = asyncio.Event()
        self._drained.clear()
        await self._drained.wait()


def release(followed: Followed) -> None:
    """The topic is no longer dispatched here: wake everything that waits on it."""
    followed.notify_drained()
    for _, done in followed.waiters:
        if not done.done():
            done.set_result(None)
    followed.waiters.clear()
    followed.notify_moved()
