"""Property tests of the work-queue store (``gateway.store``) against a model.

A hypothesis state machine drives a real :class:`Store` (a migrated SQLite
file, and PostgreSQL when it answers) with the store's injected clock, through
random enqueues (with idempotency keys and delays), lease rounds, acks (with
follow-up enqueues), nacks, rejects, extends, socket releases, purges,
redrives, mixed batches, key expiry and clock moves. Receipts are current
ones, old ones reused after a redelivery, ack or nack, forged ones (a real id
with a wrong token, ids and tokens out of range) and plain garbage.

The test keeps its own model of every message, and after every step checks the
database row by row against it, so that:

- every message is in exactly one state (visible, delayed, in_flight, dead),
  the one the model says, and the queue's stats count the same;
- an operation with a stale receipt answers ``stale_receipt`` and changes
  nothing (no row, no key);
- a message disappears only through an ack or a purge (a rejected message
  stays dead until purged);
- idempotency keys behave as PROTOCOL.md says: a key seen in the same queue
  within ``dedup_window`` (queued, in flight, acked or purged) enqueues
  nothing and answers the first message's id;
- delivery counts, lease order, expiry times and ``max_deliveries``
  dead-lettering match the model.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
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

from gateway.errors import NotFound, StaleReceipt
from gateway.leases import (
    MessageState,
    QueueSettings,
    StoredState,
    format_receipt,
    observed_state,
    parse_receipt,
)
from gateway.protocol import EnqueueSpec
from gateway.store import (
    POSTGRESQL,
    SQLITE,
    Ack,
    AckResult,
    Enqueue,
    EnqueueResult,
    Extend,
    Lease,
    LeaseResult,
    Nack,
    Purge,
    Redrive,
    Reject,
    Release,
    Stats,
    Store,
)
from tests.unit.test_leases import FakeClock

READY, LEASED, DEAD, DELAYED, WAITING = StoredState
KEYS = ("k1", "k2", "k3")
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
    deliveries: int = 0
    token: int | None = None  # the lease token of its current (or expired) lease

    def observed(self, now: float) -> MessageState:
        return observed_state(self.state, self.visible_at, now)


# -- strategies --------------------------------------------------------------

specs = st.lists(
    st.tuples(st.sampled_from((None, None, *KEYS)), st.sampled_from((0.0, 0.0, 5.0, 30.0))),
    min_size=1,
    max_size=4,
)

#: How a rule picks a receipt: (kind, index, token, text); see QueueMachine.receipt.
receipt_choice = st.tuples(
    st.sampled_from(
        ("current", "current", "issued", "issued", "forged", "swapped", "huge", "text")
    ),
    st.integers(0, 10**6),
    st.integers(0, 2**64 - 1),
    st.text(max_size=12),
)


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
        self.msgs: dict[int, Msg] = {}
        self.keys: dict[tuple[str, str], tuple[int, float]] = {}  # -> (msg id, expires at)
        self.receipts: list[str] = []  # every receipt ever issued
        self.max_id = 0
        self.next_body = 0
        self.conn = type(self).connect()
        self.store: Store | None = None
        self.settings = QueueSettings()

    @initialize(
        max_deliveries=st.sampled_from((0, 1, 2, 3)),
        dedup_window=st.sampled_from((10.0, 60.0)),
    )
    def open_store(self, max_deliveries: int, dedup_window: float) -> None:
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
            "m.lease_token FROM leasecast_message AS m JOIN leasecast_queue AS q "
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

    # -- the model

    def holder(self, receipt: str, *, unexpired: bool = True) -> Msg | None:
        """The message ``receipt`` is the current lease of, or None (stale)."""
        parsed = parse_receipt(receipt)
        if parsed is None:
            return None
        msg = self.msgs.get(parsed[0])
        if msg is None or msg.state is not LEASED or msg.token != parsed[1]:
            return None
        if unexpired and msg.visible_at <= self.now:
            return None
        return msg

    def model_enqueue(
        self, queue: str, messages: Sequence[EnqueueSpec], results: Sequence[EnqueueResult]
    ) -> None:
        assert len(results) == len(messages)
        self.created.add(queue)
        for spec, result in zip(messages, results, strict=True):
            first = self.keys.get((queue, spec.key)) if spec.key is not None else None
            if first is not None and self.now < first[1]:
                # Within the window: nothing enqueued, the first message's id.
                assert result.duplicate, (queue, spec.key, first)
                assert int(result.id) == first[0]
                continue
            assert not result.duplicate, (queue, spec.key, first, self.now)
            msg_id = int(result.id)
            assert msg_id > self.max_id, "ids grow in enqueue order and are never reused"
            self.max_id = msg_id
            state = DELAYED if spec.delay > 0 else READY
            body = spec.body_json.decode()
            self.msgs[msg_id] = Msg(msg_id, queue, body, spec.key, state, self.now + spec.delay)
            if spec.key is not None:
                self.keys[(queue, spec.key)] = (msg_id, self.now + self.settings.dedup_window)

    def model_ack(self, op: Ack, result: Any) -> None:
        msg = self.holder(op.receipt)
        if msg is None:
            assert isinstance(result, StaleReceipt), result
            return
        assert isinstance(result, AckResult), result
        del self.msgs[msg.id]  # the one way a message leaves, besides a purge
        # Follow-ups are enqueued queue by queue, in order of first appearance.
        by_queue: dict[str, list[int]] = {}
        for index, (queue, _) in enumerate(op.follow_ups):
            by_queue.setdefault(queue, []).append(index)
        assert len(result.enqueued) == len(op.follow_ups)
        for queue, indices in by_queue.items():
            self.model_enqueue(
                queue,
                [op.follow_ups[i][1] for i in indices],
                [result.enqueued[i] for i in indices],
            )

    def model_nack(self, op: Nack, result: Any) -> None:
        msg = self.holder(op.receipt)
        if msg is None:
            assert isinstance(result, StaleReceipt), result
            return
        assert result is None, result
        msg.state = DELAYED if op.delay > 0 else READY
        msg.visible_at = self.now + op.delay
        msg.token = None

    def spec(self, key: str | None, delay: float) -> EnqueueSpec:
        self.next_body += 1
        return EnqueueSpec(orjson.dumps({"n": self.next_body}), key, delay)

    def stale_ops_change_nothing(self, ops: Sequence[Any], expect_stale: bool) -> Any:
        before = self.snapshot()
        results = self.run(ops)
        if expect_stale:
            assert all(isinstance(r, StaleReceipt) for r in results), results
            assert self.snapshot() == before, "a stale receipt changed something"
        return results

    # -- rules

    @rule(queue=st.sampled_from((0, 1)), batch=specs)
    def enqueue(self, queue: int, batch: list[tuple[str | None, float]]) -> None:
        name = self.queues[queue]
        messages = [self.spec(key, delay) for key, delay in batch]
        self.model_enqueue(name, messages, self.one(Enqueue(name, messages)))

    @rule(
        queue=st.sampled_from((0, 1)),
        n=st.integers(1, 4),
        timeout=st.sampled_from((None, 5.0, 30.0)),
    )
    def lease(self, queue: int, n: int, timeout: float | None) -> None:
        name = self.queues[queue]
        result = self.one(Lease(name, n, timeout))
        assert isinstance(result, LeaseResult), result
        self.created.add(name)
        expires_at = self.now + (timeout or self.settings.visibility_timeout)
        # Visible messages are taken in enqueue (id) order; one whose next
        # delivery would exceed max_deliveries is dead-lettered instead.
        due = sorted(
            (
                m
                for m in self.msgs.values()
                if m.queue == name and m.observed(self.now) is MessageState.VISIBLE
            ),
            key=lambda m: m.id,
        )
        delivered: list[Msg] = []
        dead = 0
        for msg in due:
            if len(delivered) == n:
                break
            limit = self.settings.max_deliveries
            if limit and msg.deliveries + 1 > limit:
                # (Leased and put back dead in one round: its visible_at, which
                # means nothing for a dead message, is the round's expiry.)
                msg.state, msg.token, msg.visible_at = DEAD, None, expires_at
                dead += 1
            else:
                delivered.append(msg)
        assert result.dead_lettered == dead
        assert [int(d.id) for d in result.delivered] == [m.id for m in delivered]
        for d, msg in zip(result.delivered, delivered, strict=True):
            parsed = parse_receipt(d.receipt)
            assert parsed is not None and parsed[0] == msg.id
            assert parsed[1] != msg.token, "a new delivery gets a new receipt"
            msg.state, msg.token, msg.visible_at = LEASED, parsed[1], expires_at
            msg.deliveries += 1
            assert d.deliveries == msg.deliveries and d.body == msg.body
            assert d.expires_at == expires_at
            self.receipts.append(d.receipt)
        if len(delivered) < n:
            pending = [
                m.visible_at
                for m in self.msgs.values()
                if m.queue == name and m.state in (LEASED, DELAYED)
            ]
            assert result.next_due == (min(pending) if pending else None)

    @rule(
        choice=receipt_choice,
        follow_ups=st.lists(
            st.tuples(st.sampled_from((0, 1)), st.sampled_from((None, *KEYS))), max_size=3
        ),
    )
    def ack(self, choice: tuple[str, int, int, str], follow_ups: list[tuple[int, Any]]) -> None:
        receipt = self.receipt(choice)
        op = Ack(receipt, [(self.queues[q], self.spec(key, 0.0)) for q, key in follow_ups])
        (result,) = self.stale_ops_change_nothing([op], self.holder(receipt) is None)
        self.model_ack(op, result)

    @rule(choice=receipt_choice, delay=st.sampled_from((0.0, 5.0)))
    def nack(self, choice: tuple[str, int, int, str], delay: float) -> None:
        receipt = self.receipt(choice)
        holder = self.holder(receipt)
        queue = holder.queue if holder else self.queues[0]
        op = Nack(queue, receipt, delay)
        (result,) = self.stale_ops_change_nothing([op], holder is None)
        self.model_nack(op, result)

    @rule(choice=receipt_choice)
    def reject(self, choice: tuple[str, int, int, str]) -> None:
        receipt = self.receipt(choice)
        msg = self.holder(receipt)
        (result,) = self.stale_ops_change_nothing([Reject(receipt)], msg is None)
        if msg is not None:
            assert result is None, result
            msg.state, msg.token = DEAD, None  # deliveries kept; gone only by a purge

    @rule(choice=receipt_choice, timeout=st.sampled_from((1.0, 10.0, 60.0)))
    def extend(self, choice: tuple[str, int, int, str], timeout: float) -> None:
        receipt = self.receipt(choice)
        msg = self.holder(receipt)
        (result,) = self.stale_ops_change_nothing([Extend(receipt, timeout)], msg is None)
        if msg is not None:
            assert result == self.now + timeout
            msg.visible_at = self.now + timeout

    @rule(choices=st.lists(receipt_choice, max_size=4))
    def release_socket(self, choices: list[tuple[str, int, int, str]]) -> None:
        # A closing worker socket hands back what it holds, expired leases
        # not taken again included; stale receipts are skipped.
        receipts = [self.receipt(c) for c in choices]
        before = self.snapshot()
        released = self.one(Release(self.queues[0], receipts))
        expected = 0
        for receipt in receipts:
            msg = self.holder(receipt, unexpired=False)
            if msg is not None:
                msg.state, msg.visible_at, msg.token = READY, self.now, None
                expected += 1
        assert released == expected
        if not expected:
            assert self.snapshot() == before

    @rule(
        ops=st.lists(
            st.one_of(
                st.tuples(st.just("ack"), receipt_choice),
                st.tuples(st.just("nack"), receipt_choice),
                st.tuples(st.just("enqueue"), st.sampled_from((0, 1)), specs),
            ),
            min_size=2,
            max_size=5,
        )
    )
    def batch(self, ops: list[tuple[Any, ...]]) -> None:
        # One transaction: runs of plain acks and plain enqueues share a
        # statement, yet every op must behave as if applied alone, in order.
        built: list[Any] = []
        for op in ops:
            if op[0] == "ack":
                built.append(Ack(self.receipt(op[1])))
            elif op[0] == "nack":
                receipt = self.receipt(op[1])
                holder = self.holder(receipt)
                built.append(Nack(holder.queue if holder else self.queues[0], receipt))
            else:
                name = self.queues[op[1]]
                built.append(Enqueue(name, [self.spec(key, delay) for key, delay in op[2]]))
        results = self.run(built)
        for op, result in zip(built, results, strict=True):
            if isinstance(op, Ack):
                self.model_ack(op, result)
            elif isinstance(op, Nack):
                self.model_nack(op, result)
            else:
                self.model_enqueue(op.queue, op.messages, result)

    @rule(queue=st.sampled_from((0, 1)))
    def purge(self, queue: int) -> None:
        name = self.queues[queue]
        result = self.one(Purge(name))
        if name not in self.created:
            assert isinstance(result, NotFound), result
            return
        doomed = [m.id for m in self.msgs.values() if m.queue == name]
        doomed = [
            i for i in doomed if self.msgs[i].observed(self.now) is not MessageState.IN_FLIGHT
        ]
        assert result == len(doomed)
        for msg_id in doomed:
            del self.msgs[msg_id]

    @rule(queue=st.sampled_from((0, 1)))
    def redrive(self, queue: int) -> None:
        name = self.queues[queue]
        result = self.one(Redrive(name))
        if name not in self.created:
            assert isinstance(result, NotFound), result
            return
        dead = [m for m in self.msgs.values() if m.queue == name and m.state is DEAD]
        assert result == len(dead)
        for msg in dead:
            msg.state, msg.visible_at, msg.deliveries, msg.token = READY, self.now, 0, None

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
        rows = self.rows()
        vanished = set(self.msgs) - set(rows)
        assert not vanished, f"messages {vanished} disappeared without an ack or a purge"
        appeared = set(rows) - set(self.msgs)
        assert not appeared, f"messages {appeared} appeared from nowhere"
        for msg_id, msg in self.msgs.items():
            queue, body, key, state, visible_at, deliveries, token = rows[msg_id]
            assert (queue, body, key) == (msg.queue, msg.body, msg.key)
            stored = replace(msg, state=StoredState(state), visible_at=visible_at)
            assert stored.observed(self.now) is msg.observed(self.now), (msg, rows[msg_id])
            assert (StoredState(state), visible_at) == (msg.state, msg.visible_at), msg
            assert deliveries == msg.deliveries, msg
            if msg.state is LEASED:
                assert token == msg.token, msg
        assert self.dedup_rows() == self.keys

    @invariant()
    def stats_count_every_message_once(self) -> None:
        if self.store is None:
            return
        for name in self.queues:
            stats = self.one(Stats(name))
            if name not in self.created:
                assert isinstance(stats, NotFound), stats
                continue
            counts = dict.fromkeys(("visible", "delayed", "in_flight", "dead"), 0)
            for msg in self.msgs.values():
                if msg.queue == name:
                    counts[msg.observed(self.now).value] += 1
            assert {k: getattr(stats, k) for k in counts} == counts


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
