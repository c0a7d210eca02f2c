"""The task worker: runs the ``django.tasks`` tasks that ``LeasecastBackend`` enqueued.

``python manage.py leasecast_worker`` (``gateway.management.commands``) is a
thin shell around :class:`TaskWorker`. The worker talks to the gateway only
(WebSockets through :class:`leasecast.Worker`, one socket per queue, and
``GET /api/queues/Q`` for the queue's ``max_deliveries``): it needs no access
to the database, only the project's code and settings, so it runs on any
machine that can reach a gateway.

A task's message (``gateway.host.tasks.task_message``) names the task by module
path; the worker looks it up in its registry (:class:`TaskRegistry`, made at
start from the ``tasks`` module of every installed app and the modules of the
``LEASECAST_TASK_MODULES`` setting) and calls ``task.func``. A message never
makes the worker import anything: whoever can enqueue on a task queue could
otherwise run any module's import-time code. Sync functions run on a pool
of ``concurrency`` threads, coroutine functions on the event loop, at most
``concurrency`` tasks at once across all its queues. Each attempt ends its
lease with the outcome (docs/protocol.md, Task outcomes), which the gateway
records in the task's result in the transaction that ends the lease:

========================================  =========================================
what happened                             what the worker sends
========================================  =========================================
the task returned a JSON value            ``ack``, SUCCESSFUL with ``return_value``
it returned something else                ``ack``, FAILED (the ``TypeError``)
it raised, deliveries < max_deliveries    ``nack`` after a backoff, READY + error
it raised, deliveries >= max_deliveries   ``ack``, FAILED + error
the task is not in the registry           ``ack``, FAILED + the cause, no retry
the body is not a task message            ``reject`` (dead-lettered), a log line
========================================  =========================================

The pure part (:class:`TaskMessage`, :class:`RetryPolicy`, :func:`succeeded`,
:func:`failed`, :func:`unrunnable`, :func:`refused`) decides; :class:`TaskWorker`
does the I/O around it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures.thread
import contextlib
import functools
import importlib
import inspect
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from traceback import format_exception
from typing import Any, Literal, TypeAlias, TypedDict
from urllib.parse import quote

import orjson
from leasecast import Delivery, Worker, backoff_delays, http_get

from gateway.core.errors import (
    Backpressure,
    ConnectionClosed,
    LeasecastError,
    ProtocolError,
    StaleReceipt,
    Unavailable,
)

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
    "error_of",
    "failed",
    "refused",
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
#: Longest task id (``gateway.core.protocol.MAX_TASK_ID``) and module path the worker accepts.
MAX_TASK_ID = 64
MAX_TASK_PATH = 400
#: How much of an original traceback a refused outcome keeps.
_KEPT_TRACEBACK = 8 * 1024


# -- the task message ---------------------------------------------------------------


class NotATask(ValueError):
    """A message body that is not a task message (``gateway.host.tasks.task_message``)."""


@dataclass(frozen=True, slots=True)
class TaskMessage:
    """The body of a task's queue message: what the worker needs to run it.

    Attributes:
        task_path: the module path of the task (``myapp.tasks.send_email``).
        result_id: the id of the task's result (``TaskRecord``).
        args, kwargs: the call's arguments, as JSON.
        takes_context: whether the task was enqueued as taking a context
            (the imported task's own flag is what counts when it runs).
    """

    task_path: str
    result_id: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    takes_context: bool = False

    @classmethod
    def parse(cls, body: Any) -> TaskMessage:
        """Read a message body.

        Raises:
            NotATask: the body is not an object of the task message's shape.
        """
        if not isinstance(body, dict):
            raise NotATask(f"the body is a JSON {type(body).__name__}, not a task object")
        path, result_id = body.get("task"), body.get("id")
        if not isinstance(path, str) or not 1 <= len(path) <= MAX_TASK_PATH:
            raise NotATask(f"'task' must be a module path of 1-{MAX_TASK_PATH} characters")
        if not isinstance(result_id, str) or not 1 <= len(result_id) <= MAX_TASK_ID:
            raise NotATask(f"'id' must be a result id of 1-{MAX_TASK_ID} characters")
        args = body.get("args", [])
        kwargs = body.get("kwargs", {})
        takes_context = body.get("takes_context", False)
        if not isinstance(args, list):
            raise NotATask("'args' must be a list")
        if not isinstance(kwargs, dict):
            raise NotATask("'kwargs' must be an object")
        if not isinstance(takes_context, bool):
            raise NotATask("'takes_context' must be true or false")
        return cls(path, result_id, args, kwargs, takes_context)


# -- outcomes -----------------------------------------------------------------------


class TaskErrorJSON(TypedDict):
    """A failed attempt's error, as ``django.tasks.TaskError`` holds it."""

    exception_class_path: str
    traceback: str


Status: TypeAlias = Literal["SUCCESSFUL", "FAILED", "READY"]


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run of a task: who, when, and which delivery of its message it is."""

    result_id: str
    worker_id: str
    started_at: float
    deliveries: int

    def outcome(
        self, status: Status, *, error: TaskErrorJSON | None = None, **value: Any
    ) -> dict[str, Any]:
        """The ``task`` object of an ack or nack (docs/protocol.md, Task outcomes).

        ``return_value=...`` adds the return value (absent when not given).
        """
        outcome: dict[str, Any] = {
            "id": self.result_id,
            "status": status,
            "worker_id": self.worker_id,
            "started_at": self.started_at,
        }
        if "return_value" in value:
            outcome["return_value"] = value["return_value"]
        if error is not None:
            outcome["error"] = error
        return outcome


@dataclass(frozen=True, slots=True)
class Ack:
    """End the lease with ``ack`` carrying ``outcome`` (SUCCESSFUL or FAILED).

    ``fallback`` marks the replacement of an outcome the gateway refused.
    """

    outcome: dict[str, Any]
    fallback: bool = False


@dataclass(frozen=True, slots=True)
class Nack:
    """End the lease with ``nack``: visible again after ``delay``; ``outcome`` is READY."""

    delay: float
    outcome: dict[str, Any] | None
    fallback: bool = False


@dataclass(frozen=True, slots=True)
class Reject:
    """Dead-letter the message (it is not a task this worker can record)."""

    reason: str


Settlement: TypeAlias = Ack | Nack | Reject


def error_of(exc: BaseException) -> TaskErrorJSON:
    """The error of a failed attempt: the exception's class path and full traceback.

    The traceback starts at the task's own code: the worker's frames above it
    (this module, the thread pool) say nothing about the failure.
    """
    kind = type(exc)
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None and _machinery(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return {
        "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
        "traceback": "".join(format_exception(kind, exc, tb)),
    }


#: Source files of the worker's own machinery, left out at the top of tracebacks.
_MACHINERY = frozenset({__file__, concurrent.futures.thread.__file__})


def _machinery(filename: str) -> bool:
    return filename in _MACHINERY


def to_json(value: Any) -> Any:
    """``value`` as plain JSON, normalised as ``django.tasks`` does for results.

    Mappings become objects (keys as JSON writes them: ``1`` -> ``"1"``),
    other sequences lists, ``bytes`` UTF-8 text.

    Raises:
        TypeError: a value of a type JSON does not have (a ``datetime``, a
            model instance, an integer beyond 64 bits, ...).
        ValueError: ``bytes`` that are not UTF-8.
    """
    normal = _normalise(value)
    try:
        return orjson.loads(orjson.dumps(normal, option=orjson.OPT_NON_STR_KEYS))
    except orjson.JSONEncodeError as exc:  # a subclass of TypeError: keep it one
        raise TypeError(f"not JSON: {exc}") from exc


def _normalise(value: Any) -> Any:
    # The rules of django.tasks' normalize_json (Django 6 and django-tasks agree),
    # so that a result reads the same whichever backend stored it.
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, Mapping):
        return {_normalise(k): _normalise(v) for k, v in value.items()}
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError as exc:
            raise ValueError(f"bytes that are not UTF-8 are not JSON: {value[:20]!r}") from exc
    if isinstance(value, Sequence):
        return [_normalise(v) for v in value]
    raise TypeError(f"a {type(value).__module__}.{type(value).__qualname__} is not JSON")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When a failed attempt is retried, and after how long (exponential backoff).

    The n-th delivery's failure is retried after ``base * 2**(n-1)`` seconds,
    at most ``cap``, unless it was the queue's last allowed delivery.

    Args:
        base: the delay after the first failed attempt, in seconds.
        cap: the longest delay, in seconds.
    """

    base: float = 1.0
    cap: float = 300.0

    def delay(self, deliveries: int) -> float:
        """Seconds before the next attempt, after the failure of delivery ``deliveries``."""
        exponent = max(0, deliveries - 1)
        if exponent >= 64:  # 2**64 * base is past any cap
            return self.cap
        return float(min(self.cap, self.base * 2**exponent))

    def retries(self, deliveries: int, max_deliveries: int | None) -> bool:
        """Whether the failure of delivery ``deliveries`` is retried.

        Args:
            deliveries: this delivery's count (1 for the first).
            max_deliveries: the queue's limit (0 = unlimited); None when the
                worker could not read it: retry, the next failure asks again.
        """
        if max_deliveries is None or max_deliveries <= 0:
            return True
        return deliveries < max_deliveries


def succeeded(attempt: Attempt, value: Any) -> Ack:
    """The settlement of an attempt that returned ``value``.

    A value that is not JSON makes the task FAILED (no retry: the same code
    returns the same kind of value), its error the ``TypeError`` that says so.
    """
    try:
        normal = to_json(value)
    except (TypeError, ValueError) as exc:
        try:
            raise type(exc)(f"the task's return value is not JSON: {exc}") from exc
        except (TypeError, ValueError) as named:
            return Ack(attempt.outcome("FAILED", error=error_of(named)))
    return Ack(attempt.outcome("SUCCESSFUL", return_value=normal))


def failed(
    attempt: Attempt,
    error: TaskErrorJSON,
    *,
    max_deliveries: int | None,
    policy: RetryPolicy = RetryPolicy(),
) -> Ack | Nack:
    """The settlement of an attempt that raised: a retry, or FAILED at the last delivery.

    Acking FAILED on the last allowed delivery (rather than nacking) records the
    failure: a nacked message past ``max_deliveries`` would be dead-lettered by
    the gateway with nobody left to record its result.
    """
    if policy.retries(attempt.deliveries, max_deliveries):
        return Nack(policy.delay(attempt.deliveries), attempt.outcome("READY", error=error))
    return Ack(attempt.outcome("FAILED", error=error))


def unrunnable(attempt: Attempt, error: TaskErrorJSON) -> Ack:
    """The settlement of a task that cannot run here (not registered): FAILED, no retry."""
    return Ack(attempt.outcome("FAILED", error=error))


def refused(settlement: Ack | Nack, exc: ProtocolError) -> Settlement:
    """What to send after the gateway refused ``settlement``'s outcome.

    A return value over the gateway's body limit (``too_large``) is the usual
    cause. The fallback keeps the kind of settlement (an ack stays an ack,
    with status FAILED; a nack stays a nack, READY) with an error naming the
    refusal and the start of the original error. A fallback that was itself
    refused ends in :class:`Reject` (an ack) or a nack without outcome, so a
    message is never stuck.
    """
    outcome = settlement.outcome
    if outcome is None or settlement.fallback:
        if isinstance(settlement, Ack):
            return Reject(f"the gateway refused the task's outcome twice: {exc.detail}")
        return Nack(settlement.delay, None)
    text = f"the gateway refused this attempt's outcome ({exc.code}): {exc.detail}\n"
    original = outcome.get("error")
    if original is not None:
        kept = original["traceback"][:_KEPT_TRACEBACK]
        text += f"\nthe attempt's own error, {original['exception_class_path']}:\n{kept}"
    error: TaskErrorJSON = {
        "exception_class_path": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "traceback": text,
    }
    fallback = {k: v for k, v in outcome.items() if k not in ("return_value", "error")}
    fallback["error"] = error
    if isinstance(settlement, Ack):
        return Ack({**fallback, "status": "FAILED"}, fallback=True)
    return Nack(settlement.delay, fallback, fallback=True)


def split_prefetch(concurrency: int, queues: int) -> list[int]:
    """Each queue's socket ``prefetch``: ``concurrency`` leases in all when possible.

    A worker never holds more leases than it can run, so messages do not wait
    in one worker while another idles; with more queues than ``concurrency``
    each socket still needs one (the extra held messages wait their turn with
    their leases extended).
    """
    if queues <= 0:
        return []
    share, extra = divmod(concurrency, queues)
    return [max(1, share + (1 if i < extra else 0)) for i in range(queues)]


# -- loading tasks ------------------------------------------------------------------


#: The Django setting that names task modules beyond the installed apps' ``tasks``.
TASK_MODULES_SETTING = "LEASECAST_TASK_MODULES"


class UnregisteredTask(LookupError):
    """A message names a task that is not in the worker's registry (nothing was imported)."""


# A task result stores the error's class path (docs/tasks.md, the outcomes
# table): it stays the public path, ``gateway.task_worker``, where it resolves.
UnregisteredTask.__module__ = "gateway.task_worker"


class TaskRegistry:
    """The ``django.tasks`` tasks a worker runs, by module path (protocol 1.2, Tasks).

    Made once, at start: the worker imports the modules it is told of and
    keeps every ``Task`` they hold, under the path a message names it by
    (``task.module_path``, which :func:`gateway.host.tasks.task_message` writes). A
    lookup never imports: a message naming anything else is refused.

    Args:
        tasks: module path -> task.
        modules: the modules the tasks were collected from, in import order.
    """

    def __init__(self, tasks: Mapping[str, Any], modules: Sequence[str]) -> None:
        self._tasks = dict(tasks)
        self.modules = tuple(modules)

    @classmethod
    def of_modules(cls, names: Iterable[str]) -> TaskRegistry:
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
        return cls(tasks, modules)

    @classmethod
    def discover(cls) -> TaskRegistry:
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
        registry = cls({}, [])
        for name in [*names, *listed]:
            try:
                found = cls.of_modules([name])
            except Exception as exc:
                origin = f"listed in {TASK_MODULES_SETTING}" if name in listed else "an app's tasks"
                raise ImproperlyConfigured(
                    f"cannot import {name} ({origin}) for the task registry "
                    f"(the worker imports the installed apps' tasks modules and "
                    f"{TASK_MODULES_SETTING}): {type(exc).__name__}: {exc}"
                ) from exc
            registry = registry.merged(found)
        return registry

    def merged(self, other: TaskRegistry) -> TaskRegistry:
        """This registry and ``other``'s tasks and modules."""
        modules = [*self.modules, *(m for m in other.modules if m not in self.modules)]
        return TaskRegistry({**self._tasks, **other._tasks}, modules)

    def get(self, path: str) -> Any:
        """The task a message names by ``path``.

        Raises:
            UnregisteredTask: no registered module holds it; nothing is imported.
        """
        found = self._tasks.get(path)
        if found is None:
            raise UnregisteredTask(
                f"{path!r} is not a registered task of this worker: it runs only the "
                "django.tasks tasks of the installed apps' tasks modules and of "
                f"{TASK_MODULES_SETTING} (nothing was imported)"
            )
        return found

    def __contains__(self, path: object) -> bool:
        return path in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)


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
        grace: seconds running tasks may take to finish after :meth:`stop`.
        policy: the retry backoff.
        worker_id: recorded with each attempt (default ``host:pid``).
        registry: the tasks it runs (default :meth:`TaskRegistry.discover`,
            which needs Django's settings).
        settings_ttl: seconds a queue's ``max_deliveries`` is cached.
        backoff_initial, backoff_max: reconnect backoff of the sockets.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str,
        queues: Sequence[str],
        concurrency: int = DEFAULT_CONCURRENCY,
        grace: float = DEFAULT_GRACE,
        policy: RetryPolicy = RetryPolicy(),
        worker_id: str | None = None,
        registry: TaskRegistry | None = None,
        # -- the gateway
        settings_ttl: float = 60.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
    ) -> None:
        if not queues:
            raise ValueError("a task worker needs at least one queue")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.url = url
        self.queues = list(dict.fromkeys(queues))
        self.concurrency = concurrency
        self.grace = grace
        self.policy = policy
        self.worker_id = worker_id or default_worker_id()
        self.registry = registry if registry is not None else TaskRegistry.discover()
        self._token = token
        self._settings_ttl = settings_ttl
        self._backoff = (backoff_initial, backoff_max)
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="leasecast-task")
        self._slots: asyncio.Semaphore | None = None
        self._stopping: asyncio.Event | None = None
        self._hurry: asyncio.Event | None = None
        self._max_deliveries: dict[str, tuple[float, int]] = {}
        #: message id -> the result of its run in progress here: (raised, value or exception)
        self._runs: dict[str, asyncio.Future[tuple[bool, Any]]] = {}
        #: handler tasks per queue (a delivery from receipt to its settlement)
        self._handlers: dict[str, set[asyncio.Task[None]]] = {q: set() for q in self.queues}
        #: handlers still running when the grace ran out (their leases were released)
        self.abandoned = 0

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
                self.queues, split_prefetch(self.concurrency, len(self.queues)), strict=True
            )
        ]
        log.info(
            "worker %s: queues %s, concurrency %d, gateway %s; %d task(s) registered from %s",
            self.worker_id,
            ", ".join(self.queues),
            self.concurrency,
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
        """Run one delivery's task and end its lease; never raises (logs instead)."""
        keeper = asyncio.create_task(self._keep_lease(delivery))
        try:
            settlement = await self._attempt(delivery)
            if settlement is not None:
                await self._settle(delivery, settlement)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("message %s of queue %s: the worker failed", delivery.id, delivery.queue)
        finally:
            keeper.cancel()

    async def _attempt(self, delivery: Delivery) -> Settlement | None:
        """The settlement of one delivery, or None if it must not be ended (stopping)."""
        try:
            message = TaskMessage.parse(delivery.body)
        except NotATask as exc:
            log.error(
                "message %s of queue %s is not a task (%s): dead-lettered",
                delivery.id,
                delivery.queue,
                exc,
            )
            return Reject(str(exc))
        slots, stopping, _ = self._events()
        async with slots:
            if stopping.is_set():
                return None  # never started: the closing socket releases it
            attempt = Attempt(message.result_id, self.worker_id, time.time(), delivery.deliveries)
            try:
                task = self.registry.get(message.task_path)
            except UnregisteredTask as exc:
                log.error("task %s [%s] FAILED: %s", message.task_path, message.result_id, exc)
                return unrunnable(attempt, error_of(exc))
            log.info(
                "task %s [%s] started (queue %s, delivery %d)",
                message.task_path,
                message.result_id,
                delivery.queue,
                delivery.deliveries,
            )
            result = await self._result(delivery, task, message, attempt)
        if result is None:
            return None
        raised, value = result
        took = time.time() - attempt.started_at
        if not raised:
            success = succeeded(attempt, value)
            if success.outcome["status"] == "SUCCESSFUL":
                log.info(
                    "task %s [%s] SUCCESSFUL in %.3fs",
                    message.task_path,
                    message.result_id,
                    took,
                )
            else:
                log.error(
                    "task %s [%s] FAILED in %.3fs: its return value is not JSON",
                    message.task_path,
                    message.result_id,
                    took,
                )
            return success
        error = error_of(value)
        limit = await self.max_deliveries(delivery.queue)
        settlement = failed(attempt, error, max_deliveries=limit, policy=self.policy)
        if isinstance(settlement, Nack):
            log.warning(
                "task %s [%s] raised %s: %s (delivery %d of %s); retrying in %gs",
                message.task_path,
                message.result_id,
                error["exception_class_path"],
                value,
                delivery.deliveries,
                "?" if limit is None else (limit or "unlimited"),
                settlement.delay,
            )
        else:
            log.error(
                "task %s [%s] FAILED after %d deliveries: %s: %s",
                message.task_path,
                message.result_id,
                delivery.deliveries,
                error["exception_class_path"],
                value,
            )
        return settlement

    async def _result(
        self, delivery: Delivery, task: Any, message: TaskMessage, attempt: Attempt
    ) -> tuple[bool, Any] | None:
        """Run the task: ``(raised, value or exception)``.

        A socket that dropped and came back gets the messages its old socket
        held delivered again (the gateway released them). If such a message's
        task is still running here, its result settles the new delivery
        instead of a second run (None if that run was abandoned).
        """
        running = self._runs.get(delivery.id)
        if running is not None:
            log.info(
                "task %s [%s]: delivered again while still running here; adopting that run",
                message.task_path,
                message.result_id,
            )
            try:
                return await asyncio.shield(running)
            except asyncio.CancelledError:
                if _cancelling():
                    raise
                return None
        done: asyncio.Future[tuple[bool, Any]] = asyncio.get_running_loop().create_future()
        self._runs[delivery.id] = done
        try:
            try:
                outcome: tuple[bool, Any] = (False, await self._call(task, message, attempt))
            except asyncio.CancelledError as exc:
                if _cancelling():
                    raise  # this worker gave up on it (the grace ran out)
                outcome = (True, exc)  # the task's own code was cancelled
            except BaseException as exc:
                outcome = (True, exc)
            done.set_result(outcome)
            return outcome
        finally:
            if not done.done():
                done.cancel()
            if self._runs.get(delivery.id) is done:
                del self._runs[delivery.id]

    async def _call(self, task: Any, message: TaskMessage, attempt: Attempt) -> Any:
        args = list(message.args)
        if task.takes_context:
            args.insert(0, context_for(task, message, attempt))
        func = task.func
        if inspect.iscoroutinefunction(func):
            return await func(*args, **message.kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, functools.partial(_call_sync, func, args, message.kwargs)
        )

    # -- talking to the gateway

    async def max_deliveries(self, queue: str) -> int | None:
        """The queue's ``max_deliveries`` (0 = unlimited), cached; None if unreadable."""
        now = time.monotonic()
        cached = self._max_deliveries.get(queue)
        if cached is not None and now - cached[0] < self._settings_ttl:
            return cached[1]
        path = f"/api/queues/{quote(queue, safe='')}"
        try:
            doc = await asyncio.to_thread(http_get, self.url, path, self._token, 10.0)
            value = int(doc["max_deliveries"])
        except (LeasecastError, KeyError, TypeError, ValueError) as exc:
            log.warning("cannot read max_deliveries of queue %s: %s", queue, exc)
            return cached[1] if cached is not None else None
        self._max_deliveries[queue] = (now, value)
        return value

    async def _settle(self, delivery: Delivery, settlement: Settlement) -> None:
        """End the lease as decided; retry transient refusals, fall back on final ones."""
        for _ in range(3):  # the outcome, its fallback, the fallback's fallback
            try:
                await self._send(delivery, settlement)
                return
            except (StaleReceipt, ConnectionClosed) as exc:
                log.warning(
                    "message %s of queue %s: its lease was lost before it ended (%s); "
                    "the message will be delivered again",
                    delivery.id,
                    delivery.queue,
                    exc,
                )
                return
            except ProtocolError as exc:
                if isinstance(settlement, Reject):
                    log.error("message %s: reject refused: %s", delivery.id, exc)
                    return
                log.error(
                    "message %s of queue %s: the gateway refused the outcome: %s",
                    delivery.id,
                    delivery.queue,
                    exc,
                )
                settlement = refused(settlement, exc)

    async def _send(self, delivery: Delivery, settlement: Settlement) -> None:
        """Send the settlement, retrying ``unavailable`` and ``backpressure`` a few times."""
        delays = backoff_delays(0.2, 2.0)
        for attempt in range(5):
            try:
                if isinstance(settlement, Ack):
                    await delivery.ack(task=settlement.outcome)
                elif isinstance(settlement, Nack):
                    await delivery.nack(settlement.delay, task=settlement.outcome)
                else:
                    await delivery.reject()
                return
            except (Unavailable, Backpressure):
                if attempt == 4:
                    raise
                await asyncio.sleep(next(delays))

    async def _keep_lease(self, delivery: Delivery) -> None:
        """Extend the lease every half lease while the delivery is held."""
        lease = max(1.0, delivery.expires_in)
        while True:
            await asyncio.sleep(lease / 2)
            try:
                await delivery.extend(lease)
            except (StaleReceipt, ConnectionClosed):
                return  # ended elsewhere, or the socket dropped: nothing left to keep
            except ProtocolError as exc:
                log.warning("message %s: cannot extend its lease: %s", delivery.id, exc)
                return


def _cancelling() -> bool:
    """Whether the running asyncio task itself is being cancelled (not just its callee)."""
    current = asyncio.current_task()
    return current is not None and current.cancelling() > 0
