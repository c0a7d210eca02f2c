"""Cross-process wake-ups on PostgreSQL: ``LISTEN`` for the other gateways' commits.

Every batch that may make messages visible ends, on PostgreSQL, with a
``pg_notify('leasecast_wake', 'PROCESS QUEUE')`` inside its transaction, so the
notification is delivered exactly when the messages become visible to other
connections (``gateway.store``). Each gateway process keeps one listening
connection on a thread of its own and wakes its local pumps, so a worker
waiting on one process is fed by an enqueue on another without polling.

After the listening connection breaks, notifications may have been missed, so
every pump is woken once the connection is back.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from django.db import connections

from gateway.store import NOTIFY_CHANNEL

__all__ = ["Listener", "start_listener"]

log = logging.getLogger("leasecast.notify")


class Listener:
    """A thread that turns notifications into pump wake-ups on the event loop.

    Args:
        connect: returns a new psycopg connection in autocommit mode.
        own_name: this process's name; its own notifications are skipped.
        wake: called on the loop thread with queue names, or None for "all".
        loop: the event loop of the pumps.
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        own_name: str,
        wake: Callable[[Iterable[str] | None], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._connect = connect
        self._own = own_name
        self._wake = wake
        self._loop = loop
        self._stopping = threading.Event()
        self.received = 0
        self.thread = threading.Thread(target=self._run, name="leasecast-listen", daemon=True)

    def start(self) -> None:
        """Start listening."""
        self.thread.start()

    def stop(self) -> None:
        """Stop after the current wait (at most a second)."""
        self._stopping.set()

    def _run(self) -> None:
        backoff = 0.1
        first = True
        while not self._stopping.is_set():
            try:
                conn = self._connect()
                conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                if not first:
                    self._loop.call_soon_threadsafe(self._wake, None)
                first = False
                backoff = 0.1
                while not self._stopping.is_set():
                    woken = set()
                    for note in conn.notifies(timeout=1.0, stop_after=1000):
                        sender, _, queue = note.payload.rpartition(" ")
                        if sender != self._own:
                            woken.add(queue)
                    if woken:
                        self.received += len(woken)
                        self._loop.call_soon_threadsafe(self._wake, woken)
            except Exception as exc:
                if self._stopping.is_set():
                    return
                log.warning("listening for wake-ups failed (%s); retrying", exc)
                first = False
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)


def _connect() -> Any:
    wrapper = connections.create_connection("default")
    wrapper.ensure_connection()
    raw = wrapper.connection
    raw.autocommit = True
    return raw


def start_listener(
    wake: Callable[[Iterable[str] | None], None], own_name: str, loop: asyncio.AbstractEventLoop
) -> Listener:
    """Start a listener on Django's default (PostgreSQL) database."""
    listener = Listener(_connect, own_name, wake, loop)
    listener.start()
    return listener
