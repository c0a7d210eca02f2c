"""The task worker's decisions (pure) and one delivery's handling, with recording fakes.

The fakes are subclasses of the real classes: :class:`RecordingDelivery` is a
:class:`~gateway.client.Delivery` whose lease-ending calls are recorded
instead of sent, :class:`FixedLimitWorker` a :class:`TaskWorker` that knows
its queue's ``max_deliveries`` without asking a gateway. The tasks are the
integration tests' (``tests.tasksite.tasks``), here on this process's default
task backend.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from gateway.client import Delivery
from gateway.core.errors import ProtocolError, StaleReceipt, TooLarge
from gateway.host.task_worker import (
    Ack,
    Attempt,
    Nack,
    NotATask,
    Reject,
    RetryPolicy,
    TaskMessage,
    TaskRegistry,
    TaskWorker,
    UnregisteredTask,
    context_for,
    error_of,
    failed,
    refused,
    split_prefetch,
    succeeded,
    to_json,
    unrunnable,
)
from tests.tasksite import tasks

ATTEMPT = Attempt("r1", "host:1", 1000.0, 1)


def _raise(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


# -- the task message


def test_a_task_message_is_read_with_its_defaults() -> None:
    full = {"task": "a.b", "id": "r", "args": [1], "kwargs": {"k": 2}, "takes_context": True}
    assert TaskMessage.parse(full) == TaskMessage("a.b", "r", [1], {"k": 2}, True)
    assert TaskMessage.parse({"task": "a.b", "id": "r"}) == TaskMessage("a.b", "r", [], {}, False)


@pytest.mark.parametrize(
    "body",
    [
        None,
        [1],
        "a.b",
        {"id": "r"},
        {"task": "", "id": "r"},
        {"task": 3, "id": "r"},
        {"task": "a.b"},
        {"task": "a.b", "id": "x" * 65},
        {"task": "a.b", "id": "r", "args": {"a": 1}},
        {"task": "a.b", "id": "r", "kwargs": [1]},
        {"task": "a.b", "id": "r", "takes_context": "yes"},
    ],
)
def test_a_body_that_is_not_a_task_is_refused(body: Any) -> None:
    with pytest.raises(NotATask):
        TaskMessage.parse(body)


# -- JSON return values


def test_return_values_are_normalised_as_django_tasks_does() -> None:
    assert to_json((1, [2, (3,)])) == [1, [2, [3]]]
    assert to_json({1: "a", None: b"b", "c": {"d": (True, 1.5)}}) == {
        "1": "a",
        "null": "b",
        "c": {"d": [True, 1.5]},
    }
    assert to_json(None) is None
    assert to_json("x") == "x"


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (datetime(2026, 1, 1, tzinfo=UTC), TypeError),
        (object(), TypeError),
        ({1, 2}, TypeError),
        (2**70, TypeError),
        ({"a": [datetime(2026, 1, 1, tzinfo=UTC)]}, TypeError),
        (b"\xff", ValueError),
    ],
)
def test_values_that_are_not_json_are_errors(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        to_json(value)


# -- the retry decision


def test_backoff_doubles_from_the_base_up_to_the_cap() -> None:
    policy = RetryPolicy()
    assert [policy.delay(n) for n in range(1, 11)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    assert policy.delay(10_000) == 300
    assert RetryPolicy(base=0.5, cap=3).delay(1) == 0.5
    assert RetryPolicy(base=0.5, cap=3).delay(4) == 3


@pytest.mark.parametrize(
    ("deliveries", "max_deliveries", "retried"),
    [
        (1, 3, True),
        (2, 3, True),
        (3, 3, False),
        (1, 1, False),
        (50, 0, True),  # 0: unlimited
        (7, None, True),  # unknown: retry, ask again next time
    ],
)
def test_a_failure_is_retried_until_the_last_allowed_delivery(
    deliveries: int, max_deliveries: int | None, retried: bool
) -> None:
    assert RetryPolicy().retries(deliveries, max_deliveries) is retried


def test_a_failure_before_the_last_delivery_is_a_nack_with_backoff_and_a_ready_outcome() -> None:
    error = error_of(_raise(ValueError("boom")))
    attempt = Attempt("r1", "host:1", 1000.0, 2)
    assert failed(attempt, error, max_deliveries=3) == Nack(
        2.0,
        {
            "id": "r1",
            "status": "READY",
            "worker_id": "host:1",
            "started_at": 1000.0,
            "error": error,
        },
    )


def test_a_failure_at_the_last_delivery_is_acked_failed() -> None:
    error = error_of(_raise(ValueError("boom")))
    attempt = Attempt("r1", "host:1", 1000.0, 3)
    settlement = failed(attempt, error, max_deliveries=3, policy=RetryPolicy(base=9))
    assert settlement == Ack(
        {
            "id": "r1",
            "status": "FAILED",
            "worker_id": "host:1",
            "started_at": 1000.0,
            "error": error,
        }
    )


def test_an_error_carries_the_class_path_and_the_whole_traceback() -> None:
    def inner() -> None:
        raise KeyError("missing")

    def outer() -> None:
        try:
            inner()
        except KeyError as exc:
            raise RuntimeError("wrapped") from exc

    error = error_of(_raise_from(outer))
    assert error["exception_class_path"] == "builtins.RuntimeError"
    text = error["traceback"]
    assert text.startswith("Traceback (most recent call last):")
    assert "in inner" in text and "KeyError: 'missing'" in text  # the cause is kept
    assert text.rstrip().endswith("RuntimeError: wrapped")


def _raise_from(func: Any) -> BaseException:
    try:
        func()
    except BaseException as exc:
        return exc
    raise AssertionError("did not raise")


# -- outcomes


def test_success_is_acked_with_the_normalised_value() -> None:
    assert succeeded(ATTEMPT, (1, {2: "x"})) == Ack(
        {
            "id": "r1",
            "status": "SUCCESSFUL",
            "worker_id": "host:1",
            "started_at": 1000.0,
            "return_value": [1, {"2": "x"}],
        }
    )
    assert succeeded(ATTEMPT, None).outcome["return_value"] is None


def test_a_value_that_is_not_json_fails_the_task_at_once_naming_the_type_error() -> None:
    settlement = succeeded(ATTEMPT, datetime(2026, 1, 1, tzinfo=UTC))
    assert isinstance(settlement, Ack)
    outcome = settlement.outcome
    assert outcome["status"] == "FAILED" and "return_value" not in outcome
    assert outcome["error"]["exception_class_path"] == "builtins.TypeError"
    assert "return value is not JSON" in outcome["error"]["traceback"]
    assert "datetime" in outcome["error"]["traceback"]


# -- the registry

#: The registry of the tests' workers: the tasks site's tasks module.
REGISTRY = TaskRegistry.of_modules(["tests.tasksite.tasks"])


def test_an_unregistered_task_fails_without_retry() -> None:
    with pytest.raises(UnregisteredTask) as caught:
        REGISTRY.get("tests.tasksite.no_such_module.task")
    settlement = unrunnable(ATTEMPT, error_of(caught.value))
    assert settlement.outcome["status"] == "FAILED"
    error = settlement.outcome["error"]
    assert error["exception_class_path"] == "gateway.task_worker.UnregisteredTask"
    assert "'tests.tasksite.no_such_module.task' is not a registered task" in error["traceback"]


def test_only_the_tasks_of_registered_modules_are_found() -> None:
    assert REGISTRY.get("tests.tasksite.tasks.add") is tasks.add
    assert REGISTRY.get("tests.tasksite.tasks.gated") is tasks.gated
    for path in (
        "tests.tasksite.tasks.task_backend",  # in the module, not a task
        "tests.tasksite.tasks.no_such_task",
        "tests.tasksite.unimportable.lost",  # a task, in a module not registered
    ):
        with pytest.raises(UnregisteredTask):
            REGISTRY.get(path)


def test_looking_up_a_task_imports_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    """The defect: a message naming ``this.nothing`` printed the Zen of Python."""
    imported = tmp_path / "imported"
    monkeypatch.setenv("TASKSITE_IMPORTED", str(imported))
    for module in ("this", "tests.tasksite.side_effect"):
        assert module not in sys.modules
        with pytest.raises(UnregisteredTask):
            REGISTRY.get(f"{module}.nothing")
        assert module not in sys.modules
    assert not imported.exists()


def test_the_registry_is_the_apps_tasks_modules_and_the_setting() -> None:
    with override_settings(LEASECAST_TASK_MODULES=["tests.tasksite.tasks"]):
        registry = TaskRegistry.discover()
    # gateway is an installed app with a tasks module (the backend, no task in it).
    assert "gateway.tasks" in registry.modules
    assert registry.modules[-1] == "tests.tasksite.tasks"  # the setting's, after the apps'
    assert registry.get("tests.tasksite.tasks.add") is tasks.add
    assert "tests.tasksite.tasks.add" not in TaskRegistry.discover()  # the setting unset


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        ("tests.tasksite.tasks", "a list of module paths"),
        ([""], "a list of module paths"),
        ([3], "a list of module paths"),
        (["tests.tasksite.no_such_module"], "cannot import tests.tasksite.no_such_module"),
    ],
)
def test_a_bad_task_modules_setting_is_a_clear_error(value: Any, detail: str) -> None:
    with (
        override_settings(LEASECAST_TASK_MODULES=value),
        pytest.raises(ImproperlyConfigured, match="LEASECAST_TASK_MODULES") as caught,
    ):
        TaskRegistry.discover()
    assert detail in str(caught.value)


def test_a_refused_success_becomes_failed_then_a_reject() -> None:
    first = succeeded(ATTEMPT, "x" * 10)
    fallback = refused(first, TooLarge("return_value is over 262144 bytes"))
    assert isinstance(fallback, Ack) and fallback.fallback
    outcome = fallback.outcome
    assert outcome["status"] == "FAILED" and "return_value" not in outcome
    assert outcome["error"]["exception_class_path"] == "leasecast.errors.TooLarge"
    assert "too_large" in outcome["error"]["traceback"]
    assert isinstance(refused(fallback, TooLarge("again")), Reject)


def test_a_refused_retry_stays_a_retry_and_keeps_the_original_error() -> None:
    error = error_of(_raise(ValueError("boom")))
    first = failed(ATTEMPT, error, max_deliveries=3)
    fallback = refused(first, ProtocolError("odd"))
    assert isinstance(fallback, Nack) and fallback.delay == first.delay
    assert fallback.outcome is not None and fallback.outcome["status"] == "READY"
    assert "ValueError: boom" in fallback.outcome["error"]["traceback"]
    assert refused(fallback, ProtocolError("odd")) == Nack(first.delay, None)


@pytest.mark.parametrize(
    ("concurrency", "queues", "prefetch"),
    [(4, 1, [4]), (4, 2, [2, 2]), (5, 2, [3, 2]), (1, 3, [1, 1, 1]), (2, 3, [1, 1, 1]), (3, 0, [])],
)
def test_prefetch_is_shared_between_queues(
    concurrency: int, queues: int, prefetch: list[int]
) -> None:
    assert split_prefetch(concurrency, queues) == prefetch


def test_a_context_task_gets_its_result_and_attempt() -> None:
    message = TaskMessage("tests.tasksite.tasks.with_context", "r9", [], {"mark": None}, True)
    context = context_for(tasks.with_context, message, Attempt("r9", "host:1", 1000.0, 3))
    assert context.attempt == 3
    assert context.task_result.id == "r9"
    assert context.task_result.worker_ids[-1] == "host:1"
    assert context.task_result.kwargs == {"mark": None}


# -- one delivery, end to end in process


class RecordingDelivery(Delivery):
    """A delivery whose ack, nack, reject and extend are recorded, not sent.

    ``refuse``: errors to raise from the next lease-ending calls, in order.
    """

    def __init__(self, body: Any, *, deliveries: int = 1, id: str = "7", refuse: Any = ()) -> None:
        super().__init__(
            queue="q",
            id=id,
            receipt=f"{id}.{deliveries}",
            body=body,
            deliveries=deliveries,
            expires_in=30.0,
            _link=None,  # type: ignore[arg-type]  # never used: every call is overridden
        )
        self.sent: list[tuple[Any, ...]] = []
        self.refuse = list(refuse)

    def _end(self, *call: Any) -> None:
        self.sent.append(call)
        if self.refuse:
            raise self.refuse.pop(0)

    async def ack(
        self, enqueue: list[dict[str, Any]] | None = None, *, task: dict[str, Any] | None = None
    ) -> list[dict[str, Any]]:
        self._end("ack", task)
        return []

    async def nack(self, delay: float = 0.0, *, task: dict[str, Any] | None = None) -> None:
        self._end("nack", delay, task)

    async def reject(self) -> None:
        self._end("reject")

    async def extend(self, timeout: float) -> float:
        self.sent.append(("extend", timeout))
        return timeout


class FixedLimitWorker(TaskWorker):
    """A worker whose queues' ``max_deliveries`` is given, not read from a gateway."""

    def __init__(self, limit: int | None = 3, **kwargs: Any) -> None:
        super().__init__(
            "http://127.0.0.1:9",
            token="t",
            queues=["q"],
            worker_id="w:1",
            registry=REGISTRY,
            **kwargs,
        )
        self.limit = limit

    async def max_deliveries(self, queue: str) -> int | None:
        return self.limit


