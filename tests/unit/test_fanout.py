"""The broadcast dispatcher core, driven by hand with a fake clock."""

from __future__ import annotations

import pytest

from gateway.core.fanout import Dispatcher, Offer, Policy, RateMeter, Subscription
from tests.support.fakes import FakeClock


def body(i: int) -> bytes:
    return str(i).encode()


def received(dispatcher: Dispatcher, budget: int = 10_000) -> dict[int, list[int]]:
    """Drain everything sendable; bodies by subscriber id."""
    got: dict[int, list[int]] = {}
    for sub, items, _ in dispatcher.drain(budget):
        got.setdefault(sub.sid, []).extend(int(b) for _, b in items)
    return got


def check_books(sub: Subscription) -> None:
    # seq is counted on its own as messages are offered: every one of them
    # must be delivered, dropped or still buffered, exactly once.
    assert sub.seq == sub.delivered + sub.dropped + sub.buffered
    assert sub.buffered <= sub.capacity


def test_broadcast_to_two_consumers_in_order() -> None:
    d = Dispatcher(FakeClock())
    a = d.subscribe("t", capacity=10, policy=Policy.DROP_OLDEST, credit=100)
    b = d.subscribe("t", capacity=10, policy=Policy.DROP_OLDEST, credit=100)
    for i in range(5):
        assert d.publish("t", body(i)).subscribers == 2
    got = received(d)
    assert got[a.sid] == got[b.sid] == [0, 1, 2, 3, 4]
    for sub in (a, b):
        check_books(sub)


def test_capacity_3_drop_oldest_keeps_the_3_newest_and_counts_2() -> None:
    d = Dispatcher(FakeClock())
    s = d.subscribe("t", capacity=3, policy=Policy.DROP_OLDEST, credit=0)
    for i in range(5):
        d.publish("t", body(i))
    assert [int(b) for _, b in s.buffer] == [2, 3, 4]
    assert s.dropped_oldest == 2 and s.dropped == 2
    d.grant(s.sid, 10)
    [(_, items, dropped)] = d.drain(100)
    assert [int(b) for _, b in items] == [2, 3, 4] and dropped == 2
    assert [seq for seq, _ in items] == [3, 4, 5]  # seq shows where the gap was
    check_books(s)


def test_drop_newest_keeps_the_oldest() -> None:
    d = Dispatcher(FakeClock())
    s = d.subscribe("t", capacity=2, policy=Policy.DROP_NEWEST)
    outcomes = [s.offer(body(i)) for i in range(4)]
    assert outcomes == [Offer.BUFFERED, Offer.BUFFERED, Offer.DROPPED, Offer.DROPPED]
    assert [int(b) for _, b in s.buffer] == [0, 1] and s.dropped_newest == 2
    check_books(s)


def test_slow_capacity_2_consumer_beside_a_fast_one() -> None:
    d = Dispatcher(FakeClock())
    fast = d.subscribe("t", capacity=100, policy=Policy.DROP_OLDEST, credit=1000)
    slow = d.subscribe("t", capacity=2, policy=Policy.DROP_OLDEST, credit=0)
    got: list[int] = []
    for i in range(50):
        d.publish("t", body(i))
        got += received(d).get(fast.sid, [])  # the fast one keeps up
    assert got == list(range(50))
    d.grant(slow.sid, 10)
    assert received(d)[slow.sid] == [48, 49]
    assert slow.dropped == 48
    check_books(fast)
    check_books(slow)


def test_block_refuses_when_full_and_takes_once_room_is_made() -> None:
    d = Dispatcher(FakeClock())
    s = d.subscribe("t", capacity=2, policy=Policy.BLOCK, credit=0)
    d.publish("t", body(0))
    d.publish("t", body(1))
    outcome = d.publish("t", body(2))
    assert outcome.blocked == [s] and s.dropped == 0 and s.offered == 2
    assert d.offer_again(outcome.blocked, body(2)) == [s]  # still full
    d.grant(s.sid, 1)
    assert received(d)[s.sid] == [0]  # a blocked consumer wakes on dispatch
    assert d.offer_again([s], body(2)) == []
    d.grant(s.sid, 5)
    assert received(d)[s.sid] == [1, 2]  # every message, in order
    check_books(s)


