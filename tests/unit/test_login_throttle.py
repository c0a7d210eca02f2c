"""The login throttle's counting (gateway.login_throttle), on a clock the test moves."""

from __future__ import annotations

import pytest

from gateway.access import login_throttle
from gateway.access.login_throttle import LoginThrottle
from tests.support.fakes import FakeClock


def test_a_pair_is_refused_after_its_failures_until_the_lockout_passes() -> None:
    clock = FakeClock()
    limits = LoginThrottle(3, 60.0, clock)
    pair = ("ops", "10.0.0.1")
    for _ in range(3):
        assert not limits.refused(pair)
        limits.failed(pair)
    assert limits.refused(pair)
    # Another address, or another name, is not affected.
    assert not limits.refused(("ops", "10.0.0.2"))
    assert not limits.refused(("other", "10.0.0.1"))
    clock.now += 59.0
    assert limits.refused(pair)
    clock.now += 1.0
    assert not limits.refused(pair)


def test_a_success_clears_the_count_and_zero_turns_it_off() -> None:
    limits = LoginThrottle(2, 60.0, FakeClock())
    pair = ("ops", "10.0.0.1")
    limits.failed(pair)
    limits.succeeded(pair)
    limits.failed(pair)
    assert not limits.refused(pair)
    off = LoginThrottle(0, 60.0, FakeClock())
    for _ in range(10):
        off.failed(pair)
    assert not off.refused(pair)


def test_the_table_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(login_throttle, "MAX_PAIRS", 3)
    limits = LoginThrottle(1, 60.0, FakeClock())
    for n in range(5):
        limits.failed((f"user{n}", "a"))
    assert not limits.refused(("user0", "a"))  # forgotten first
    assert limits.refused(("user4", "a"))
