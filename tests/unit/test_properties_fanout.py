"""Property tests of the broadcast dispatcher core (``gateway.core.fanout``).

A hypothesis state machine drives one :class:`Dispatcher` with random
subscribes, unsubscribes, publishes, relay losses, credit grants, drains and
clock moves, and keeps its own model of what each subscriber was offered. A
``block`` publish that meets a full buffer is handled the way
``gateway.topics.broadcast`` handles it: the publish waits (later publishes to the
topic queue behind it), is offered again, and the subscribers still full are
disconnected. After every step, for every subscriber:

- offered == delivered + dropped + buffered, and equals what the model
  dispatched to it (its ``seq``);
- what it received has strictly increasing seqs, each naming the message the
  model dispatched under that seq (publish order, gaps only where drops were);
- the drops it was told of, plus those not yet told, are its drops, and a
  gap in its seqs is never silent;
- its buffer never exceeds its capacity;
- a ``block`` subscriber never drops: it got a gap-free prefix of what was
  published, or was disconnected;
- credit is never negative, and nothing is sent beyond credit;
- draining is work-conserving and shares a scarce budget by weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from gateway.core.fanout import MAX_CREDIT, Dispatcher, Policy, RateMeter, Subscription
from tests.support.fakes import FakeClock

TOPICS = ("a", "b")
WINDOW = 5  # RateMeter's default window


@dataclass
class Model:
    """What the test knows one subscriber was offered and received."""

    sub: Subscription
    credit: int
    granted: int  # all credit ever granted (initial included), uncapped
    #: every message taken for it, by seq - 1: a publish id, or None for a relay loss
    dispatched: list[int | None] = field(default_factory=list)
    #: every publish to its topic while it was subscribed (a refused one included)
    published: list[int] = field(default_factory=list)
    received: list[tuple[int, int]] = field(default_factory=list)  # (seq, publish id)
    told_dropped: int = 0
    live: bool = True
    closed_slow: bool = False
    discarded: int = 0  # buffered when its socket closed: released with the socket
    delivered_at: list[tuple[int, int]] = field(default_factory=list)  # rate events
    dropped_at: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Pending:
    """A publish waiting for room in full ``block`` buffers."""

    pid: int
    blocked: list[Subscription]


def rate(events: list[tuple[int, int]], now: float) -> float:
    second = int(now)
    return sum(n for s, n in events if second - WINDOW <= s < second) / WINDOW


class FanoutMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock(1000.0)
        self.d = Dispatcher(self.clock)
        self.models: dict[int, Model] = {}
        self.pending: dict[str, Pending] = {}
        self.next_pid = 0
        self.published_at: dict[str, list[tuple[int, int]]] = {}

    @initialize(quantum=st.integers(1, 6))
    def setup(self, quantum: int) -> None:
        self.d = Dispatcher(self.clock, quantum=quantum)

    # -- helpers

    def live(self) -> list[Model]:
        return [m for m in self.models.values() if m.live]

    def pick(self, index: int) -> Model:
        live = self.live()
        return live[index % len(live)]

    def close(self, model: Model, *, slow: bool) -> None:
        model.discarded = model.sub.buffered
        self.d.unsubscribe(model.sub.sid)
        model.live = False
        model.closed_slow = slow

    def note_drop(self, model: Model, n: int) -> None:
        model.dropped_at.append((int(self.clock()), n))

    def settle(self, topic: str, *, give_up: bool) -> None:
        """Offer a waiting publish again; with ``give_up``, close who is still full."""
        pending = self.pending.get(topic)
        if pending is None:
            return
        body = str(pending.pid).encode()
        before = {s.sid: (s.buffered, s.capacity) for s in pending.blocked}
        still = self.d.offer_again(pending.blocked, body)
        still_ids = {s.sid for s in still}
        for sub in pending.blocked:
            model = self.models[sub.sid]
            if not model.live:
                assert sub.sid not in still_ids  # a closed socket is not waited for
                continue
            buffered, capacity = before[sub.sid]
            assert (sub.sid in still_ids) == (buffered >= capacity)
            if sub.sid not in still_ids:
                model.dispatched.append(pending.pid)
        pending.blocked = still
        if give_up:
            for sub in still:
                self.close(self.models[sub.sid], slow=True)
            pending.blocked = []
        if not pending.blocked:
            del self.pending[topic]

    # -- membership

    @precondition(lambda self: len(self.live()) < 6)
    @rule(
        topic=st.sampled_from(TOPICS),
        policy=st.sampled_from(Policy),
        capacity=st.one_of(st.integers(1, 6), st.just(60)),
        weight=st.integers(1, 4),
        credit=st.integers(0, 12),
    )
    def subscribe(
        self, topic: str, policy: Policy, capacity: int, weight: int, credit: int
    ) -> None:
        sub = self.d.subscribe(
            topic, capacity=capacity, policy=policy, weight=weight, credit=credit
        )
        assert sub.sid not in self.models
        self.models[sub.sid] = Model(sub, credit, credit)

    @precondition(lambda self: bool(self.live()))
    @rule(index=st.integers(0, 100))
    def unsubscribe(self, index: int) -> None:
        self.close(self.pick(index), slow=False)

    # -- publishing

    @rule(topic=st.sampled_from(TOPICS), n=st.integers(1, 25))
    def publish_burst(self, topic: str, n: int) -> None:
        for _ in range(n):
            self.publish(topic)

    @rule(topic=st.sampled_from(TOPICS))
    def publish(self, topic: str) -> None:
        # Publishes to a topic are applied in order: one waiting for a full
        # block buffer is settled first (room, or the 4008 close).
        self.settle(topic, give_up=True)
        pid = self.next_pid
        self.next_pid += 1
        members = [m for m in self.live() if m.sub.topic == topic]
        full = {m.sub.sid for m in members if m.sub.buffered >= m.sub.capacity}
        outcome = self.d.publish(topic, str(pid).encode())
        self.published_at.setdefault(topic, []).append((int(self.clock()), 1))
        assert outcome.seq == len(self.published_at[topic])
        assert outcome.subscribers == len(members)
        blocked = {s.sid for s in outcome.blocked}
        assert blocked == {m.sub.sid for m in members if m.sub.sid in full and _blocks(m)}
        assert outcome.dropped == len(full - blocked)
        for m in members:
            m.published.append(pid)
            if m.sub.sid not in blocked:
                m.dispatched.append(pid)
                if m.sub.sid in full:
                    self.note_drop(m, 1)
        if outcome.blocked:
            self.pending[topic] = Pending(pid, outcome.blocked)

    @precondition(lambda self: bool(self.pending))
    @rule(topic=st.sampled_from(TOPICS), give_up=st.booleans())
    def settle_blocked(self, topic: str, give_up: bool) -> None:
        self.settle(topic, give_up=give_up)

    @rule(topic=st.sampled_from(TOPICS), n=st.integers(1, 3))
    def relay_loss(self, topic: str, n: int) -> None:
        members = [m for m in self.live() if m.sub.topic == topic]
        doomed = self.d.lose(topic, n)
        assert {s.sid for s in doomed} == {m.sub.sid for m in members if _blocks(m)}
        for m in members:
            if _blocks(m):
                self.close(m, slow=True)  # promised every message: disconnected
            else:
                m.dispatched.extend([None] * n)
                self.note_drop(m, n)
        pending = self.pending.get(topic)
        if pending is not None:
            pending.blocked = [s for s in pending.blocked if self.models[s.sid].live]
            if not pending.blocked:
                del self.pending[topic]

    # -- credit and sending

    @precondition(lambda self: bool(self.live()))
    @rule(
        index=st.integers(0, 100),
        n=st.one_of(st.integers(0, 8), st.just(MAX_CREDIT)),
    )
    def grant(self, index: int, n: int) -> None:
        model = self.pick(index)
        self.d.grant(model.sub.sid, n)
        model.credit = min(MAX_CREDIT, model.credit + n)
        model.granted += n

    @rule(budget=st.integers(1, 40))
    def drain(self, budget: int) -> None:
        self.drain_once(budget)

    @rule()
    def drain_everything(self) -> None:
        while self.d.has_ready:
            self.drain_once(10_000)
        for m in self.live():
            # Nothing is stuck: what may be sent was sent, and a subscriber
            # waiting for messages has been told of every drop.
            assert m.sub.sendable == 0
            assert m.sub.credit == 0 or m.sub.unreported == 0

    def drain_once(self, budget: int) -> None:
        before = {m.sub.sid: (m.sub.sendable, m.sub.credit) for m in self.live()}
        served = self.d.drain(budget)
        sids = [sub.sid for sub, _, _ in served]
        assert len(sids) == len(set(sids)), "one frame per subscriber per drain"
        sent: dict[int, int] = {}
        for sub, items, dropped in served:
            model = self.models[sub.sid]
            assert model.live, "nothing is sent to a closed socket"
            sendable, credit = before[sub.sid]
            assert len(items) <= min(sendable, credit), "nothing is sent beyond credit"
            assert items or dropped, "no empty frames"
            for seq, body in items:
                last = model.received[-1][0] if model.received else 0
                assert seq > last, "seq increases strictly"
                pid = model.dispatched[seq - 1]
                assert pid is not None and body == str(pid).encode(), "seq names its message"
                model.received.append((seq, pid))
            model.credit -= len(items)
            model.told_dropped += dropped
            if items:
                model.delivered_at.append((int(self.clock()), len(items)))
                # The client sees every gap below its newest seq as reported drops.
                assert model.told_dropped >= model.received[-1][0] - len(model.received)
            sent[sub.sid] = len(items)
        total = sum(sent.values())
        assert total <= budget
        # Work-conserving: a drain stops short of its budget only when nothing
        # more may be sent.
        assert total == min(budget, sum(s for s, _ in before.values()))
        # Weighted fairness: subscribers that had more to send than they got
        # were served in proportion to their weights (deficit round robin).
        backlogged = [
            m
            for m in self.live()
            if before[m.sub.sid][0] > 0 and m.sub.sendable > 0 and m.sub.sid in sent
        ]
        if len(backlogged) > 1:
            shares = [sent[m.sub.sid] / m.sub.weight for m in backlogged]
            assert max(shares) - min(shares) <= 2 * self.d.quantum, (shares, self.d.quantum)

    @rule(seconds=st.sampled_from([0.25, 0.5, 1.0, 2.0, 5.0, 7.5]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    # -- invariants

    @invariant()
    def books_balance(self) -> None:
        for m in self.models.values():
            sub = m.sub
            assert sub.seq == len(m.dispatched)
            assert sub.offered == sub.delivered + sub.dropped + sub.buffered
            assert sub.offered + m.discarded == len(m.dispatched)
            assert sub.delivered == len(m.received)
            assert sub.dropped == m.dispatched.count(None) + sub.dropped_oldest + (
                sub.dropped_newest
            )
            assert m.told_dropped + sub.unreported == sub.dropped
            assert 0 <= sub.buffered <= sub.capacity
            assert 0 <= sub.credit == m.credit <= MAX_CREDIT
            assert sub.delivered <= m.granted
            # The buffer holds the newest messages not yet received, in seq order.
            last = m.received[-1][0] if m.received else 0
            for seq, body in sub.buffer:
                assert seq > last
                last = seq
                pid = m.dispatched[seq - 1]
                assert pid is not None and body == str(pid).encode()
            received = [pid for _, pid in m.received]
            assert received == sorted(set(received)), "publish order"
            if _blocks(m):
                assert sub.dropped == 0
                held = received + [int(b) for _, b in sub.buffer]
                assert held == m.published[: len(held)], "a block subscriber has no gap"
                missing = m.published[len(held) :]
                if m.live:
                    pending = self.pending.get(sub.topic)
                    waiting = pending is not None and sub in pending.blocked
                    assert missing == ([pending.pid] if waiting and pending else [])
            elif m.live:
                assert [p for p in m.dispatched if p is not None] == m.published

    @invariant()
    def membership_and_readiness(self) -> None:
        for topic in TOPICS:
            live = [m for m in self.live() if m.sub.topic == topic]
            assert self.d.subscribers(topic) == len(live)
        assert set(self.d.subscriptions) == {m.sub.sid for m in self.live()}
        for m in self.models.values():
            if not m.live:
                assert m.sub.buffered == 0  # released on close
        if any(m.sub.sendable for m in self.live()):
            assert self.d.has_ready, "a sendable subscriber is never forgotten"

    @invariant()
    def rates_follow_the_clock(self) -> None:
        now = self.clock()
        for m in self.live():
            assert m.sub.delivered_rate.per_second() == rate(m.delivered_at, now)
            assert m.sub.dropped_rate.per_second() == rate(m.dropped_at, now)
        for topic, events in self.published_at.items():
            meter: RateMeter = self.d.publish_rate[topic]
            assert meter.per_second() == rate(events, now)


def _blocks(model: Model) -> bool:
    return model.sub.policy is Policy.BLOCK


@settings(max_examples=200, deadline=None)
@given(
    quantum=st.integers(1, 8),
    weights=st.lists(st.integers(1, 4), min_size=2, max_size=4),
    budgets=st.lists(st.integers(1, 50), min_size=1, max_size=60),
)
def test_backlogged_subscribers_are_served_by_weight_across_drains(
    quantum: int, weights: list[int], budgets: list[int]
) -> None:
    # Every subscriber always has more to send than any budget: deficit round
    # robin must give each quantum * weight per turn, whatever the budget of
    # each drain, so the service per unit of weight never drifts apart by more
    # than one quantum (a turn cut short by the budget resumes in the next drain).
    d = Dispatcher(FakeClock(), quantum=quantum)
    backlog = sum(budgets)
    subs = [
        d.subscribe("t", capacity=backlog, policy=Policy.DROP_OLDEST, weight=w, credit=backlog)
        for w in weights
    ]
    for i in range(backlog):
        d.publish("t", str(i).encode())
    served = dict.fromkeys((s.sid for s in subs), 0)
    for n, budget in enumerate(budgets, 1):
        for sub, items, dropped in d.drain(budget):
            served[sub.sid] += len(items)
            assert dropped == 0
        assert sum(served.values()) == sum(budgets[:n])  # work-conserving
        shares = [served[s.sid] / s.weight for s in subs]
        assert max(shares) - min(shares) <= quantum, (shares, [s.deficit for s in subs])
    assert sum(served.values()) == backlog


FanoutMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)
TestFanoutProperties = FanoutMachine.TestCase
