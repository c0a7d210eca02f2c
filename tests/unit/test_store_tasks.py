"""Task outcomes recorded with the ack or nack that ends a task message's lease.

``gateway.store.tasks`` against a real store on SQLite and PostgreSQL: the
result row changes in the same transaction as the ack (or not at all when the
receipt is stale), only the row that belongs to the acked message can be
written, errors and workers accumulate across attempts, and old results are
pruned.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.core.errors import StaleReceipt
from gateway.core.protocol import EnqueueSpec, TaskOutcome
from gateway.store import Ack, Enqueue, Lease, LeaseResult, Nack, Store
from tests.support.fakes import FakeClock


def _task(store: Store, queue: str, task_id: str) -> str:
    """Enqueue a task message and its result row; returns the message id."""
    ((enqueued,),) = store.run([Enqueue(queue, [EnqueueSpec(b'{"task": "x"}')])])
    with store.transaction() as txn:
        txn.exec(
            "INSERT INTO leasecast_task (id, backend, task_path, queue, priority, args, kwargs, "
            "status, message_id, enqueued_at, errors, worker_ids) VALUES "
            f"(%s, 'default', 'x', %s, 0, {txn.dialect.json_param}, {txn.dialect.json_param}, "
            f"'READY', %s, 0, {txn.dialect.json_param}, {txn.dialect.json_param})",
            (task_id, queue, "[]", "{}", int(enqueued.id), "[]", "[]"),
        )
    return str(enqueued.id)


def _row(store: Store, task_id: str) -> dict[str, Any]:
    with store.transaction() as txn:
        row = txn.exec(
            "SELECT status, return_value, errors, worker_ids, started_at, finished_at "
            "FROM leasecast_task WHERE id = %s",
            (task_id,),
        ).fetchone()
    loads = lambda v: orjson.loads(v) if isinstance(v, str) else v  # noqa: E731
    return {
        "status": row[0],
        "return_value": loads(row[1]),
        "errors": loads(row[2]),
        "worker_ids": loads(row[3]),
        "started_at": row[4],
        "finished_at": row[5],
    }


def _lease(store: Store, queue: str) -> str:
    (result,) = store.run([Lease(queue, 1)])
    assert isinstance(result, LeaseResult) and result.delivered
    return result.delivered[0].receipt


def test_a_failed_attempt_then_success(store: Store, queue: str, clock: FakeClock) -> None:
    _task(store, queue, "t1")
    receipt = _lease(store, queue)
    failed = TaskOutcome("t1", "READY", "w1", clock(), error=("builtins.ValueError", "tb 1"))
    assert store.run([Nack(queue, receipt, 0.0, failed)]) == [None]
    row = _row(store, "t1")
    assert row["status"] == "READY" and row["finished_at"] is None
    assert row["errors"] == [{"exception_class_path": "builtins.ValueError", "traceback": "tb 1"}]
    assert row["worker_ids"] == ["w1"]

    clock.advance(1)
    receipt = _lease(store, queue)
    done = TaskOutcome("t1", "SUCCESSFUL", "w2", clock(), return_json=b'{"ok":[1,2]}')
    (acked,) = store.run([Ack(receipt, (), done)])
    assert not isinstance(acked, Exception)
    row = _row(store, "t1")
    assert row["status"] == "SUCCESSFUL" and row["return_value"] == {"ok": [1, 2]}
    assert row["worker_ids"] == ["w1", "w2"] and len(row["errors"]) == 1
    assert row["finished_at"] == clock() and row["started_at"] is not None


def test_a_stale_ack_records_nothing(store: Store, queue: str, clock: FakeClock) -> None:
    _task(store, queue, "t2")
    receipt = _lease(store, queue)
    clock.advance(3600)  # the lease timed out
    outcome = TaskOutcome("t2", "SUCCESSFUL", "w", clock(), return_json=b"1")
    (result,) = store.run([Ack(receipt, (), outcome)])
    assert isinstance(result, StaleReceipt)
    assert _row(store, "t2")["status"] == "READY"


def test_only_the_acked_messages_task_can_be_written(
    store: Store, queue: str, clock: FakeClock
) -> None:
    _task(store, queue, "victim")
    _task(store, queue, "mine")
    victim_receipt = _lease(store, queue)  # the victim's message, leased first
    mine = _lease(store, queue)
    forged = TaskOutcome("victim", "SUCCESSFUL", "w", clock(), return_json=b'"forged"')
    (result,) = store.run([Ack(mine, (), forged)])
    assert not isinstance(result, Exception)  # the ack itself is fine
    assert _row(store, "victim")["status"] == "READY"  # but not the other task's result
    assert victim_receipt


def test_old_results_are_pruned(store: Store, queue: str, clock: FakeClock) -> None:
    _task(store, queue, "old")
    receipt = _lease(store, queue)
    store.run([Ack(receipt, (), TaskOutcome("old", "FAILED", "w", clock(), error=("E", "t")))])
    clock.advance(100)
    store.forget_old_results(200)
    assert _row(store, "old")["status"] == "FAILED"  # kept: finished 100 s ago
    clock.advance(150)
    assert store.forget_old_results(200) >= 1
    with store.transaction() as txn:
        assert txn.exec("SELECT 1 FROM leasecast_task WHERE id = 'old'").fetchone() is None
