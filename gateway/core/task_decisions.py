"""What the task worker does with a message, a run and a refusal: the pure rules.

The decisions of the ``django.tasks`` task worker (``manage.py
leasecast_worker``), kept apart from the runner that does the I/O around them
(sockets, threads, signals, the lease's keep-alive, Django), as procrastinate
keeps its ``retry.py`` beside its ``worker.py``: values in, a decision out; no
thread, no socket, no clock of its own, no Django. Each attempt ends its
lease with the outcome (docs/protocol.md, Task outcomes):

========================================  =========================================
what happened                             what the worker sends
========================================  =========================================
the task returned a JSON value            ``ack``, SUCCESSFUL with ``return_value``
it returned something else                ``ack``, FAILED (the ``TypeError``)
it raised, deliveries < max_deliveries    ``nack`` after a backoff, READY + error
it raised, deliveries >= max_deliveries   ``ack``, FAILED + error
the task is not in the registry           ``ack``, FAILED + the cause, no retry
the body is not a task message            ``reject`` (dead-lettered), a log line
the grace ran out while it ran            nothing: the closing socket releases it
the message was cancelled                 nothing: the cancel ended the lease
========================================  =========================================

:func:`decide` makes that choice from a run's :data:`Run` (:class:`Returned`,
:class:`Raised`, :class:`Abandoned` or :class:`CancelledRun`);
:func:`after_send_error` says what to do when the gateway did not take the
settlement; :class:`LimitCache` when a queue's ``max_deliveries`` must be
asked again. What the task's topic ``task.RESULT_ID`` is told, and the rule
that keeps its history, are at the end (:func:`outcome_update`,
:func:`task_topic_settings`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from traceback import format_exception
from typing import Any, Literal, TypeAlias, TypedDict

import orjson

from gateway.core.errors import (
    Backpressure,
    ConnectionClosed,
    ProtocolError,
    StaleReceipt,
    Unavailable,
)
from gateway.core.history import DEFAULT_TOPIC_SETTINGS, TopicSettings

__all__ = [
    "CANCELLED_PATH",
    "DEFAULT_PREFETCH_MULTIPLIER",
    "MAX_PREFETCH_MULTIPLIER",
    "MAX_TASK_ID",
    "MAX_TASK_PATH",
    "PREFETCH_SETTING",
    "SEND_ATTEMPTS",
    "SETTLEMENTS",
    "TASK_MODULES_SETTING",
    "TASK_TOPIC_PREFIX",
    "TASK_TOPIC_SETTINGS",
    "Abandoned",
    "Ack",
    "Attempt",
    "CancelledRun",
    "LeaseLost",
    "LimitCache",
    "Nack",
    "NotATask",
    "Raised",
    "Reject",
    "Resend",
    "RetryPolicy",
    "Returned",
    "Run",
    "Settlement",
    "TaskErrorJSON",
    "TaskMessage",
    "TaskRegistry",
    "UnregisteredTask",
    "Unsent",
    "after_send_error",
    "cancelled_update",
    "decide",
    "error_line",
    "error_of",
    "failed",
    "keep_alive_period",
    "leases_held",
    "outcome_update",
    "progress_update",
    "refused",
    "split_prefetch",
    "succeeded",
    "task_topic",
    "task_topic_settings",
    "to_json",
    "unrunnable",
]

#: Longest task id (the protocol's ``MAX_TASK_ID``) and module path the worker accepts.
MAX_TASK_ID = 64
MAX_TASK_PATH = 400
#: The Django setting that names task modules beyond the installed apps' ``tasks``.
TASK_MODULES_SETTING = "LEASECAST_TASK_MODULES"
#: The Django setting of the worker's prefetch multiplier (:func:`leases_held`).
PREFETCH_SETTING = "LEASECAST_WORKER_PREFETCH_MULTIPLIER"
#: Leases a worker holds per task it can run, unless the setting says otherwise.
DEFAULT_PREFETCH_MULTIPLIER = 4
#: The largest multiplier taken.
MAX_PREFETCH_MULTIPLIER = 100
#: How much of an original traceback a refused outcome keeps.
_KEPT_TRACEBACK = 8 * 1024
#: Sends of one settlement while the gateway answers ``unavailable`` or ``backpressure``.
SEND_ATTEMPTS = 5
#: Settlements tried for one delivery: the outcome, its fallback, the fallback's fallback.
SETTLEMENTS = 3


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


# -- the registry -------------------------------------------------------------------


class UnregisteredTask(LookupError):
    """A message names a task that is not in the worker's registry (nothing was imported)."""


# A task result stores the error's class path (docs/tasks.md, the outcomes
# table): it stays the public path, ``gateway.task_worker``, where it resolves.
UnregisteredTask.__module__ = "gateway.task_worker"


