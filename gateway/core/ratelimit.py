"""Per-token limits: how many sockets a token holds open, how fast it may send.

Pure: no Django, no asyncio, an injected clock (design decision 9). The
consumers and the HTTP views (``consumers.limits``) keep one
:class:`TokenLimiter` per gateway process and ask it before they act; a
refusal is answered with the protocol's ``backpressure`` (HTTP 429), and the
socket stays open.

Message rate is a token bucket per key (a token or a staff user): the bucket
holds at most ``burst`` units and refills at ``rate`` units a second. A frame
costs one unit per message it carries (``enqueue_many`` and ``ack_many`` count
their items). A cost larger than the bucket can ever hold is admitted when
the bucket is full and leaves it in debt, so a large batch is possible but
pays for itself before the next one: over any long window a key is held to
``rate`` on average, plus one burst.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

__all__ = ["ADMITTED", "Clock", "Decision", "RateLimits", "TokenBucket", "TokenLimiter"]

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class RateLimits:
    """The per-key limits; 0 turns a limit off.

    Args:
        max_sockets: WebSockets one key may hold open at once (on this process).
        rate: units (messages) a second one key may send, on average.
        burst: the bucket's size; 0 means twice ``rate`` (and at least 1).
    """

    max_sockets: int = 0
    rate: float = 0.0
    burst: float = 0.0

    def __post_init__(self) -> None:
        if self.max_sockets < 0 or self.rate < 0 or self.burst < 0:
            raise ValueError(f"limits must be >= 0 (0 turns one off): {self}")

    @property
    def capacity(self) -> float:
        """The bucket size in effect."""
        return self.burst if self.burst > 0 else max(2.0 * self.rate, 1.0)

    @property
    def limits_sockets(self) -> bool:
        return self.max_sockets > 0

    @property
    def limits_rate(self) -> bool:
        return self.rate > 0


@dataclass(frozen=True, slots=True)
class Decision:
    """What the limiter decided: admitted, or refused until ``retry_after`` seconds pass."""

    admitted: bool
    retry_after: float = 0.0


ADMITTED = Decision(True)


class TokenBucket:
    """``burst`` units that refill at ``rate`` a second; starts full.

    The clock is read by the caller and passed in, so one limiter reads it
    once per decision. A clock that steps backwards refills nothing.
    """

    __slots__ = ("burst", "level", "rate", "stamp")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("a token bucket needs rate > 0 and burst > 0")
        self.rate = rate
        self.burst = burst
        self.level = burst
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.burst, self.level + (now - self.stamp) * self.rate)
            self.stamp = now

    def take(self, cost: float, now: float) -> Decision:
        """Take ``cost`` units if there are enough (all of a full bucket at most).

        Raises:
            ValueError: a negative cost.
        """
        if cost < 0:
            raise ValueError(f"cost must be >= 0, got {cost}")
        self._refill(now)
        need = min(cost, self.burst)
        if self.level >= need:
            self.level -= cost  # may go below 0: a batch larger than the bucket
            return ADMITTED
        return Decision(False, (need - self.level) / self.rate)

    def is_full(self, now: float) -> bool:
        """True if the bucket is as a new one would be (so it can be forgotten)."""
        self._refill(now)
        return self.level >= self.burst


class TokenLimiter:
    """Socket counts and message buckets per key, for one gateway process.

    Keys are whatever identifies a caller (the adapter uses the token's id or
    the staff user's id). Memory is bounded by the keys in use: a bucket that
    is full again is the same as no bucket, and is forgotten when the table
    grows past ``max_keys``.
    """

    def __init__(self, limits: RateLimits, clock: Clock, *, max_keys: int = 10_000) -> None:
        self.limits = limits
        self.clock = clock
        self.max_keys = max_keys
        self._sockets: dict[Hashable, int] = {}
        self._buckets: dict[Hashable, TokenBucket] = {}
        #: Refusals so far, for stats: sockets refused, frames or requests refused.
        self.refused_sockets = 0
        self.refused_messages = 0

    # -- sockets

    def open_socket(self, key: Hashable) -> Decision:
        """Count a new socket of ``key``, or refuse it if ``key`` holds ``max_sockets``."""
        held = self._sockets.get(key, 0)
        if self.limits.limits_sockets and held >= self.limits.max_sockets:
            self.refused_sockets += 1
            return Decision(False)
        self._sockets[key] = held + 1
        return ADMITTED

    def close_socket(self, key: Hashable) -> None:
        """Forget one socket of ``key`` (one that :meth:`open_socket` admitted).

        Raises:
            ValueError: ``key`` holds no socket (a close without an open).
        """
        held = self._sockets.get(key, 0)
        if held <= 0:
            raise ValueError(f"{key!r} holds no socket")
        if held == 1:
            del self._sockets[key]
        else:
            self._sockets[key] = held - 1

    def sockets(self, key: Hashable) -> int:
        """Sockets ``key`` holds open now."""
        return self._sockets.get(key, 0)

    # -- messages

    def admit(self, key: Hashable, cost: float = 1.0) -> Decision:
        """Charge ``cost`` messages to ``key``'s bucket, or refuse with the wait."""
        if not self.limits.limits_rate or cost == 0:
            return ADMITTED
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._forget_full(now)
            bucket = self._buckets[key] = TokenBucket(self.limits.rate, self.limits.capacity, now)
        decision = bucket.take(cost, now)
        if not decision.admitted:
            self.refused_messages += 1
        return decision

    def _forget_full(self, now: float) -> None:
        for key in [k for k, b in self._buckets.items() if b.is_full(now)]:
            del self._buckets[key]

    def tracked(self) -> int:
        """Buckets held in memory (for tests and stats)."""
        return len(self._buckets)
