"""Telling the worker socket that holds a cancelled message (protocol 1.2: Cancel).

A cancel dead-letters the message in the store, wherever it was leased. The
socket holding the lease may be on this process or another one: every process
hears of the cancel (``gateway.engine.notify``) and :func:`tell_holder` looks
among its own sockets of the queue. At most one holds the receipt; the others,
and a lease taken over HTTP (which belongs to no socket), need no word.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from gateway.engine.pump import QueuePump

__all__ = ["CancellableSink", "tell_holder"]


@runtime_checkable
class CancellableSink(Protocol):
    """A worker socket that can be told one of its leases was cancelled."""

    def lease_cancelled(self, msg_id: str, receipt: str) -> bool:
        """End the lease ``receipt`` here and tell the client, if this socket holds
        it; returns whether it did (a second notice of one cancel does nothing)."""


def tell_holder(pumps: dict[str, QueuePump], queue: str, msg_id: str, receipt: str) -> bool:
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
