"""The lease rules of the work queue, as pure code with an injected clock.

Nothing here does I/O. The store (``gateway.store``) applies these rules inside
its transactions; the worker socket keeps a :class:`WorkerLeases` to know what
it holds; the per-queue pump keeps a :class:`LeaseScheduler` to know when a
lease round is worth running. The unit tests drive all of them with a fake clock.

Stored states (the ``state`` column) and the states the protocol names
(``docs/protocol.md``, Work queue) are not one-to-one, because visibility is a
time (design decision 1): a leased message whose ``visible_at`` has passed *is*
visible again, with no scavenger needed for correctness.

=============  =====================  ===========================
stored state   ``visible_at <= now``  ``visible_at > now``
=============  =====================  ===========================
READY          visible                (never: READY is due now)
LEASED         visible (expired)      in_flight
DELAYED        visible (due)          delayed
WAITING        visible                delayed
DEAD           dead                   dead
=============  =====================  ===========================

WAITING is a message of a group held behind an earlier message of the same
group (protocol 1.1, groups). Of each group's messages that are not dead,
exactly one is not WAITING: the earliest, the group's *head*, and only a head
can be leased. So a lease round needs no per-group check at all; the store
promotes the next message when a head leaves (see ``gateway.store.groups``).
"""

from __future__ import annotations

import enum
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, TypeAlias

from gateway.core.errors import BadFrame, Invalid

__all__ = [
    "DEAD_REASONS",
    "DEFAULT_QUEUE_SETTINGS",
    "LEASE_SECONDS_BUCKETS",
    "OVERFLOW_POLICIES",
    "Clock",
    "DeadReason",
    "LeaseScheduler",
    "MessageState",
    "Overflow",
    "QueueSettings",
    "StoredState",
    "WorkerLeases",
    "format_bound",
    "format_receipt",
    "lease_outcome",
    "lease_seconds_bucket",
    "observed_state",
    "parse_receipt",
    "release_state",
]

Clock = Callable[[], float]


class StoredState(enum.IntEnum):
    """The ``state`` column of a stored message."""

    READY = 0
    LEASED = 1
    DEAD = 2
    DELAYED = 3
    WAITING = 4


class MessageState(enum.Enum):
    """The states the protocol names."""

    VISIBLE = "visible"
    DELAYED = "delayed"
    IN_FLIGHT = "in_flight"
    DEAD = "dead"


def observed_state(stored: StoredState, visible_at: float, now: float) -> MessageState:
    """The protocol state of a stored message at time ``now`` (see the module table)."""
    if stored is StoredState.DEAD:
        return MessageState.DEAD
    if stored is StoredState.READY or visible_at <= now:
        return MessageState.VISIBLE
    if stored is StoredState.LEASED:
        return MessageState.IN_FLIGHT
    return MessageState.DELAYED


#: Why a message was dead-lettered (protocol 1.1: ``dead_reason``; 1.2 adds
#: ``cancelled``, an operator's cancel).
DeadReason: TypeAlias = Literal["max_deliveries", "rejected", "expired", "overflow", "cancelled"]
DEAD_REASONS: tuple[DeadReason, ...] = (
    "max_deliveries",
    "rejected",
    "expired",
    "overflow",
    "cancelled",
)

#: A bounded queue's policy when an enqueue would exceed ``max_length``.
Overflow: TypeAlias = Literal["drop_newest", "drop_oldest", "block"]
OVERFLOW_POLICIES: tuple[Overflow, ...] = ("drop_newest", "drop_oldest", "block")

#: Longest lease accepted (``visibility_timeout``, ``extend``): 12 hours.
MAX_TIMEOUT = 12 * 3600.0

#: Upper bounds (seconds) of ``leasecast_queue_lease_seconds``'s buckets:
#: from delivery to ack, sub-second handlers to hour-long jobs.
LEASE_SECONDS_BUCKETS: tuple[float, ...] = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)


