"""The task worker's runner: runs the ``django.tasks`` tasks that ``LeasecastBackend`` enqueued.

``python manage.py leasecast_worker`` (``gateway.management.commands``) is a
thin shell around :class:`TaskWorker`. The worker talks to the gateway only
(WebSockets through :class:`leasecast.Worker`, one socket per queue, and
``GET /api/queues/Q`` for the queue's ``max_deliveries``): it needs no access
to the database, only the project's code and settings, so it runs on any
machine that can reach a gateway.

A task's message (``gateway.host.tasks.task_message``) names the task by module
path; the worker looks it up in its registry (:class:`TaskRegistry`, made at
start by :func:`discover_registry` from the ``tasks`` module of every
installed app and the modules of the ``LEASECAST_TASK_MODULES`` setting) and
calls ``task.func``. A message never makes the worker import anything:
whoever can enqueue on a task queue could otherwise run any module's
import-time code. Sync functions run on a pool of ``concurrency`` threads,
coroutine functions on the event loop, at most ``concurrency`` tasks at once
across all its queues. Each attempt ends its lease with the outcome
(docs/protocol.md, Task outcomes), which the gateway records in the task's
result in the transaction that ends the lease.

What to send for each run, and what to do when the gateway does not take it,
is decided by the pure rules of :mod:`gateway.core.task_decisions` (the table
of outcomes is there); this module is the I/O around them: sockets, the
thread pool, signals, the lease's keep-alive, the registry's imports and
Django. The pure names are re-exported here for code that imported them from
this module.
"""

from __future__ import annotations

import asyncio
import concurrent.futures.thread
import contextlib
import contextvars
import functools
import importlib
import inspect
import logging
import os
import signal
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

from leasecast import Delivery, Worker, backoff_delays, http_get

from gateway.conf import client_setting
from gateway.core.errors import ConnectionClosed, LeasecastError, ProtocolError, StaleReceipt
from gateway.core.task_decisions import (
    DEFAULT_PREFETCH_MULTIPLIER,
    MAX_TASK_ID,
    PREFETCH_SETTING,
    SETTLEMENTS,
    TASK_MODULES_SETTING,
    Abandoned,
    Ack,
    Attempt,
    CancelledRun,
    LeaseLost,
    LimitCache,
    Nack,
    NotATask,
    Raised,
    Reject,
    Resend,
    RetryPolicy,
    Returned,
    Run,
    Settlement,
    TaskMessage,
    TaskRegistry,
    UnregisteredTask,
    Unsent,
    after_send_error,
    cancelled_update,
    decide,
    error_of,
    failed,
    keep_alive_period,
    leases_held,
    outcome_update,
    refused,
    split_prefetch,
    succeeded,
    to_json,
    unrunnable,
)
from gateway.host.task_progress import RunLink, TaskFeed, TopicPublisher, current_run

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_GRACE",
    "Ack",
    "Attempt",
    "Nack",
    "NotATask",
    "Reject",
    "RetryPolicy",
    "Settlement",
    "TaskMessage",
    "TaskRegistry",
    "TaskWorker",
    "UnregisteredTask",
    "context_for",
    "default_worker_id",
    "discover_registry",
    "error_of",
    "failed",
    "prefetch_multiplier_setting",
    "refused",
    "registry_of_modules",
    "split_prefetch",
    "succeeded",
    "to_json",
    "unrunnable",
]

log = logging.getLogger("leasecast.worker")

#: Tasks run at once by default (sync ones on this many threads).
DEFAULT_CONCURRENCY = 4
#: Seconds running tasks get to finish after SIGTERM / SIGINT.
DEFAULT_GRACE = 30.0
#: The retry backoff of a worker not given one (1 s doubling up to 5 minutes).
DEFAULT_RETRY_POLICY = RetryPolicy()
#: Source files of the worker's own machinery, left out at the top of tracebacks.
MACHINERY = frozenset({__file__, concurrent.futures.thread.__file__})


# -- loading tasks ------------------------------------------------------------------


