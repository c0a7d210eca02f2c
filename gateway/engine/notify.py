"""Cross-process wake-ups: ``LISTEN`` on PostgreSQL, datagrams beside a SQLite file.

Every batch that may make messages visible ends, on PostgreSQL, with a
``pg_notify('leasecast_wake', 'PROCESS QUEUE')`` inside its transaction, so the
notification is delivered exactly when the messages become visible to other
connections (``gateway.store``). Each gateway process keeps one listening
connection on a thread of its own and wakes its local pumps, so a worker
waiting on one process is fed by an enqueue on another without polling.

After the listening connection breaks, notifications may have been missed, so
every pump is woken once the connection is back.

On SQLite there is no ``NOTIFY``. A process that commits messages outside
the gateway (the transactional enqueue API of ``gateway.host.producer``, an
admin action in another process) announces the queues with one datagram to
each gateway process using the same database file: each binds a Unix
datagram socket in a directory beside the file (``<db>.wake/<pid>.sock``).
A socket whose process is gone is removed by the first sender that finds it
dead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from django.db import connections

from gateway.store import NOTIFY_CHANNEL

__all__ = ["Listener", "announce_local", "start_listener", "start_local_listener", "wake_dir"]

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
                    # Each notification wakes its queue as it arrives: the
                    # generator yields them one by one (it returns only after
                    # the timeout, or after stop_after of them, so waking at
                    # its end delayed every wake-up by up to a second).
                    for note in conn.notifies(timeout=1.0):
                        sender, _, queue = note.payload.rpartition(" ")
                        if sender != self._own:
                            self.received += 1
                            self._loop.call_soon_threadsafe(self._wake, {queue})
                        if self._stopping.is_set():
                            break
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


# -- SQLite: datagrams between processes on one machine ---------------------------


def wake_dir(using: str = "default") -> Path | None:
    """Where gateway processes on the SQLite file of Django database ``using`` listen,
    or None (not SQLite, or in memory)."""
    db = connections[using]
    name = str(db.settings_dict.get("NAME") or "")
    if db.vendor != "sqlite" or not name or name == ":memory:" or name.startswith("file:"):
        return None
    path = Path(name)
    return path.with_name(path.name + ".wake")


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, wake: Callable[[Iterable[str] | None], None]) -> None:
        self._wake = wake

    def datagram_received(self, data: bytes, addr: Any) -> None:
        queues = {q for q in data.decode(errors="replace").split("\n") if q}
        if queues:
            self._wake(queues)


async def start_local_listener(
    wake: Callable[[Iterable[str] | None], None],
) -> asyncio.DatagramTransport | None:
    """Listen for :func:`announce_local` datagrams (SQLite only); None if it cannot."""
    directory = wake_dir()
    if directory is None:
        return None
    path = directory / f"{os.getpid()}.sock"
    if len(str(path)) > 100:  # sun_path holds 108 bytes
        log.warning("no cross-process wake-ups: the path %s is too long for a socket", path)
        return None
    try:
        directory.mkdir(exist_ok=True)
        path.unlink(missing_ok=True)  # a previous process with our pid
        transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: _Datagrams(wake), local_addr=str(path), family=socket.AF_UNIX
        )
    except OSError as exc:
        log.warning("no cross-process wake-ups (%s)", exc)
        return None
    return transport


def announce_local(queues: Iterable[str], using: str = "default") -> int:
    """Wake the pumps of ``queues`` in every gateway process on the SQLite file of
    Django database ``using`` (the one the messages were committed to).

    Returns how many processes were told. Never raises: a wake-up that cannot
    be sent only delays delivery until the next one.
    """
    directory = wake_dir(using)
    payload = "\n".join(sorted(set(queues))).encode()
    if directory is None or not payload or not directory.is_dir():
        return 0
    own = f"{os.getpid()}.sock"
    told = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.setblocking(False)
        for peer in directory.glob("*.sock"):
            if peer.name == own:
                continue
            try:
                sender.sendto(payload, str(peer))
                told += 1
            except (ConnectionRefusedError, FileNotFoundError):
                peer.unlink(missing_ok=True)  # its process is gone
            except OSError:
                pass  # a full buffer: that process has wake-ups pending anyway
    return told
