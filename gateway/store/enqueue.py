"""Enqueue: inserts, idempotency keys, and bounded queues (protocol: Enqueue; 1.1 additions).

A message of a group is inserted WAITING; the group is settled before the
commit (``gateway.store.groups``), which makes it the head if its group had
none. A bounded queue (``max_length`` > 0) is counted after the insert, inside
a savepoint, so a refused enqueue changes nothing (not even its key's claim).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.core.errors import QueueFull
from gateway.core.leases import StoredState
from gateway.core.protocol import EnqueueSpec
from gateway.store.expiry import dead_letter_ids, expire
from gateway.store.ops import Enqueue, EnqueueResult
from gateway.store.txn import QueueRow, Txn

__all__ = ["enqueue", "enqueue_plain", "is_plain_enqueue"]

_INSERT_CHUNK = 500  # rows per INSERT statement, which bounds its size


def enqueue(txn: Txn, queue: str, specs: Sequence[EnqueueSpec]) -> list[EnqueueResult]:
    """Enqueue ``specs`` to ``queue`` in order, all or nothing.

    Raises:
        QueueFull: the queue is bounded and they do not fit (``drop_newest``
            or ``block``); nothing was applied.
    """
    q = txn.queue(queue, create=True)
    if not q.settings.max_length:
        return _enqueue_into(txn, q, specs)
    if q.settings.overflow != "drop_oldest" and all(spec.key is None for spec in specs):
        # Without keys every message counts: a full queue is refused before
        # any write, which is most of what a full queue sees.
        _check_room(txn, q, len(specs))
    with txn.savepoint():
        results = _enqueue_into(txn, q, specs)
        added = sum(1 for r in results if not r.duplicate)
        if added:
            _enforce_length(txn, q, added)
    return results


def is_plain_enqueue(txn: Txn, op: object) -> bool:
    """True for an enqueue that can share one INSERT with its neighbours: no
    idempotency keys, and a queue without ``max_length``."""
    if not isinstance(op, Enqueue) or any(spec.key is not None for spec in op.messages):
        return False
    return not txn.queue(op.queue, create=True).settings.max_length


def enqueue_plain(txn: Txn, ops: Sequence[Enqueue]) -> list[list[EnqueueResult]]:
    """Apply a run of plain enqueues (see :func:`is_plain_enqueue`) as one INSERT."""
    rows: list[tuple[QueueRow, EnqueueSpec]] = []
    for op in ops:
        q = txn.queue(op.queue, create=True)
        rows += [(q, spec) for spec in op.messages]
    ids = iter(insert(txn, rows))
    return [[EnqueueResult(str(next(ids)), False) for _ in op.messages] for op in ops]


def insert(txn: Txn, rows: Sequence[tuple[QueueRow, EnqueueSpec]]) -> list[int]:
    """Insert messages; returns their ids in the order given."""
    now = txn.now
    ids: list[int] = []
    for start in range(0, len(rows), _INSERT_CHUNK):
        chunk = rows[start : start + _INSERT_CHUNK]
        values: list[tuple[Any, ...]] = []
        for q, spec in chunk:
            if spec.group is not None:
                state = StoredState.WAITING
                txn.unsettle(q.id, spec.group)
            else:
                state = StoredState.DELAYED if spec.delay > 0 else StoredState.READY
            values.append(
                (
                    q.id,
                    spec.body_json.decode(),
                    spec.key,
                    int(state),
                    now + spec.delay,
                    now,
                    spec.group,
                    spec.priority,
                    None if spec.ttl is None else now + spec.ttl,
                )
            )
            if spec.ttl is not None and now + spec.ttl < q.sweep_at:
                q.sweep_at = now + spec.ttl  # swept by the first round after it runs out
            txn.woken.add(q.name)
            txn.count(q.id, "enqueued")
        ids += txn.dialect.insert(txn.exec, values)
    return ids


def _enqueue_into(txn: Txn, q: QueueRow, specs: Sequence[EnqueueSpec]) -> list[EnqueueResult]:
    results: list[EnqueueResult | None] = [None] * len(specs)
    plain: list[int] = []

    def flush() -> None:
        ids = insert(txn, [(q, specs[i]) for i in plain])
        for i, msg_id in zip(plain, ids, strict=True):
            results[i] = EnqueueResult(str(msg_id), False)
        plain.clear()

    for index, spec in enumerate(specs):
        if spec.key is None:
            plain.append(index)
            continue
        # Keyed messages go one by one, in order, so a key repeated inside
        # one batch is a duplicate of its first occurrence.
        if plain:
            flush()
        results[index] = _enqueue_keyed(txn, q, spec)
    if plain:
        flush()
    return [r for r in results if r is not None]


def _enqueue_keyed(txn: Txn, q: QueueRow, spec: EnqueueSpec) -> EnqueueResult:
    # Claim the key first: the upsert takes it if new or expired. On
    # PostgreSQL a concurrent claimer waits on the unique index, so two
    # gateways cannot both enqueue one key.
    now = txn.now
    claimed = txn.exec(
        'INSERT INTO leasecast_dedup (queue_id, "key", msg_id, expires_at) '
        'VALUES (%s, %s, 0, %s) ON CONFLICT (queue_id, "key") DO UPDATE '
        "SET msg_id = 0, expires_at = excluded.expires_at "
        "WHERE leasecast_dedup.expires_at <= %s RETURNING queue_id",
        (q.id, spec.key, now + q.settings.dedup_window, now),
    ).fetchone()
    if claimed is None:
        existing = txn.exec(
            'SELECT msg_id FROM leasecast_dedup WHERE queue_id = %s AND "key" = %s',
            (q.id, spec.key),
        ).fetchone()
        return EnqueueResult(str(existing[0]), True)
    (msg_id,) = insert(txn, [(q, spec)])
    txn.exec(
        'UPDATE leasecast_dedup SET msg_id = %s WHERE queue_id = %s AND "key" = %s',
        (msg_id, q.id, spec.key),
    )
    return EnqueueResult(str(msg_id), False)


def _length(txn: Txn, q: QueueRow) -> int:
    """How many messages of bounded queue ``q`` count against ``max_length`` now."""
    expire(txn, q)  # expired messages no longer count
    count = txn.lengths.get(q.id)
    if count is None:
        (count,) = txn.exec(_COUNT, (q.id, q.id, txn.now, q.id)).fetchone()
        txn.lengths[q.id] = count
    return count


def _check_room(txn: Txn, q: QueueRow, n: int) -> None:
    """Refuse ``n`` more messages if they would take ``q`` past ``max_length``."""
    if _length(txn, q) + n > q.settings.max_length:
        raise _full(q)


def _full(q: QueueRow) -> QueueFull:
    return QueueFull(
        f"queue {q.name!r} holds its max_length of {q.settings.max_length} messages",
        queue=q.name,
        may_wait=q.settings.overflow == "block",
    )


def _enforce_length(txn: Txn, q: QueueRow, added: int) -> None:
    """After ``added`` messages went into bounded queue ``q``: apply its overflow
    policy if it is over ``max_length``.

    Counted once per transaction and queue (three index range counts), then
    kept up to date here, so a batch of enqueues does not count again each.
    """
    expired = q.id not in txn.swept and expire(txn, q)
    count = txn.lengths.get(q.id)
    if count is None or expired:
        # Counted afresh, the rows just inserted included.
        (count,) = txn.exec(_COUNT, (q.id, q.id, txn.now, q.id)).fetchone()
    else:
        count += added
    excess = count - q.settings.max_length
    if excess <= 0:
        txn.lengths[q.id] = count
        return
    if q.settings.overflow == "drop_oldest":
        dead_letter_ids(txn, _oldest(txn, q, excess), "overflow")
        txn.lengths[q.id] = count - excess
        return
    raise _full(q)


def _oldest(txn: Txn, q: QueueRow, n: int) -> list[int]:
    """Take the ``n`` oldest counted messages of ``q`` (earliest enqueued, any priority)."""
    known = txn.oldest.get(q.id, [])
    if len(known) < n:
        # Read ahead: the next enqueues of this batch will want the next ones.
        # Messages inserted later are newer than all of these, so the list
        # stays the oldest until something else forgets it.
        known = [
            row[0]
            for row in txn.exec(
                _OLDEST, (q.id, q.id, txn.now, q.id, max(n, _OLDEST_READ_AHEAD))
            ).fetchall()
        ]
    txn.oldest[q.id] = known[n:]
    return known[:n]


#: Messages that count against ``max_length``: visible or delayed, not in
#: flight. Each part is a range of one partial index (ready; timed; grouped).
_COUNTED_PARTS = (
    "SELECT {what} FROM leasecast_message WHERE queue_id = %s AND state = 0",
    "SELECT {what} FROM leasecast_message WHERE queue_id = %s AND state IN (1, 3) "
    "AND (state = 3 OR visible_at <= %s)",
    'SELECT {what} FROM leasecast_message WHERE queue_id = %s AND "group" IS NOT NULL '
    "AND state = 4",
)
_COUNT = "SELECT " + " + ".join(f"({p.format(what='COUNT(*)')})" for p in _COUNTED_PARTS)
_OLDEST = (
    "SELECT id FROM ("
    + " UNION ALL ".join(p.format(what="id") for p in _COUNTED_PARTS)
    + ") AS counted ORDER BY id LIMIT %s"
)
_OLDEST_READ_AHEAD = 256