_ids = itertools.count()


def body(task: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"task": f"tests.tasksite.tasks.{task}", "id": f"r{next(_ids)}", "args": list(args),
            "kwargs": kwargs, "takes_context": False}  # fmt: skip


async def handled(delivery: RecordingDelivery, worker: TaskWorker | None = None) -> Any:
    await (worker or FixedLimitWorker()).handle(delivery)
    (call,) = delivery.sent
    return call


async def test_a_sync_task_runs_on_a_thread_and_is_acked_successful() -> None:
    op, outcome = await handled(RecordingDelivery(body("add", 2, 3)))
    assert op == "ack"
    assert outcome["status"] == "SUCCESSFUL" and outcome["return_value"] == 5
    assert outcome["worker_id"] == "w:1" and isinstance(outcome["started_at"], float)


async def test_an_async_task_runs_on_the_loop() -> None:
    op, outcome = await handled(RecordingDelivery(body("async_add", 2, 3)))
    assert (op, outcome["status"], outcome["return_value"]) == ("ack", "SUCCESSFUL", 5)


async def test_a_context_task_sees_its_delivery_as_its_attempt() -> None:
    message = {**body("with_context"), "takes_context": True}
    _, outcome = await handled(RecordingDelivery(message, deliveries=2))
    assert outcome["return_value"] == {"attempt": 2, "id": message["id"]}


