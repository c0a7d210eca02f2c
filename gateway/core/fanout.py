"""The broadcast dispatcher core: bounded per-socket buffers, policies, credit, fair draining.

Pure (design decision 9): no asyncio, no I/O, an injected clock. Commands in
(``publish``, ``grant``, ``drain``), decisions out. ``gateway.topics.broadcast`` wraps
it for the subscriber sockets.

Every subscriber has its own bounded buffer (protocol: Broadcast topics):

- a published message is *offered* to each subscriber of its topic and gets
  that subscriber's next ``seq``; when the buffer is full, the policy decides:
  ``drop_oldest`` evicts the oldest buffered message, ``drop_newest`` drops
  the new one, ``block`` refuses it (the publish must wait, then the socket is
  disconnected: never a silent gap);
- messages leave the buffer only against credit the client granted;
- when several sockets have messages and credit, :meth:`Dispatcher.drain`
  shares the send budget by deficit round robin, in proportion to weights.

For every subscriber, at all times:
``offered == delivered + dropped + buffered`` (a drop is never also a delivery),
and ``seq`` counts the offered messages.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = [
    "Dispatcher",
    "Offer",
    "Policy",
    "PublishOutcome",
    "RateMeter",
    "Subscription",
]

Clock = Callable[[], float]

#: Most credit a subscriber may hold (protects the counters from absurd grants).
MAX_CREDIT = 1_000_000_000


class Policy(enum.Enum):
    """What a full buffer does with a new message (query parameter ``on_full``)."""

    DROP_OLDEST = "drop_oldest"
    DROP_NEWEST = "drop_newest"
    BLOCK = "block"


class Offer(enum.Enum):
    """What became of one message offered to one subscriber."""

    BUFFERED = "buffered"
    EVICTED_OLDEST = "evicted_oldest"  # buffered, and the oldest was dropped
    DROPPED = "dropped"  # drop_newest: the new message was dropped
    FULL = "full"  # block: not taken; nothing changed


class RateMeter:
    """Events per second over the last ``window`` seconds, in one-second buckets."""

    def __init__(self, clock: Clock, window: int = 5) -> None:
        self._clock = clock
        self._window = window
        self._buckets: deque[tuple[int, int]] = deque()
        #: when the last event was counted
        self.last = clock()

    def add(self, n: int = 1) -> None:
        """Count ``n`` events now."""
        self.last = now = self._clock()
        second = int(now)
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1] = (second, self._buckets[-1][1] + n)
        else:
            self._buckets.append((second, n))
            while len(self._buckets) > self._window + 1:
                self._buckets.popleft()

    def per_second(self) -> float:
        """The average rate over the last full ``window`` seconds."""
        now = int(self._clock())
        total = sum(n for second, n in self._buckets if now - self._window <= second < now)
        return total / self._window


@dataclass(eq=False)
class Subscription:
    """One subscriber socket's buffer, credit and counters.

    Args:
        sid: the socket's id in the dispatcher.
        topic: the topic subscribed to.
        capacity: buffer size (1..1,000,000).
        policy: what a full buffer does.
        weight: share of send capacity under contention (>= 1).
        credit: messages the client has granted and not yet received.
    """

    sid: int
    topic: str
    capacity: int
    policy: Policy
    weight: int = 1
    credit: int = 0
    clock: Clock = field(default=lambda: 0.0, repr=False)
    buffer: deque[tuple[int, bytes]] = field(default_factory=deque, repr=False)
    seq: int = 0  # the last seq given to an offered message
    delivered: int = 0
    dropped_oldest: int = 0
    dropped_newest: int = 0
    dropped_relay: int = 0  # lost between gateway processes (see gateway.relay)
    unreported: int = 0  # drops not yet told in a ``messages`` frame
    deficit: int = 0  # deficit round robin
    # Its socket's transport is full (design decision 14): nothing is taken
    # from the buffer, so capacity and policy apply to a client that stopped
    # reading its TCP socket. Set by :meth:`Dispatcher.pause` / ``resume``.
    paused: bool = False
    delivered_rate: RateMeter = field(init=False, repr=False)
    dropped_rate: RateMeter = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.capacity >= 1:
            raise ValueError("capacity must be >= 1")
        if self.weight < 1:
            raise ValueError("weight must be >= 1")
        self.delivered_rate = RateMeter(self.clock)
        self.dropped_rate = RateMeter(self.clock)

    @property
    def offered(self) -> int:
        """Messages offered to this subscriber: each is delivered, dropped or buffered."""
        return self.delivered + self.dropped + len(self.buffer)

    @property
    def buffered(self) -> int:
        """Messages waiting in the buffer."""
        return len(self.buffer)

    @property
    def dropped(self) -> int:
        """Messages this subscriber lost, by any cause."""
        return self.dropped_oldest + self.dropped_newest + self.dropped_relay

    @property
    def sendable(self) -> int:
        """Messages that may be sent now: buffered and covered by credit."""
        return min(self.credit, len(self.buffer))

    def offer(self, body: bytes) -> Offer:
        """Offer one published message; the policy decides when the buffer is full."""
        if len(self.buffer) >= self.capacity:
            if self.policy is Policy.BLOCK:
                return Offer.FULL
            self.seq += 1
            self.unreported += 1
            self.dropped_rate.add()
            if self.policy is Policy.DROP_NEWEST:
                self.dropped_newest += 1
                return Offer.DROPPED
            self.buffer.popleft()
            self.dropped_oldest += 1
            self.buffer.append((self.seq, body))
            return Offer.EVICTED_OLDEST
        self.seq += 1
        self.buffer.append((self.seq, body))
        return Offer.BUFFERED

    def lose(self, n: int) -> None:
        """Count ``n`` messages lost before they reached this process (a relay gap)."""
        self.seq += n
        self.dropped_relay += n
        self.unreported += n
        self.dropped_rate.add(n)

    def grant(self, n: int) -> None:
        """The client granted ``n`` more messages."""
        self.credit = min(MAX_CREDIT, self.credit + n)

    def take(self, limit: int) -> tuple[list[tuple[int, bytes]], int]:
        """Remove up to ``limit`` sendable messages; returns them and the drops to report."""
        n = min(limit, self.credit, len(self.buffer))
        items = [self.buffer.popleft() for _ in range(n)]
        self.credit -= n
        self.delivered += n
        if n:
            self.delivered_rate.add(n)
        dropped, self.unreported = self.unreported, 0
        return items, dropped


@dataclass
class PublishOutcome:
    """What one publish did on this process."""

    seq: int
    subscribers: int = 0
    dropped: int = 0
    blocked: list[Subscription] = field(default_factory=list)
    #: drops by the dropping subscriber's policy (``drop_oldest``, ``drop_newest``)
    dropped_by: dict[str, int] = field(default_factory=dict)


class Dispatcher:
    """All topics and subscribers of one process.

    Args:
        clock: the current time in seconds.
        quantum: items a weight-1 subscriber may take per round of draining.
    """

    def __init__(self, clock: Clock, quantum: int = 16) -> None:
        self.clock = clock
        self.quantum = quantum
        self.topics: dict[str, dict[int, Subscription]] = {}
        self.subscriptions: dict[int, Subscription] = {}
        self.published: dict[str, int] = {}  # per-topic publish counter
        self.publish_rate: dict[str, RateMeter] = {}
        self._ready: dict[int, Subscription] = {}  # insertion-ordered: the DRR ring
        # The subscriber whose turn the last drain's budget cut short: it is at
        # the head of the ring and goes on with its deficit, no new quantum.
        self._resume: int | None = None
        self._next_sid = 0

    # -- membership

    def subscribe(
        self, topic: str, *, capacity: int, policy: Policy, weight: int = 1, credit: int = 0
    ) -> Subscription:
        """Add a subscriber; it receives what is published from now on."""
        self._next_sid += 1
        sub = Subscription(
            self._next_sid, topic, capacity, policy, weight, min(credit, MAX_CREDIT), self.clock
        )
        self.subscriptions[sub.sid] = sub
        self.topics.setdefault(topic, {})[sub.sid] = sub
        return sub

    def unsubscribe(self, sid: int) -> Subscription | None:
        """Remove a subscriber and release its buffer."""
        sub = self.subscriptions.pop(sid, None)
        if sub is None:
            return None
        members = self.topics.get(sub.topic)
        if members is not None:
            members.pop(sid, None)
            if not members:
                del self.topics[sub.topic]
        self._ready.pop(sid, None)
        if self._resume == sid:
            self._resume = None
        sub.buffer.clear()
        return sub

    def detach(self, sid: int) -> None:
        """Take a subscriber off its topic's live stream, keeping its buffer, credit
        and counters (a resuming subscriber while it is replayed from the history)."""
        sub = self.subscriptions.get(sid)
        if sub is None:
            return
        members = self.topics.get(sub.topic)
        if members is not None:
            members.pop(sid, None)
            if not members:
                del self.topics[sub.topic]
        self._ready.pop(sid, None)
        if self._resume == sid:
            self._resume = None

    def attach(self, sid: int) -> None:
        """Put a detached subscriber back on its topic's live stream."""
        sub = self.subscriptions.get(sid)
        if sub is not None:
            self.topics.setdefault(sub.topic, {})[sid] = sub
            self._mark(sub)

    def forget_idle(self, idle_for: float, keep: int | None = None) -> list[str]:
        """Forget the counters of topics with no subscriber here and no publish for
        ``idle_for`` seconds, and then, if more than ``keep`` topics are left, of
        the least recently published ones with no subscriber; returns their names.

        Topics live in memory only, named by whoever publishes: without this,
        every name ever published to would stay (and be listed in the stats)
        for the life of the process. A forgotten topic's counter starts again.
        """
        now = self.clock()
        unsubscribed = [
            (meter.last, topic)
            for topic, meter in self.publish_rate.items()
            if topic not in self.topics
        ]
        gone = [topic for last, topic in unsubscribed if now - last >= idle_for]
        if keep is not None:
            excess = len(self.publish_rate) - len(gone) - keep
            if excess > 0:
                recent = sorted(item for item in unsubscribed if now - item[0] < idle_for)
                gone.extend(topic for _, topic in recent[:excess])
        for topic in gone:
            del self.publish_rate[topic]
            self.published.pop(topic, None)
        return gone

    def subscribers(self, topic: str) -> int:
        """How many subscribers the topic has on this process."""
        return len(self.topics.get(topic, ()))

    # -- publishing

    def publish(self, topic: str, body: bytes) -> PublishOutcome:
        """Offer ``body`` to every subscriber of ``topic``.

        ``block`` subscribers that are full are returned in ``blocked``; the
        caller waits for room and offers again with :meth:`offer_again`, or
        disconnects them.
        """
        count = self.published[topic] = self.published.get(topic, 0) + 1
        meter = self.publish_rate.get(topic)
        if meter is None:
            meter = self.publish_rate[topic] = RateMeter(self.clock)
        meter.add()
        outcome = PublishOutcome(count)
        members = self.topics.get(topic)
        if not members:
            return outcome
        outcome.subscribers = len(members)
        ready = self._ready
        for sid, sub in members.items():
            buffer = sub.buffer
            if len(buffer) < sub.capacity:
                # The common case, inlined: this loop runs once per subscriber
                # per publish, so a method call here is a visible cost.
                seq = sub.seq = sub.seq + 1
                buffer.append((seq, body))
                if sub.credit and not sub.paused and sid not in ready:
                    ready[sid] = sub
            else:
                self._record(sub, sub.offer(body), outcome)
        return outcome

    def offer_again(self, subs: Iterable[Subscription], body: bytes) -> list[Subscription]:
        """Offer a blocked message again; returns the subscribers still full."""
        still: list[Subscription] = []
        for sub in subs:
            if sub.sid in self.subscriptions and sub.offer(body) is Offer.FULL:
                still.append(sub)
            else:
                self._mark(sub)
        return still

    def lose(self, topic: str, n: int) -> list[Subscription]:
        """``n`` messages of ``topic`` were lost between processes.

        Returns the ``block`` subscribers, who must be disconnected (they were
        promised every message); the others count the loss as drops.
        """
        doomed = []
        for sub in self.topics.get(topic, {}).values():
            if sub.policy is Policy.BLOCK:
                doomed.append(sub)
            else:
                sub.lose(n)
                self._mark(sub)
        return doomed

    def _record(self, sub: Subscription, offer: Offer, outcome: PublishOutcome) -> None:
        if offer is Offer.FULL:
            outcome.blocked.append(sub)
            return
        if offer is not Offer.BUFFERED:
            outcome.dropped += 1
            policy = sub.policy.value
            outcome.dropped_by[policy] = outcome.dropped_by.get(policy, 0) + 1
        self._mark(sub)

    def _mark(self, sub: Subscription) -> None:
        # Unreported drops make a subscriber that is waiting for messages (it
        # has credit) ready too: they are told in a frame with no items, so a
        # loss that nothing follows is not silent. Without credit they ride on
        # the next frame, so a stalled subscriber is not flooded with reports.
        if (
            (sub.sendable or (sub.unreported and sub.credit))
            and not sub.paused
            and sub.sid in self.subscriptions
        ):
            self._ready.setdefault(sub.sid, sub)

    # -- credit and sending

    def grant(self, sid: int, n: int) -> None:
        """A subscriber granted ``n`` more credit."""
        sub = self.subscriptions.get(sid)
        if sub is not None:
            sub.grant(n)
            self._mark(sub)

    def pause(self, sid: int) -> None:
        """The subscriber's transport is full: take nothing for it until :meth:`resume`.

        Its buffer keeps filling, so its capacity and ``on_full`` policy apply
        as for a subscriber without credit (design decision 14).
        """
        sub = self.subscriptions.get(sid)
        if sub is None or sub.paused:
            return
        sub.paused = True
        self._ready.pop(sid, None)
        if self._resume == sid:
            self._resume = None
        sub.deficit = 0  # out of the ring, like an emptied queue (DRR)

    def resume(self, sid: int) -> None:
        """The subscriber's transport has room again: it is ready if it has sendable items."""
        sub = self.subscriptions.get(sid)
        if sub is not None and sub.paused:
            sub.paused = False
            self._mark(sub)

    @property
    def has_ready(self) -> bool:
        """True if some subscriber has messages and credit."""
        return bool(self._ready)

    def drain(self, budget: int) -> list[tuple[Subscription, list[tuple[int, bytes]], int]]:
        """Take up to ``budget`` messages to send, shared by weight (deficit round robin).

        Returns ``(subscription, items, dropped_to_report)`` per subscriber
        served, each to become one coalesced ``messages`` frame.
        """
        served: dict[int, tuple[Subscription, list[tuple[int, bytes]], int]] = {}
        while budget > 0 and self._ready:
            progressed = False
            for sid in list(self._ready):
                if budget <= 0:
                    break
                sub = self._ready[sid]
                if sid == self._resume:
                    self._resume = None
                else:
                    sub.deficit += self.quantum * sub.weight
                items, dropped = sub.take(min(sub.deficit, budget))
                sub.deficit -= len(items)
                budget -= len(items)
                progressed = progressed or bool(items) or bool(dropped)
                if sid in served:
                    _, earlier, earlier_dropped = served[sid]
                    served[sid] = (sub, earlier + items, earlier_dropped + dropped)
                else:
                    served[sid] = (sub, items, dropped)
                if budget <= 0 and sub.deficit and sub.sendable:
                    # The budget ended this turn early: it stays at the head and
                    # the next drain finishes it. (Going to the back with its
                    # deficit, a subscriber cut short drain after drain would
                    # pile up deficit and later take far more than its weight.)
                    self._resume = sid
                    break
                # Rotate: whoever was served goes to the back of the ring.
                del self._ready[sid]
                if sub.sendable:
                    self._ready[sid] = sub
                else:
                    sub.deficit = 0  # an emptied queue keeps no deficit (DRR)
            if not progressed:
                break
        return list(served.values())
