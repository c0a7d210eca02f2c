"""Leases and how they end: lease rounds, ack, nack, reject, extend, release.

Leasing is one statement per round (design decision 2, ``Dialect.lease``). A
receipt names one delivery (design decision 4): every statement that ends a
lease checks the lease token, that the lease has not timed out, and that the
message's ``ttl`` has not run out, so a stale receipt changes nothing.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from gateway.core.errors import StaleReceipt
from gateway.core.leases import (
    format_receipt,
    lease_outcome,
    lease_seconds_bucket,
    parse_receipt,
    release_state,
)
from gateway.core.queue_limits import Allowance, Bucket, allowance
from gateway.store import tasks
from gateway.store.enqueue import enqueue
from gateway.store.expiry import dead_letter_ids, expire
from gateway.store.ops import (
    Ack,
    AckResult,
    Delivered,
    EnqueueResult,
    Extend,
    Lease,
    LeaseResult,
    Nack,
    Release,
)
from gateway.store.txn import QueueRow, Txn

__all__ = [
    "LEASE_SECONDS",
    "LEASE_SECONDS_SUM",
    "ack",
    "ack_plain",
    "extend",
    "lease",
    "nack",
    "reject",
    "release",
]

_ACK_CHUNK = 500
#: Queue counters of the lease-length histogram (``leasecast_queue_lease_seconds``):
#: acks per bucket (the label), and the sum of their lengths in milliseconds.
LEASE_SECONDS = "lease_seconds"
LEASE_SECONDS_SUM = "lease_seconds_sum_ms"
#: Seconds after which a pump waiting on a paused queue looks again, at least
#: (a resume on this process, or by NOTIFY, wakes it sooner).
PAUSED_RECHECK = 1.0
#: Seconds between a queue's sweeps of expired messages in its lease rounds,
#: at most, when no ttl it knows of runs out sooner (see :func:`lease`).
SWEEP_EVERY = 1.0
#: Seconds after which a round that found a limited queue's row held by
#: another transaction, and could not wait for it, tries again (rare: only a
#: batch that already holds a later queue's row; see :func:`_allowance`).
BUSY_RETRY = 0.05
_STALE = "the receipt is not a current lease (acked, expired or redelivered)"
#: A lease is current while its timeout and its message's ttl both lie ahead.
_CURRENT = (
    "lease_token = %s AND state = 1 AND visible_at > %s AND (expires_at IS NULL OR expires_at > %s)"
)


def lease(txn: Txn, op: Lease) -> LeaseResult:
    """Lease up to ``op.n`` messages, dead-lettering those past ``max_deliveries``.

    A paused queue leases nothing; a limited one at most what its
    ``max_in_flight`` and token bucket allow, counted in this transaction
    (:func:`_allowance`), so no number of processes can exceed them.

    A queue this process believes uncontrolled (its cached settings) leases
    with a guarded statement that takes nothing if the stored row says the
    queue is paused or limited; a round that comes back empty reads the row
    and, if so, goes on under the control rules. So a pause or a limit stored
    by another process binds here from its commit on, not a settings TTL later.

    A message past its ttl is never leased (the lease statement's
    condition). Dead-lettering such messages (the sweep, ``expire``) is a
    statement of its own, so a round runs it only when a ttl it knows of has
    run out, or every :data:`SWEEP_EVERY` seconds for those it cannot know
    of (enqueued by another process since): each round learns the queue's
    earliest ttl along with its next due time, and an enqueue through this
    cache lowers it. An operator's read sweeps first anyway.
    """
    q = txn.queue(op.queue, create=True)
    now = txn.now
    if q.sweep_at <= now:
        expire(txn, q)
        q.sweep_at = now + SWEEP_EVERY
    result = LeaseResult()
    limit_due: float | None = None
    after: tuple[float | None, float | None] | None = None
    controlled = q.settings.paused or q.settings.limited
    if not controlled:
        after = _lease_into(txn, q, op, op.n, result, guarded=True)
        # The guard takes all or nothing: only an empty round may be its doing.
        empty = not result.delivered and not result.dead_lettered
        controlled = empty and _became_controlled(txn, q)
    if controlled:
        wanted = op.n - len(result.delivered)
        limits = _allowance(txn, q, wanted)
        if limits == "paused":  # look again when the settings may have changed
            result.next_due = now + max(PAUSED_RECHECK, txn.queues.ttl)
            return result
        if limits == "busy":  # another process is leasing from it right now
            result.next_due = now + BUSY_RETRY
            return result
        before = len(result.delivered)
        if limits.n > 0:  # else no statement runs, and the guarded one's reading stands
            after = _lease_into(txn, q, op, limits.n, result, guarded=False)
        leased = len(result.delivered) - before
        bucket = limits.spent(leased)
        if bucket is not None:
            txn.exec(
                "UPDATE leasecast_queue SET rate_tokens = %s, rate_refilled_at = %s WHERE id = %s",
                (bucket.tokens, bucket.refilled_at, q.id),
            )
        limit_due = limits.wake_at(leased, wanted)
    if after is not None:
        # Read by the lease statement itself, but for the leases it made.
        due, expiring = after
        ends = [d.expires_at for d in result.delivered]
        if ends:
            due = min(ends) if due is None else min(due, *ends)
    elif len(result.delivered) < op.n:
        # One statement, one round trip: the next lease to time out or
        # delayed message to come due, and the next ttl to run out.
        due, expiring = txn.exec(_NEXT_DUE, (q.id, q.id)).fetchone()
    else:
        due = expiring = None
    if expiring is not None and expiring < q.sweep_at:
        q.sweep_at = expiring
    if len(result.delivered) < op.n:
        times = [t for t in (due, expiring, limit_due) if t is not None]
        result.next_due = min(times) if times else None
    return result


_NEXT_DUE = (
    "SELECT (SELECT MIN(visible_at) FROM leasecast_message "
    "WHERE queue_id = %s AND state IN (1, 3)), "
    "(SELECT MIN(expires_at) FROM leasecast_message "
    "WHERE queue_id = %s AND expires_at IS NOT NULL)"
)


def _lease_into(
    txn: Txn, q: QueueRow, op: Lease, wanted: int, result: LeaseResult, *, guarded: bool
) -> tuple[float | None, float | None] | None:
    """Lease up to ``wanted`` messages into ``result``, refilling what
    ``max_deliveries`` dead-letters on the way, until the queue runs dry.

    Args:
        guarded: take nothing if the queue's stored row is paused or limited
            (``Dialect.lease``), for a round run without the control rules.

    Returns:
        The last lease statement's ``Leased.after``: None if the dialect does
        not read it, if that statement leased all it asked for, or if no
        statement ran.
    """
    now = txn.now
    timeout = op.visibility_timeout or q.settings.visibility_timeout
    after: tuple[float | None, float | None] | None = None
    while wanted > 0:
        token = secrets.randbits(62)
        leased = txn.dialect.lease(
            txn.exec, q.id, wanted, now, now + timeout, token, guarded=guarded
        )
        rows, after = leased.rows, leased.after
        # The rows' order is not promised: restore delivery order.
        rows.sort(key=lambda row: (-row[4], row[0]))
        dead: list[int] = []
        for msg_id, body, deliveries, group, priority, lease_end in rows:
            if lease_outcome(deliveries, q.settings.max_deliveries) == "dead_letter":
                dead.append(msg_id)
            else:
                result.delivered.append(
                    Delivered(
                        str(msg_id),
                        format_receipt(msg_id, token),
                        body,
                        deliveries,
                        lease_end,
                        group,
                        priority,
                    )
                )
        delivered = result.delivered[len(result.delivered) - (len(rows) - len(dead)) :]
        txn.count(q.id, "delivered", len(delivered))
        txn.count(q.id, "redelivered", sum(1 for d in delivered if d.deliveries > 1))
        if dead:
            # Not delivered after all: the raised count is put back, so a
            # dead message shows the deliveries it really had.
            txn.exec(
                "UPDATE leasecast_message SET deliveries = deliveries - 1 WHERE id IN ("
                + ",".join(["%s"] * len(dead))
                + ")",
                dead,
            )
            dead_letter_ids(txn, dead, "max_deliveries")
            result.dead_lettered += len(dead)
            # The statement read the earliest ttl before these lost theirs:
            # its reading no longer holds, and lease() reads afresh.
            after = None
        if rows:
            txn.leased(q.id, [row[0] for row in rows])
        asked, wanted = wanted, wanted - (len(rows) - len(dead))
        if len(rows) < asked:
            break  # the queue ran dry (or the guard held); else refill the dead-lettered
    return after


def _became_controlled(txn: Txn, q: QueueRow) -> bool:
    """Whether ``q``'s stored row is paused or limited though the cache said not
    (another process changed it); the cache takes the stored values either way."""
    row = txn.exec(
        "SELECT paused, max_in_flight, rate_limit, rate_burst FROM leasecast_queue WHERE id = %s",
        (q.id,),
    ).fetchone()
    if row is None:
        return False
    paused, max_in_flight, rate_limit, rate_burst = row
    q.settings = replace(
        q.settings,
        paused=bool(paused),
        max_in_flight=max_in_flight,
        rate_limit=rate_limit,
        rate_burst=rate_burst,
    )
    txn.queues.note_control(q)
    return q.settings.paused or q.settings.limited


def _allowance(txn: Txn, q: QueueRow, wanted: int) -> Allowance | Literal["paused", "busy"]:
    """How many messages this round may lease under ``q``'s limits; ``"paused"``;
    or ``"busy"``: another transaction holds the queue and this one may not wait.

    Reads the queue's control row afresh (locked until the commit on
    PostgreSQL, ``Dialect.control``), so a resume or a new limit stored by any
    process counts here at once, and counts the queue's leases in flight after
    the lock, so every lease committed before it is seen.
    """
    # Queue rows are locked in ascending id order within a transaction; one
    # that would come out of order is not waited for (SKIP LOCKED), so two
    # transactions can never each wait for the other's queue.
    locked = txn.control_locked
    wait = q.id in locked or all(other < q.id for other in locked)
    row = txn.dialect.control(txn.exec, q.id, wait=wait)
    if row is None:
        return "busy" if not wait else Allowance(wanted, None, 0.0, False, txn.now)
    locked.add(q.id)
    paused, max_in_flight, rate_limit, rate_burst, tokens, refilled_at = row
    # The fresh values replace the cached ones on this process.
    q.settings = replace(
        q.settings,
        paused=bool(paused),
        max_in_flight=max_in_flight,
        rate_limit=rate_limit,
        rate_burst=rate_burst,
    )
    txn.queues.note_control(q)
    settings = q.settings
    if settings.paused:
        return "paused"
    in_flight = 0
    if settings.max_in_flight > 0:
        in_flight = txn.dialect.in_flight(txn.exec, q.id, txn.now)
    return allowance(
        wanted,
        now=txn.now,
        max_in_flight=settings.max_in_flight,
        in_flight=in_flight,
        rate=settings.rate_limit,
        burst=settings.burst,
        bucket=Bucket(tokens, refilled_at),
    )


def _lease_ended(txn: Txn, queue_id: int, leased_at: float | None, acked: bool) -> None:
    """A lease of ``queue_id`` ended: observe its length if acked, and wake the
    queue's workers if it has a ``max_in_flight`` (there is room again)."""
    if acked and leased_at is not None:
        seconds = max(0.0, txn.now - leased_at)
        txn.count(queue_id, LEASE_SECONDS, label=lease_seconds_bucket(seconds))
        txn.count(queue_id, LEASE_SECONDS_SUM, round(seconds * 1000))
    name = txn.queues.in_flight_limited(queue_id)
    if name is not None:
        txn.woken.add(name)


