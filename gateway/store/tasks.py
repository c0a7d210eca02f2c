"""Task results (``gateway.tasks``): outcomes recorded with the ack or nack, and pruning.

A worker's ack or nack of a task's message may carry the task's outcome
(``TaskOutcome``); it is written here, in the same transaction, so a task is
SUCCESSFUL or FAILED exactly when its message is gone. Only the result row
that belongs to the acked message is touched (``message_id``): a worker
cannot write the result of a task it does not hold.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.core.protocol import TaskOutcome
from gateway.store.txn import Txn

__all__ = ["create", "forget_results", "record"]


def create(
    txn: Txn,
    result_id: str,
    *,
    backend: str,
    task_path: str,
    queue: str,
    priority: int,
    args_json: bytes,
    kwargs_json: bytes,
    message_id: int,
    enqueued_at: float,
    run_after: float | None,
) -> None:
    """Insert a task's result row (READY, no attempts yet) in the enqueuer's transaction.

    The row of ``gateway.models.TaskRecord`` that the ORM would write, in one
    statement without building a model instance (every enqueue pays for it).
    ``args_json`` and ``kwargs_json`` are the JSON texts of the arguments.
    """
    cast = txn.dialect.json_param
    txn.exec(
        "INSERT INTO leasecast_task (id, backend, task_path, queue, priority, args, kwargs, "
        "status, message_id, enqueued_at, run_after, started_at, finished_at, "
        "last_attempted_at, return_value, errors, worker_ids) "
        f"VALUES (%s, %s, %s, %s, %s, {cast}, {cast}, 'READY', %s, %s, %s, "
        f"NULL, NULL, NULL, NULL, {cast}, {cast})",
        (
            result_id,
            backend,
            task_path,
            queue,
            priority,
            args_json.decode(),
            kwargs_json.decode(),
            message_id,
            enqueued_at,
            run_after,
            "[]",
            "[]",
        ),
    )


def record(txn: Txn, msg_id: int, outcome: TaskOutcome) -> bool:
    """Write ``outcome`` into the result of the task carried by message ``msg_id``.

    Returns:
        Whether a result row was written (False: no such task, or pruned).
    """
    row = txn.exec(
        "SELECT errors, worker_ids FROM leasecast_task WHERE id = %s AND message_id = %s",
        (outcome.task_id, msg_id),
    ).fetchone()
    if row is None:
        return False
    errors: list[Any] = _json(row[0]) or []
    worker_ids: list[Any] = _json(row[1]) or []
    if outcome.error is not None:
        path, traceback = outcome.error
        errors.append({"exception_class_path": path, "traceback": traceback})
    worker_ids.append(outcome.worker_id)
    finished = outcome.status != "READY"
    cast = txn.dialect.json_param
    txn.exec(
        "UPDATE leasecast_task SET status = %s, "
        f"errors = {cast}, worker_ids = {cast}, return_value = {cast}, "
        "started_at = COALESCE(started_at, %s), last_attempted_at = %s, finished_at = %s "
        "WHERE id = %s",
        (
            outcome.status,
            orjson.dumps(errors).decode(),
            orjson.dumps(worker_ids).decode(),
            outcome.return_json.decode() if outcome.return_json is not None else "null",
            outcome.started_at,
            outcome.started_at,
            txn.now if finished else None,
            outcome.task_id,
        ),
    )
    return True


def forget_results(txn: Txn, older_than: float) -> int:
    """Delete results finished more than ``older_than`` seconds ago."""
    deleted: int = txn.exec(
        "DELETE FROM leasecast_task WHERE finished_at <= %s", (txn.now - older_than,)
    ).rowcount
    return deleted


def _json(value: Any) -> Any:
    # SQLite hands JSON columns back as text, psycopg as decoded values.
    return orjson.loads(value) if isinstance(value, str | bytes) else value
