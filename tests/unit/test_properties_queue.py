"""Property tests of the work-queue store (``gateway.store``) against a model.

A hypothesis state machine drives a real :class:`Store` (a migrated SQLite
file, and PostgreSQL when it answers) with the store's injected clock, through
random enqueues (with idempotency keys, delays, ordering groups, priorities
and ttls), lease rounds, acks (with follow-up enqueues), nacks, rejects,
extends, socket releases, purges, redrives, per-message requeues and deletes,
browsing, stats, queue settings (``max_length`` under each overflow policy),
mixed batches (lease rounds and releases among acks, nacks, rejects and
enqueues; busy batches on a bounded queue, whose count the store keeps per
transaction), key expiry and clock moves. Receipts are current ones, old ones
reused after a redelivery, ack, nack or expiry, forged ones (a real id with a
wrong token, ids and tokens out of range) and plain garbage.

The test keeps its own model of every message, stored state included (of a
group's messages that are not dead exactly one, the head, is READY, DELAYED or
LEASED; the others are WAITING), and after every step checks the database row
by row against it, so that:

- every message is in exactly one state, the one the model says;
- no group ever has two heads, or messages without a head, or two messages
  in flight; only a message of a group can be WAITING;
- leases come in delivery order: priority first (higher first), then enqueue
  order; a message of a group is leased only when no earlier message of its
  group is left, except one put back by an operator (requeue, redrive)
  while a later one was in flight;
- a message past its ``ttl`` is dead-lettered with reason ``expired`` when the
  store next looks at its queue (lease rounds, stats, browsing, bounded
  enqueues, redrive, requeue), and every receipt of it is stale from its
  expiry on, swept or not;
- in a bounded queue, ``drop_oldest`` dead-letters exactly the earliest
  enqueued counted messages (visible and delayed, waiting included, not in
  flight) with reason ``overflow``; ``drop_newest`` and ``block`` refuse the
  whole enqueue (``block`` saying it may wait), and a refused enqueue (or an
  ack whose follow-up is refused) changes nothing, idempotency keys included;
- every dead message has its ``dead_reason``, and no other message has one;
- an operation with a stale receipt answers ``stale_receipt`` and changes
  nothing (no row, no key);
- a message disappears only through an ack, a purge or a delete;
- idempotency keys behave as docs/protocol.md says: a key seen in the same queue
  within ``dedup_window`` (queued, in flight, acked or purged) enqueues
  nothing and answers the first message's id; a duplicate never counts
  against ``max_length``;
- browsing pages through each state in delivery order, every field as
  modelled, and changes nothing; stats count what the model counts.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from gateway.core.errors import NotFound, QueueFull, StaleReceipt
from gateway.core.leases import (
    DEAD_REASONS,
    OVERFLOW_POLICIES,
    MessageState,
    QueueSettings,
    StoredState,
    format_receipt,
    observed_state,
    parse_receipt,
)
from gateway.core.protocol import EnqueueSpec
from gateway.store import (
    POSTGRESQL,
    SQLITE,
    Ack,
    AckResult,
    Browse,
    BrowsePage,
    Configure,
    DeleteMessage,
    Enqueue,
    EnqueueResult,
    Extend,
    Lease,
    LeaseResult,
    Nack,
    Purge,
    QueueStats,
    Redrive,
    Reject,
    Release,
    RequeueMessage,
    Stats,
    Store,
)
from tests.support.fakes import FakeClock

READY, LEASED, DEAD, DELAYED, WAITING = StoredState
HEADS = (READY, LEASED, DELAYED)
KEYS = ("k1", "k2", "k3")
STATES = ("visible", "delayed", "in_flight", "dead")
_machines = itertools.count()


@dataclass
class Msg:
    """The model of one stored message."""

    id: int
    queue: str
    body: str
    key: str | None
    state: StoredState
    visible_at: float
    enqueued_at: float
    group: str | None = None
    priority: int = 0
    expires_at: float | None = None
    deliveries: int = 0
    token: int | None = None  # the lease token of its current (or expired) lease
    dead_reason: str | None = None
    #: requeued or redriven: may wait behind a later message of its group
    put_back: bool = False

    def observed(self, now: float) -> MessageState:
        return observed_state(self.state, self.visible_at, now)

    def counted(self, now: float) -> bool:
        """Counts against ``max_length``: visible or delayed, not in flight."""
        return self.state in (READY, DELAYED, WAITING) or (
            self.state is LEASED and self.visible_at <= now
        )

    def leasable(self, now: float) -> bool:
        """A head that is visible."""
        return self.state is READY or (self.state in (LEASED, DELAYED) and self.visible_at <= now)


# -- strategies --------------------------------------------------------------

#: (key, delay, group, priority, ttl) of one message to enqueue.
specs = st.lists(
    st.tuples(
        st.sampled_from((None, None, *KEYS)),
        st.sampled_from((0.0, 0.0, 5.0, 30.0)),
        st.sampled_from((None, None, "g1", "g1", "g2")),
        st.sampled_from((0, 0, 1, -1)),
        st.sampled_from((None, None, None, 8.0, 40.0)),
    ),
    min_size=1,
    max_size=4,
)

#: How a rule picks a receipt: (kind, index, token, text); see QueueMachine.receipt.
receipt_choice = st.tuples(
    st.sampled_from(
        ("current", "current", "held", "issued", "issued", "forged", "swapped", "huge", "text")
    ),
    st.integers(0, 10**6),
    st.integers(0, 2**64 - 1),
    st.text(max_size=12),
)


queue_choice = st.sampled_from((0, 1))

#: Which message a per-message op picks (see QueueMachine.pick).
pick_choice = st.sampled_from(("dead_or_leased", "dead_or_leased", "any", "missing"))


class QueueMachine(RuleBasedStateMachine):
    """Drives a real Store and a model of it side by side."""

    connect: Callable[[], Any]
    kind: str

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(1_000_000.0)
        n = next(_machines)
        self.queues = (f"pa{n}", f"pb{n}")
        self.created: set[str] = set()  # queues that exist (a first use creates one)
        self.bounds: dict[str, tuple[int, str]] = {}  # queue -> (max_length, overflow)
        self.msgs: dict[int, Msg] = {}
        self.keys: dict[tuple[str, str], tuple[int, float]] = {}  # -> (msg id, expires at)
        self.receipts: list[str] = []  # every receipt ever issued
        self.max_id = 0
        self.next_body = 0
        # Groups whose head may have left, settled at the end of each batch.
        self.unsettled: set[tuple[str, str]] = set()
        self.reordered: set[tuple[str, str]] = set()
        self.conn = type(self).connect()
        self.store: Store | None = None
        self.settings = QueueSettings()

    @initialize(
        max_deliveries=st.sampled_from((0, 1, 2, 3)),
        dedup_window=st.sampled_from((10.0, 60.0)),
        max_length=st.sampled_from((0, 2, 3)),
        overflow=st.sampled_from(OVERFLOW_POLICIES),
    )
    def open_store(
        self, max_deliveries: int, dedup_window: float, max_length: int, overflow: str
    ) -> None:
        self.settings = QueueSettings(
            visibility_timeout=30.0, max_deliveries=max_deliveries, dedup_window=dedup_window
        )
        self.store = Store(
            type(self).connect,
            SQLITE if self.kind == "sqlite" else POSTGRESQL,
            clock=self.clock,
            defaults=self.settings,
            settings_ttl=0,
        )
        if max_length:  # the second queue is bounded from the start
            self.configure(1, max_length, overflow)

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()
        self.conn.close()

    # -- plumbing

    @property
    def now(self) -> float:
        return self.clock.now

    def run(self, ops: Sequence[Any]) -> list[Any]:
        assert self.store is not None
        return self.store.run(ops)

    def one(self, op: Any) -> Any:
        (result,) = self.run([op])
        return result

    def sql(self, text: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        if self.kind == "sqlite":
            text = text.replace("%s", "?")
        rows = self.conn.execute(text, params).fetchall()
        return [tuple(row) for row in rows]

    def rows(self) -> dict[int, tuple[Any, ...]]:
        """The stored messages of this machine's queues, straight from the database."""
        found = self.sql(
            'SELECT m.id, q.name, m.body, m."key", m.state, m.visible_at, m.deliveries, '
            'm.lease_token, m."group", m.priority, m.expires_at, m.dead_reason, m.enqueued_at '
            "FROM leasecast_message AS m JOIN leasecast_queue AS q "
            "ON q.id = m.queue_id WHERE q.name IN (%s, %s)",
            self.queues,
        )
        return {row[0]: row[1:] for row in found}

    def dedup_rows(self) -> dict[tuple[str, str], tuple[int, float]]:
        found = self.sql(
            'SELECT q.name, d."key", d.msg_id, d.expires_at FROM leasecast_dedup AS d '
            "JOIN leasecast_queue AS q ON q.id = d.queue_id WHERE q.name IN (%s, %s)",
            self.queues,
        )
        return {(name, key): (msg_id, expires_at) for name, key, msg_id, expires_at in found}

    def snapshot(self) -> tuple[Any, ...]:
        return self.rows(), self.dedup_rows()

    def receipt(self, choice: tuple[str, int, int, str]) -> str:
        """A receipt to try: issued earlier (current or stale), forged, or garbage."""
        kind, index, token, text = choice
        ids = sorted(self.msgs) or [self.max_id + 1]
        if kind == "current":  # a lease still held (or, if none is, any receipt)
            current = [r for r in self.receipts if self.holder(r)] or self.receipts
            kind, receipts = "issued", current
        elif kind == "held":  # the last lease of a leased message, timed out or expired or not
            held = [r for r in self.receipts if self.last_lease(r)] or self.receipts
            kind, receipts = "issued", held
        else:
            receipts = self.receipts
        if kind == "issued" and receipts:
            return receipts[index % len(receipts)]
        if kind == "forged":  # a real id with a token never issued for it
            return format_receipt(ids[index % len(ids)], token % 2**62)
        if kind == "swapped" and self.receipts:  # a real token on another message
            parsed = parse_receipt(self.receipts[index % len(self.receipts)])
            assert parsed is not None
            return format_receipt(ids[index % len(ids)], parsed[1])
        if kind == "huge":  # well-formed, but out of range for the database
            return f"{index * 10**15 + 2**63}.{token:x}" if index % 2 else f"1.{token:x}"
        return text

    def spec(
        self,
        key: str | None,
        delay: float = 0.0,
        group: str | None = None,
        priority: int = 0,
        ttl: float | None = None,
    ) -> EnqueueSpec:
        self.next_body += 1
        return EnqueueSpec(orjson.dumps({"n": self.next_body}), key, delay, group, priority, ttl)

    def of(self, queue: str) -> list[Msg]:
        return [m for m in self.msgs.values() if m.queue == queue]

    # -- the model

    def save(self) -> tuple[Any, ...]:
        """The model's state, for a refusal to put back."""
        return (
            {i: replace(m) for i, m in self.msgs.items()},
            dict(self.keys),
            set(self.created),
            set(self.unsettled),
            set(self.reordered),
            self.max_id,
        )

    def restore(self, saved: tuple[Any, ...]) -> None:
        msgs, keys, created, unsettled, reordered, max_id = saved
        self.msgs, self.keys, self.created = msgs, keys, created
        self.unsettled, self.reordered, self.max_id = unsettled, reordered, max_id

    def last_lease(self, receipt: str) -> Msg | None:
        """The leased message ``receipt`` is the last lease of, whether or not it is
        still current (its timeout or its message's ttl may have passed)."""
        parsed = parse_receipt(receipt)
        if parsed is None:
            return None
        msg = self.msgs.get(parsed[0])
        if msg is None or msg.state is not LEASED or msg.token != parsed[1]:
            return None
        return msg

    def holder(self, receipt: str, *, unexpired: bool = True) -> Msg | None:
        """The message ``receipt`` is the current lease of, or None (stale).

        A message's ttl ends its lease whether or not the store has swept it.
        """
        msg = self.last_lease(receipt)
        if msg is None:
            return None
        if msg.expires_at is not None and msg.expires_at <= self.now:
            return None
        if unexpired and msg.visible_at <= self.now:
            return None
        return msg

    def unsettle(self, msg: Msg, *, reordered: bool = False) -> None:
        if msg.group is not None:
            self.unsettled.add((msg.queue, msg.group))
            if reordered:
                self.reordered.add((msg.queue, msg.group))

    def dead_letter(self, msg: Msg, reason: str) -> None:
        msg.state, msg.dead_reason, msg.token, msg.expires_at = DEAD, reason, None, None
        self.unsettle(msg)

    def remove(self, msg: Msg) -> None:
        del self.msgs[msg.id]
        self.unsettle(msg)

    def sweep(self, queue: str, ids: Iterable[int] | None = None) -> None:
        """The store looked at ``queue`` (or at messages ``ids``): expired messages die."""
        chosen = self.of(queue) if ids is None else [self.msgs[i] for i in ids]
        for msg in chosen:
            if msg.expires_at is not None and msg.expires_at <= self.now:
                self.dead_letter(msg, "expired")

    def settle(self) -> None:
        """The end of a batch: every group left without a head gets its earliest waiting
        message as head. A group that took a message back (requeue, redrive) first
        puts back a head not yet leased that is later than a waiting message."""
        for queue, group in sorted(self.unsettled):
            members = sorted(
                (m for m in self.of(queue) if m.group == group and m.state is not DEAD),
                key=lambda m: m.id,
            )
            waiting = [m.id for m in members if m.state is WAITING]
            if (queue, group) in self.reordered and waiting:
                for m in members:
                    if m.state in (READY, DELAYED) and min(waiting) < m.id:
                        m.state = WAITING
            if members and not any(m.state in HEADS for m in members):
                first = next(m for m in members if m.state is WAITING)
                first.state = DELAYED if first.visible_at > self.now else READY
        self.unsettled, self.reordered = set(), set()

    def model_enqueue(
        self,
        queue: str,
        messages: Sequence[EnqueueSpec],
        results: Sequence[EnqueueResult] | None,
    ) -> str | None:
        """Apply an enqueue to the model; returns the overflow policy that refused it
        (the model is then as before), or None. ``results`` is None when the store
        refused the batch it is part of."""
        saved = self.save()
        self.created.add(queue)
        if results is not None:
            assert len(results) == len(messages)
        fresh = 0
        for index, spec in enumerate(messages):
            result = None if results is None else results[index]
            first = self.keys.get((queue, spec.key)) if spec.key is not None else None
            if first is not None and self.now < first[1]:
                # Within the window: nothing enqueued, the first message's id.
                if result is not None:
                    assert result.duplicate, (queue, spec.key, first)
                    assert int(result.id) == first[0]
                continue
            fresh += 1
            if result is None:
                msg_id = self.max_id + 1  # (refused in the end: the id is never seen)
            else:
                assert not result.duplicate, (queue, spec.key, first, self.now)
                msg_id = int(result.id)
                assert msg_id > self.max_id, "ids grow in enqueue order and are never reused"
            self.max_id = msg_id
            # A message of a group waits until its batch settles the group.
            state = DELAYED if spec.delay > 0 else READY
            state = WAITING if spec.group is not None else state
            msg = Msg(
                msg_id,
                queue,
                spec.body_json.decode(),
                spec.key,
                state,
                self.now + spec.delay,
                self.now,
                spec.group,
                spec.priority,
                None if spec.ttl is None else self.now + spec.ttl,
            )
            self.msgs[msg_id] = msg
            self.unsettle(msg)
            if spec.key is not None:
                self.keys[(queue, spec.key)] = (msg_id, self.now + self.settings.dedup_window)
        max_length, overflow = self.bounds.get(queue, (0, "drop_newest"))
        if max_length and fresh:
            self.sweep(queue)  # expired messages no longer count
            counted = sorted((m for m in self.of(queue) if m.counted(self.now)), key=lambda m: m.id)
            excess = len(counted) - max_length
            if excess > 0:
                if overflow != "drop_oldest":
                    self.restore(saved)
                    return overflow
                # The earliest enqueued, whatever their priority.
                for msg in counted[:excess]:
                    self.dead_letter(msg, "overflow")
        return None

    def check_refusal(self, result: Any, queue: str, refused_by: str | None) -> None:
        if refused_by is None:
            assert not isinstance(result, QueueFull), result
            return
        assert isinstance(result, QueueFull), (result, refused_by)
        assert result.may_wait == (refused_by == "block")
        assert result.queue == queue
        # Nothing was applied. The store may have swept the queue's expired
        # messages before it found the queue full: a sweep is not the enqueue,
        # and what it does no one can tell from not having done it yet (those
        # messages are dead already for every purpose).
        expired = [
            m
            for m in self.of(queue)
            if m.state is not DEAD and m.expires_at is not None and m.expires_at <= self.now
        ]
        if expired:
            (state,) = self.sql(
                "SELECT state FROM leasecast_message WHERE id = %s", [expired[0].id]
            )[0]
            if state == DEAD:
                self.sweep(queue)

    def enqueue_op(self, op: Enqueue, result: Any) -> None:
        results = result if isinstance(result, list) else None
        refused_by = self.model_enqueue(op.queue, op.messages, results)
        self.check_refusal(result, op.queue, refused_by)
        if refused_by is None:
            assert isinstance(result, list), result

    def model_ack(self, op: Ack, result: Any) -> None:
        msg = self.holder(op.receipt)
        if msg is None:
            assert isinstance(result, StaleReceipt), result
            return
        saved = self.save()
        self.remove(msg)  # the one way a message leaves, besides a purge or a delete
        # Follow-ups are enqueued queue by queue, in order of first appearance.
        by_queue: dict[str, list[int]] = {}
        for index, (queue, _) in enumerate(op.follow_ups):
            by_queue.setdefault(queue, []).append(index)
        if isinstance(result, AckResult):
            assert len(result.enqueued) == len(op.follow_ups)
        for queue, indices in by_queue.items():
            refused_by = self.model_enqueue(
                queue,
                [op.follow_ups[i][1] for i in indices],
                [result.enqueued[i] for i in indices] if isinstance(result, AckResult) else None,
            )
            if refused_by is not None:
                # A follow-up refused takes the ack back with it.
                self.restore(saved)
                self.check_refusal(result, queue, refused_by)
                return
        assert isinstance(result, AckResult), result

    def model_nack(self, op: Nack, result: Any) -> None:
        msg = self.holder(op.receipt)
        if msg is None:
            assert isinstance(result, StaleReceipt), result
            return
        assert result is None, result
        msg.state = DELAYED if op.delay > 0 else READY  # a group's head stays its head
        msg.visible_at = self.now + op.delay
        msg.token = None

    def stale_ops_change_nothing(self, ops: Sequence[Any], expect_stale: bool) -> Any:
        before = self.snapshot()
        results = self.run(ops)
        if expect_stale:
            assert all(isinstance(r, StaleReceipt) for r in results), results
            assert self.snapshot() == before, "a stale receipt changed something"
        return results

    # -- rules

    @rule(queue=st.sampled_from((0, 1)), batch=specs)
    def enqueue(self, queue: int, batch: list[tuple[Any, ...]]) -> None:
        name = self.queues[queue]
        op = Enqueue(name, [self.spec(*fields) for fields in batch])
        # (A refused enqueue changed nothing: the model is as before it, and
        # the invariants compare every row and key with the model.)
        self.enqueue_op(op, self.one(op))
        self.settle()

    @rule(
        queue=st.sampled_from((0, 1)),
        max_length=st.sampled_from((0, 1, 2, 4)),
        overflow=st.sampled_from(OVERFLOW_POLICIES),
    )
    def configure(self, queue: int, max_length: int, overflow: str) -> None:
        name = self.queues[queue]
        result = self.one(Configure(name, {"max_length": max_length, "overflow": overflow}))
        assert isinstance(result, QueueStats), result
        assert (result.settings.max_length, result.settings.overflow) == (max_length, overflow)
        self.created.add(name)
        self.bounds[name] = (max_length, overflow)
        self.sweep(name)
        self.check_counts(name, result)
        self.settle()

    @rule(
        queue=st.sampled_from((0, 1)),
        n=st.integers(1, 4),
        timeout=st.sampled_from((None, 5.0, 30.0)),
    )
    def lease(self, queue: int, n: int, timeout: float | None) -> None:
        op = Lease(self.queues[queue], n, timeout)
        self.model_lease(op, self.one(op))
        self.settle()

    def model_lease(self, op: Lease, result: Any) -> None:
        name, n, timeout = op.queue, op.n, op.visibility_timeout
        assert isinstance(result, LeaseResult), result
        self.created.add(name)
        self.sweep(name)
        lease_end = self.now + (timeout or self.settings.visibility_timeout)
        # Visible heads are taken in delivery order; one whose next delivery
        # would exceed max_deliveries is dead-lettered instead.
        due = sorted(
            (m for m in self.of(name) if m.leasable(self.now)), key=lambda m: (-m.priority, m.id)
        )
        delivered: list[Msg] = []
        dead = 0
        for msg in due:
            if len(delivered) == n:
                break
            limit = self.settings.max_deliveries
            if limit and msg.deliveries + 1 > limit:
                self.dead_letter(msg, "max_deliveries")
                dead += 1
            else:
                delivered.append(msg)
        assert result.dead_lettered == dead
        assert [int(d.id) for d in result.delivered] == [m.id for m in delivered]
        # Priority first, then enqueue order; one message of a group at a time,
        # and never one while an earlier one of its group is left (unless that
        # one was put back by an operator after this one became the head).
        assert [(-d.priority, int(d.id)) for d in result.delivered] == sorted(
            (-d.priority, int(d.id)) for d in result.delivered
        )
        groups = [m.group for m in delivered if m.group is not None]
        assert len(groups) == len(set(groups)), "two messages of one group in one round"
        for msg in delivered:
            if msg.group is None:
                continue
            for other in self.of(name):
                if other is msg or other.group != msg.group or other.state is DEAD:
                    continue
                assert other.observed(self.now) is not MessageState.IN_FLIGHT, (msg, other)
                assert other.id > msg.id or other.put_back, ("group order", msg, other)
        for d, msg in zip(result.delivered, delivered, strict=True):
            parsed = parse_receipt(d.receipt)
            assert parsed is not None and parsed[0] == msg.id
            assert parsed[1] != msg.token, "a new delivery gets a new receipt"
            msg.state, msg.token = LEASED, parsed[1]
            # A lease never outlives the message's ttl.
            msg.visible_at = lease_end if msg.expires_at is None else min(msg.expires_at, lease_end)
            msg.deliveries += 1
            assert d.deliveries == msg.deliveries and d.body == msg.body
            assert (d.group, d.priority) == (msg.group, msg.priority)
            assert d.expires_at == msg.visible_at
            self.receipts.append(d.receipt)
        if len(delivered) < n:
            pending = [m.visible_at for m in self.of(name) if m.state in (LEASED, DELAYED)]
            pending += [m.expires_at for m in self.of(name) if m.expires_at is not None]
            assert result.next_due == (min(pending) if pending else None)

    @rule(
        choice=receipt_choice,
        follow_ups=st.lists(
            st.tuples(
                st.sampled_from((0, 1)),
                st.sampled_from((None, *KEYS)),
                st.sampled_from((None, "g1")),
            ),
            max_size=3,
        ),
    )
    def ack(self, choice: tuple[str, int, int, str], follow_ups: list[tuple[Any, ...]]) -> None:
        receipt = self.receipt(choice)
        op = Ack(
            receipt,
            [(self.queues[q], self.spec(key, group=group)) for q, key, group in follow_ups],
        )
        (result,) = self.stale_ops_change_nothing([op], self.holder(receipt) is None)
        self.model_ack(op, result)
        self.settle()

    @rule(choice=receipt_choice, delay=st.sampled_from((0.0, 5.0)))
    def nack(self, choice: tuple[str, int, int, str], delay: float) -> None:
        receipt = self.receipt(choice)
        holder = self.holder(receipt)
        queue = holder.queue if holder else self.queues[0]
        op = Nack(queue, receipt, delay)
        (result,) = self.stale_ops_change_nothing([op], holder is None)
        self.model_nack(op, result)
        self.settle()

    @rule(choice=receipt_choice)
    def reject(self, choice: tuple[str, int, int, str]) -> None:
        receipt = self.receipt(choice)
        op = Reject(receipt)
        (result,) = self.stale_ops_change_nothing([op], self.holder(receipt) is None)
        self.model_reject(op, result)
        self.settle()

    def model_reject(self, op: Reject, result: Any) -> None:
        msg = self.holder(op.receipt)
        if msg is None:
            assert isinstance(result, StaleReceipt), result
            return
        assert result is None, result
        self.dead_letter(msg, "rejected")  # deliveries kept; gone only by a purge or a delete

    @rule(choice=receipt_choice, timeout=st.sampled_from((1.0, 10.0, 60.0)))
    def extend(self, choice: tuple[str, int, int, str], timeout: float) -> None:
        receipt = self.receipt(choice)
        msg = self.holder(receipt)
        (result,) = self.stale_ops_change_nothing([Extend(receipt, timeout)], msg is None)
        if msg is not None:
            end = self.now + timeout
            msg.visible_at = end if msg.expires_at is None else min(msg.expires_at, end)
            assert result == msg.visible_at

    def expired_leases(self) -> list[str]:
        """Receipts of leases that their message's ttl ended (not swept yet, maybe)."""
        found = []
        for receipt in self.receipts:
            msg = self.last_lease(receipt)
            if msg is not None and msg.expires_at is not None and msg.expires_at <= self.now:
                found.append(receipt)
        return found

    @precondition(lambda self: bool(self.expired_leases()))
    @rule(
        index=st.integers(0, 100),
        kind=st.sampled_from(("ack", "nack", "reject", "extend", "requeue", "redrive")),
    )
    def end_an_expired_lease(self, index: int, kind: str) -> None:
        # Expiry ends the lease, swept or not: every way to end it is stale,
        # and a closing socket has nothing to hand back; an operator's requeue
        # or redrive gives the dead message a fresh start.
        receipts = self.expired_leases()
        receipt = receipts[index % len(receipts)]
        msg = self.last_lease(receipt)
        assert msg is not None
        if kind == "requeue":
            self.requeue_id(msg.queue, msg.id)
            return
        if kind == "redrive":
            self.redrive(self.queues.index(msg.queue))
            return
        ops: dict[str, Any] = {
            "ack": Ack(receipt),
            "nack": Nack(msg.queue, receipt),
            "reject": Reject(receipt),
            "extend": Extend(receipt, 10.0),
        }
        self.stale_ops_change_nothing([ops[kind]], expect_stale=True)
        before = self.snapshot()
        assert self.one(Release(msg.queue, receipts)) == 0
        assert self.snapshot() == before

    @rule(choices=st.lists(receipt_choice, max_size=4), everything=st.booleans())
    def release_socket(self, choices: list[tuple[str, int, int, str]], everything: bool) -> None:
        # A closing worker socket hands back what it holds, expired leases
        # not taken again included; stale receipts (and leases that their
        # message's ttl ended) are skipped.
        receipts = [self.receipt(c) for c in choices]
        if everything:  # every last lease: as if one socket had taken them all
            receipts += [r for r in self.receipts if self.last_lease(r)]
        before = self.snapshot()
        op = Release(self.queues[0], receipts)
        if not self.model_release(op, self.one(op)):
            assert self.snapshot() == before

    def model_release(self, op: Release, released: Any) -> int:
        expected = 0
        for receipt in op.receipts:
            msg = self.holder(receipt, unexpired=False)
            if msg is not None:
                msg.state, msg.visible_at, msg.token = READY, self.now, None
                expected += 1
        assert released == expected
        return expected

    @rule(
        ops=st.lists(
            st.one_of(
                st.tuples(st.just("ack"), receipt_choice),
                st.tuples(st.just("nack"), receipt_choice),
                st.tuples(st.just("reject"), receipt_choice),
                st.tuples(st.just("enqueue"), st.sampled_from((0, 1)), specs),
                st.tuples(st.just("lease"), st.sampled_from((0, 1)), st.integers(1, 3)),
                st.tuples(st.just("release"), st.lists(receipt_choice, max_size=2)),
            ),
            min_size=2,
            max_size=6,
        )
    )
    def batch(self, ops: list[tuple[Any, ...]]) -> None:
        # One transaction: runs of plain acks and plain enqueues share a
        # statement, yet every op must behave as if applied alone, in order,
        # and groups settle once, at the end.
        built: list[Any] = []
        for op in ops:
            if op[0] == "ack":
                built.append(Ack(self.receipt(op[1])))
            elif op[0] == "nack":
                receipt = self.receipt(op[1])
                holder = self.holder(receipt)
                built.append(Nack(holder.queue if holder else self.queues[0], receipt))
            elif op[0] == "reject":
                built.append(Reject(self.receipt(op[1])))
            elif op[0] == "lease":
                built.append(Lease(self.queues[op[1]], op[2]))
            elif op[0] == "release":
                built.append(Release(self.queues[0], [self.receipt(c) for c in op[1]]))
            else:
                name = self.queues[op[1]]
                built.append(Enqueue(name, [self.spec(*fields) for fields in op[2]]))
        self.run_batch(built)

    def run_batch(self, built: list[Any]) -> None:
        """Run ``built`` as one batch, and apply it to the model op by op."""
        results = self.run(built)
        for op, result in zip(built, results, strict=True):
            if isinstance(op, Ack):
                self.model_ack(op, result)
            elif isinstance(op, Nack):
                self.model_nack(op, result)
            elif isinstance(op, Reject):
                self.model_reject(op, result)
            elif isinstance(op, Lease):
                self.model_lease(op, result)  # (groups not settled yet: as the store does)
            elif isinstance(op, Release):
                self.model_release(op, result)
            else:
                self.enqueue_op(op, result)
        self.settle()

    @precondition(lambda self: self.bounds.get(self.queues[1], (0,))[0] > 0)
    @rule(
        kinds=st.lists(
            st.sampled_from(("enqueue", "enqueue", "enqueue", "lease", "nack", "release", "ack")),
            min_size=3,
            max_size=8,
        ),
        grouped=st.booleans(),
    )
    def busy_bounded_batch(self, kinds: list[str], grouped: bool) -> None:
        # One commit of a busy bounded queue: enqueues (one message each)
        # among lease rounds and leases ending, so that what the store counts
        # once per transaction must follow every op of it.
        name = self.queues[1]
        held = [r for r in self.receipts if (m := self.holder(r)) and m.queue == name]
        built: list[Any] = []
        for kind in kinds:
            if kind == "enqueue":
                built.append(Enqueue(name, [self.spec(None, group="g1" if grouped else None)]))
            elif kind == "lease":
                built.append(Lease(name, 1))
            elif held:
                receipt = held.pop()
                ops = {"nack": Nack(name, receipt), "release": Release(name, [receipt])}
                built.append(ops.get(kind, Ack(receipt)))
        self.run_batch(built)

    def purge(self, queue: int) -> None:
        name = self.queues[queue]
        result = self.one(Purge(name))
        if name not in self.created:
            assert isinstance(result, NotFound), result
            return
        doomed = [m for m in self.of(name) if m.observed(self.now) is not MessageState.IN_FLIGHT]
        assert result == len(doomed)
        for msg in doomed:
            self.remove(msg)
        self.settle()

    def redrive(self, queue: int) -> None:
        name = self.queues[queue]
        result = self.one(Redrive(name))
        if name not in self.created:
            assert isinstance(result, NotFound), result
            return
        self.sweep(name)  # past their ttl: dead, swept or not
        dead = [m for m in self.of(name) if m.state is DEAD]
        assert result == len(dead)
        for msg in dead:
            self.put_back(msg)
        self.settle()

    @rule(
        action=st.one_of(
            st.tuples(st.just("purge"), queue_choice),
            st.tuples(st.just("redrive"), queue_choice),
            st.tuples(st.just("requeue"), queue_choice, pick_choice, st.integers(0, 100)),
            st.tuples(st.just("requeue"), queue_choice, pick_choice, st.integers(0, 100)),
            st.tuples(st.just("delete"), queue_choice, pick_choice, st.integers(0, 100)),
            st.tuples(st.just("stats"), queue_choice),
        )
    )
    def operator(self, action: tuple[Any, ...]) -> None:
        # What an operator does (HTTP API, admin), in one rule so that the
        # workers' rules keep their share of the steps.
        getattr(self, action[0])(*action[1:])

    def put_back(self, msg: Msg) -> None:
        """An operator's fresh start (requeue, redrive): delivery count reset; a
        message of a group waits for its turn, which may come before its head's."""
        msg.state = READY if msg.group is None else WAITING
        msg.visible_at, msg.deliveries, msg.token, msg.dead_reason = self.now, 0, None, None
        msg.put_back = True
        self.unsettle(msg, reordered=True)

    def earlier_than_heads(self) -> list[Msg]:
        """Dead or leased messages of a group that are earlier than its head, which is
        not leased yet: put back, they go first (the head waits again)."""
        heads = {
            (m.queue, m.group): m.id for m in self.msgs.values() if m.state in (READY, DELAYED)
        }
        return [
            m
            for m in self.msgs.values()
            if m.state in (DEAD, LEASED) and heads.get((m.queue, m.group), 0) > m.id
        ]

    @precondition(lambda self: bool(self.earlier_than_heads()))
    @rule(index=st.integers(0, 100), redrive=st.booleans())
    def put_back_before_the_head(self, index: int, redrive: bool) -> None:
        # (A rule of its own: the state is rare and the reordering subtle.)
        candidates = sorted(self.earlier_than_heads(), key=lambda m: m.id)
        chosen = candidates[index % len(candidates)]
        if redrive and chosen.state is DEAD:
            self.redrive(self.queues.index(chosen.queue))
        else:
            self.requeue_id(chosen.queue, chosen.id)

    def pick(self, name: str, which: str, index: int) -> int:
        """A message id for a per-message op on queue ``name``: mostly one of its
        dead or leased messages (what a requeue changes), else one of any
        queue's, or one that does not exist."""
        if which == "missing":
            return self.max_id + 1
        chosen = [m.id for m in self.of(name) if m.state in (DEAD, LEASED)]
        if which == "any" or not chosen:
            chosen = sorted(self.msgs)
        return chosen[index % len(chosen)] if chosen else self.max_id + 1

    def found(self, name: str, msg_id: int, result: Any) -> Msg | None:
        """The message the per-message op is about, or None (then NotFound)."""
        msg = self.msgs.get(msg_id)
        if name not in self.created or msg is None or msg.queue != name:
            assert isinstance(result, NotFound), result
            return None
        return msg

    def requeue(self, queue: int, which: str, index: int) -> None:
        name = self.queues[queue]
        self.requeue_id(name, self.pick(name, which, index))

    def requeue_id(self, name: str, msg_id: int) -> None:
        before = self.snapshot()
        result = self.one(RequeueMessage(name, msg_id))
        msg = self.found(name, msg_id, result)
        if msg is None:
            assert self.snapshot() == before
            return
        self.sweep(name, [msg_id])  # past its ttl: dead, swept or not
        if msg.state in (LEASED, DEAD):
            assert result == 1, (result, msg)
            self.put_back(msg)  # an open lease on it is stale from now on
        else:
            assert result == 0, (result, msg)
        self.settle()

    def delete(self, queue: int, which: str, index: int) -> None:
        name = self.queues[queue]
        msg_id = self.pick(name, which, index)
        result = self.one(DeleteMessage(name, msg_id))
        msg = self.found(name, msg_id, result)
        if msg is not None:
            assert result == 1, result
            self.remove(msg)
        self.settle()

    @rule(
        queue=queue_choice,
        state=st.sampled_from(("visible", "visible", *STATES)),
        limit=st.sampled_from((1, 2, 5, 1000)),
    )
    def browse(self, queue: int, state: str, limit: int) -> None:
        """Page through one state; browsing leases and changes nothing (the
        invariants then find the database as the model left it: only swept)."""
        name = self.queues[queue]
        seen: list[Any] = []
        after: int | None = None
        for _ in range(100):
            page = self.one(Browse(name, state, limit, after))  # type: ignore[arg-type]
            if name not in self.created:
                assert isinstance(page, NotFound), page
                return
            assert isinstance(page, BrowsePage), page
            self.sweep(name)  # each page is a batch that looks at the queue
            self.settle()
            assert len(page.messages) <= limit
            seen += page.messages
            if page.next is None:
                break
            assert len(page.messages) == limit and page.next == page.messages[-1].id
            after = int(page.next)
        wanted = [m for m in self.of(name) if m.observed(self.now).value == state]
        order = (lambda m: (-m.priority, m.id)) if state == "visible" else (lambda m: m.id)
        wanted.sort(key=order)
        assert [int(b.id) for b in seen] == [m.id for m in wanted]
        for b, m in zip(seen, wanted, strict=True):
            assert b.state == state
            assert (b.body_json, b.key, b.group, b.priority) == (m.body, m.key, m.group, m.priority)
            assert (b.deliveries, b.dead_reason, b.enqueued_at) == (
                m.deliveries,
                m.dead_reason,
                m.enqueued_at,
            )
            timed = state in ("delayed", "in_flight")
            assert b.visible_in == (round(m.visible_at - self.now, 3) if timed else None)
            expires_in = None if m.expires_at is None else round(m.expires_at - self.now, 3)
            assert b.expires_in == expires_in

    def stats(self, queue: int) -> None:
        name = self.queues[queue]
        stats = self.one(Stats(name))
        if name not in self.created:
            assert isinstance(stats, NotFound), stats
            return
        self.sweep(name)
        self.check_counts(name, stats)
        self.settle()

    def check_counts(self, name: str, stats: QueueStats) -> None:
        counts = dict.fromkeys(STATES, 0)
        for msg in self.of(name):
            counts[msg.observed(self.now).value] += 1
        assert {k: getattr(stats, k) for k in counts} == counts

    @precondition(lambda self: self.store is not None)
    @rule()
    def forget_expired_keys(self) -> None:
        assert self.store is not None
        self.store.forget_expired_keys()  # every machine's: expired keys are as good as gone
        self.keys = {k: v for k, v in self.keys.items() if v[1] > self.now}

    @rule(seconds=st.sampled_from((0.5, 1.0, 4.5, 5.0, 10.0, 29.5, 30.0, 61.0)))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    # -- invariants

    @invariant()
    def database_matches_the_model(self) -> None:
        if self.store is None:
            return
        assert not self.unsettled, "every rule settles the model's groups"
        rows = self.rows()
        self.check_groups_and_reasons(rows)
        vanished = set(self.msgs) - set(rows)
        assert not vanished, f"messages {vanished} disappeared without an ack, purge or delete"
        appeared = set(rows) - set(self.msgs)
        assert not appeared, f"messages {appeared} appeared from nowhere"
        for msg_id, msg in self.msgs.items():
            (queue, body, key, state, visible_at, deliveries, token, *rest) = rows[msg_id]
            group, priority, expires_at, dead_reason, enqueued_at = rest
            assert (queue, body, key, group, priority) == (
                msg.queue,
                msg.body,
                msg.key,
                msg.group,
                msg.priority,
            )
            assert StoredState(state) is msg.state, (msg, rows[msg_id])
            if msg.state is not DEAD:  # (a dead message's visible_at means nothing)
                assert visible_at == msg.visible_at, (msg, rows[msg_id])
            assert (deliveries, expires_at, dead_reason, enqueued_at) == (
                msg.deliveries,
                msg.expires_at,
                msg.dead_reason,
                msg.enqueued_at,
            ), (msg, rows[msg_id])
            if msg.state is LEASED:
                assert token == msg.token, msg
        assert self.dedup_rows() == self.keys

    def check_groups_and_reasons(self, rows: dict[int, tuple[Any, ...]]) -> None:
        """Straight from the database, whatever the model says: every group with
        messages has exactly one head and at most one message in flight; only
        messages of a group wait; a message is dead if and only if it has a
        dead_reason."""
        members: dict[tuple[str, str], list[tuple[int, float]]] = {}
        for row in rows.values():
            queue, state, visible_at, group, reason = row[0], row[3], row[4], row[7], row[10]
            if state == DEAD:
                assert reason in DEAD_REASONS, row
                continue
            assert reason is None, row
            if group is None:
                assert state != WAITING, row
            else:
                members.setdefault((queue, group), []).append((state, visible_at))
        for key, group_rows in members.items():
            heads = [s for s, _ in group_rows if s in HEADS]
            assert len(heads) == 1, ("one head per group", key, group_rows)
            in_flight = [s for s, v in group_rows if s == LEASED and v > self.now]
            assert len(in_flight) <= 1, ("one in flight per group", key, group_rows)


# -- the databases -------------------------------------------------------------


#: Examples per backend: SQLite is cheap, PostgreSQL's round trips are not.
EXAMPLES = {"sqlite": 250, "postgres": 30}


def test_store_matches_its_model(database: tuple[str, Callable[[], Any]]) -> None:
    kind, connect = database

    class Machine(QueueMachine):
        pass

    Machine.connect = staticmethod(connect)
    Machine.kind = kind
    run_state_machine_as_test(
        Machine,
        settings=settings(max_examples=EXAMPLES[kind], stateful_step_count=40, deadline=None),
    )