def registry_of_modules(names: Iterable[str]) -> TaskRegistry:
    """Import the modules ``names`` and collect their tasks.

    Raises:
        Exception: whatever importing a module raised.
    """
    from gateway.host.tasks import Task

    tasks: dict[str, Any] = {}
    modules: list[str] = []
    for name in dict.fromkeys(names):
        module = importlib.import_module(name)
        modules.append(name)
        for value in vars(module).values():
            if isinstance(value, Task):
                tasks[value.module_path] = value
    return TaskRegistry(tasks, modules)


def discover_registry() -> TaskRegistry:
    """The registry of this project: the installed apps' ``tasks`` modules, then
    those of ``LEASECAST_TASK_MODULES``.

    Raises:
        ImproperlyConfigured: the setting is not a list of module paths, or
            one of the modules cannot be imported (the cause is chained).
    """
    from django.apps import apps
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.utils.module_loading import module_has_submodule

    listed = getattr(settings, TASK_MODULES_SETTING, None) or []
    # A bare string (a common slip) is refused too, not read letter by letter.
    if not isinstance(listed, list | tuple) or not all(
        isinstance(name, str) and name for name in listed
    ):
        raise ImproperlyConfigured(
            f"{TASK_MODULES_SETTING} must be a list of module paths "
            f"(e.g. ['myapp.jobs']), got {listed!r}"
        )
    names = [
        f"{app.name}.tasks"
        for app in apps.get_app_configs()
        if module_has_submodule(app.module, "tasks")
    ]
    registry = TaskRegistry({}, [])
    for name in [*names, *listed]:
        try:
            found = registry_of_modules([name])
        except Exception as exc:
            origin = f"listed in {TASK_MODULES_SETTING}" if name in listed else "an app's tasks"
            raise ImproperlyConfigured(
                f"cannot import {name} ({origin}) for the task registry "
                f"(the worker imports the installed apps' tasks modules and "
                f"{TASK_MODULES_SETTING}): {type(exc).__name__}: {exc}"
            ) from exc
        registry = registry.merged(found)
    return registry


def prefetch_multiplier_setting() -> int:
    """``LEASECAST_WORKER_PREFETCH_MULTIPLIER``: the Django setting, else the
    environment variable of that name, else the default.

    Raises:
        ImproperlyConfigured: the value is not an int from 1 to 100.
    """
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    value: Any = getattr(settings, PREFETCH_SETTING, None) if settings.configured else None
    if value is None:
        text = (client_setting(PREFETCH_SETTING) or "").strip()
        if not text:
            return DEFAULT_PREFETCH_MULTIPLIER
        value = int(text) if text.isdigit() else text
    try:
        leases_held(1, value)
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from exc
    return int(value)


def context_for(task: Any, message: TaskMessage, attempt: Attempt) -> Any:
    """The ``TaskContext`` a ``takes_context`` task receives (as ImmediateBackend builds it).

    ``task_result.attempt`` is the message's delivery count. The worker has no
    database, so the earlier attempts' worker ids are unknown: ``worker_ids``
    holds empty strings for them, then this worker's id.
    """
    from gateway.host.tasks import TaskResult, TaskResultStatus, _tasks_api, to_datetime

    task_context = _tasks_api()[1].TaskContext
    started = to_datetime(attempt.started_at)
    result = TaskResult(
        task=task,
        id=message.result_id,
        status=TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=started,
        finished_at=None,
        last_attempted_at=started,
        args=message.args,
        kwargs=message.kwargs,
        backend=task.backend,
        errors=[],
        worker_ids=[""] * (attempt.deliveries - 1) + [attempt.worker_id],
    )
    return task_context(task_result=result)


