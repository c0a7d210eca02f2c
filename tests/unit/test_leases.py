"""The pure lease rules, the per-socket lease table and the pump's scheduler."""

from __future__ import annotations

import pytest

from gateway.core.leases import (
    LeaseScheduler,
    MessageState,
    StoredState,
    WorkerLeases,
    format_receipt,
    lease_outcome,
    observed_state,
    parse_receipt,
    release_state,
)
from tests.support.fakes import FakeClock


@pytest.mark.parametrize(
    ("stored", "visible_at", "expected"),
    [
        (StoredState.READY, 999.0, MessageState.VISIBLE),
        (StoredState.LEASED, 1001.0, MessageState.IN_FLIGHT),
        (StoredState.LEASED, 1000.0, MessageState.VISIBLE),  # expired at this instant
        (StoredState.DELAYED, 1001.0, MessageState.DELAYED),
        (StoredState.DELAYED, 999.0, MessageState.VISIBLE),
        (StoredState.DEAD, 999.0, MessageState.DEAD),
        (StoredState.DEAD, 2000.0, MessageState.DEAD),
    ],
)
def test_observed_state_follows_visible_at(
    stored: StoredState, visible_at: float, expected: MessageState
) -> None:
    assert observed_state(stored, visible_at, 1000.0) is expected


def test_lease_outcome_dead_letters_past_max_deliveries() -> None:
    assert lease_outcome(1, 3) == "deliver"
    assert lease_outcome(3, 3) == "deliver"
    assert lease_outcome(4, 3) == "dead_letter"
    assert lease_outcome(10_000, 0) == "deliver"  # 0 is unlimited


def test_release_state_is_ready_or_delayed() -> None:
    assert release_state(0) is StoredState.READY
    assert release_state(0.5) is StoredState.DELAYED


def test_receipts_round_trip_and_reject_foreign_strings() -> None:
    receipt = format_receipt(42, 0xABCDEF)
    assert parse_receipt(receipt) == (42, 0xABCDEF)
    for bad in ["", "42", "x.1", "42.", "42.zz", "-1.5", "1." + "f" * 17, "4 2.1"]:
        assert parse_receipt(bad) is None, bad


def test_worker_leases_count_demand_against_prefetch() -> None:
    clock = FakeClock()
    leases = WorkerLeases(2, clock)
    assert leases.demand == 2
    leases.add("a", 1010.0)
    leases.add("b", 1020.0)
    assert leases.demand == 0
    assert leases.holds("a")
    assert leases.end("a")
    assert not leases.end("a")
    assert leases.demand == 1


def test_worker_leases_expire_in_time_order_and_honour_extend() -> None:
    clock = FakeClock()
    leases = WorkerLeases(5, clock)
    leases.add("a", 1010.0)
    leases.add("b", 1005.0)
    leases.add("c", 1020.0)
    leases.extend("b", 1030.0)
    assert leases.next_expiry() == 1010.0
    clock.advance(10)
    assert not leases.holds("a")  # expired: a later ack is stale
    assert leases.expire() == ["a"]
    assert leases.next_expiry() == 1020.0
    clock.advance(15)
    assert leases.expire() == ["c"]
    assert leases.holds("b")
    clock.advance(5)
    assert leases.expire() == ["b"]
    assert leases.next_expiry() is None
    assert leases.demand == 5


def test_worker_leases_ended_lease_never_expires_later() -> None:
    clock = FakeClock()
    leases = WorkerLeases(1, clock)
    leases.add("a", 1001.0)
    leases.end("a")
    clock.advance(5)
    assert leases.expire() == []


def test_worker_leases_refuse_zero_prefetch() -> None:
    with pytest.raises(ValueError, match="prefetch"):
        WorkerLeases(0, FakeClock())


def test_scheduler_runs_once_woken_and_stops_when_drained() -> None:
    scheduler = LeaseScheduler()
    assert not scheduler.should_run(5) or scheduler.maybe_work  # fresh: may have work
    token = scheduler.start()
    assert not scheduler.should_run(5)  # one round at a time
    scheduler.finish(token, requested=5, got=2)  # short: drained
    assert not scheduler.should_run(5)
    scheduler.wake()
    assert scheduler.should_run(5)
    assert not scheduler.should_run(0)  # nobody wants work


def test_scheduler_keeps_a_wake_that_arrives_during_a_round() -> None:
    scheduler = LeaseScheduler()
    token = scheduler.start()
    scheduler.wake()  # an enqueue committed while the round ran
    scheduler.finish(token, requested=5, got=0)
    assert scheduler.should_run(5)


def test_scheduler_full_round_means_more_may_wait() -> None:
    scheduler = LeaseScheduler()
    token = scheduler.start()
    scheduler.finish(token, requested=5, got=5)
    assert scheduler.should_run(1)


def test_scheduler_refuses_overlapping_rounds() -> None:
    scheduler = LeaseScheduler()
    scheduler.start()
    with pytest.raises(RuntimeError):
        scheduler.start()