async def test_failures_are_retried_with_backoff_then_failed() -> None:
    worker = FixedLimitWorker(limit=3)
    first = await handled(RecordingDelivery(body("fail"), deliveries=1), worker)
    second = await handled(RecordingDelivery(body("async_fail"), deliveries=2), worker)
    last = await handled(RecordingDelivery(body("fail"), deliveries=3), worker)
    assert first[:2] == ("nack", 1.0) and first[2]["status"] == "READY"
    assert second[:2] == ("nack", 2.0)
    assert second[2]["error"]["exception_class_path"] == "builtins.KeyError"
    assert last[0] == "ack" and last[1]["status"] == "FAILED"
    traceback = last[1]["error"]["traceback"]
    assert "tasksite/tasks.py" in traceback and "ValueError: boom" in traceback
    # The traceback starts at the task's code, not in the worker's machinery.
    assert "task_worker.py" not in traceback.splitlines()[1]


async def test_an_unknown_limit_retries() -> None:
    call = await handled(RecordingDelivery(body("fail"), deliveries=5), FixedLimitWorker(None))
    assert call[0] == "nack"


async def test_an_unregistered_task_fails_at_once_and_is_not_imported() -> None:
    for path in ("tests.tasksite.unknown.add", "this.nothing", "tests.tasksite.unimportable.lost"):
        message = {**body("add"), "task": path}
        op, outcome = await handled(RecordingDelivery(message), FixedLimitWorker(limit=10))
        assert op == "ack" and outcome["status"] == "FAILED"
        error = outcome["error"]
        assert error["exception_class_path"] == "gateway.task_worker.UnregisteredTask"
        assert f"{path!r} is not a registered task" in error["traceback"]
    assert "this" not in sys.modules