def test_credit_caps_what_is_sent() -> None:
    d = Dispatcher(FakeClock())
    s = d.subscribe("t", capacity=100, policy=Policy.DROP_OLDEST, credit=3)
    for i in range(10):
        d.publish("t", body(i))
    assert received(d)[s.sid] == [0, 1, 2]
    assert not d.has_ready and s.buffered == 7
    d.grant(s.sid, 4)
    assert received(d)[s.sid] == [3, 4, 5, 6]


def test_weights_share_a_scarce_budget() -> None:
    d = Dispatcher(FakeClock(), quantum=4)
    light = d.subscribe("t", capacity=10_000, policy=Policy.DROP_OLDEST, credit=10**6)
    heavy = d.subscribe("t", capacity=10_000, policy=Policy.DROP_OLDEST, weight=2, credit=10**6)
    for i in range(3000):
        d.publish("t", body(i))
    counts = {light.sid: 0, heavy.sid: 0}
    for _ in range(100):  # the process can send 30 per turn: contention
        for sub, items, _ in d.drain(30):
            counts[sub.sid] += len(items)
    assert counts[heavy.sid] == pytest.approx(2 * counts[light.sid], rel=0.1)
    assert sum(counts.values()) == 3000


def test_relay_loss_counts_drops_and_condemns_block_subscribers() -> None:
    d = Dispatcher(FakeClock())
    dropper = d.subscribe("t", capacity=5, policy=Policy.DROP_OLDEST, credit=10)
    blocker = d.subscribe("t", capacity=5, policy=Policy.BLOCK, credit=10)
    assert d.lose("t", 3) == [blocker]
    d.publish("t", body(9))
    [(_, items, dropped)] = [x for x in d.drain(10) if x[0] is dropper]
    assert dropped == 3 and items == [(4, b"9")]
    check_books(dropper)


def test_unsubscribe_releases_the_buffer_and_the_count() -> None:
    d = Dispatcher(FakeClock())
    s = d.subscribe("t", capacity=5, policy=Policy.DROP_OLDEST)
    d.publish("t", body(1))
    assert d.subscribers("t") == 1
    d.unsubscribe(s.sid)
    assert d.subscribers("t") == 0 and s.buffered == 0 and "t" not in d.topics
    assert d.publish("t", body(2)).subscribers == 0


def test_rate_meter_counts_the_last_window() -> None:
    clock = FakeClock(100.0)
    meter = RateMeter(clock, window=5)
    for _ in range(5):
        meter.add(10)
        clock.advance(1)
    assert meter.per_second() == 10
    clock.advance(10)
    assert meter.per_second() == 0


def test_a_loss_nothing_follows_is_reported_to_a_waiting_subscriber_only() -> None:
    d = Dispatcher(FakeClock())
    waiting = d.subscribe("t", capacity=5, policy=Policy.DROP_OLDEST, credit=10)
    stalled = d.subscribe("t", capacity=5, policy=Policy.DROP_OLDEST, credit=0)
    d.lose("t", 4)
    served = {sub.sid: (items, dropped) for sub, items, dropped in d.drain(100)}
    assert served == {waiting.sid: ([], 4)}  # an empty frame that says so
    d.grant(stalled.sid, 1)
    d.publish("t", body(1))
    served = {sub.sid: (items, dropped) for sub, items, dropped in d.drain(100)}
    assert served[stalled.sid] == ([(5, b"1")], 4)  # told with its next message


def test_idle_topics_without_subscribers_are_forgotten() -> None:
    clock = FakeClock()
    d = Dispatcher(clock)
    d.subscribe("kept", capacity=10, policy=Policy.DROP_OLDEST)
    for topic in ("kept", "idle", "busy"):
        d.publish(topic, body(1))
    clock.advance(200)
    d.publish("busy", body(2))
    clock.advance(100)
    assert d.forget_idle(300) == ["idle"]  # "kept" has a subscriber; "busy" published lately
    assert set(d.published) == {"kept", "busy"} and set(d.publish_rate) == {"kept", "busy"}
    assert d.publish("idle", body(3)).seq == 1  # a forgotten topic's counter starts again


