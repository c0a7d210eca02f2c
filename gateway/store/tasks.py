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

    One UPDATE: the attempt's worker id (and its error, if any) is appended
    to the row's JSON lists by the database, without reading them first.

    Returns:
        Whether a result row was written (False: no such task, or pruned).
    """
    postgres = txn.dialect.name == "postgresql"
    if postgres:
        append = "COALESCE({0}, '[]'::jsonb) || jsonb_build_array(CAST(%s AS {1}))"
    else:
        append = "json_insert(COALESCE({0}, '[]'), '$[#]', {1}(%s))"
    params: list[Any] = [outcome.status]
    sets = "status = %s, worker_ids = " + append.format("worker_ids", "text" if postgres else "")
    params.append(outcome.worker_id)
    if outcome.error is not None:
        path, traceback = outcome.error
        sets += ", errors = " + append.format("errors", "jsonb" if postgres else "json")
        params.append(orjson.dumps({"exception_class_path": path, "traceback": traceback}).decode())
    params += [
        outcome.return_json.decode() if outcome.return_json is not None else "null",
        outcome.started_at,
        outcome.started_at,
        txn.now if outcome.status != "READY" else None,
        outcome.task_id,
        msg_id,
    ]
    written: int = txn.exec(
        f"UPDATE leasecast_task SET {sets}, return_value = {txn.dialect.json_param}, "
        "started_at = COALESCE(started_at, %s), last_attempted_at = %s, finished_at = %s "
        "WHERE id = %s AND message_id = %s",
        tuple(params),
    ).rowcount
    return written > 0


def forget_results(txn: Txn, older_than: float) -> int:
    """Delete results finished more than ``older_than`` seconds ago."""
    deleted: int = txn.exec(
        "DELETE FROM leasecast_task WHERE finished_at <= %s", (txn.now - older_than,)
    ).rowcount
    return deleted
