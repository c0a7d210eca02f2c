"""The task worker's runner: its registry's imports and one delivery's handling.

Its pure decisions are tested, fed values, in test_task_decisions.py.

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
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from gateway.client import Delivery
from gateway.core.errors import StaleReceipt, TooLarge
from gateway.host.task_progress import TopicPublisher
from gateway.host.task_worker import (
    Attempt,
    TaskMessage,
    TaskWorker,
    UnregisteredTask,
    context_for,
    discover_registry,
    error_of,
    registry_of_modules,
    unrunnable,
)
from gateway.tasks import cancelled, progress
from tests.tasksite import tasks

ATTEMPT = Attempt("r1", "host:1", 1000.0, 1)


# -- the registry

#: The registry of the tests' workers: the tasks site's tasks module.
REGISTRY = registry_of_modules(["tests.tasksite.tasks"])


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
        registry = discover_registry()
    # gateway is an installed app with a tasks module (the backend, no task in it).
    assert "gateway.tasks" in registry.modules
    assert registry.modules[-1] == "tests.tasksite.tasks"  # the setting's, after the apps'
    assert registry.get("tests.tasksite.tasks.add") is tasks.add
    assert "tests.tasksite.tasks.add" not in discover_registry()  # the setting unset


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
        discover_registry()
    assert detail in str(caught.value)


def _held(**kwargs: Any) -> int:
    worker = TaskWorker(
        "http://127.0.0.1:9", token="t", queues=["a", "b"], registry=REGISTRY, **kwargs
    )
    return worker.prefetch


def test_a_worker_holds_its_multiplier_times_its_concurrency(monkeypatch: Any) -> None:
    monkeypatch.delenv("LEASECAST_WORKER_PREFETCH_MULTIPLIER", raising=False)
    assert _held(concurrency=3) == 12  # the default multiplier, 4
    assert _held(concurrency=3, prefetch_multiplier=1) == 3
    monkeypatch.setenv("LEASECAST_WORKER_PREFETCH_MULTIPLIER", "2")
    assert _held(concurrency=3) == 6
    with override_settings(LEASECAST_WORKER_PREFETCH_MULTIPLIER=5):  # before the environment
        assert _held(concurrency=3) == 15


@pytest.mark.parametrize("value", ["0", "101", "four", "-1", "2.5"])
def test_a_bad_prefetch_multiplier_is_a_clear_error(monkeypatch: Any, value: str) -> None:
    monkeypatch.setenv("LEASECAST_WORKER_PREFETCH_MULTIPLIER", value)
    with pytest.raises(ImproperlyConfigured, match="must be an int from 1 to 100, got"):
        _held()
    setting = int(value) if value.isdigit() else value
    with (
        override_settings(LEASECAST_WORKER_PREFETCH_MULTIPLIER=setting),
        pytest.raises(ImproperlyConfigured, match="LEASECAST_WORKER_PREFETCH_MULTIPLIER"),
    ):
        _held()


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


# -- the task's topic: progress, outcome, cancel (protocol 1.2, Tasks)


class RecordingPublisher(TopicPublisher):
    """A publisher that records what it would publish."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9", "t")
        self.published: list[tuple[str, Any]] = []

    async def publish(self, topic: str, body: Any) -> bool:
        await asyncio.sleep(0)  # as a real one does: the loop runs meanwhile
        self.published.append((topic, body))
        return True


def topic_worker(**kwargs: Any) -> tuple[FixedLimitWorker, RecordingPublisher]:
    publisher = RecordingPublisher()
    return FixedLimitWorker(publisher=publisher, **kwargs), publisher


async def test_progress_then_the_outcome_go_to_the_task_topic_in_order() -> None:
    worker, publisher = topic_worker()
    message = body("steps", 3)
    op, _ = await handled(RecordingDelivery(message), worker)
    assert op == "ack"
    topic = f"task.{message['id']}"
    assert publisher.published == [
        (topic, {"status": "RUNNING", "progress": {"step": 0}}),
        (topic, {"status": "RUNNING", "progress": {"step": 1}}),
        (topic, {"status": "RUNNING", "progress": {"step": 2}}),
        (topic, {"status": "SUCCESSFUL", "return_value": "3 steps"}),
    ]


async def test_a_retry_publishes_nothing_and_the_last_failure_publishes_failed() -> None:
    worker, publisher = topic_worker(limit=2)
    message = body("fail")
    await handled(RecordingDelivery(message, deliveries=1), worker)
    assert publisher.published == []  # READY: the next attempt follows
    await handled(RecordingDelivery(message, deliveries=2), worker)
    assert publisher.published == [
        (f"task.{message['id']}", {"status": "FAILED", "error": "builtins.ValueError: boom"})
    ]


