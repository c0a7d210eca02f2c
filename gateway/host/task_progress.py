"""A running task's link to its page: ``progress()``, ``cancelled()`` and the task topic.

Inside a task run by ``manage.py leasecast_worker``, :func:`progress` publishes
``{"status": "RUNNING", "progress": DATA}`` to the topic ``task.RESULT_ID``
(protocol 1.2, Tasks: Progress) over the worker's own gateway connection (a
producer socket; the worker needs no database), and the worker publishes the
outcome there when the task ends. :func:`cancelled` tells a sync task that
its message was cancelled (protocol 1.2, Cancel).

Outside a worker (a task run by another backend, a test, a shell) there is
no task topic: :func:`progress` does nothing and :func:`cancelled` is False,
so a task's code runs the same everywhere.

The task's run is found through a context variable the worker sets for it
(copied into the pool thread of a sync task), so concurrent tasks never see
each other's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from contextvars import ContextVar
from typing import Any

from leasecast import Producer

from gateway.core.errors import ConnectionClosed, Forbidden, LeasecastError
from gateway.core.task_decisions import progress_update, task_topic, to_json

__all__ = [
    "MAX_WAITING",
    "RunLink",
    "TaskFeed",
    "TopicPublisher",
    "cancelled",
    "current_run",
    "progress",
]

log = logging.getLogger("leasecast.worker")

#: Updates of one task waiting to be published, at most (the oldest go first).
MAX_WAITING = 1000


class TopicPublisher:
    """The worker's one producer socket, for its tasks' topics (opened on first use).

    Publishing is best effort: a refusal or a dropped connection is logged and
    the update is lost (the task's result, recorded with its ack, is what
    counts); the next publish reconnects. A token without ``publish`` on
    ``task.*`` is warned about once, then nothing more is tried.

    Args:
        url: the gateway.
        token: the worker's token (``publish:task.*`` besides its ``consume``).
    """

    def __init__(self, url: str, token: str) -> None:
        self._producer = Producer(url, token=token)
        self._forbidden = False

    async def publish(self, topic: str, body: Any) -> bool:
        """Publish ``body`` to ``topic``; True if the gateway took it."""
        if self._forbidden:
            return False
        for tries in (1, 2):
            try:
                await self._producer.publish(topic, body)
                return True
            except Forbidden as exc:
                self._forbidden = True
                log.warning(
                    "cannot publish task progress (%s): give the worker's token "
                    "publish:task.* to show tasks' progress and outcomes on their topics",
                    exc,
                )
                return False
            except ConnectionClosed as exc:
                if tries == 2:
                    log.warning("cannot publish to %s: %s", topic, exc)
            except LeasecastError as exc:
                log.warning("cannot publish to %s: %s", topic, exc)
                return False
        return False

    async def close(self) -> None:
        """Close the socket."""
        with contextlib.suppress(LeasecastError):
            await self._producer.close()


class TaskFeed:
    """One run's updates to its topic, published in order on the worker's loop.

    Each update is published, one after the other. A task that reports far
    faster than the gateway answers has at most :data:`MAX_WAITING` updates
    waiting; past that the oldest waiting one is dropped (the topic keeps
    the last 100 anyway, and a page shows the latest). The outcome goes last.

    Args:
        publisher: the worker's publisher.
        result_id: the task's result id (its topic is ``task.RESULT_ID``).
    """

    def __init__(self, publisher: TopicPublisher, result_id: str) -> None:
        self._publisher = publisher
        self.topic = task_topic(result_id)
        self._waiting: deque[Any] = deque(maxlen=MAX_WAITING)
        self._sending: asyncio.Task[None] | None = None
        self.published = 0

    def put(self, body: Any) -> None:
        """Publish ``body`` after the updates before it (call on the loop's thread)."""
        self._waiting.append(body)
        if self._sending is None or self._sending.done():
            self._sending = asyncio.ensure_future(self._send())

    async def _send(self) -> None:
        while self._waiting:
            if await self._publisher.publish(self.topic, self._waiting.popleft()):
                self.published += 1

    async def finish(self, body: Any) -> None:
        """Publish the final ``body`` after every update put before it."""
        self._waiting.append(body)
        while self._sending is not None and not self._sending.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self._sending)
        if self._waiting:
            self._sending = asyncio.ensure_future(self._send())
            await self._sending


class RunLink:
    """What a running task reaches through :func:`progress` and :func:`cancelled`.

    Args:
        feed: the run's topic feed.
        loop: the worker's event loop (progress from a pool thread is handed to it).
    """

    def __init__(self, feed: TaskFeed, loop: asyncio.AbstractEventLoop) -> None:
        self.feed = feed
        self.loop = loop
        #: set when the task's message is cancelled (read from any thread)
        self.cancel_flag = threading.Event()
        #: set on the loop when the gateway's cancel frame for the message arrives
        self.cancel_requested = asyncio.Event()

    def publish(self, body: Any) -> None:
        """Hand ``body`` to the feed from the loop or from any thread."""
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self.feed.put(body)
        else:
            # Ordered with the run's end: the pool thread's result reaches the
            # loop by the same call_soon_threadsafe queue, after this.
            with contextlib.suppress(RuntimeError):  # the loop closed: the worker is gone
                self.loop.call_soon_threadsafe(self.feed.put, body)


_current: ContextVar[RunLink | None] = ContextVar("leasecast_task_run", default=None)


def current_run() -> ContextVar[RunLink | None]:
    """The context variable the worker sets for each run (for the runner only)."""
    return _current


def progress(data: Any) -> None:
    """Publish ``{"status": "RUNNING", "progress": data}`` to this task's topic.

    Inside a task run by ``leasecast_worker`` only; anywhere else it does
    nothing. It does not wait for the gateway: updates are published in
    the order they were made, before the task's outcome.

    Args:
        data: any JSON value (normalised as a task's return value is).

    Raises:
        TypeError, ValueError: ``data`` is not JSON (also outside a worker,
            so a mistake shows wherever the task runs).
    """
    body = progress_update(to_json(data))
    run = _current.get()
    if run is not None:
        run.publish(body)


def cancelled() -> bool:
    """Whether this task's message was cancelled while it runs (protocol 1.2, Cancel).

    A sync task should check it now and then and return when it is true: the
    worker stops waiting for it after its grace. Always False outside a
    ``leasecast_worker`` run. (An ``async`` task is cancelled instead: it gets
    :class:`asyncio.CancelledError` at its next ``await``.)
    """
    run = _current.get()
    return run is not None and run.cancel_flag.is_set()
