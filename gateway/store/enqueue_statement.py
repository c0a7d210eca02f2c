"""One enqueue as one PostgreSQL statement: the common case of Django code's enqueues.

``gateway.enqueue`` and the tasks backend write through Django's connection
(``gateway.host.on_django``). The general path there is a store transaction of
several statements, each a round trip to the server, parsed and planned anew
(Django's cursor prepares nothing): read the queue's settings, insert the
message, add to its counter, insert the task's result row, notify the
gateways, with ``BEGIN`` and ``COMMIT`` around them.

For one message without an idempotency key or group, to a queue that exists
and has no ``max_length`` (every task, and most enqueues), nothing has to be
decided between those steps. PostgreSQL runs them as one statement whose
parts hand the new id on (data-modifying ``WITH`` clauses); outside a
transaction that statement is its own transaction. The rows written and the
notification sent are the general path's, so nothing downstream can tell.

When the queue does not qualify, the statement writes nothing and returns no
id: the caller takes the general path, which creates the queue or applies its
bound. SQLite has no data-modifying ``WITH``, so it always takes that path.
"""

from __future__ import annotations

from typing import Any

from gateway.core.leases import StoredState
from gateway.core.protocol import EnqueueSpec
from gateway.store.dialects import INSERT_COLUMNS
from gateway.store.runner import NOTIFY_CHANNEL
from gateway.store.tasks import TASK_COLUMNS, TASK_VALUES, NewTask

__all__ = ["enqueue_in_one_statement", "fits_one_statement"]

# The message's placeholders follow INSERT_COLUMNS; the counter's row is the
# one the general path's Txn.write_counts adds to.
_HEAD = f"""
WITH q AS (
    SELECT id FROM leasecast_queue WHERE name = %s AND max_length = 0
), m AS (
    INSERT INTO leasecast_message ({INSERT_COLUMNS})
    SELECT q.id, %s, NULL, %s, %s, 0, %s, NULL, %s, %s FROM q
    RETURNING id, queue_id
), c AS (
    INSERT INTO leasecast_queue_counter (queue_id, name, label, shard, value)
    SELECT queue_id, 'enqueued', '', %s, 1 FROM m
    ON CONFLICT (queue_id, name, label, shard)
    DO UPDATE SET value = leasecast_queue_counter.value + excluded.value
)"""
_TASK = (
    f", t AS (INSERT INTO leasecast_task ({TASK_COLUMNS}) SELECT "
    + TASK_VALUES.format(json="CAST(%s AS jsonb)", message_id="m.id")
    + " FROM m)"
)
# The wake-up is in the statement's result, so it runs once per message
# inserted: never when the queue did not qualify. Delivered on commit.
_TAIL = "\nSELECT m.id, pg_notify(%s, %s) FROM m"
_MESSAGE_ONLY = _HEAD + _TAIL
_WITH_TASK = _HEAD + _TASK + _TAIL


def fits_one_statement(specs: list[EnqueueSpec]) -> bool:
    """Whether ``specs`` may try :func:`enqueue_in_one_statement` (the queue's
    own settings are checked by the statement itself)."""
    return len(specs) == 1 and specs[0].key is None and specs[0].group is None


def enqueue_in_one_statement(
    cursor: Any,
    queue: str,
    spec: EnqueueSpec,
    *,
    now: float,
    shard: int,
    task: NewTask | None = None,
) -> int | None:
    """Enqueue ``spec`` (see :func:`fits_one_statement`) to ``queue``, with
    ``task``'s result row if given, on PostgreSQL cursor ``cursor``.

    Args:
        now: the enqueue's time (``enqueued_at``; ``visible_at`` after the delay).
        shard: the counter row to add to (``gateway.store.txn.django_shard``).

    Returns:
        The new message's id, or None if ``queue`` does not exist or is
        bounded: then nothing was written.
    """
    state = StoredState.DELAYED if spec.delay > 0 else StoredState.READY
    params: list[Any] = [
        queue,
        spec.body_json.decode(),
        int(state),
        now + spec.delay,
        now,
        spec.priority,
        None if spec.ttl is None else now + spec.ttl,
        shard,
    ]
    sql = _MESSAGE_ONLY
    if task is not None:
        sql = _WITH_TASK
        params += task.values()
    params += [NOTIFY_CHANNEL, f"admin {queue}"]
    cursor.execute(sql, params)
    row = cursor.fetchone()
    return None if row is None else int(row[0])