class TaskRegistry:
    """The ``django.tasks`` tasks a worker runs, by module path (protocol 1.2, Tasks).

    Made once, at start, by the runner (which imports the modules it is told
    of): each task under the path a message names it by (``task.module_path``,
    which :func:`gateway.host.tasks.task_message` writes). A lookup never imports:
    a message naming anything else is refused, so whoever can enqueue on a
    task queue cannot make the worker run any module's import-time code.

    Args:
        tasks: module path -> task.
        modules: the modules the tasks were collected from, in import order.
    """

    def __init__(self, tasks: Mapping[str, Any], modules: Sequence[str]) -> None:
        self._tasks = dict(tasks)
        self.modules = tuple(modules)

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


def error_of(exc: BaseException, *, machinery: Collection[str] = ()) -> TaskErrorJSON:
    """The error of a failed attempt: the exception's class path and full traceback.

    Args:
        exc: the exception the attempt raised.
        machinery: source files of the worker's own frames (the runner, the
            thread pool): left out at the top of the traceback, which starts
            at the task's own code, since they say nothing about the failure.
    """
    kind = type(exc)
    tb = exc.__traceback__
    skipped = {__file__, *machinery}
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename in skipped:
        tb = tb.tb_next
    return {
        "exception_class_path": f"{kind.__module__}.{kind.__qualname__}",
        "traceback": "".join(format_exception(kind, exc, tb)),
    }


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


# -- a run's result -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Returned:
    """The task returned ``value``."""

    value: Any


@dataclass(frozen=True, slots=True)
class Raised:
    """The task raised ``exc`` (its own code cancelled included)."""

    exc: BaseException


@dataclass(frozen=True, slots=True)
class Abandoned:
    """The run ended without a result of its own: the grace ran out while it ran
    (the worker gave up on it), or the worker was stopping before it started."""


@dataclass(frozen=True, slots=True)
class CancelledRun:
    """The message was cancelled while the task ran (protocol 1.2: Cancel): the
    gateway dead-lettered it and ended its lease, so nothing is sent for it;
    its topic is told FAILED with ``leasecast.errors.Cancelled``
    (:func:`cancelled_update`)."""

    detail: str = "the task was cancelled"


Run: TypeAlias = Returned | Raised | Abandoned | CancelledRun


def decide(
    attempt: Attempt,
    run: Run,
    *,
    max_deliveries: int | None = None,
    policy: RetryPolicy = RetryPolicy(),
    machinery: Collection[str] = (),
) -> Ack | Nack | None:
    """The settlement of a run: what the module docstring's table says.

    Args:
        attempt: the run's attempt.
        run: how it ended.
        max_deliveries: the queue's limit, for a run that raised (0 =
            unlimited, None = unknown: retried).
        policy: the retry backoff.
        machinery: the runner's source files, left out of tracebacks
            (:func:`error_of`).

    Returns:
        The settlement, or None for an abandoned run (its lease is not ended
        here: the closing socket releases it and the message runs again) and
        for a cancelled one (the gateway ended its lease already).
    """
    match run:
        case Returned(value):
            return succeeded(attempt, value)
        case Raised(exc):
            error = error_of(exc, machinery=machinery)
            return failed(attempt, error, max_deliveries=max_deliveries, policy=policy)
        case Abandoned() | CancelledRun():
            return None


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


# -- when the gateway does not take a settlement ------------------------------------


@dataclass(frozen=True, slots=True)
class Resend:
    """Send the same settlement again after a backoff: the refusal was transient."""


@dataclass(frozen=True, slots=True)
class LeaseLost:
    """Send nothing more: the lease ended elsewhere or its socket dropped; the
    gateway delivers the message again."""


@dataclass(frozen=True, slots=True)
class Unsent:
    """Send nothing more: even the reject was refused (``reason``)."""

    reason: str


def after_send_error(
    settlement: Settlement, exc: BaseException, *, sends: int
) -> Resend | LeaseLost | Unsent | Settlement:
    """What to do after sending ``settlement`` failed with ``exc``.

    Args:
        settlement: what was sent.
        exc: what the send raised.
        sends: how many times this settlement was sent (1 after the first).

    Returns:
        :class:`Resend` for ``unavailable`` or ``backpressure`` until
        :data:`SEND_ATTEMPTS` sends; :class:`LeaseLost` for a stale receipt or
        a closed socket; :class:`Unsent` when a reject was refused; otherwise
        the fallback settlement to send (:func:`refused`).

    Raises:
        BaseException: ``exc`` itself when it is not the gateway's answer (a
            defect of the worker, for the runner to log).
    """
    if isinstance(exc, StaleReceipt | ConnectionClosed):
        return LeaseLost()
    if not isinstance(exc, ProtocolError):
        raise exc
    if isinstance(exc, Unavailable | Backpressure) and sends < SEND_ATTEMPTS:
        return Resend()
    if isinstance(settlement, Reject):
        return Unsent(f"reject refused: {exc}")
    return refused(settlement, exc)


# -- what the runner asks the gateway -----------------------------------------------


def keep_alive_period(expires_in: float) -> tuple[float, float]:
    """How a held lease is kept: ``(every, extend_to)`` in seconds.

    The lease is extended to its own length (at least a second) every half
    of it, so one lost extension still leaves time for the next.
    """
    lease = max(1.0, expires_in)
    return lease / 2, lease


