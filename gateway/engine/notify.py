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

Cancelled leases travel the same ways (protocol 1.2: Cancel): the worker
socket holding a cancelled message may be on any process. On PostgreSQL the
cancel's transaction sends ``pg_notify('leasecast_cancel', 'QUEUE ID
RECEIPT')`` (``gateway.store.operator.cancel_message``) and every listener,
the sender's own included, hands it to the process's ``cancelled`` callback;
on SQLite a cancel committed through Django's connection (the admin, a task's
cancel) is told to every gateway process on the file, this one included, by
a datagram line ``cancel QUEUE ID RECEIPT`` (:func:`announce_cancelled`).
Telling a process whose sockets do not hold the lease does nothing, so a
notice may arrive twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from django.db import connections, transaction

from gateway.store import NOTIFY_CHANNEL
from gateway.store.operator import CANCEL_CHANNEL

__all__ = [
    "Cancelled",
    "Listener",
    "announce_cancelled",
    "announce_local",
    "listening",
    "parse_cancel_notice",
    "start_listener",
    "start_local_listener",
    "wake_dir",
]

#: Told that a lease was cancelled: ``(queue, message id, receipt)``, on the loop.
Cancelled = Callable[[str, str, str], None]


def parse_cancel_notice(text: str) -> tuple[str, str, str] | None:
    """``QUEUE ID RECEIPT`` as sent on the cancel channel, or None if malformed."""
    parts = text.split(" ")
    if len(parts) != 3 or not all(parts):
        return None
    return parts[0], parts[1], parts[2]


log = logging.getLogger("leasecast.notify")


class Listener:
    """A thread that turns notifications into pump wake-ups on the event loop.

    Args:
        connect: returns a new psycopg connection in autocommit mode.
        own_name: this process's name; its own notifications are skipped.
        wake: called on the loop thread with queue names, or None for "all".
        loop: the event loop of the pumps.
        cancelled: called on the loop thread for each cancelled lease
            announced on :data:`~gateway.store.operator.CANCEL_CHANNEL`
            (this process's own too: its socket may hold the lease).
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        own_name: str,
        wake: Callable[[Iterable[str] | None], None],
        loop: asyncio.AbstractEventLoop,
        cancelled: Cancelled | None = None,
    ) -> None:
        self._connect = connect
        self._own = own_name
        self._wake = wake
        self._loop = loop
        self._cancelled = cancelled
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
                if self._cancelled is not None:
                    conn.execute(f"LISTEN {CANCEL_CHANNEL}")
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
                        if note.channel == CANCEL_CHANNEL:
                            self._notice(note.payload)
                            continue
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

    def _notice(self, payload: str) -> None:
        notice = parse_cancel_notice(payload)
        if notice is not None and self._cancelled is not None:
            self.received += 1
            self._loop.call_soon_threadsafe(self._cancelled, *notice)


def _connect() -> Any:
    wrapper = connections.create_connection("default")
    wrapper.ensure_connection()
    raw = wrapper.connection
    raw.autocommit = True
    return raw


def start_listener(
    wake: Callable[[Iterable[str] | None], None],
    own_name: str,
    loop: asyncio.AbstractEventLoop,
    cancelled: Cancelled | None = None,
) -> Listener:
    """Start a listener on Django's default (PostgreSQL) database."""
    listener = Listener(_connect, own_name, wake, loop, cancelled)
    listener.start()
    return listener


# -- SQLite: datagrams between processes on one machine ---------------------------


def wake_dir(using: str = "default") -> Path | None:
    """Where gateway processes on the SQLite file of Django database ``using`` listen,
    or None (not SQLite, or in memory)."""
    name = _wake_dir_name(using)
    return None if name is None else Path(name)


#: wake directories by (alias, database NAME): an enqueue looks its own up
#: on every commit, and the settings do not change under a running process
_wake_dirs: dict[tuple[str, str], str | None] = {}


def _wake_dir_name(using: str) -> str | None:
    db = connections[using]
    name = str(db.settings_dict.get("NAME") or "")
    key = (using, name)
    if key not in _wake_dirs:
        path: str | None = name + ".wake"
        if db.vendor != "sqlite" or not name or name == ":memory:" or name.startswith("file:"):
            path = None
        _wake_dirs[key] = path
    return _wake_dirs[key]