def lease_seconds_bucket(seconds: float) -> str:
    """The label of the smallest bucket of :data:`LEASE_SECONDS_BUCKETS` that
    holds a lease of ``seconds`` (``"+Inf"`` past the last), as Prometheus
    writes ``le``: the store counts each ack in one bucket, the scrape sums them."""
    for bound in LEASE_SECONDS_BUCKETS:
        if seconds <= bound:
            return format_bound(bound)
    return "+Inf"


def format_bound(bound: float) -> str:
    """A bucket's bound as Prometheus writes ``le`` (``1.0``, ``0.25``, ``+Inf``)."""
    return "+Inf" if bound == float("inf") else repr(float(bound))


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """Per-queue settings, stored in the database.

    The defaults here are the protocol's, and the only copy of them: the
    models, the ``GATEWAY_DEFAULT_*`` settings and the admin read them from
    :data:`DEFAULT_QUEUE_SETTINGS`.
    """

    visibility_timeout: float = 30.0
    max_deliveries: int = 10
    dedup_window: float = 300.0
    #: most messages visible or delayed (in flight ones are not counted); 0 = unlimited
    max_length: int = 0
    overflow: Overflow = "drop_newest"
    # Control (protocol 1.2: Pause, Concurrency and rate limits).
    #: a paused queue leases nothing (enqueues, acks and nacks go on)
    paused: bool = False
    #: most messages leased at the same moment, over every process; 0 = unlimited
    max_in_flight: int = 0
    #: leases granted per second, over every process (a token bucket); 0 = none
    rate_limit: float = 0.0
    #: the bucket's size; None = ``max(1, ceil(rate_limit))`` (see :attr:`burst`)
    rate_burst: int | None = None

    @property
    def burst(self) -> int:
        """The token bucket's size in force: ``rate_burst``, else ``max(1, ceil(rate_limit))``."""
        if self.rate_burst is not None:
            return self.rate_burst
        return max(1, math.ceil(self.rate_limit))

    @property
    def limited(self) -> bool:
        """True if a lease round must count against ``max_in_flight`` or ``rate_limit``."""
        return self.max_in_flight > 0 or self.rate_limit > 0

    def changed(self, changes: dict[str, object]) -> QueueSettings:
        """These settings with ``changes`` applied, every value checked.

        Args:
            changes: setting name to new value, as decoded from JSON (a
                ``PATCH /api/queues/QUEUE`` body) or from command-line options.

        Raises:
            BadFrame: a value of the wrong JSON type.
            Invalid: an unknown setting (the detail lists the known ones).
            Invalid: a value out of range; nothing is changed.
        """
        values: dict[str, object] = {}
        for name, value in changes.items():
            check = _SETTING_CHECKS.get(name)
            if check is None:
                known = ", ".join(_SETTING_CHECKS)
                raise Invalid(f"unknown queue setting {name[:40]!r}; known: {known}")
            values[name] = check(value)
        return replace(self, **values)  # type: ignore[arg-type]

    def as_json(self) -> dict[str, object]:
        """The settings as they appear in a queue's ``GET`` document."""
        return {
            "visibility_timeout": self.visibility_timeout,
            "max_deliveries": self.max_deliveries,
            "dedup_window": self.dedup_window,
            "max_length": self.max_length,
            "overflow": self.overflow,
            "paused": self.paused,
            "max_in_flight": self.max_in_flight,
            "rate_limit": self.rate_limit,
            "rate_burst": self.burst,
        }


def _number(name: str, value: object) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise BadFrame(f"{name} must be a number")
    if value != value or value in (float("inf"), float("-inf")):
        raise Invalid(f"{name} must be finite")
    return float(value)


def _whole(name: str, value: object) -> int:
    number = _number(name, value)
    if number != int(number):
        raise Invalid(f"{name} must be a whole number")
    if number < 0:
        raise Invalid(f"{name} must be >= 0")
    if number > 2**31 - 1:
        raise Invalid(f"{name} must be < 2**31")
    return int(number)


