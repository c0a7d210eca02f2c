"""What operators see and do: stats, settings, browsing, purge, redrive, requeue, delete, cancel.

These run through the store like every other op (HTTP API), and also on
Django's own connection for the admin (``gateway.host.operations``), so both
apply the same rules, groups included.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.core.errors import Invalid, NotFound
from gateway.core.leases import StoredState, format_receipt, observed_state
from gateway.store.dialects import POSTGRESQL
from gateway.store.expiry import dead_letter_ids, expire, expire_ids
from gateway.store.ops import (
    BrowsedMessage,
    BrowsePage,
    BrowseState,
    CancelResult,
    MessageCondition,
    QueueStats,
)
from gateway.store.txn import QueueRow, Txn

__all__ = [
    "CANCEL_CHANNEL",
    "all_stats",
    "browse",
    "cancel_message",
    "configure",
    "delete_message",
    "purge",
    "redrive",
    "requeue_ids",
    "requeue_message",
    "stats",
]

READY, LEASED, DEAD, DELAYED, WAITING = (int(s) for s in StoredState)

#: The PostgreSQL NOTIFY channel on which cancelled leases are announced, as
#: ``QUEUE ID RECEIPT`` (read by ``gateway.engine.notify``).
CANCEL_CHANNEL = "leasecast_cancel"

#: Which stored rows are in each protocol state at time %s (see gateway.core.leases).
_STATE_SQL: dict[str, str] = {
    "visible": "state <> 2 AND visible_at <= %s",
    "delayed": "state IN (3, 4) AND visible_at > %s",
    "in_flight": "state = 1 AND visible_at > %s",
}


def stats(txn: Txn, q: QueueRow) -> QueueStats:
    """Counts per protocol state, the age of the oldest visible message, and settings."""
    expire(txn, q)
    now = txn.now
    counts = {"visible": 0, "delayed": 0, "in_flight": 0, "dead": 0}
    oldest: float | None = None
    for state, due, count, first in txn.exec(
        "SELECT state, visible_at <= %s AS due, COUNT(*), MIN(enqueued_at) "
        "FROM leasecast_message WHERE queue_id = %s GROUP BY 1, 2",
        (now, q.id),
    ).fetchall():
        if state == DEAD:
            counts["dead"] += count
        elif state == READY or due:
            counts["visible"] += count
            oldest = first if oldest is None else min(oldest, first)
        elif state == LEASED:
            counts["in_flight"] += count
        else:
            counts["delayed"] += count
    return QueueStats(
        name=q.name,
        oldest_visible_age=None if oldest is None else max(0.0, now - oldest),
        settings=q.settings,
        **counts,
    )


def all_stats(txn: Txn) -> list[QueueStats]:
    """:func:`stats` of every queue, by name."""
    names = txn.exec("SELECT name FROM leasecast_queue ORDER BY name").fetchall()
    return [stats(txn, txn.queue(name, create=False)) for (name,) in names]


def configure(txn: Txn, name: str, changes: Mapping[str, object]) -> QueueStats:
    """Apply ``changes`` to queue ``name``'s settings (creating it); its new ``GET`` document.

    Raises:
        BadFrame, Invalid: a change is unknown or out of range; nothing was written.
    """
    txn.queues.defaults.changed(dict(changes))  # check every value before any write
    current = txn.queues.get(txn, name, create=True, fresh=True)
    return stats(txn, txn.queues.configure(txn, name, current.settings.changed(dict(changes))))


def purge(txn: Txn, q: QueueRow) -> int:
    """Delete every message of ``q`` that is not in flight; returns how many."""
    # In flight means leased and not expired: those stay with their workers,
    # and stay their groups' heads. The groups purged from are settled all
    # the same: on PostgreSQL another transaction may be promoting a message
    # deleted here, and without this purge's group locks that promotion
    # would find its row gone and leave the group without a head
    # (tests/unit/test_groups_concurrency.py).
    not_in_flight = "queue_id = %s AND NOT (state = 1 AND visible_at > %s)"
    purged: int = txn.exec(
        f'DELETE FROM leasecast_message WHERE {not_in_flight} AND "group" IS NULL',
        (q.id, txn.now),
    ).rowcount
    rows = txn.exec(
        f'DELETE FROM leasecast_message WHERE {not_in_flight} AND "group" IS NOT NULL '
        'RETURNING "group"',
        (q.id, txn.now),
    ).fetchall()
    for group in {row[0] for row in rows}:
        txn.unsettle(q.id, group)
    txn.forget_length(q.id)
    return purged + len(rows)


def redrive(txn: Txn, q: QueueRow) -> int:
    """Move every dead message of ``q`` back to visible, delivery count reset.

    Messages past their ttl are dead too, swept or not yet.
    """
    expire(txn, q)
    rows = txn.exec(
        "UPDATE leasecast_message SET "
        'state = CASE WHEN "group" IS NULL THEN 0 ELSE 4 END, visible_at = %s, '
        "deliveries = 0, lease_token = NULL, dead_reason = NULL "
        'WHERE queue_id = %s AND state = 2 RETURNING "group"',
        (txn.now, q.id),
    ).fetchall()
    for (group,) in rows:
        txn.unsettle(q.id, group, reordered=True)
    # An operator's redrive or requeue puts messages back: counted as
    # enqueues (GET /metrics, the dashboard's rates; docs/operations.md).
    txn.count(q.id, "enqueued", len(rows))
    if rows:
        txn.woken.add(q.name)
        txn.forget_length(q.id)
    return len(rows)


def requeue_ids(txn: Txn, ids: list[int], queue_id: int | None = None) -> int:
    """Make dead or leased messages visible again, delivery count reset.

    An operator's requeue is a fresh start: a message dead-lettered for
    exceeding ``max_deliveries`` is delivered at the next lease instead of
    being dead-lettered again, and a leased message's lease token is cleared,
    so its old receipt is stale. A message of a group waits for its group's
    current head, so the group keeps its order and one message in flight.
    Messages waiting for a lease (ready, delayed, waiting) are left alone,
    unless their ttl has run out: then they are dead, swept or not yet.

    Args:
        ids: message ids.
        queue_id: if given, only messages of this queue.

    Returns:
        How many messages changed.
    """
    if not ids:
        return 0
    expire_ids(txn, ids)
    marks = ",".join(["%s"] * len(ids))
    where = f"id IN ({marks}) AND state IN (1, 2)"
    params: list[object] = [txn.now, *ids]
    if queue_id is not None:
        where += " AND queue_id = %s"
        params.append(queue_id)
    rows = txn.exec(
        "UPDATE leasecast_message SET "
        'state = CASE WHEN "group" IS NULL THEN 0 ELSE 4 END, visible_at = %s, '
        f"deliveries = 0, lease_token = NULL, dead_reason = NULL WHERE {where} "
        'RETURNING queue_id, "group"',
        params,
    ).fetchall()
    for row_queue, group in rows:
        txn.unsettle(row_queue, group, reordered=True)
        txn.woken.add(txn.queues.name_of(txn, row_queue))
        txn.forget_length(row_queue)
        txn.count(row_queue, "enqueued")
    return len(rows)


def delete_message(
    txn: Txn, q: QueueRow, msg_id: int, expect: MessageCondition | None = None
) -> int:
    """Delete one message in any state; its group's next message may go.

    Returns 0, changing nothing, if the message no longer matches ``expect``.

    Raises:
        NotFound: ``q`` has no message ``msg_id``.
    """
    if expect is not None and not _matches(txn, q, msg_id, expect):
        return 0
    row = txn.exec(
        'DELETE FROM leasecast_message WHERE id = %s AND queue_id = %s RETURNING "group"',
        (msg_id, q.id),
    ).fetchone()
    if row is None:
        raise NotFound(f"queue {q.name!r} has no message {msg_id}")
    txn.unsettle(q.id, row[0])
    txn.forget_length(q.id)
    return 1


def requeue_message(
    txn: Txn, q: QueueRow, msg_id: int, expect: MessageCondition | None = None
) -> int:
    """:func:`requeue_ids` for one message of ``q`` (0 if it was not dead or leased,
    or no longer matches ``expect``).

    Raises:
        NotFound: ``q`` has no message ``msg_id``.
    """
    # An empty condition holds for any message: it only checks that it exists.
    if not _matches(txn, q, msg_id, expect or MessageCondition()):
        return 0
    return requeue_ids(txn, [msg_id], q.id)


def cancel_message(txn: Txn, q: QueueRow, msg_id: int) -> CancelResult:
    """Dead-letter message ``msg_id`` of ``q`` now with reason ``cancelled``,
    whatever its state (protocol 1.2: Cancel).

    A lease on it ends with it: its receipt is stale from now on (every
    statement that ends a lease wants ``state = 1``). If the message was in
    flight, the result names that lease's receipt so that the socket holding
    it can be told, and on PostgreSQL the transaction announces it with
    ``NOTIFY`` on :data:`CANCEL_CHANNEL`, delivered to every gateway process
    when it commits (whichever connection it runs on: the gateway's store or
    Django's, for the admin).

    Returns:
        ``cancelled`` 1, or 0 if the message was already dead (its ttl ran
        out counts: it is dead, swept or not yet).

    Raises:
        NotFound: ``q`` has no message ``msg_id`` (never, or acked).
    """
    expire_ids(txn, [msg_id])
    row = txn.exec(
        "SELECT state, visible_at, lease_token FROM leasecast_message "
        "WHERE id = %s AND queue_id = %s",
        (msg_id, q.id),
    ).fetchone()
    if row is None:
        raise NotFound(f"queue {q.name!r} has no message {msg_id}")
    state, visible_at, token = int(row[0]), float(row[1]), row[2]
    if state == DEAD:
        return CancelResult(0)
    in_flight = state == LEASED and visible_at > txn.now and token is not None
    dead_letter_ids(txn, [msg_id], "cancelled")
    # It left the states a bounded queue counts (visible, delayed), or its
    # lease ended; a group's next message is promoted by settling.
    txn.forget_length(q.id)
    if not in_flight:
        return CancelResult(1)
    txn.woken.add(q.name)  # a place under max_in_flight is free again
    receipt = format_receipt(msg_id, int(token))
    if txn.dialect is POSTGRESQL:
        txn.exec("SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, f"{q.name} {msg_id} {receipt}"))
    return CancelResult(1, receipt)


def _matches(txn: Txn, q: QueueRow, msg_id: int, expect: MessageCondition) -> bool:
    """Whether message ``msg_id`` of ``q`` is still as ``expect`` says (its ttl
    applied first, as a listing applies it).

    Raises:
        NotFound: ``q`` has no message ``msg_id``.
    """
    expire_ids(txn, [msg_id])
    row = txn.exec(
        "SELECT state, visible_at, deliveries FROM leasecast_message "
        "WHERE id = %s AND queue_id = %s",
        (msg_id, q.id),
    ).fetchone()
    if row is None:
        raise NotFound(f"queue {q.name!r} has no message {msg_id}")
    state, visible_at, deliveries = StoredState(row[0]), float(row[1]), int(row[2])
    return (
        (expect.state is None or observed_state(state, visible_at, txn.now).value == expect.state)
        and (expect.deliveries is None or deliveries == expect.deliveries)
        and (expect.visible_at is None or visible_at == expect.visible_at)
    )


_BROWSE_COLUMNS = (
    'id, state, body, deliveries, enqueued_at, "group", priority, dead_reason, visible_at, '
    '"key", expires_at'
)


def browse(txn: Txn, q: QueueRow, state: BrowseState, limit: int, after: int | None) -> BrowsePage:
    """A page of ``q``'s messages in ``state``, without leasing or changing them.

    Visible messages come in delivery order (priority, then enqueue order);
    the other states in enqueue order. ``after`` is the last id of the
    previous page: the page goes on after it in that order, wherever that
    message is now. If it no longer exists (acked, deleted), the page holds
    the messages enqueued after it, in delivery order.
    """
    if not 1 <= limit <= 1000:
        raise Invalid("limit must be 1..1000")
    expire(txn, q)
    now = txn.now
    params: list[object] = [q.id]
    if state == "dead":
        where = "state = 2"
    else:
        where = _STATE_SQL[state]
        params.append(now)
    order = "id"
    if state == "visible":
        order = "priority DESC, id"
        if after is not None:
            found = txn.exec(
                "SELECT priority FROM leasecast_message WHERE id = %s AND queue_id = %s",
                (after, q.id),
            ).fetchone()
            if found is not None:
                where += " AND (priority < %s OR (priority = %s AND id > %s))"
                params += [found[0], found[0], after]
                after = None
    if after is not None:
        where += " AND id > %s"
        params.append(after)
    rows = txn.exec(
        f"SELECT {_BROWSE_COLUMNS} FROM leasecast_message WHERE queue_id = %s AND {where} "
        f"ORDER BY {order} LIMIT %s",
        (*params, limit + 1),
    ).fetchall()
    page = [_browsed(row, state, now) for row in rows[:limit]]
    return BrowsePage(page, page[-1].id if len(rows) > limit else None)


def _browsed(row: Any, state: BrowseState, now: float) -> BrowsedMessage:
    (msg_id, _, body, deliveries, enqueued_at, group, priority, reason, visible_at, key, exp) = row
    timed = state in ("delayed", "in_flight")
    return BrowsedMessage(
        id=str(msg_id),
        state=state,
        body_json=str(body),
        deliveries=int(deliveries),
        enqueued_at=float(enqueued_at),
        group=group,
        priority=int(priority),
        dead_reason=reason,
        visible_in=round(float(visible_at) - now, 3) if timed else None,
        key=key,
        expires_in=None if exp is None else round(float(exp) - now, 3),
        visible_at=float(visible_at),
    )
