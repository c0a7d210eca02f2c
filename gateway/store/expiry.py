"""Expiry and dead-lettering: the statements that take messages out of reach.

Leasing (``gateway.store.leasing``), enqueue (a bounded queue's overflow) and
the operator's reads all sweep a queue's expired messages first, and leasing
and enqueue dead-letter messages by id; both live here, under all three, so
that none of them imports another for it.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.core.leases import DeadReason
from gateway.store.txn import QueueRow, Txn

__all__ = ["dead_letter_ids", "expire", "expire_ids"]

_EXPIRE = (
    "UPDATE leasecast_message SET state = 2, dead_reason = 'expired', lease_token = NULL, "
    'expires_at = NULL WHERE {where} AND expires_at <= %s RETURNING queue_id, "group"'
)


def expire(txn: Txn, q: QueueRow) -> int:
    """Dead-letter (reason ``expired``) every message of ``q`` whose ttl has run out.

    Once per transaction and queue: the transaction's clock does not move.
    """
    if q.id in txn.swept:
        return 0
    txn.swept.add(q.id)
    return _expire(txn, "queue_id = %s", [q.id])


def expire_ids(txn: Txn, ids: Sequence[int]) -> int:
    """:func:`expire` for these messages only (whatever their queue)."""
    if not ids:
        return 0
    return _expire(txn, "id IN (" + ",".join(["%s"] * len(ids)) + ")", list(ids))


def _expire(txn: Txn, where: str, params: list[object]) -> int:
    rows = txn.exec(_EXPIRE.format(where=where), (*params, txn.now)).fetchall()
    for queue_id, group in rows:
        txn.unsettle(queue_id, group)
        txn.forget_length(queue_id)
        txn.count(queue_id, "dead_lettered", label="expired")
    return len(rows)


def dead_letter_ids(txn: Txn, ids: Sequence[int], reason: DeadReason) -> None:
    """Dead-letter these messages with ``reason`` (their leases become stale)."""
    if not ids:
        return
    # A dead message has no ttl left: a requeue or redrive gives it a fresh start.
    rows = txn.exec(
        "UPDATE leasecast_message SET state = 2, dead_reason = %s, lease_token = NULL, "
        "expires_at = NULL WHERE id IN (" + ",".join(["%s"] * len(ids)) + ") "
        'RETURNING queue_id, "group"',
        (reason, *ids),
    ).fetchall()
    for queue_id, group in rows:
        txn.unsettle(queue_id, group)
        txn.count(queue_id, "dead_lettered", label=reason)