def _parse(receipt: str) -> tuple[int, int]:
    parsed = parse_receipt(receipt)
    if parsed is None:
        raise StaleReceipt(f"receipt {receipt[:60]!r} was never issued")
    return parsed


def _end_lease(txn: Txn, receipt: str, set_sql: str, params: Sequence[object]) -> tuple[int, str]:
    """Apply ``set_sql`` to the message of a current lease; returns (queue id, group)."""
    msg_id, token = _parse(receipt)
    row = txn.exec(
        f"UPDATE leasecast_message SET {set_sql} WHERE id = %s AND {_CURRENT} "
        'RETURNING queue_id, "group"',
        (*params, msg_id, token, txn.now, txn.now),
    ).fetchone()
    if row is None:
        raise StaleReceipt(_STALE)
    return row[0], row[1]


def ack(txn: Txn, op: Ack) -> AckResult:
    """Delete a leased message and enqueue its follow-ups, all or nothing."""

    if not op.follow_ups:
        return _ack_one(txn, op)
    # A follow-up refused by a bounded queue must take the ack back with it.
    with txn.savepoint():
        _ack_one(txn, op)
        by_queue: dict[str, list[int]] = {}
        for index, (queue, _) in enumerate(op.follow_ups):
            by_queue.setdefault(queue, []).append(index)
        slots: list[EnqueueResult | None] = [None] * len(op.follow_ups)
        for queue, indices in by_queue.items():
            specs = [op.follow_ups[i][1] for i in indices]
            for i, res in zip(indices, enqueue(txn, queue, specs), strict=True):
                slots[i] = res
    return AckResult([s for s in slots if s is not None])