async def test_a_refused_outcome_publishes_what_the_gateway_took() -> None:
    worker, publisher = topic_worker()
    delivery = RecordingDelivery(body("add", 1, 1), refuse=[TooLarge("body over 262144 bytes")])
    await worker.handle(delivery)
    ((_, published),) = publisher.published
    assert published["status"] == "FAILED"
    assert published["error"].startswith("leasecast.errors.TooLarge: the gateway refused")


async def test_a_cancel_cancels_an_async_task_and_publishes_cancelled(tmp_path: Path) -> None:
    worker, publisher = topic_worker()
    message = body("async_until_cancelled", str(tmp_path / "marks"))
    delivery = RecordingDelivery(message)
    handler = asyncio.create_task(worker.handle(delivery))
    while not publisher.published:  # its progress: it runs
        await asyncio.sleep(0.01)
    delivery.cancelled.set()
    await handler
    assert delivery.sent == []  # the lease is over: nothing to end
    assert (tmp_path / "marks").read_text().split()[0] == "async-cancelled"
    *_, (_, end) = publisher.published
    assert end == {
        "status": "FAILED",
        "error": "leasecast.errors.Cancelled: the task was cancelled while it ran",
    }


async def test_a_cancel_sets_cancelled_for_a_sync_task(tmp_path: Path) -> None:
    worker, publisher = topic_worker()
    delivery = RecordingDelivery(body("sync_until_cancelled", str(tmp_path / "marks")))
    handler = asyncio.create_task(worker.handle(delivery))
    while not publisher.published:
        await asyncio.sleep(0.01)
    delivery.cancelled.set()
    await handler
    assert delivery.sent == []
    assert (tmp_path / "marks").read_text().split()[0] == "sync-saw-cancelled"
    assert publisher.published[-1][1]["error"].startswith("leasecast.errors.Cancelled: ")


async def test_a_delivery_cancelled_before_its_turn_never_runs() -> None:
    worker, publisher = topic_worker()
    delivery = RecordingDelivery(body("add", 1, 1))
    delivery.cancelled.set()
    await worker.handle(delivery)
    assert delivery.sent == []
    assert publisher.published[-1][1]["error"].startswith("leasecast.errors.Cancelled: ")


def test_outside_a_worker_progress_does_nothing_and_cancelled_is_false() -> None:
    progress({"step": 1})  # no worker: nothing to publish to, no error
    assert cancelled() is False
    with pytest.raises(TypeError, match="not JSON"):
        progress(object())  # a mistake shows wherever the task runs


async def test_an_adopted_run_publishes_its_outcome_once_and_its_new_delivery_can_cancel_it(
    tmp_path: Path,
) -> None:
    tasks.GATE.clear()
    worker, publisher = topic_worker()
    message = body("gated", "adopt-topic")
    old = RecordingDelivery(message, deliveries=1, refuse=[StaleReceipt("socket closed")])
    new = RecordingDelivery(message, deliveries=2)
    first = asyncio.create_task(worker.handle(old))
    while tasks.RUNS["adopt-topic"] == 0:
        await asyncio.sleep(0.01)
    second = asyncio.create_task(worker.handle(new))
    await asyncio.sleep(0.05)
    tasks.GATE.set()
    await asyncio.gather(first, second)
    assert publisher.published == [
        (f"task.{message['id']}", {"status": "SUCCESSFUL", "return_value": "adopt-topic"})
    ]

    # The cancel frame reaches the new delivery: the run (held by the old one) stops.
    worker, publisher = topic_worker()
    message = body("async_until_cancelled", str(tmp_path / "marks"))
    old = RecordingDelivery(message, deliveries=1)
    new = RecordingDelivery(message, deliveries=2)
    first = asyncio.create_task(worker.handle(old))
    while not publisher.published:
        await asyncio.sleep(0.01)
    second = asyncio.create_task(worker.handle(new))
    await asyncio.sleep(0.05)
    new.cancelled.set()
    await asyncio.gather(first, second)
    assert (old.sent, new.sent) == ([], [])
    assert (tmp_path / "marks").read_text().split()[0] == "async-cancelled"
    (end,) = [b for _, b in publisher.published if b["status"] != "RUNNING"]  # once
    assert end["error"].startswith("leasecast.errors.Cancelled")
