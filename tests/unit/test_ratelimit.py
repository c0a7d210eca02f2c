"""The per-token limits, driven by a fake clock (gateway.core.ratelimit)."""

from __future__ import annotations

import pytest

from gateway.core.ratelimit import ADMITTED, Decision, RateLimits, TokenBucket, TokenLimiter
from tests.support.fakes import FakeClock


def limiter(clock: FakeClock, **limits: float) -> TokenLimiter:
    return TokenLimiter(RateLimits(**limits), clock)  # type: ignore[arg-type]


# -- the bucket


def test_bucket_starts_full_and_refuses_past_its_burst() -> None:
    bucket = TokenBucket(rate=2.0, burst=5.0, now=0.0)
    assert [bucket.take(1, 0.0).admitted for _ in range(6)] == [True] * 5 + [False]


def test_refusal_says_how_long_until_the_cost_fits() -> None:
    bucket = TokenBucket(rate=4.0, burst=4.0, now=0.0)
    assert bucket.take(4, 0.0) is ADMITTED
    refused = bucket.take(2, 0.0)
    assert refused == Decision(False, 0.5)  # 2 units at 4 a second
    assert not bucket.take(2, 0.49).admitted
    assert bucket.take(2, 0.5).admitted


def test_refill_is_capped_at_the_burst() -> None:
    bucket = TokenBucket(rate=10.0, burst=3.0, now=0.0)
    assert bucket.take(3, 0.0).admitted
    # An hour idle refills three units, not 36,000.
    assert [bucket.take(1, 3600.0).admitted for _ in range(4)] == [True, True, True, False]


def test_a_refused_take_costs_nothing() -> None:
    bucket = TokenBucket(rate=1.0, burst=2.0, now=0.0)
    assert bucket.take(2, 0.0).admitted
    for _ in range(100):
        assert not bucket.take(1, 0.0).admitted
    assert bucket.take(1, 1.0).admitted  # one second refilled exactly one unit


def test_a_batch_larger_than_the_bucket_goes_into_debt() -> None:
    bucket = TokenBucket(rate=8.0, burst=8.0, now=0.0)
    assert bucket.take(40, 0.0).admitted  # a full bucket admits any batch
    refused = bucket.take(1, 0.0)
    assert refused == Decision(False, 4.125)  # 32 of debt, then 1 more, at 8 a second
    assert not bucket.take(1, 4.0).admitted
    assert bucket.take(1, 4.125).admitted


def test_a_big_batch_on_a_part_empty_bucket_waits_for_a_full_one() -> None:
    bucket = TokenBucket(rate=1.0, burst=10.0, now=0.0)
    assert bucket.take(5, 0.0).admitted
    assert bucket.take(100, 0.0).retry_after == pytest.approx(5.0)
    assert bucket.take(100, 5.0).admitted


def test_a_clock_stepping_back_refills_nothing() -> None:
    bucket = TokenBucket(rate=1.0, burst=1.0, now=100.0)
    assert bucket.take(1, 100.0).admitted
    assert not bucket.take(1, 50.0).admitted
    assert not bucket.take(1, 100.5).admitted  # the step back did not move the stamp
    assert bucket.take(1, 101.0).admitted


def test_zero_cost_is_free_and_negative_cost_is_refused() -> None:
    bucket = TokenBucket(rate=1.0, burst=1.0, now=0.0)
    assert bucket.take(1, 0.0).admitted
    assert bucket.take(0, 0.0).admitted
    with pytest.raises(ValueError):
        bucket.take(-1, 0.0)


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1.0), (1.0, 0.0), (-1.0, 1.0)])
def test_a_bucket_needs_a_rate_and_a_size(rate: float, burst: float) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate, burst, 0.0)


# -- limits


def test_default_burst_is_two_seconds_of_rate_and_at_least_one() -> None:
    assert RateLimits(rate=50).capacity == 100
    assert RateLimits(rate=0.1).capacity == 1
    assert RateLimits(rate=50, burst=7).capacity == 7


def test_negative_limits_are_refused() -> None:
    for bad in ({"max_sockets": -1}, {"rate": -0.5}, {"burst": -1}):
        with pytest.raises(ValueError):
            RateLimits(**bad)  # type: ignore[arg-type]


# -- the limiter


def test_off_by_default_admits_everything() -> None:
    clock = FakeClock()
    lim = limiter(clock)
    assert all(lim.admit("t", 1000).admitted for _ in range(10_000))
    assert all(lim.open_socket("t").admitted for _ in range(10_000))
    assert lim.tracked() == 0  # no bucket is even made
    assert lim.refused_messages == lim.refused_sockets == 0


def test_each_key_has_its_own_bucket() -> None:
    clock = FakeClock()
    lim = limiter(clock, rate=1, burst=3)
    assert [lim.admit("a").admitted for _ in range(4)] == [True, True, True, False]
    # b is unaffected by a's exhaustion.
    assert [lim.admit("b").admitted for _ in range(3)] == [True, True, True]
    assert not lim.admit("a").admitted
    assert lim.refused_messages == 2
    clock.advance(1.0)
    assert lim.admit("a").admitted
    assert not lim.admit("a").admitted


def test_the_rate_holds_over_time() -> None:
    """Over 100 simulated seconds a greedy key gets rate x time plus one burst."""
    clock = FakeClock()
    lim = limiter(clock, rate=4, burst=10)
    admitted = 0
    for _ in range(1600):  # a try every 1/16 s, for 100 s
        admitted += lim.admit("greedy").admitted
        clock.advance(0.0625)
    assert 4 * 100 <= admitted <= 4 * 100 + 10


def test_socket_count_per_key() -> None:
    lim = limiter(FakeClock(), max_sockets=2)
    assert lim.open_socket("a").admitted
    assert lim.open_socket("a").admitted
    assert not lim.open_socket("a").admitted
    assert lim.open_socket("b").admitted  # another key is unaffected
    assert lim.sockets("a") == 2 and lim.refused_sockets == 1
    lim.close_socket("a")
    assert lim.sockets("a") == 1
    assert lim.open_socket("a").admitted
    assert not lim.open_socket("a").admitted


def test_closing_forgets_the_key_and_a_close_without_open_is_an_error() -> None:
    lim = limiter(FakeClock(), max_sockets=1)
    assert lim.open_socket("a").admitted
    lim.close_socket("a")
    assert lim.sockets("a") == 0
    with pytest.raises(ValueError):
        lim.close_socket("a")
    assert lim.open_socket("a").admitted


def test_sockets_are_counted_even_without_a_socket_limit() -> None:
    """So turning the limit on later (a new process) is the only thing that changes."""
    lim = limiter(FakeClock(), rate=1)
    for _ in range(3):
        lim.open_socket("a")
    assert lim.sockets("a") == 3


def test_memory_is_bounded_by_forgetting_full_buckets() -> None:
    clock = FakeClock()
    lim = TokenLimiter(RateLimits(rate=1, burst=1), clock, max_keys=100)
    for i in range(100):
        assert lim.admit(f"k{i}").admitted
    assert lim.tracked() == 100
    clock.advance(1.0)  # every bucket is full again
    assert lim.admit("new").admitted
    assert lim.tracked() == 1
    # A bucket that is not full yet is kept: forgetting it would reset its debt.
    for i in range(99):
        lim.admit(f"j{i}")
    assert not lim.admit("new").admitted
    lim.admit("one-more")
    assert not lim.admit("new").admitted
