"""Telling the worker socket that holds a cancelled message (protocol 1.2: Cancel).

A cancel dead-letters the message in the store, wherever it was leased. The
socket holding the lease may be on this process or another one: every process
hears of the cancel (``gateway.engine.notify``) and :meth:`CancelNotices.tell`
looks among its own sockets of the queue. At most one holds the receipt; the
others, and a lease taken over HTTP (which belongs to no socket), need no word.

One race is closed here too: a notice may reach a process between the commit
of its lease round and the moment the pump hands the leased messages to its
sockets. A notice no socket claimed is kept a while, and a socket about to
take a delivery whose receipt was cancelled drops it instead
(:meth:`CancelNotices.claim`), so it never holds a dead message's lease.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from gateway.engine.pump import QueuePump

__all__ = ["CancelNotices", "CancellableSink", "tell_holder"]

#: How long a notice no socket claimed is kept, in seconds: far longer than a
#: lease round's way from its commit to its sockets.
KEEP_UNCLAIMED = 30.0
#: Most unclaimed notices kept (the oldest go first).
MAX_UNCLAIMED = 10_000


@runtime_checkable
class CancellableSink(Protocol):
    """A worker socket that can be told one of its leases was cancelled."""

    def lease_cancelled(self, msg_id: str, receipt: str) -> bool:
        """End the lease ``receipt`` here and tell the client, if this socket holds
        it; returns whether it did (a second notice of one cancel does nothing)."""


def tell_holder(pumps: Mapping[str, QueuePump], queue: str, msg_id: str, receipt: str) -> bool:
    """Tell the socket of this process that holds ``receipt`` of ``queue``, if any.

    Args:
        pumps: the process's pumps by queue (``Engine.pumps``): each knows
            the worker sockets of its queue.

    Returns:
        Whether a socket of this process held it.
    """
    pump = pumps.get(queue)
    if pump is None:
        return False
    for sink in pump.sinks:
        if isinstance(sink, CancellableSink) and sink.lease_cancelled(msg_id, receipt):
            return True
    return False


class CancelNotices:
    """One process's cancel notices: told to the holding socket, or kept a while.

    Args:
        pumps: the process's pumps by queue (``Engine.pumps``).
        clock: monotonic seconds.
    """

    def __init__(
        self, pumps: Mapping[str, QueuePump], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._pumps = pumps
        self._clock = clock
        # (queue, receipt) -> when it stops being kept; insertion order is age order
        self._unclaimed: dict[tuple[str, str], float] = {}

    def __len__(self) -> int:
        return len(self._unclaimed)

    def tell(self, queue: str, msg_id: str, receipt: str) -> bool:
        """A lease of ``queue`` was cancelled: tell its socket here, or keep the
        notice for :meth:`claim`. Returns whether a socket held it."""
        if tell_holder(self._pumps, queue, msg_id, receipt):
            return True
        self._forget_old()
        self._unclaimed[(queue, receipt)] = self._clock() + KEEP_UNCLAIMED
        while len(self._unclaimed) > MAX_UNCLAIMED:
            del self._unclaimed[next(iter(self._unclaimed))]
        return False

    def claim(self, queue: str, receipt: str) -> bool:
        """True (once) if the lease ``receipt`` of ``queue`` was cancelled before a
        socket of this process took it: the socket must not take it."""
        if not self._unclaimed:
            return False
        return self._unclaimed.pop((queue, receipt), None) is not None

    def _forget_old(self) -> None:
        now = self._clock()
        while self._unclaimed:
            key, until = next(iter(self._unclaimed.items()))
            if until > now:
                break
            del self._unclaimed[key]
