"""The task worker's pure decisions, fed values: no thread, no socket, no Django.

What to send for a run that returned, raised or was abandoned; what to do
when the gateway does not take a settlement; the registry's lookup; the
lease keep-alive and the ``max_deliveries`` cache. The runner around them
(``TaskWorker``) is tested in test_task_worker.py.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Any

import pytest

from gateway.core.task_decisions import (
    DEFAULT_PREFETCH_MULTIPLIER,
    SEND_ATTEMPTS,
    Abandoned,
    Ack,
    Attempt,
    LeaseLost,
    LimitCache,
    Nack,
    NotATask,
    Raised,
    Reject,
    Resend,
    RetryPolicy,
    Returned,
    TaskMessage,
    TaskRegistry,
    UnregisteredTask,
    Unsent,
    after_send_error,
    decide,
    error_of,
    failed,
    keep_alive_period,
    leases_held,
    refused,
    split_prefetch,
    succeeded,
    to_json,
)
from gateway.errors import (
    Backpressure,
    ConnectionClosed,
    Invalid,
    ProtocolError,
    StaleReceipt,
    TooLarge,
    Unavailable,
)

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


# -- refusals


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
    assert isinstance(first, Nack)
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


@pytest.mark.parametrize(
    ("concurrency", "multiplier", "held"), [(4, 1, 4), (4, 4, 16), (1, 100, 100), (3, 2, 6)]
)
def test_a_worker_holds_its_multiplier_times_its_concurrency(
    concurrency: int, multiplier: int, held: int
) -> None:
    assert leases_held(concurrency, multiplier) == held


@pytest.mark.parametrize("multiplier", [0, -1, 101, 2.0, "4", True, None])
def test_a_multiplier_out_of_range_is_refused_by_name(multiplier: object) -> None:
    with pytest.raises(ValueError, match="LEASECAST_WORKER_PREFETCH_MULTIPLIER must be an int"):
        leases_held(4, multiplier)  # type: ignore[arg-type]


def test_the_default_multiplier_is_within_range() -> None:
    assert leases_held(1, DEFAULT_PREFETCH_MULTIPLIER) == DEFAULT_PREFETCH_MULTIPLIER


# -- a run's result


def test_a_returned_run_is_settled_as_its_value_says() -> None:
    assert decide(ATTEMPT, Returned({1: b"x"})) == succeeded(ATTEMPT, {1: b"x"})
    settlement = decide(ATTEMPT, Returned(datetime(2026, 1, 1, tzinfo=UTC)))
    assert isinstance(settlement, Ack) and settlement.outcome["status"] == "FAILED"


def test_a_raised_run_is_retried_until_the_queues_last_delivery() -> None:
    exc = _raise(ValueError("boom"))
    policy = RetryPolicy(base=2.0)
    first = decide(ATTEMPT, Raised(exc), max_deliveries=2, policy=policy)
    assert isinstance(first, Nack) and first.delay == 2.0
    assert first.outcome is not None and first.outcome["status"] == "READY"
    last = decide(Attempt("r1", "host:1", 1000.0, 2), Raised(exc), max_deliveries=2)
    assert isinstance(last, Ack) and last.outcome["status"] == "FAILED"
    assert last.outcome["error"]["exception_class_path"] == "builtins.ValueError"
    # An unknown limit (the gateway could not be asked) retries.
    assert isinstance(decide(Attempt("r", "w", 0.0, 99), Raised(exc)), Nack)


def test_a_run_the_worker_gave_up_on_is_not_settled() -> None:
    assert decide(ATTEMPT, Abandoned(), max_deliveries=1) is None


def test_the_runners_frames_are_left_out_of_a_raised_runs_traceback() -> None:
    def machinery() -> BaseException:
        return _raise_from(task_code)

    def task_code() -> None:
        raise KeyError("in the task")

    exc = machinery()
    whole = error_of(exc)["traceback"]
    here = __file__
    trimmed = decide(ATTEMPT, Raised(exc), machinery=[here])
    assert isinstance(trimmed, Nack) and trimmed.outcome is not None
    text = trimmed.outcome["error"]["traceback"]
    assert "in _raise_from" in whole and "in _raise_from" not in text
    # The task's own frame stays, even though it is in the same file here:
    # only the leading frames are skipped, down to the last one.
    assert "in task_code" in text and "KeyError: 'in the task'" in text


# -- when the gateway does not take a settlement

SUCCESS = succeeded(ATTEMPT, 1)


@pytest.mark.parametrize("exc", [StaleReceipt("ended"), ConnectionClosed("dropped")])
def test_a_lost_lease_ends_the_sending(exc: Exception) -> None:
    assert after_send_error(SUCCESS, exc, sends=1) == LeaseLost()
    assert after_send_error(Reject("x"), exc, sends=1) == LeaseLost()


@pytest.mark.parametrize("exc", [Unavailable("db down"), Backpressure("slow down")])
def test_a_transient_refusal_is_sent_again_a_few_times_then_falls_back(
    exc: ProtocolError,
) -> None:
    decisions = [after_send_error(SUCCESS, exc, sends=n) for n in range(1, SEND_ATTEMPTS + 1)]
    assert decisions[:-1] == [Resend()] * (SEND_ATTEMPTS - 1)
    last = decisions[-1]
    assert isinstance(last, Ack) and last.fallback and last.outcome["status"] == "FAILED"
    assert f"({exc.code})" in last.outcome["error"]["traceback"]


def test_a_final_refusal_falls_back_and_a_refused_reject_is_given_up() -> None:
    fallback = after_send_error(SUCCESS, TooLarge("return_value too large"), sends=1)
    assert fallback == refused(SUCCESS, TooLarge("return_value too large"))
    gave_up = after_send_error(Reject("not a task"), Invalid("no"), sends=1)
    assert isinstance(gave_up, Unsent) and "no" in gave_up.reason


def test_an_error_that_is_not_the_gateways_answer_is_raised_again() -> None:
    with pytest.raises(RuntimeError, match="a defect"):
        after_send_error(SUCCESS, RuntimeError("a defect"), sends=1)


# -- the lease and the queue's limit


@pytest.mark.parametrize(
    ("expires_in", "period"), [(30.0, (15.0, 30.0)), (3.0, (1.5, 3.0)), (0.2, (0.5, 1.0))]
)
def test_a_held_lease_is_extended_every_half_lease(
    expires_in: float, period: tuple[float, float]
) -> None:
    assert keep_alive_period(expires_in) == period


def test_a_queues_limit_is_read_again_after_its_ttl_and_kept_when_unreadable() -> None:
    cache = LimitCache(ttl=60.0)
    assert cache.fresh("q", now=0.0) is None  # never read: ask
    assert cache.unreadable("q") is None  # and if the gateway cannot say: unknown
    assert cache.read("q", now=10.0, value=0) == 0
    assert cache.fresh("q", now=69.9) == 0  # 0 (unlimited) is a value, not a miss
    assert cache.fresh("q", now=70.0) is None  # stale: ask again
    assert cache.unreadable("q") == 0  # the last value read, however old
    assert cache.fresh("other", now=11.0) is None


# -- the registry's lookup


def test_a_lookup_finds_only_registered_tasks_and_imports_nothing() -> None:
    send, other = object(), object()
    registry = TaskRegistry({"app.tasks.send": send}, ["app.tasks"])
    assert registry.get("app.tasks.send") is send
    assert "app.tasks.send" in registry and len(registry) == 1
    for path in ("app.tasks.other", "this.nothing", ""):
        with pytest.raises(UnregisteredTask, match="is not a registered task"):
            registry.get(path)
    assert "this" not in sys.modules
    both = registry.merged(TaskRegistry({"lib.jobs.other": other}, ["lib.jobs", "app.tasks"]))
    assert both.modules == ("app.tasks", "lib.jobs")
    assert both.get("lib.jobs.other") is other and both.get("app.tasks.send") is send
