"""gateway.engine.cancels: a cancel notice goes to the socket holding the lease,
or is kept for the socket about to take it (the race between a lease round's
commit and its hand-out)."""

from __future__ import annotations

from gateway.engine.cancels import KEEP_UNCLAIMED, MAX_UNCLAIMED, CancelNotices
from gateway.engine.pump import QueuePump
from gateway.store import Delivered
from tests.support.fakes import FakeClock


class Holder:
    """A worker socket holding some receipts (what the pump and the notices use)."""

    def __init__(self, *receipts: str) -> None:
        self.held = set(receipts)
        self.told: list[tuple[str, str]] = []

    @property
    def demand(self) -> int:
        return 0

    @property
    def room(self) -> int:
        return 0

    @property
    def visibility_timeout(self) -> float | None:
        return None

    def deliver(self, items: list[Delivered]) -> None:
        raise AssertionError("no demand, no deliveries")

    def lease_cancelled(self, msg_id: str, receipt: str) -> bool:
        if receipt not in self.held:
            return False
        self.held.discard(receipt)
        self.told.append((msg_id, receipt))
        return True


def _pumps(**sinks: list[Holder]) -> dict[str, QueuePump]:
    pumps = {}
    for queue, holders in sinks.items():
        pump = pumps[queue] = QueuePump(queue, lambda op, done: None)
        for holder in holders:
            pump.attach(holder)
    return pumps


def test_the_holding_socket_is_told_once() -> None:
    a, b = Holder("1.a"), Holder("2.b")
    notices = CancelNotices(_pumps(q=[a, b]))
    assert notices.tell("q", "2", "2.b")
    assert (a.told, b.told) == ([], [("2", "2.b")])
    assert not notices.tell("q", "2", "2.b")  # a second notice: nobody holds it now
    assert b.told == [("2", "2.b")]


def test_an_unclaimed_notice_is_claimed_once_by_its_queue_only() -> None:
    clock = FakeClock()
    notices = CancelNotices(_pumps(q=[Holder()]), clock)
    assert not notices.claim("q", "1.a")
    assert not notices.tell("q", "1", "1.a")  # its delivery has not reached a socket yet
    assert not notices.claim("other", "1.a")
    assert notices.claim("q", "1.a")
    assert not notices.claim("q", "1.a")
    assert len(notices) == 0


def test_unclaimed_notices_are_forgotten_in_time_and_bounded() -> None:
    clock = FakeClock()
    notices = CancelNotices({}, clock)
    notices.tell("q", "1", "1.a")
    clock.advance(KEEP_UNCLAIMED + 1)
    notices.tell("q", "2", "2.b")  # forgets what has been kept long enough
    assert not notices.claim("q", "1.a")
    assert notices.claim("q", "2.b")
    for i in range(MAX_UNCLAIMED + 5):
        notices.tell("q", str(i), f"{i}.f")
    assert len(notices) == MAX_UNCLAIMED
    assert not notices.claim("q", "0.f")  # the oldest went first
    assert notices.claim("q", f"{MAX_UNCLAIMED + 4}.f")