def _ack_one(txn: Txn, op: Ack) -> AckResult:
    msg_id, token = _parse(op.receipt)
    row = txn.exec(
        f"DELETE FROM leasecast_message WHERE id = %s AND {_CURRENT} "
        'RETURNING queue_id, "group", leased_at',
        (msg_id, token, txn.now, txn.now),
    ).fetchone()
    if row is None:
        raise StaleReceipt(_STALE)
    txn.unsettle(row[0], row[1])
    txn.count(row[0], "acked")
    _lease_ended(txn, row[0], row[2], acked=True)
    if op.task is not None:
        tasks.record(txn, msg_id, op.task)
    return AckResult([])


def ack_plain(txn: Txn, ops: Sequence[Ack]) -> list[AckResult | StaleReceipt]:
    """Apply a run of acks without follow-ups with one DELETE per chunk."""
    results: list[AckResult | StaleReceipt] = [StaleReceipt(_STALE)] * len(ops)
    wanted: dict[int, tuple[int, int]] = {}  # op index -> (id, token)
    for k, op in enumerate(ops):
        parsed = parse_receipt(op.receipt)
        if parsed is None:
            results[k] = StaleReceipt(f"receipt {op.receipt[:60]!r} was never issued")
        else:
            wanted[k] = parsed
    deleted: set[tuple[int, int]] = set()
    pairs = list(dict.fromkeys(wanted.values()))
    for start in range(0, len(pairs), _ACK_CHUNK):
        chunk = pairs[start : start + _ACK_CHUNK]
        for msg_id, token, queue_id, group, leased_at in txn.dialect.ack_many(
            txn.exec, chunk, txn.now
        ):
            deleted.add((msg_id, token))
            txn.unsettle(queue_id, group)
            txn.count(queue_id, "acked")
            _lease_ended(txn, queue_id, leased_at, acked=True)
    for k, pair in wanted.items():
        if pair in deleted:
            deleted.discard(pair)  # a receipt repeated in one batch acks once
            results[k] = AckResult([])
    return results