def listening(using: str = "default") -> list[str]:
    """The sockets (paths) of the gateway processes listening beside the SQLite
    file of Django database ``using``; empty if none, or not SQLite. (A socket
    whose process is gone is removed by the first datagram sent to it.)

    One directory read: a transaction on Django's connection reads it once,
    for both :func:`leave_checkpoints_to_gateways
    <gateway.engine.wal.leave_checkpoints_to_gateways>` and the wake-up after
    its commit (it was two globs, about a tenth of an enqueue's time).
    """
    directory = _wake_dir_name(using)
    if directory is None:
        return []
    try:
        with os.scandir(directory) as entries:
            return [entry.path for entry in entries if entry.name.endswith(".sock")]
    except OSError:  # no directory: no gateway process has listened there
        return []


#: A datagram line that announces a cancelled lease, not a queue to wake
#: (queue names never hold a space).
_CANCEL_LINE = "cancel "


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(
        self, wake: Callable[[Iterable[str] | None], None], cancelled: Cancelled | None
    ) -> None:
        self._wake = wake
        self._cancelled = cancelled

    def datagram_received(self, data: bytes, addr: Any) -> None:
        queues = set()
        for line in data.decode(errors="replace").split("\n"):
            if line.startswith(_CANCEL_LINE):
                notice = parse_cancel_notice(line.removeprefix(_CANCEL_LINE))
                if notice is not None and self._cancelled is not None:
                    self._cancelled(*notice)
            elif line:
                queues.add(line)
        if queues:
            self._wake(queues)


async def start_local_listener(
    wake: Callable[[Iterable[str] | None], None],
    cancelled: Cancelled | None = None,
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
            lambda: _Datagrams(wake, cancelled), local_addr=str(path), family=socket.AF_UNIX
        )
    except OSError as exc:
        log.warning("no cross-process wake-ups (%s)", exc)
        return None
    return transport


def announce_local(
    queues: Iterable[str], using: str = "default", peers: list[str] | None = None
) -> int:
    """Wake the pumps of ``queues`` in every gateway process on the SQLite file of
    Django database ``using`` (the one the messages were committed to).

    Args:
        peers: those processes' sockets, if the caller has just read them
            (:func:`listening`); read now otherwise.

    Returns how many processes were told. Never raises: a wake-up that cannot
    be sent only delays delivery until the next one.
    """
    if peers is None:
        peers = listening(using)
    return _send_local(peers, "\n".join(sorted(set(queues))), skip_own=True)


def announce_cancelled(queue: str, msg_id: str, receipt: str, using: str = "default") -> None:
    """Tell the worker socket holding ``receipt`` that its message was cancelled,
    after a cancel committed through Django connection ``using`` (the admin, a
    task's cancel: ``gateway.store.operator.cancel_message``).

    Runs when the caller's transaction commits (at once outside one). On
    SQLite: one datagram to every gateway process on the file, this one
    included (it may serve the admin and hold the socket). On PostgreSQL the
    cancel's own ``NOTIFY`` already told every process: nothing to do.
    Never raises.
    """
    if connections[using].vendor == "postgresql":
        return
    line = f"{_CANCEL_LINE}{queue} {msg_id} {receipt}"
    transaction.on_commit(lambda: _send_local(listening(using), line, skip_own=False), using=using)


def _send_local(peers: list[str], text: str, *, skip_own: bool) -> int:
    """Send ``text`` to the gateway processes listening at ``peers``."""
    payload = text.encode()
    if not peers or not payload:
        return 0
    own = f"{os.getpid()}.sock"
    sender = _sender()
    told = 0
    for peer in peers:
        if skip_own and os.path.basename(peer) == own:
            continue
        try:
            sender.sendto(payload, peer)
            told += 1
        except (ConnectionRefusedError, FileNotFoundError):
            with contextlib.suppress(OSError):
                os.unlink(peer)  # its process is gone
        except OSError:
            pass  # a full buffer: that process has wake-ups pending anyway
    return told


_senders = threading.local()


def _sender() -> socket.socket:
    """This thread's datagram socket for wake-ups (made once: not one per commit)."""
    sender: socket.socket | None = getattr(_senders, "socket", None)
    if sender is None:
        sender = _senders.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sender.setblocking(False)
    return sender
