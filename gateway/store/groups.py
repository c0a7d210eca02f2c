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
left without a head. A requeued or redriven message is WAITING again too; if
it is earlier than its group's head and that head is not in flight, the head
steps back to WAITING, so the group keeps its enqueue order; if the head is
in flight, the requeued message goes next. Either way one message at a time.

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
    reordered = txn.reordered
    txn.unsettled, txn.reordered = set(), set()
    lock = txn.dialect.lock_groups(keys)
    if lock is not None:
        txn.exec(*lock)
    for queue_id, run in groupby(keys, key=lambda key: key[0]):
        groups = [group for _, group in run]
        for start in range(0, len(groups), _CHUNK):
            chunk = groups[start : start + _CHUNK]
            marks = ",".join(["%s"] * len(chunk))
            back = [group for group in chunk if (queue_id, group) in reordered]
            if back:
                _step_back(txn, queue_id, back)
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


def _step_back(txn: Txn, queue_id: int, groups: list[str]) -> None:
    """A head not yet leased (READY or DELAYED) with an earlier WAITING message
    in its group goes back to WAITING, for :func:`settle` to promote the earlier."""
    marks = ",".join(["%s"] * len(groups))
    txn.exec(
        "UPDATE leasecast_message SET state = 4 "
        f'WHERE queue_id = %s AND "group" IN ({marks}) AND state IN (0, 3) '
        "AND EXISTS (SELECT 1 FROM leasecast_message AS w"
        "  WHERE w.queue_id = leasecast_message.queue_id"
        '  AND w."group" = leasecast_message."group"'
        "  AND w.state = 4 AND w.id < leasecast_message.id)",
        (queue_id, *groups),
    )
