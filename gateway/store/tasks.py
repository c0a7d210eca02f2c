"""Task results (``gateway.tasks``): the row an enqueue creates, outcomes recorded
with the ack or nack, and pruning.

A worker's ack or nack of a task's message may carry the task's outcome
(``TaskOutcome``); it is written here, in the same transaction, so a task is
SUCCESSFUL or FAILED exactly when its message is gone. Only the result row
that belongs to the acked message is touched (``message_id``): a worker
cannot write the result of a task it does not hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.core.protocol import TaskOutcome
from gateway.store.txn import Txn

__all__ = ["TASK_COLUMNS", "TASK_VALUES", "NewTask", "create", "forget_results", "record"]


@dataclass(frozen=True, slots=True)
class NewTask:
    """A task's result row as its enqueue writes it (READY, no attempts yet).

    ``args_json`` and ``kwargs_json`` are the JSON texts of the arguments; the
    row's ``message_id`` is the id of the message enqueued with it.
    """

    result_id: str
    backend: str
    task_path: str
    queue: str
    priority: int
    args_json: bytes
    kwargs_json: bytes
    enqueued_at: float
    run_after: float | None

    def values(self) -> tuple[Any, ...]:
        """The parameters of :data:`TASK_VALUES`, in order (the message id's aside)."""
        return (
            self.result_id,
            self.backend,
            self.task_path,
            self.queue,
            self.priority,
            self.args_json.decode(),
            self.kwargs_json.decode(),
            self.enqueued_at,
            self.run_after,
            "[]",  # errors
            "[]",  # worker_ids
        )


#: The columns of a new result row and their values: :meth:`NewTask.values`
#: fills the placeholders, ``{json}`` is the dialect's JSON parameter and
#: ``{message_id}`` the message's id (last, so the two statements that write
#: the row can each put their own there).
TASK_COLUMNS = (
    "id, backend, task_path, queue, priority, args, kwargs, enqueued_at, run_after, "
    "errors, worker_ids, status, started_at, finished_at, last_attempted_at, return_value, "
    "message_id"
)
TASK_VALUES = (
    "%s, %s, %s, %s, %s, {json}, {json}, %s, %s, {json}, {json}, 'READY', NULL, NULL, NULL, "
    "NULL, {message_id}"
)


def create(txn: Txn, task: NewTask, message_id: int) -> None:
    """Insert ``task``'s result row in the enqueuer's transaction.

    The row of ``gateway.models.TaskRecord`` that the ORM would write, in one
    statement without building a model instance (every enqueue pays for it).
    """
    values = TASK_VALUES.format(json=txn.dialect.json_param, message_id="%s")
    txn.exec(
        f"INSERT INTO leasecast_task ({TASK_COLUMNS}) VALUES ({values})",
        (*task.values(), message_id),
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
