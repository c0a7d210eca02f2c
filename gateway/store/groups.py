"""Ordering groups: one message of a group in flight at a time, in enqueue order.

Protocol 1.1: a message of a group is not leased while an earlier message of
the same group is still in the queue (visible, delayed or in flight).

The store keeps that rule with a stored state instead of a check in the lease
statement. Of a group's messages that are not dead, only the earliest, the
*head*, is READY, DELAYED or LEASED; the others are WAITING, which no lease
round looks at. So leasing costs the same with or without groups, and two
gateway processes cannot lease two messages of one group: only one of them
is leasable at all.

Whatever may remove a head (ack, reject, dead-lettering, expiry, overflow,
purge, delete) or add a message to a group (enqueue, requeue, redrive) notes
the group in :attr:`Txn.unsettled`; :func:`settle` then runs once per batch,
before the commit, and promotes the earliest WAITING message of each group
left without a head. A requeued or redriven message is WAITING again too, so
it waits for the current head rather than running beside it.

On PostgreSQL, two transactions could each see the other's group as headless
(read committed sees neither's uncommitted changes), so settling takes an
advisory lock per group first (``Dialect.lock_groups``). The settling
statement then sees every settlement committed before it, and the last
transaction to touch a group always leaves it with exactly one head.
``tests/unit/test_groups_concurrency.py`` shows two heads without the lock.
"""

from __future__ import annotations

from itertools import groupby

from gateway.store.txn import Txn

__all__ = ["settle"]

_CHUNK = 200


def settle(txn: Txn) -> None:
    """Give every group noted in ``txn.unsettled`` a head, if it has messages left."""
    if not txn.unsettled:
        return
    keys = sorted(txn.unsettled)
    txn.unsettled = set()
    lock = txn.dialect.lock_groups(keys)
    if lock is not None:
        txn.exec(*lock)
    for queue_id, run in groupby(keys, key=lambda key: key[0]):
        groups = [group for _, group in run]
        for start in range(0, len(groups), _CHUNK):
            chunk = groups[start : start + _CHUNK]
            marks = ",".join(["%s"] * len(chunk))
            promoted = txn.exec(
                "UPDATE leasecast_message "
                "SET state = CASE WHEN visible_at > %s THEN 3 ELSE 0 END "
                "WHERE id IN ("
                "  SELECT MIN(w.id) FROM leasecast_message AS w"
                f'  WHERE w.queue_id = %s AND w."group" IN ({marks}) AND w.state = 4'
                "  AND NOT EXISTS (SELECT 1 FROM leasecast_message AS h"
                '    WHERE h.queue_id = w.queue_id AND h."group" = w."group"'
                "    AND h.state IN (0, 1, 3))"
                '  GROUP BY w."group")',
                (txn.now, queue_id, *chunk),
            ).rowcount
            if promoted:
                txn.woken.add(txn.queues.name_of(txn, queue_id))