def _check_visibility_timeout(value: object) -> float:
    timeout = _number("visibility_timeout", value)
    if not 0 < timeout <= MAX_TIMEOUT:
        raise Invalid(f"visibility_timeout must be > 0 and <= {MAX_TIMEOUT:.0f} seconds")
    return timeout


def _check_dedup_window(value: object) -> float:
    window = _number("dedup_window", value)
    if not 0 <= window <= 365 * 24 * 3600:
        raise Invalid("dedup_window must be 0..31536000 seconds")
    return window


def _check_overflow(value: object) -> Overflow:
    if not isinstance(value, str):
        raise BadFrame("overflow must be a string")
    for policy in OVERFLOW_POLICIES:
        if value == policy:
            return policy
    raise Invalid(f"overflow must be one of {', '.join(OVERFLOW_POLICIES)}, got {value[:40]!r}")


def _control(check: Callable[[object], object]) -> Callable[[object], object]:
    """A 1.2 control setting's check: a value of the wrong JSON type is ``invalid``
    too (``PATCH``'s rule: invalid values are 400 ``invalid``)."""

    def checked(value: object) -> object:
        try:
            return check(value)
        except BadFrame as exc:
            raise Invalid(exc.detail) from exc

    return checked


def _check_paused(value: object) -> bool:
    if not isinstance(value, bool):
        raise Invalid(f"paused must be true or false, got {str(value)[:40]!r}")
    return value


#: Most leases per second a rate limit may name (a bucket refilled faster is no limit).
MAX_RATE_LIMIT = 1_000_000.0


def _check_rate_limit(value: object) -> float:
    rate = _number("rate_limit", value)
    if not 0 <= rate <= MAX_RATE_LIMIT:
        raise Invalid(f"rate_limit must be 0..{MAX_RATE_LIMIT:.0f} leases per second")
    return rate


def _check_rate_burst(value: object) -> int | None:
    if value is None:
        return None  # back to the default, max(1, ceil(rate_limit))
    burst = _whole("rate_burst", value)
    if burst < 1:
        raise Invalid("rate_burst must be >= 1 (or null for max(1, ceil(rate_limit)))")
    return burst


_SETTING_CHECKS: dict[str, Callable[[object], object]] = {
    "visibility_timeout": _check_visibility_timeout,
    "max_deliveries": lambda value: _whole("max_deliveries", value),
    "dedup_window": _check_dedup_window,
    "max_length": lambda value: _whole("max_length", value),
    "overflow": _check_overflow,
    "paused": _check_paused,
    "max_in_flight": _control(lambda value: _whole("max_in_flight", value)),
    "rate_limit": _control(_check_rate_limit),
    "rate_burst": _control(_check_rate_burst),
}


#: The protocol's defaults for a queue created on first use.
DEFAULT_QUEUE_SETTINGS = QueueSettings()


def lease_outcome(deliveries: int, max_deliveries: int) -> Literal["deliver", "dead_letter"]:
    """Decide a leased message's fate once its delivery count has been raised.

    ``deliveries`` already counts the delivery about to happen. A message whose
    next delivery would exceed ``max_deliveries`` is dead-lettered instead of
    delivered; ``max_deliveries`` 0 means unlimited (protocol: Work queue).
    """
    if max_deliveries and deliveries > max_deliveries:
        return "dead_letter"
    return "deliver"


def release_state(delay: float) -> StoredState:
    """The stored state of a released message (nack, closed socket): due now or later."""
    return StoredState.DELAYED if delay > 0 else StoredState.READY


def format_receipt(msg_id: int, lease_token: int) -> str:
    """A receipt names one delivery: the message and the lease token of that delivery."""
    return f"{msg_id}.{lease_token:x}"


#: Ids and lease tokens are stored as signed 64-bit integers.
_MAX_STORED_INT = 2**63 - 1


def parse_receipt(receipt: str) -> tuple[int, int] | None:
    """Split a receipt into ``(msg_id, lease_token)``, or None if it is not one of ours.

    Numbers the database cannot hold are not ours either: passed on, they would
    fail the whole batch of statements instead of being a stale receipt.
    """
    head, sep, tail = receipt.partition(".")
    if not sep or not head.isdigit() or not 0 < len(tail) <= 16:
        return None
    try:
        msg_id, token = int(head), int(tail, 16)
    except ValueError:
        return None
    if not (0 <= msg_id <= _MAX_STORED_INT and 0 <= token <= _MAX_STORED_INT):
        return None
    return msg_id, token