async def test_a_body_that_is_not_a_task_is_rejected() -> None:
    assert await handled(RecordingDelivery({"hello": 1})) == ("reject",)


async def test_a_refused_outcome_falls_back_to_failed() -> None:
    delivery = RecordingDelivery(body("add", 1, 1), refuse=[TooLarge("return_value too large")])
    await FixedLimitWorker().handle(delivery)
    (_, first), (op2, second) = delivery.sent
    assert first["status"] == "SUCCESSFUL"
    assert (op2, second["status"]) == ("ack", "FAILED")
    assert second["error"]["exception_class_path"] == "leasecast.errors.TooLarge"


async def test_a_lost_lease_is_logged_and_nothing_else_is_sent() -> None:
    delivery = RecordingDelivery(body("add", 1, 1), refuse=[StaleReceipt("socket closed")])
    await FixedLimitWorker().handle(delivery)  # does not raise
    assert [call[0] for call in delivery.sent] == ["ack"]


async def test_a_stopping_worker_starts_nothing() -> None:
    worker = FixedLimitWorker()
    worker.stop()
    delivery = RecordingDelivery(body("add", 1, 1))
    await worker.handle(delivery)
    assert delivery.sent == []  # not ended: the closing socket releases it


async def test_a_redelivery_of_a_running_message_adopts_its_run() -> None:
    """After a reconnect, the same message comes again while its task still runs here."""
    tasks.GATE.clear()
    worker = FixedLimitWorker()
    message = body("gated", "adopt")
    old = RecordingDelivery(message, deliveries=1, refuse=[StaleReceipt("socket closed")])
    new = RecordingDelivery(message, deliveries=2)
    first = asyncio.create_task(worker.handle(old))
    while tasks.RUNS["adopt"] == 0:
        await asyncio.sleep(0.01)
    second = asyncio.create_task(worker.handle(new))
    await asyncio.sleep(0.05)
    tasks.GATE.set()
    await asyncio.gather(first, second)
    assert tasks.RUNS["adopt"] == 1  # one run for both deliveries
    assert new.sent == [("ack", new.sent[0][1])]
    assert new.sent[0][1]["status"] == "SUCCESSFUL" and new.sent[0][1]["return_value"] == "adopt"