class LimitCache:
    """Each queue's ``max_deliveries`` as last read, and when to read it again.

    Args:
        ttl: seconds a value read is used without asking again.
    """

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._read: dict[str, tuple[float, int]] = {}

    def fresh(self, queue: str, now: float) -> int | None:
        """The value read less than ``ttl`` ago, or None: ask the gateway."""
        cached = self._read.get(queue)
        if cached is not None and now - cached[0] < self.ttl:
            return cached[1]
        return None

    def read(self, queue: str, now: float, value: int) -> int:
        """Keep ``value``, read at ``now``; returns it."""
        self._read[queue] = (now, value)
        return value

    def unreadable(self, queue: str) -> int | None:
        """The gateway could not be asked: the last value read, however old, or None
        (unknown: a failure is retried, and the next one asks again)."""
        cached = self._read.get(queue)
        return cached[1] if cached is not None else None


def split_prefetch(held: int, queues: int) -> list[int]:
    """Each queue's socket ``prefetch``: ``held`` leases in all when possible.

    ``held`` is what the worker may hold at once (:func:`leases_held`); with
    more queues than that each socket still needs one. Messages held beyond
    the tasks running wait their turn with their leases extended.
    """
    if queues <= 0:
        return []
    share, extra = divmod(held, queues)
    return [max(1, share + (1 if i < extra else 0)) for i in range(queues)]


def leases_held(concurrency: int, multiplier: int) -> int:
    """The leases a worker may hold at once: ``multiplier`` x ``concurrency``.

    Raises:
        ValueError: ``multiplier`` is not an int from 1 to :data:`MAX_PREFETCH_MULTIPLIER`.
    """
    if (
        isinstance(multiplier, bool)
        or not isinstance(multiplier, int)
        or not 1 <= multiplier <= MAX_PREFETCH_MULTIPLIER
    ):
        raise ValueError(
            f"{PREFETCH_SETTING} must be an int from 1 to {MAX_PREFETCH_MULTIPLIER}, "
            f"got {multiplier!r}"
        )
    return concurrency * multiplier


# -- the task's topic ---------------------------------------------------------------

#: A task's progress and outcome go to the topic ``task.RESULT_ID`` (protocol
#: 1.2, Tasks: Progress), so a page follows a task as it follows any topic.
TASK_TOPIC_PREFIX = "task."
#: What a task topic keeps unless an operator stored other settings for it:
#: the last 100 messages for an hour, so a page that opens late gets the
#: latest and one that reconnects misses nothing.
TASK_TOPIC_SETTINGS = replace(DEFAULT_TOPIC_SETTINGS, history_size=100, history_ttl=3600.0)


def task_topic(result_id: str) -> str:
    """The topic of the task whose result id is ``result_id``."""
    return TASK_TOPIC_PREFIX + result_id


def task_topic_settings(topic: str, settings: TopicSettings) -> TopicSettings:
    """The settings a topic is used with: a task topic without stored settings
    of its own (``settings`` is the default object) keeps its history by rule.

    By rule, not by a row written per task: a row written when the task is
    enqueued reaches the other gateway processes only when their settings
    cache is read again (``GATEWAY_QUEUE_SETTINGS_TTL``), and the task's
    first messages, often its last too, come sooner than that.
    """
    if settings is DEFAULT_TOPIC_SETTINGS and topic.startswith(TASK_TOPIC_PREFIX):
        return TASK_TOPIC_SETTINGS
    return settings


def progress_update(data: Any) -> dict[str, Any]:
    """What ``progress(data)`` publishes on the task's topic."""
    return {"status": "RUNNING", "progress": data}


def error_line(error: TaskErrorJSON) -> str:
    """``module.Class: message`` of a recorded error (the last line of its traceback).

    A traceback ends with its exception's own line (``Class: message``; the
    class is named without its module for builtins): the line is rebuilt
    with the full class path. An error that is not a traceback (a refused
    outcome's explanation) gives its first line.
    """
    path = error["exception_class_path"]
    text = error["traceback"].strip()
    if not text.startswith("Traceback"):
        return f"{path}: {text.splitlines()[0] if text else ''}".rstrip(": ")
    last = text.splitlines()[-1]
    _, sep, message = last.partition(": ")
    return f"{path}: {message}" if sep else path


def outcome_update(outcome: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the task's topic is told once the gateway took an attempt's outcome:
    SUCCESSFUL with its ``return_value``, FAILED with its ``error`` line, or
    nothing for a retry (READY: the next attempt's progress follows)."""
    if outcome is None:
        return None
    if outcome["status"] == "SUCCESSFUL":
        return {"status": "SUCCESSFUL", "return_value": outcome.get("return_value")}
    if outcome["status"] == "FAILED":
        error = outcome.get("error")
        line = error_line(error) if error is not None else "FAILED"
        return {"status": "FAILED", "error": line}
    return None


#: The class path a cancelled task's error names (the client's error tree).
CANCELLED_PATH = "leasecast.errors.Cancelled"


def cancelled_update(detail: str) -> dict[str, Any]:
    """What the task's topic is told when the task was cancelled."""
    return {"status": "FAILED", "error": f"{CANCELLED_PATH}: {detail}"}