def nack(txn: Txn, op: Nack) -> None:
    """Release a lease; visible again after ``op.delay`` (a group keeps its head)."""
    state = int(release_state(op.delay))
    queue_id, _ = _end_lease(
        txn,
        op.receipt,
        "state = %s, visible_at = %s, lease_token = NULL",
        (state, txn.now + op.delay),
    )
    if op.task is not None:
        tasks.record(txn, _parse(op.receipt)[0], op.task)
    txn.forget_length(queue_id)  # visible or delayed again: it counts
    txn.woken.add(op.queue)


def reject(txn: Txn, receipt: str) -> None:
    """Dead-letter a leased message now (reason ``rejected``)."""
    queue_id, group = _end_lease(
        txn,
        receipt,
        "state = 2, lease_token = NULL, dead_reason = 'rejected', expires_at = NULL",
        (),
    )
    txn.unsettle(queue_id, group)
    txn.count(queue_id, "dead_lettered", label="rejected")
    _lease_ended(txn, queue_id, None, acked=False)


def extend(txn: Txn, op: Extend) -> float:
    """Move a lease's end to ``op.timeout`` from now (never past the message's ttl)."""
    end = txn.now + op.timeout
    msg_id, token = _parse(op.receipt)
    row = txn.exec(
        "UPDATE leasecast_message "
        "SET visible_at = CASE WHEN expires_at < %s THEN expires_at ELSE %s END "
        f"WHERE id = %s AND {_CURRENT} RETURNING visible_at",
        (end, end, msg_id, token, txn.now, txn.now),
    ).fetchone()
    if row is None:
        raise StaleReceipt(_STALE)
    return float(row[0])


#: Hands a lease back. ``%s`` after SET: 0, or 1 for a lease no client saw
#: (a round's leftovers), whose delivery is taken back. The queue counters
#: keep it: they are Prometheus counters, which only ever go up.
_RELEASE = (
    "UPDATE leasecast_message SET state = 0, visible_at = %s, lease_token = NULL, "
    "deliveries = deliveries - %s "
    "WHERE id = %s AND lease_token = %s AND state = 1 "
    "AND (expires_at IS NULL OR expires_at > %s)"
)


def release(txn: Txn, op: Release) -> int:
    """Hand leases back at once (a closed socket, or a round's leftovers);
    stale receipts are skipped."""
    taken_back = 1 if op.undelivered else 0
    released = 0
    for receipt in op.receipts:
        parsed = parse_receipt(receipt)
        if parsed is None:
            continue
        # No visible_at test: an expired lease not yet taken again is still
        # ours to hand back, which makes it visible a little sooner. But a
        # message past its ttl is not (expiry ended the lease, even if no
        # sweep has dead-lettered it yet). A group's head stays its head, so
        # the group keeps its order.
        released += txn.exec(_RELEASE, (txn.now, taken_back, *parsed, txn.now)).rowcount
    if released:
        txn.woken.add(op.queue)
        txn.lengths.clear()  # visible again: they count against max_length
        txn.oldest.clear()
    return released