def _call_sync(func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Run a sync task on a pool thread, with Django's connection hygiene around it."""
    from django.db import close_old_connections

    close_old_connections()  # as Django does around a request
    try:
        return func(*args, **kwargs)
    finally:
        close_old_connections()


def default_worker_id() -> str:
    """``host:pid``, at most 64 characters."""
    return f"{socket.gethostname()[:50]}:{os.getpid()}"[:MAX_TASK_ID]


# -- the worker ---------------------------------------------------------------------


class TaskWorker:
    """Consumes task queues and runs their tasks (see the module docstring).

    Args:
        url: the gateway, ``http://host:port``.
        token: a token with ``consume`` on every queue.
        queues: the queues to consume (at least one).
        concurrency: most tasks running at once, across queues; also the
            number of threads for sync tasks.
        prefetch_multiplier: the worker holds up to ``prefetch_multiplier`` x
            ``concurrency`` leases (messages waiting here for a free slot
            have their leases extended); default the
            ``LEASECAST_WORKER_PREFETCH_MULTIPLIER`` setting, else
            :data:`~gateway.core.task_decisions.DEFAULT_PREFETCH_MULTIPLIER`.
            1: no more leases than it runs.
        grace: seconds running tasks may take to finish after :meth:`stop`.
        policy: the retry backoff.
        worker_id: recorded with each attempt (default ``host:pid``).
        registry: the tasks it runs (default :func:`discover_registry`,
            which needs Django's settings).

    Raises:
        ValueError: no queue, or a concurrency or multiplier out of range.
        ImproperlyConfigured: the registry's modules or the multiplier
            setting (see :func:`discover_registry`, :func:`prefetch_multiplier_setting`).
        settings_ttl: seconds a queue's ``max_deliveries`` is cached.
        backoff_initial, backoff_max: reconnect backoff of the sockets.
        publisher: publishes to the tasks' topics (default: a producer
            socket to ``url`` with ``token``, which needs ``publish:task.*``).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str,
        queues: Sequence[str],
        concurrency: int = DEFAULT_CONCURRENCY,
        prefetch_multiplier: int | None = None,
        grace: float = DEFAULT_GRACE,
        policy: RetryPolicy = DEFAULT_RETRY_POLICY,
        worker_id: str | None = None,
        registry: TaskRegistry | None = None,
        # -- the gateway
        settings_ttl: float = 60.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        publisher: TopicPublisher | None = None,
    ) -> None:
        if not queues:
            raise ValueError("a task worker needs at least one queue")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.url = url
        self.queues = list(dict.fromkeys(queues))
        self.concurrency = concurrency
        if prefetch_multiplier is None:
            prefetch_multiplier = prefetch_multiplier_setting()
        #: the leases held at most, across queues (running and waiting for a slot)
        self.prefetch = leases_held(concurrency, prefetch_multiplier)
        self.grace = grace
        self.policy = policy
        self.worker_id = worker_id or default_worker_id()
        self.registry = registry if registry is not None else discover_registry()
        self._token = token
        self._backoff = (backoff_initial, backoff_max)
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="leasecast-task")
        self._slots: asyncio.Semaphore | None = None
        self._stopping: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None
        self._limits = LimitCache(settings_ttl)
        #: message id -> its run in progress here
        self._runs: dict[str, _Running] = {}
        #: handler tasks per queue (a delivery from receipt to its settlement)
        self._handlers: dict[str, set[asyncio.Task[None]]] = {q: set() for q in self.queues}
        #: handlers still running when the grace ran out (their leases were
        #: released), and cancelled sync tasks whose threads were abandoned
        self.abandoned = 0
        #: the tasks' topics (progress and outcomes), over a producer socket of its own
        self._publisher = publisher or TopicPublisher(url, token)
        #: message id -> the feed of its task's topic, while handled here
        self._feeds: dict[str, TaskFeed] = {}
        #: message id -> how many handlers hold it here (2 while one adopts a run)
        self._handling: Counter[str] = Counter()

    # -- life cycle

    def _events(self) -> tuple[asyncio.Semaphore, asyncio.Event, asyncio.Event]:
        # Created on first use, on the loop that runs the worker.
        if self._slots is None or self._stopping is None or self._hurry is None:
            self._slots = asyncio.Semaphore(self.concurrency)
            self._stopping = asyncio.Event()
            self._hurry = asyncio.Event()
        return self._slots, self._stopping, self._hurry

    @property
    def stopping(self) -> bool:
        """True once :meth:`stop` was called."""
        return self._stopping is not None and self._stopping.is_set()

    def stop(self) -> None:
        """Take no new tasks; running ones get ``grace`` seconds. A second call: no grace."""
        _, stopping, hurry = self._events()
        if stopping.is_set():
            if not hurry.is_set():
                log.warning("stopping now: tasks still running are abandoned")
            hurry.set()
            return
        running = sum(len(h) for h in self._handlers.values())
        log.info(
            "stopping: no new tasks; %d held, running ones get up to %gs",
            running,
            self.grace,
        )
        stopping.set()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Consume until :meth:`stop` (or SIGTERM / SIGINT), then drain and return.

        Raises:
            LeasecastError: a refusal a reconnect cannot cure (bad token,
                forbidden queue); running tasks were given the grace first.
        """
        _, stopping, _ = self._events()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self.stop)
        workers = [
            Worker(
                self.url,
                queue,
                token=self._token,
                prefetch=prefetch,
                backoff_initial=self._backoff[0],
                backoff_max=self._backoff[1],
            )
            for queue, prefetch in zip(
                self.queues, split_prefetch(self.prefetch, len(self.queues)), strict=True
            )
        ]
        log.info(
            "worker %s: queues %s, concurrency %d (holding up to %d), gateway %s; "
            "%d task(s) registered from %s",
            self.worker_id,
            ", ".join(self.queues),
            self.concurrency,
            self.prefetch,
            self.url,
            len(self.registry),
            ", ".join(self.registry.modules) or "no module",
        )
        consumers = [asyncio.create_task(self._consume(w)) for w in workers]
        stop_waiter: asyncio.Task[Any] = asyncio.create_task(stopping.wait())
        failure: BaseException | None = None
        try:
            await asyncio.wait([*consumers, stop_waiter], return_when=asyncio.FIRST_COMPLETED)
            for consumer in consumers:
                if consumer.done() and not consumer.cancelled() and consumer.exception():
                    failure = consumer.exception()
                    log.error("cannot consume: %s", failure)
            if not stopping.is_set():
                self.stop()
        finally:
            for consumer in [*consumers, stop_waiter]:
                consumer.cancel()
            await asyncio.gather(*consumers, stop_waiter, return_exceptions=True)
            await self._drain(workers)
            for sig in signals:
                loop.remove_signal_handler(sig)
            await self._publisher.close()
            self._pool.shutdown(wait=False, cancel_futures=True)
        if failure is not None:
            raise failure
        log.info("worker %s stopped", self.worker_id)

    async def _drain(self, workers: list[Worker]) -> None:
        """Let running tasks finish within the grace, closing each socket when its queue is idle."""
        _, _, hurry = self._events()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace

        async def drain(worker: Worker) -> None:
            while not hurry.is_set():
                pending = [h for h in self._handlers[worker.queue] if not h.done()]
                remaining = deadline - loop.time()
                if not pending or remaining <= 0:
                    break
                hurried = asyncio.create_task(hurry.wait())
                await asyncio.wait(
                    [*pending, hurried], timeout=remaining, return_when=asyncio.FIRST_COMPLETED
                )
                hurried.cancel()
            left = [h for h in self._handlers[worker.queue] if not h.done()]
            if left:
                self.abandoned += len(left)
                log.warning(
                    "queue %s: %d task(s) did not finish within the grace; their messages "
                    "are released and will run again",
                    worker.queue,
                    len(left),
                )
                for handler in left:
                    handler.cancel()
                await asyncio.gather(*left, return_exceptions=True)
            # Closing releases whatever the socket still holds (deliveries that
            # never started) at once, for other workers (protocol: Worker socket).
            await worker.close()

        await asyncio.gather(*(drain(w) for w in workers))

    # -- consuming

    async def _consume(self, worker: Worker) -> None:
        """Connect (retrying while the gateway is unreachable), then handle each delivery."""
        _, stopping, _ = self._events()
        delays = backoff_delays(*self._backoff)
        while True:
            try:
                await worker.connect()
                break
            except ConnectionClosed as exc:
                delay = next(delays)
                log.warning(
                    "queue %s: cannot reach the gateway (%s); retrying in %.1fs",
                    worker.queue,
                    exc,
                    delay,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), delay)
                if stopping.is_set():
                    return
        log.info("queue %s: connected", worker.queue)
        handlers = self._handlers[worker.queue]
        async for delivery in worker:
            if stopping.is_set():
                # Not started, not ended: released when the socket closes. A
                # nack now would bring it straight back to this socket.
                continue
            handler = asyncio.create_task(self.handle(delivery))
            handlers.add(handler)
            handler.add_done_callback(handlers.discard)

    async def handle(self, delivery: Delivery) -> None:
        """Run one delivery's task and end its lease; never raises (logs instead).

        Once the gateway took the outcome (or the message was cancelled), the
        task's topic is told (protocol 1.2, Tasks: Progress).
        """
        keeper = asyncio.create_task(self._keep_lease(delivery))
        self._handling[delivery.id] += 1
        try:
            message, settlement, final = await self._attempt(delivery)
            if settlement is not None:
                taken = await self._settle(delivery, settlement)
                if isinstance(taken, Ack | Nack):
                    final = outcome_update(taken.outcome)
            if message is not None and final is not None:
                await self._feed(delivery.id, message).finish(final)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("message %s of queue %s: the worker failed", delivery.id, delivery.queue)
        finally:
            keeper.cancel()
            self._handling[delivery.id] -= 1
            if not self._handling[delivery.id]:
                # The last handler of the message here (a redelivery adopting a
                # run shares the run's feed, so the outcome follows its progress).
                del self._handling[delivery.id]
                self._feeds.pop(delivery.id, None)

    def _feed(self, message_id: str, message: TaskMessage) -> TaskFeed:
        """The feed of the task's topic (one per message while it is handled here)."""
        feed = self._feeds.get(message_id)
        if feed is None:
            feed = self._feeds[message_id] = TaskFeed(self._publisher, message.result_id)
        return feed

    async def _attempt(
        self, delivery: Delivery
    ) -> tuple[TaskMessage | None, Settlement | None, dict[str, Any] | None]:
        """The message, the settlement of one delivery (None if it must not be
        ended: stopping, or cancelled), and what its topic is told without a
        settlement (a cancelled task), if anything."""
        try:
            message = TaskMessage.parse(delivery.body)
        except NotATask as exc:
            log.error(
                "message %s of queue %s is not a task (%s): dead-lettered",
                delivery.id,
                delivery.queue,
                exc,
            )
            return None, Reject(str(exc)), None
        slots, stopping, _ = self._events()
        async with slots:
            if stopping.is_set():
                return message, None, None  # never started: the closing socket releases it
            if delivery.cancelled.is_set():
                detail = "the task was cancelled before it started"
                log.info(
                    "task %s [%s] cancelled before it started", message.task_path, message.result_id
                )
                return message, None, cancelled_update(detail)
            attempt = Attempt(message.result_id, self.worker_id, time.time(), delivery.deliveries)
            try:
                task = self.registry.get(message.task_path)
            except UnregisteredTask as exc:
                log.error("task %s [%s] FAILED: %s", message.task_path, message.result_id, exc)
                return message, unrunnable(attempt, error_of(exc, machinery=MACHINERY)), None
            log.info(
                "task %s [%s] started (queue %s, delivery %d)",
                message.task_path,
                message.result_id,
                delivery.queue,
                delivery.deliveries,
            )
            run = await self._result(delivery, task, message, attempt)
        if isinstance(run, CancelledRun):
            log.warning(
                "task %s [%s] CANCELLED: %s", message.task_path, message.result_id, run.detail
            )
            return message, None, cancelled_update(run.detail)
        # Only a failure needs the queue's limit: asked then, not for every task.
        limit = await self.max_deliveries(delivery.queue) if isinstance(run, Raised) else None
        settlement = decide(
            attempt, run, max_deliveries=limit, policy=self.policy, machinery=MACHINERY
        )
        if settlement is not None:
            _log_outcome(message, attempt, run, settlement, limit)
        return message, settlement, None

    async def _result(
        self, delivery: Delivery, task: Any, message: TaskMessage, attempt: Attempt
    ) -> Run:
        """Run the task: what it returned or raised, or that it was cancelled.

        A socket that dropped and came back gets the messages its old socket
        held delivered again (the gateway released them). If such a message's
        task is still running here, its result settles the new delivery
        instead of a second run (:class:`Abandoned` if that run was given up).
        A cancel of either delivery cancels the run.
        """
        running = self._runs.get(delivery.id)
        if running is not None:
            log.info(
                "task %s [%s]: delivered again while still running here; adopting that run",
                message.task_path,
                message.result_id,
            )
            watch = asyncio.create_task(_forward_cancel(delivery, running.link))
            try:
                adopted = await asyncio.shield(running.done)
                # A cancelled run is told on its topic by its own handler, once.
                return Abandoned() if isinstance(adopted, CancelledRun) else adopted
            except asyncio.CancelledError:
                if _cancelling():
                    raise
                return Abandoned()
            finally:
                watch.cancel()
        link = RunLink(self._feed(delivery.id, message), asyncio.get_running_loop())
        state = _Running(link, asyncio.get_running_loop().create_future())
        self._runs[delivery.id] = state
        watch = asyncio.create_task(_forward_cancel(delivery, link))
        try:
            run = await self._race(task, message, attempt, link)
            state.done.set_result(run)
            return run
        finally:
            watch.cancel()
            if not state.done.done():
                state.done.cancel()
            if self._runs.get(delivery.id) is state:
                del self._runs[delivery.id]

    async def _race(self, task: Any, message: TaskMessage, attempt: Attempt, link: RunLink) -> Run:
        """Run the task until it ends or its message is cancelled (protocol 1.2, Cancel).

        Cancelled, an ``async`` task is cancelled (``CancelledError`` at its
        next ``await``); a sync one sees ``cancelled()`` true and is waited
        for at most the grace, then abandoned (its thread cannot be stopped).
        """
        work = asyncio.ensure_future(self._call(task, message, attempt, link))
        cancel = asyncio.ensure_future(link.cancel_requested.wait())
        try:
            await asyncio.wait([work, cancel], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()  # this worker gave up on it (the grace ran out)
            raise
        finally:
            cancel.cancel()
        if not link.cancel_requested.is_set():
            return _ended(work)
        link.cancel_flag.set()
        is_async = inspect.iscoroutinefunction(task.func)
        if is_async:
            work.cancel()
        done, _ = await asyncio.wait([work], timeout=self.grace)
        if not done:
            work.add_done_callback(_forget)
            if not is_async:
                self._replace_pool()
            return CancelledRun(
                f"the task was cancelled and did not stop within the worker's grace "
                f"({self.grace:g}s): abandoned"
            )
        if not is_async and not work.cancelled():
            ended = _ended(work)
            how = "returned" if isinstance(ended, Returned) else "raised"
            return CancelledRun(f"the task was cancelled while it ran ({how} after the cancel)")
        return CancelledRun("the task was cancelled while it ran")

    def _replace_pool(self) -> None:
        """A new thread pool for the next sync tasks: an abandoned task's thread
        cannot be stopped and would hold a place of the old pool until it ends.
        The old pool's threads end with their tasks."""
        old = self._pool
        self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="leasecast-task")
        old.shutdown(wait=False)
        # Its thread would keep the interpreter from exiting (the command leaves
        # with os._exit when something was abandoned).
        self.abandoned += 1

    async def _call(self, task: Any, message: TaskMessage, attempt: Attempt, link: RunLink) -> Any:
        # Its own asyncio task: the context variable set here is this run's alone.
        current_run().set(link)
        args = list(message.args)
        if task.takes_context:
            args.insert(0, context_for(task, message, attempt))
        func = task.func
        if inspect.iscoroutinefunction(func):
            return await func(*args, **message.kwargs)
        loop = asyncio.get_running_loop()
        # The pool thread runs in a copy of this context, so progress() and
        # cancelled() find this run there too.
        context = contextvars.copy_context()
        return await loop.run_in_executor(
            self._pool, functools.partial(context.run, _call_sync, func, args, message.kwargs)
        )

    # -- talking to the gateway

    async def max_deliveries(self, queue: str) -> int | None:
        """The queue's ``max_deliveries`` (0 = unlimited), cached; None if unreadable."""
        now = time.monotonic()
        fresh = self._limits.fresh(queue, now)
        if fresh is not None:
            return fresh
        path = f"/api/queues/{quote(queue, safe='')}"
        try:
            doc = await asyncio.to_thread(http_get, self.url, path, self._token, 10.0)
            value = int(doc["max_deliveries"])
        except (LeasecastError, KeyError, TypeError, ValueError) as exc:
            log.warning("cannot read max_deliveries of queue %s: %s", queue, exc)
            return self._limits.unreadable(queue)
        return self._limits.read(queue, now, value)

    async def _settle(self, delivery: Delivery, settlement: Settlement) -> Settlement | None:
        """End the lease as decided; :func:`after_send_error` says what to do when
        the gateway does not take it (send again, fall back, or give up).

        Returns:
            The settlement the gateway took (the decided one or its fallback),
            or None if none was taken.
        """
        tried, sends = 1, 0
        delays = backoff_delays(0.2, 2.0)
        while True:
            sends += 1
            try:
                await self._send(delivery, settlement)
                return settlement
            except LeasecastError as exc:
                error = exc
                decision = after_send_error(settlement, exc, sends=sends)
            match decision:
                case Resend():
                    await asyncio.sleep(next(delays))
                case LeaseLost():
                    log.warning(
                        "message %s of queue %s: its lease was lost before it ended (%s); "
                        "the message will be delivered again",
                        delivery.id,
                        delivery.queue,
                        error,
                    )
                    return None
                case Unsent(reason):
                    log.error("message %s: %s", delivery.id, reason)
                    return None
                case _:
                    log.error(
                        "message %s of queue %s: the gateway refused the outcome: %s",
                        delivery.id,
                        delivery.queue,
                        error,
                    )
                    tried += 1
                    if tried > SETTLEMENTS:
                        return None
                    settlement, sends, delays = decision, 0, backoff_delays(0.2, 2.0)

    async def _send(self, delivery: Delivery, settlement: Settlement) -> None:
        """Send the settlement once."""
        if isinstance(settlement, Ack):
            await delivery.ack(task=settlement.outcome)
        elif isinstance(settlement, Nack):
            await delivery.nack(settlement.delay, task=settlement.outcome)
        else:
            await delivery.reject()

    async def _keep_lease(self, delivery: Delivery) -> None:
        """Extend the lease while the delivery is held (:func:`keep_alive_period`)."""
        every, lease = keep_alive_period(delivery.expires_in)
        while True:
            await asyncio.sleep(every)
            try:
                await delivery.extend(lease)
            except (StaleReceipt, ConnectionClosed):
                return  # ended elsewhere, or the socket dropped: nothing left to keep
            except ProtocolError as exc:
                log.warning("message %s: cannot extend its lease: %s", delivery.id, exc)
                return