def test_beyond_keep_the_least_recently_published_unsubscribed_topics_are_forgotten() -> None:
    clock = FakeClock()
    d = Dispatcher(clock)
    d.subscribe("kept", capacity=10, policy=Policy.DROP_OLDEST)
    for topic in ("kept", "oldest", "older", "newer", "newest"):
        d.publish(topic, body(1))
        clock.advance(1)
    # None is idle yet; five are counted and three may stay: the two least
    # recently published without a subscriber go, never the subscribed one.
    assert d.forget_idle(300, keep=3) == ["oldest", "older"]
    assert set(d.publish_rate) == {"kept", "newer", "newest"}
    assert d.forget_idle(300, keep=3) == []  # at the limit: nothing more
    # A subscribed topic is kept even past the limit; the others give way.
    assert d.forget_idle(300, keep=0) == ["newer", "newest"]
    assert set(d.published) == {"kept"}


# -- transport backpressure (design decision 14)


def test_a_paused_subscriber_is_not_drained_and_its_policy_applies() -> None:
    d = Dispatcher(FakeClock())
    stalled = d.subscribe("t", capacity=3, policy=Policy.DROP_OLDEST, credit=100)
    other = d.subscribe("t", capacity=100, policy=Policy.DROP_OLDEST, credit=100)
    d.pause(stalled.sid)
    for i in range(5):
        d.publish("t", body(i))
    assert received(d) == {other.sid: [0, 1, 2, 3, 4]}
    assert not d.has_ready
    # Credit does not make it ready either: its transport has no room.
    d.grant(stalled.sid, 10)
    assert not d.has_ready
    assert stalled.buffered == 3 and stalled.dropped_oldest == 2 and stalled.delivered == 0
    check_books(stalled)
    d.resume(stalled.sid)
    assert d.has_ready
    served = {sub.sid: (items, dropped) for sub, items, dropped in d.drain(100)}
    assert served == {stalled.sid: ([(3, b"2"), (4, b"3"), (5, b"4")], 2)}
    check_books(stalled)


def test_a_paused_block_subscriber_stays_full() -> None:
    d = Dispatcher(FakeClock())
    sub = d.subscribe("t", capacity=2, policy=Policy.BLOCK, credit=100)
    d.pause(sub.sid)
    d.publish("t", body(1))
    d.publish("t", body(2))
    outcome = d.publish("t", body(3))
    assert outcome.blocked == [sub]
    assert d.drain(100) == []
    assert d.offer_again(outcome.blocked, body(3)) == [sub]  # still full: no room was made
    d.resume(sub.sid)
    assert received(d) == {sub.sid: [1, 2]}
    assert d.offer_again([sub], body(3)) == []
    assert received(d) == {sub.sid: [3]}


def test_pausing_the_subscriber_a_drain_cut_short_drops_its_turn() -> None:
    d = Dispatcher(FakeClock(), quantum=4)
    a = d.subscribe("t", capacity=100, policy=Policy.DROP_OLDEST, credit=100)
    b = d.subscribe("t", capacity=100, policy=Policy.DROP_OLDEST, credit=100)
    for i in range(10):
        d.publish("t", body(i))
    assert received(d, budget=2) == {a.sid: [0, 1]}  # a's turn was cut short
    d.pause(a.sid)
    assert a.deficit == 0
    assert received(d) == {b.sid: list(range(10))}
    d.resume(a.sid)
    assert received(d) == {a.sid: list(range(2, 10))}


def test_a_paused_subscriber_with_unreported_drops_is_told_once_resumed() -> None:
    d = Dispatcher(FakeClock())
    sub = d.subscribe("t", capacity=5, policy=Policy.DROP_OLDEST, credit=10)
    d.pause(sub.sid)
    d.lose("t", 3)
    assert d.drain(100) == []
    d.resume(sub.sid)
    served = {s.sid: (items, dropped) for s, items, dropped in d.drain(100)}
    assert served == {sub.sid: ([], 3)}


def test_pause_and_resume_of_unknown_or_repeated_sids_change_nothing() -> None:
    d = Dispatcher(FakeClock())
    sub = d.subscribe("t", capacity=5, policy=Policy.DROP_OLDEST, credit=10)
    d.pause(999)
    d.resume(999)
    d.resume(sub.sid)  # not paused: nothing to do
    d.pause(sub.sid)
    d.pause(sub.sid)
    d.publish("t", body(1))
    assert not d.has_ready
    d.unsubscribe(sub.sid)
    d.resume(sub.sid)  # gone: never ready again
    assert not d.has_ready