class WorkerLeases:
    """The leases one worker socket holds, and how many more it may take.

    Args:
        prefetch: most unacked leases the socket may hold at once.
        clock: returns the current time in seconds.
    """

    def __init__(self, prefetch: int, clock: Clock) -> None:
        if prefetch < 1:
            raise ValueError("prefetch must be >= 1")
        self.prefetch = prefetch
        self._clock = clock
        self._expiry: dict[str, float] = {}
        # (expires_at, receipt); entries go stale when a lease ends or is extended
        # and are skipped lazily, which keeps every operation O(log n).
        self._heap: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._expiry)

    def __contains__(self, receipt: object) -> bool:
        return receipt in self._expiry

    @property
    def demand(self) -> int:
        """How many more deliveries this socket may receive now."""
        return max(0, self.prefetch - len(self._expiry))

    def receipts(self) -> list[str]:
        """Every receipt currently held."""
        return list(self._expiry)

    def add(self, receipt: str, expires_at: float) -> None:
        """Record a new lease."""
        self._expiry[receipt] = expires_at
        heapq.heappush(self._heap, (expires_at, receipt))

    def holds(self, receipt: str) -> bool:
        """True if ``receipt`` is a lease of this socket that has not expired."""
        expires_at = self._expiry.get(receipt)
        return expires_at is not None and expires_at > self._clock()

    def end(self, receipt: str) -> bool:
        """Forget a lease (acked, nacked, rejected). Returns whether it was held."""
        return self._expiry.pop(receipt, None) is not None

    def extend(self, receipt: str, expires_at: float) -> None:
        """Move a held lease's expiry."""
        if receipt in self._expiry:
            self._expiry[receipt] = expires_at
            heapq.heappush(self._heap, (expires_at, receipt))

    def expire(self) -> list[str]:
        """Drop and return every lease whose time has passed."""
        now = self._clock()
        expired: list[str] = []
        while self._heap and self._heap[0][0] <= now:
            expires_at, receipt = heapq.heappop(self._heap)
            if self._expiry.get(receipt) == expires_at:
                del self._expiry[receipt]
                expired.append(receipt)
        return expired

    def next_expiry(self) -> float | None:
        """When the earliest held lease expires, or None if none is held."""
        while self._heap:
            expires_at, receipt = self._heap[0]
            if self._expiry.get(receipt) == expires_at:
                return expires_at
            heapq.heappop(self._heap)
        return None


class LeaseScheduler:
    """Decides when a queue's pump should run a lease round.

    The pump must not poll: it runs when something may have become visible
    (a wake: an enqueue, a release, a timer for the next due message) and some
    socket wants work. A round that returns fewer messages than asked shows the
    queue is drained, unless a wake arrived while the round ran; the generation
    counter tells the two apart, so no wake is ever lost.
    """

    def __init__(self) -> None:
        self._generation = 0
        self._drained_at = -1  # generation at which the queue was last seen empty
        self.running = False

    @property
    def maybe_work(self) -> bool:
        """True if the queue may hold visible messages that no round has seen."""
        return self._drained_at != self._generation

    def wake(self) -> None:
        """Something may have become visible."""
        self._generation += 1

    def should_run(self, demand: int) -> bool:
        """True if a round should start now."""
        return demand > 0 and not self.running and self.maybe_work

    def start(self) -> int:
        """Mark a round as started; returns the token to pass to :meth:`finish`."""
        if self.running:
            raise RuntimeError("a lease round is already running")
        self.running = True
        return self._generation

    def finish(self, token: int, requested: int, got: int) -> None:
        """Mark a round as finished; a short round drains the queue (unless woken since)."""
        self.running = False
        if got < requested:
            self._drained_at = token