def _log_outcome(
    message: TaskMessage, attempt: Attempt, run: Run, settlement: Settlement, limit: int | None
) -> None:
    """One line per finished attempt: what it did and what is sent for it."""
    path, result_id = message.task_path, message.result_id
    took = time.time() - attempt.started_at
    outcome = settlement.outcome if isinstance(settlement, Ack | Nack) else None
    if isinstance(run, Returned):
        if outcome is not None and outcome["status"] == "SUCCESSFUL":
            log.info("task %s [%s] SUCCESSFUL in %.3fs", path, result_id, took)
        else:
            log.error(
                "task %s [%s] FAILED in %.3fs: its return value is not JSON", path, result_id, took
            )
        return
    if not isinstance(run, Raised) or outcome is None:
        return
    kind = outcome["error"]["exception_class_path"]
    if isinstance(settlement, Nack):
        log.warning(
            "task %s [%s] raised %s: %s (delivery %d of %s); retrying in %gs",
            path,
            result_id,
            kind,
            run.exc,
            attempt.deliveries,
            "?" if limit is None else (limit or "unlimited"),
            settlement.delay,
        )
    else:
        log.error(
            "task %s [%s] FAILED after %d deliveries: %s: %s",
            path,
            result_id,
            attempt.deliveries,
            kind,
            run.exc,
        )


class _Running:
    """A run in progress here: its link (cancel, topic) and its result to come."""

    def __init__(self, link: RunLink, done: asyncio.Future[Run]) -> None:
        self.link = link
        self.done = done


async def _forward_cancel(delivery: Delivery, link: RunLink) -> None:
    """Tell the run when the gateway cancels the message held by ``delivery``."""
    await delivery.cancelled.wait()
    link.cancel_requested.set()


def _ended(work: asyncio.Future[Any]) -> Run:
    """How a finished task call ended."""
    if work.cancelled():
        return Raised(asyncio.CancelledError())  # the task's own code was cancelled
    exc = work.exception()
    return Returned(work.result()) if exc is None else Raised(exc)


def _forget(work: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned call's outcome (nobody waits for it any more)."""
    if not work.cancelled():
        work.exception()


def _cancelling() -> bool:
    """Whether the running asyncio task itself is being cancelled (not just its callee)."""
    current = asyncio.current_task()
    return current is not None and current.cancelling() > 0
