"""A queue's concurrency and rate limits, as pure rules (protocol 1.2: Concurrency
and rate limits).

Nothing here does I/O. The store reads a limited queue's row in its lease
transaction (locked on PostgreSQL, under ``BEGIN IMMEDIATE`` on SQLite), counts
its leases in flight, asks :func:`allowance` how many messages this round may
lease, leases at most that many, and writes back the bucket that
:meth:`Allowance.spent` returns, all before the commit. The limits are thus
shared by every process of a deployment and never kept in one process's memory.

The rate limit is a token bucket: it holds at most ``burst`` tokens, gains
``rate`` tokens a second, and each lease takes one. Over any interval of T
seconds at most ``burst + rate * T`` leases are granted: the tokens at the start
(at most ``burst``) plus those gained meanwhile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["LIMIT_RECHECK", "Allowance", "Bucket", "allowance"]

#: Seconds after which a worker held back by ``max_in_flight`` tries again even
#: if no wake-up came (a lease that ended on another process of an SQLite
#: deployment, which has no cross-process wake-ups): no faster than once a second.
LIMIT_RECHECK = 1.0
#: Tokens within this of a whole one count as whole (float sums of rate * dt).
_EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Bucket:
    """A token bucket as stored: ``tokens`` left as of ``refilled_at`` (Unix seconds)."""

    tokens: float
    refilled_at: float

    def refilled(self, rate: float, burst: int, now: float) -> Bucket:
        """The bucket at ``now``: topped up by ``rate`` per second since
        :attr:`refilled_at`, never above ``burst``.

        A clock behind the stored time (another process's) adds nothing and
        keeps the later time, so skewed clocks never mint tokens twice.
        """
        elapsed = max(0.0, now - self.refilled_at)
        tokens = min(float(burst), max(0.0, self.tokens) + elapsed * rate)
        return Bucket(tokens, max(now, self.refilled_at))


@dataclass(frozen=True, slots=True)
class Allowance:
    """How many messages one lease round may lease, and why not more.

    Attributes:
        n: messages the round may lease (0: wait).
        bucket: the refilled bucket before this round spends from it (None: no
            rate limit).
        rate: the rate limit in force (0: none).
        held_by_in_flight: ``max_in_flight`` allows fewer than were wanted.
        now: the time the allowance was made at.
    """

    n: int
    bucket: Bucket | None
    rate: float
    held_by_in_flight: bool
    now: float

    def spent(self, leased: int) -> Bucket | None:
        """The bucket to store after the round leased ``leased`` messages."""
        if self.bucket is None:
            return None
        return Bucket(self.bucket.tokens - leased, self.bucket.refilled_at)

    def wake_at(self, leased: int, wanted: int) -> float | None:
        """When a round that leased ``leased`` of ``wanted`` should be tried again
        for the limits' sake (None: the limits did not hold it back, because it
        got all it wanted or fewer than they allowed).

        The next token's time if the bucket ran dry; :data:`LIMIT_RECHECK` from
        now if ``max_in_flight`` was reached (a lease that ends on this process,
        or on another PostgreSQL one, wakes the workers sooner).
        """
        if leased >= wanted or leased < self.n:
            return None  # all it wanted, or the queue ran dry: not the limits
        times: list[float] = []
        bucket = self.spent(leased)
        if bucket is not None and bucket.tokens < 1 - _EPSILON and self.rate > 0:
            times.append(bucket.refilled_at + (1 - bucket.tokens) / self.rate)
        if self.held_by_in_flight:
            times.append(self.now + LIMIT_RECHECK)
        return min(times) if times else None


def allowance(
    wanted: int,
    *,
    now: float,
    max_in_flight: int = 0,
    in_flight: int = 0,
    rate: float = 0.0,
    burst: int = 1,
    bucket: Bucket | None = None,
) -> Allowance:
    """How many of ``wanted`` messages a lease round may lease now.

    Args:
        wanted: messages the round asks for.
        now: the transaction's time.
        max_in_flight: the queue's limit (0: none).
        in_flight: the queue's messages leased now, on every process.
        rate: leases per second (0: no rate limit).
        burst: the bucket's size.
        bucket: the stored bucket (None: a fresh, full one).
    """
    n = max(0, wanted)
    refilled: Bucket | None = None
    if rate > 0:
        stored = bucket if bucket is not None else Bucket(float(burst), now)
        refilled = stored.refilled(rate, burst, now)
        n = min(n, math.floor(refilled.tokens + _EPSILON))
    held = False
    if max_in_flight > 0:
        room = max(0, max_in_flight - in_flight)
        if room <= n and room < wanted:
            n, held = room, True  # the binding limit (or as binding as the bucket)
    return Allowance(n, refilled, rate, held, now)
