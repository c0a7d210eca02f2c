"""The store's protocol 1.1 leasing rules on real SQLite and PostgreSQL, with a fake clock.

Ordering groups (one message of a group in flight, in enqueue order, through
every way a message leaves or comes back), priority, ``ttl``, bounded queues
under each overflow policy, and browsing. Fixtures: ``tests/unit/conftest.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.errors import NotFound, QueueFull, StaleReceipt
from gateway.core.protocol import EnqueueSpec
from gateway.store import (
    Ack,
    AckResult,
    Browse,
    BrowsePage,
    Configure,
    DeleteMessage,
    Delivered,
    Enqueue,
    Extend,
    Nack,
    Purge,
    Redrive,
    Reject,
    Release,
    RequeueMessage,
    Stats,
    Store,
)
from tests.support.fakes import FakeClock
from tests.support.store import lease, msg, one


def put(store: Store, queue: str, *specs: EnqueueSpec) -> list[str]:
    results = one(store, Enqueue(queue, list(specs)))
    assert isinstance(results, list), results
    return [r.id for r in results]


def take(store: Store, queue: str, n: int = 10, timeout: float | None = None) -> list[Delivered]:
    return lease(store, queue, n, timeout).delivered


def names(delivered: list[Delivered]) -> list[str]:
    import orjson

    return [orjson.loads(d.body) for d in delivered]


def browse_all(store: Store, queue: str, state: str) -> list[Any]:
    page = one(store, Browse(queue, state, 1000))  # type: ignore[arg-type]
    assert isinstance(page, BrowsePage), page
    return page.messages


def g(body: str, group: str = "g", **kwargs: Any) -> EnqueueSpec:
    return msg(body, group=group, **kwargs)


def configure(store: Store, queue: str, max_length: int, overflow: str) -> None:
    one(store, Configure(queue, {"max_length": max_length, "overflow": overflow}))


# -- groups --------------------------------------------------------------------


def test_group_goes_one_at_a_time_in_enqueue_order_through_acks(store: Store, queue: str) -> None:
    put(store, queue, g("a"), g("b"), msg("x"), g("c"), g("o", group="other"))
    first = take(store, queue)
    assert names(first) == ["a", "x", "o"]
    assert [d.group for d in first] == ["g", None, "other"]
    assert take(store, queue) == []  # b waits for a
    stats = one(store, Stats(queue))
    assert (stats.in_flight, stats.visible) == (3, 2)  # waiting messages count as visible
    one(store, Ack(first[0].receipt))
    (b,) = take(store, queue)
    assert names([b]) == ["b"]
    one(store, Ack(b.receipt))
    assert names(take(store, queue)) == ["c"]


def test_group_nack_with_delay_keeps_the_head(store: Store, queue: str, clock: FakeClock) -> None:
    put(store, queue, g("a"), g("b"))
    (a,) = take(store, queue)
    assert one(store, Nack(queue, a.receipt, delay=10)) is None
    assert take(store, queue) == []  # a is delayed, b still waits for it
    assert [m.state for m in browse_all(store, queue, "delayed")] == ["delayed"]
    clock.advance(10)
    (again,) = take(store, queue)
    assert (names([again]), again.deliveries) == (["a"], 2)
    one(store, Nack(queue, again.receipt))  # no delay: visible at once, still first
    (third,) = take(store, queue)
    assert (names([third]), third.deliveries) == (["a"], 3)
    one(store, Ack(third.receipt))
    assert names(take(store, queue)) == ["b"]


def test_group_reject_lets_the_next_go(store: Store, queue: str) -> None:
    put(store, queue, g("a"), g("b"))
    (a,) = take(store, queue)
    assert one(store, Reject(a.receipt)) is None
    assert names(take(store, queue)) == ["b"]
    (dead,) = browse_all(store, queue, "dead")
    assert (dead.id, dead.dead_reason, dead.group) == (a.id, "rejected", "g")


def test_group_max_deliveries_dead_letters_the_head_and_the_next_goes(
    store: Store, queue: str
) -> None:
    put(store, queue, g("poison"), g("next"))
    for _ in range(3):  # max_deliveries is 3
        (d,) = take(store, queue)
        one(store, Nack(queue, d.receipt))
    result = lease(store, queue)
    assert result.dead_lettered == 1
    # The next message of the group becomes the head when the round's batch
    # settles its group: it is leased by the following round.
    got = result.delivered or take(store, queue)
    assert (names(got), got[0].deliveries) == (["next"], 1)
    (dead,) = browse_all(store, queue, "dead")
    assert (dead.dead_reason, dead.deliveries) == ("max_deliveries", 3)


def test_group_head_expiry_lets_the_next_go_and_ends_its_lease(
    store: Store, queue: str, clock: FakeClock
) -> None:
    put(store, queue, g("a", ttl=10), g("b"))
    (a,) = take(store, queue)
    assert a.expires_at == clock.now + 10  # the ttl comes before the 30 s timeout
    clock.advance(10)
    got = take(store, queue) or take(store, queue)
    assert names(got) == ["b"]
    for op in (Ack(a.receipt), Nack(queue, a.receipt), Reject(a.receipt), Extend(a.receipt, 5)):
        assert isinstance(one(store, op), StaleReceipt), op
    assert one(store, Release(queue, [a.receipt])) == 0
    (dead,) = browse_all(store, queue, "dead")
    assert (dead.id, dead.dead_reason) == (a.id, "expired")


def test_group_head_released_by_a_closed_socket_stays_first(store: Store, queue: str) -> None:
    put(store, queue, g("a"), g("b"))
    (a,) = take(store, queue)
    assert one(store, Release(queue, [a.receipt])) == 1
    (again,) = take(store, queue)
    assert (again.id, again.deliveries) == (a.id, 2)
    assert take(store, queue) == []


def test_group_head_whose_lease_timed_out_is_redelivered_first(
    store: Store, queue: str, clock: FakeClock
) -> None:
    put(store, queue, g("a"), g("b"))
    (a,) = take(store, queue, timeout=5)
    clock.advance(5)
    (again,) = take(store, queue)
    assert (again.id, again.deliveries) == (a.id, 2)
    assert isinstance(one(store, Ack(a.receipt)), StaleReceipt)


def test_requeue_of_the_head_in_flight_makes_its_receipt_stale(store: Store, queue: str) -> None:
    put(store, queue, g("a"), g("b"))
    (a,) = take(store, queue)
    assert one(store, RequeueMessage(queue, int(a.id))) == 1
    assert isinstance(one(store, Ack(a.receipt)), StaleReceipt)
    (again,) = take(store, queue)
    assert (again.id, again.deliveries) == (a.id, 1)  # delivery count reset
    assert take(store, queue) == []


def test_requeued_earlier_message_goes_before_a_head_not_yet_leased(
    store: Store, queue: str
) -> None:
    put(store, queue, g("a"), g("b"), g("c"))
    (a,) = take(store, queue)
    one(store, Reject(a.receipt))  # b is the head now, not leased yet
    assert one(store, RequeueMessage(queue, int(a.id))) == 1
    assert not browse_all(store, queue, "dead")
    order = []
    for _ in range(3):
        (d,) = take(store, queue)
        assert take(store, queue) == []
        order += names([d])
        one(store, Ack(d.receipt))
    assert order == ["a", "b", "c"]


def test_requeued_earlier_message_goes_next_after_a_head_in_flight(
    store: Store, queue: str
) -> None:
    put(store, queue, g("a"), g("b"), g("c"))
    (a,) = take(store, queue)
    one(store, Reject(a.receipt))
    (b,) = take(store, queue)  # the head is in flight when a comes back
    assert one(store, RequeueMessage(queue, int(a.id))) == 1
    assert take(store, queue) == []  # still one at a time
    one(store, Ack(b.receipt))
    order = []
    for _ in range(2):
        (d,) = take(store, queue)
        order += names([d])
        one(store, Ack(d.receipt))
    assert order == ["a", "c"]


def test_redrive_puts_the_dead_of_a_group_back_in_enqueue_order(store: Store, queue: str) -> None:
    put(store, queue, g("a"), g("b"), g("c"), msg("x"))
    for _ in range(2):
        (d, *rest) = take(store, queue)
        one(store, Reject(d.receipt))
        one(store, Release(queue, [r.receipt for r in rest]))
    # a and b are dead, c is the head (not leased), x is ungrouped
    assert one(store, Redrive(queue)) == 2
    order = []
    while got := [d for d in take(store, queue) if d.group == "g"]:
        assert len(got) == 1
        order += names(got)
        one(store, Ack(got[0].receipt))
    assert order == ["a", "b", "c"]


def test_redriven_message_starts_its_delivery_count_again(store: Store, queue: str) -> None:
    put(store, queue, g("a"))
    for _ in range(3):
        (d,) = take(store, queue)
        one(store, Nack(queue, d.receipt))
    assert lease(store, queue).dead_lettered == 1
    assert one(store, Redrive(queue)) == 1
    (d,) = take(store, queue)
    assert d.deliveries == 1


def test_purge_keeps_the_head_in_flight_and_the_group_goes_on(store: Store, queue: str) -> None:
    put(store, queue, g("a"), g("b"), g("c"))
    (a,) = take(store, queue)
    assert one(store, Purge(queue)) == 2
    assert take(store, queue) == []
    put(store, queue, g("d"))
    assert take(store, queue) == []  # a is still the head
    one(store, Ack(a.receipt))
    assert names(take(store, queue)) == ["d"]


def test_delete_of_the_head_lets_the_next_go(store: Store, queue: str) -> None:
    ids = put(store, queue, g("a"), g("b"), g("c"), g("d"))
    assert one(store, DeleteMessage(queue, int(ids[0]))) == 1  # the head, not leased
    (b,) = take(store, queue)
    assert names([b]) == ["b"]
    assert one(store, DeleteMessage(queue, int(ids[2]))) == 1  # waiting: just gone
    assert one(store, DeleteMessage(queue, int(b.id))) == 1  # the head in flight
    assert isinstance(one(store, Ack(b.receipt)), StaleReceipt)
    assert names(take(store, queue)) == ["d"]
    assert isinstance(one(store, DeleteMessage(queue, int(b.id))), NotFound)
    assert isinstance(one(store, DeleteMessage(queue + "-other", int(ids[3]))), NotFound)


def test_ack_follow_up_into_the_same_group_waits_its_turn(store: Store, queue: str) -> None:
    put(store, queue, g("a"), g("b"))
    (a,) = take(store, queue)
    result = one(store, Ack(a.receipt, [(queue, g("after"))]))
    assert isinstance(result, AckResult)
    order = []
    for _ in range(2):
        (d,) = take(store, queue)
        order += names([d])
        one(store, Ack(d.receipt))
    assert order == ["b", "after"]


def test_delayed_message_of_a_group_keeps_its_delay_when_promoted(
    store: Store, queue: str, clock: FakeClock
) -> None:
    put(store, queue, g("a"), g("b", delay=20))
    (a,) = take(store, queue)
    one(store, Ack(a.receipt))
    got = lease(store, queue)
    assert got.delivered == [] and got.next_due == clock.now + 20
    clock.advance(20)
    assert names(take(store, queue)) == ["b"]


# -- priority ------------------------------------------------------------------


def test_priority_orders_visible_messages_and_keeps_enqueue_order_within_one(
    store: Store, queue: str
) -> None:
    put(
        store,
        queue,
        msg("a"),
        msg("b", priority=5),
        msg("c"),
        msg("d", priority=5),
        msg("e", priority=-1),
    )
    got = take(store, queue, 2)
    assert names(got) == ["b", "d"]
    assert [d.priority for d in got] == [5, 5]
    assert names(take(store, queue)) == ["a", "c", "e"]


def test_redelivered_message_keeps_its_place_among_its_priority(store: Store, queue: str) -> None:
    put(store, queue, msg("a", priority=1), msg("b", priority=1))
    (a, _) = take(store, queue)
    one(store, Nack(queue, a.receipt))
    put(store, queue, msg("c", priority=1), msg("hi", priority=2))
    assert names(take(store, queue)) == ["hi", "a", "c"]


def test_within_a_group_enqueue_order_wins_over_priority(store: Store, queue: str) -> None:
    put(store, queue, g("low", priority=0), g("high", priority=9), msg("mid", priority=5))
    got = take(store, queue)
    assert names(got) == ["mid", "low"]  # "high" waits for "low"
    one(store, Ack(got[1].receipt))
    assert names(take(store, queue)) == ["high"]


# -- ttl -----------------------------------------------------------------------


def test_ttl_dead_letters_a_message_never_leased(
    store: Store, queue: str, clock: FakeClock
) -> None:
    put(store, queue, msg("short", ttl=10), msg("long", ttl=100), msg("forever"))
    clock.advance(9.5)
    assert one(store, Stats(queue)).visible == 3
    clock.advance(0.5)
    stats = one(store, Stats(queue))
    assert (stats.visible, stats.dead) == (2, 1)
    (dead,) = browse_all(store, queue, "dead")
    assert (names_of(dead), dead.dead_reason, dead.expires_in) == ("short", "expired", None)
    (long, forever) = browse_all(store, queue, "visible")
    assert (long.expires_in, forever.expires_in) == (90.0, None)
    assert names(take(store, queue)) == ["long", "forever"]


def names_of(browsed: Any) -> Any:
    import orjson

    return orjson.loads(browsed.body_json)


def test_ttl_ends_the_lease_and_every_receipt_of_it(
    store: Store, queue: str, clock: FakeClock
) -> None:
    put(store, queue, msg("a", ttl=10))
    (a,) = take(store, queue)
    assert a.expires_at == clock.now + 10
    assert one(store, Extend(a.receipt, 60)) == clock.now + 10  # never past the ttl
    clock.advance(10)
    for op in (Ack(a.receipt), Nack(queue, a.receipt), Reject(a.receipt), Extend(a.receipt, 5)):
        assert isinstance(one(store, op), StaleReceipt), op
    assert take(store, queue) == []
    (dead,) = browse_all(store, queue, "dead")
    assert (dead.dead_reason, dead.deliveries) == ("expired", 1)


def test_expired_lease_is_not_released_by_a_closing_socket(
    store: Store, queue: str, clock: FakeClock
) -> None:
    put(store, queue, msg("a", ttl=10))
    (a,) = take(store, queue)
    clock.advance(10)
    # Expiry ended the lease: the socket holds nothing to hand back.
    assert one(store, Release(queue, [a.receipt])) == 0
    assert one(store, Stats(queue)).dead == 1


def test_next_due_includes_the_next_expiry(store: Store, queue: str, clock: FakeClock) -> None:
    put(store, queue, msg("a", ttl=50), msg("b", delay=80))
    (a,) = take(store, queue)
    assert lease(store, queue).next_due == clock.now + 30  # a's lease ends first
    one(store, Extend(a.receipt, 100))  # capped at the ttl
    assert lease(store, queue).next_due == clock.now + 50


def test_next_due_counts_the_leases_the_round_made(
    store: Store, queue: str, clock: FakeClock
) -> None:
    # On PostgreSQL the lease statement reads the next due time itself, which
    # leaves out the rows it leases: their new ends must still count.
    put(store, queue, msg("a"), msg("b", delay=40))
    got = lease(store, queue, timeout=5)
    assert names(got.delivered) == ["a"] and got.next_due == clock.now + 5  # a's lease ends
    put(store, queue, msg("c"), msg("d", delay=3))
    got = lease(store, queue, timeout=5)
    assert names(got.delivered) == ["c"] and got.next_due == clock.now + 3  # d comes due


def test_a_round_that_dead_letters_its_last_ttl_message_has_nothing_due(
    store: Store, queue: str, clock: FakeClock
) -> None:
    # Found by test_properties_queue: the lease statement's reading of the
    # earliest ttl came before max_deliveries dead-lettered the message.
    put(store, queue, msg("a", ttl=50))
    for _ in range(3):  # the store's max_deliveries
        (a,) = take(store, queue)
        one(store, Nack(queue, a.receipt))
    got = lease(store, queue)
    assert (got.delivered, got.dead_lettered, got.next_due) == ([], 1, None)


def test_a_message_past_its_ttl_is_never_leased_before_a_sweep_finds_it(
    database: tuple[str, Any], store: Store, queue: str, clock: FakeClock
) -> None:
    from gateway.core.leases import QueueSettings
    from gateway.store.leasing import SWEEP_EVERY

    _, connect = database
    assert take(store, queue) == []  # this round sweeps; the next is a second off
    # Another process enqueues: this store's rounds cannot know of its ttl.
    settings = QueueSettings(visibility_timeout=30, max_deliveries=3, dedup_window=60)
    other = Store(connect, store.dialect, clock=clock, defaults=settings, settings_ttl=0)
    try:
        put(other, queue, msg("short", ttl=SWEEP_EVERY / 4), msg("long"))
    finally:
        other.close()
    clock.advance(SWEEP_EVERY / 2)
    got = lease(store, queue)
    assert names(got.delivered) == ["long"]
    assert not any(name == "dead_lettered" for _, name, _ in store.counted)  # not swept yet
    assert got.next_due is not None and got.next_due <= clock.now  # but its ttl was learnt
    assert take(store, queue) == []
    assert store.counted.get((queue, "dead_lettered", "expired")) == 1
    (dead,) = browse_all(store, queue, "dead")
    assert (names_of(dead), dead.dead_reason, dead.deliveries) == ("short", "expired", 0)


def test_redrive_takes_messages_expired_since_anyone_looked(
    store: Store, queue: str, clock: FakeClock
) -> None:
    put(store, queue, msg("a", ttl=10), msg("b", ttl=10))
    (a, _) = take(store, queue)
    clock.advance(10)
    # Nothing has swept the queue since both expired; they are dead all the same.
    assert one(store, Redrive(queue)) == 2
    assert one(store, Stats(queue)).visible == 2  # a fresh start: no ttl any more
    clock.advance(1000)
    assert sorted(names(take(store, queue))) == ["a", "b"]
    assert isinstance(one(store, Ack(a.receipt)), StaleReceipt)


def test_requeue_of_a_message_expired_since_anyone_looked_is_a_fresh_start(
    store: Store, queue: str, clock: FakeClock
) -> None:
    ids = put(store, queue, msg("leased", ttl=10), msg("waiting", ttl=10))
    take(store, queue, 1)
    clock.advance(10)
    assert one(store, RequeueMessage(queue, int(ids[0]))) == 1
    assert one(store, RequeueMessage(queue, int(ids[1]))) == 1  # it is dead (expired)
    clock.advance(1000)
    got = take(store, queue)
    assert (names(got), [d.deliveries for d in got]) == (["leased", "waiting"], [1, 1])


# -- bounded queues ------------------------------------------------------------


def test_drop_newest_refuses_what_does_not_fit_and_applies_nothing(
    store: Store, queue: str
) -> None:
    configure(store, queue, 3, "drop_newest")
    put(store, queue, msg("a"), msg("b", key="kb"))
    refused = one(store, Enqueue(queue, [msg("c", key="kc"), msg("d")]))  # 4 > 3: whole batch
    assert isinstance(refused, QueueFull) and not refused.may_wait
    assert one(store, Stats(queue)).visible == 2
    (c,) = put(store, queue, msg("c", key="kc"))  # the key was not claimed by the refusal
    assert isinstance(one(store, Enqueue(queue, [msg("e")])), QueueFull)
    # A duplicate never counts against max_length.
    (dup,) = one(store, Enqueue(queue, [msg("again", key="kc")]))
    assert dup.duplicate and dup.id == c
    # In flight is not counted: a lease makes room.
    take(store, queue, 1)
    put(store, queue, msg("e"))
    assert isinstance(one(store, Enqueue(queue, [msg("f")])), QueueFull)
    stats = one(store, Stats(queue))
    assert (stats.visible, stats.in_flight, stats.dead) == (3, 1, 0)


def test_block_refuses_like_drop_newest_but_may_wait(store: Store, queue: str) -> None:
    configure(store, queue, 1, "block")
    put(store, queue, msg("a"))
    refused = one(store, Enqueue(queue, [msg("b")]))
    assert isinstance(refused, QueueFull) and refused.may_wait and refused.queue == queue
    assert one(store, Stats(queue)).visible == 1


def test_drop_oldest_dead_letters_the_earliest_enqueued_whatever_the_priority(
    store: Store, queue: str
) -> None:
    configure(store, queue, 2, "drop_oldest")
    put(store, queue, msg("a"), msg("b", priority=9))
    (in_flight,) = take(store, queue, 1)  # b: not counted, so not dropped
    put(store, queue, msg("c", priority=-5))
    put(store, queue, msg("d"), msg("e"))
    dead = browse_all(store, queue, "dead")
    assert [(names_of(m), m.dead_reason) for m in dead] == [("a", "overflow"), ("c", "overflow")]
    assert names(take(store, queue)) == ["d", "e"]
    assert isinstance(one(store, Ack(in_flight.receipt)), AckResult)


def test_counted_messages_include_waiting_delayed_and_timed_out_leases(
    store: Store, queue: str, clock: FakeClock
) -> None:
    configure(store, queue, 3, "drop_newest")
    put(store, queue, g("head"), g("waiting"), msg("later", delay=100))
    assert isinstance(one(store, Enqueue(queue, [msg("x")])), QueueFull)
    take(store, queue, 1, timeout=5)  # the head goes in flight: room for one
    put(store, queue, msg("x"))
    assert names(take(store, queue, 1, timeout=100)) == ["x"]  # room for one more
    clock.advance(5)  # the head's lease timed out: visible, so counted again
    assert isinstance(one(store, Enqueue(queue, [msg("y")])), QueueFull)


def test_expired_messages_do_not_count(store: Store, queue: str, clock: FakeClock) -> None:
    configure(store, queue, 1, "drop_newest")
    put(store, queue, msg("a", ttl=5))
    assert isinstance(one(store, Enqueue(queue, [msg("b")])), QueueFull)
    clock.advance(5)
    put(store, queue, msg("b"))
    (dead,) = browse_all(store, queue, "dead")
    assert dead.dead_reason == "expired"


def test_drop_oldest_drops_a_group_head_and_the_next_goes(store: Store, queue: str) -> None:
    configure(store, queue, 2, "drop_oldest")
    put(store, queue, g("a"), g("b"))
    put(store, queue, g("c"))
    assert [names_of(m) for m in browse_all(store, queue, "dead")] == ["a"]
    assert names(take(store, queue)) == ["b"]


def test_a_follow_up_refused_by_a_full_queue_takes_the_ack_back(store: Store, queue: str) -> None:
    full = queue + "-full"
    configure(store, full, 1, "drop_newest")
    put(store, full, msg("x"))
    put(store, queue, g("a"), g("b"))
    (a,) = take(store, queue)
    refused = one(store, Ack(a.receipt, [(queue, msg("f1")), (full, msg("f2"))]))
    assert isinstance(refused, QueueFull)
    assert one(store, Stats(queue)).in_flight == 1
    assert take(store, queue) == []  # a is still the head in flight
    assert isinstance(one(store, Ack(a.receipt)), AckResult)
    assert names(take(store, queue)) == ["b"]


def test_a_refused_enqueue_leaves_its_batch_neighbours_alone(store: Store, queue: str) -> None:
    configure(store, queue, 1, "drop_newest")
    other = queue + "-free"
    results = store.run(
        [
            Enqueue(queue, [msg("fits")]),
            Enqueue(queue, [msg("refused")]),
            Enqueue(other, [msg("elsewhere")]),
        ]
    )
    assert isinstance(results[0], list) and isinstance(results[2], list)
    assert isinstance(results[1], QueueFull)
    assert names(take(store, queue)) == ["fits"]
    assert names(take(store, other)) == ["elsewhere"]


# -- browsing ------------------------------------------------------------------


def walk(store: Store, queue: str, state: str, limit: int) -> list[Any]:
    """Every page of ``state`` in turn, following ``next``."""
    seen: list[Any] = []
    after: int | None = None
    while True:
        page = one(store, Browse(queue, state, limit, after))  # type: ignore[arg-type]
        assert isinstance(page, BrowsePage), page
        assert len(page.messages) <= limit
        seen += page.messages
        if page.next is None:
            return seen
        assert page.next == page.messages[-1].id and len(page.messages) == limit
        after = int(page.next)


@pytest.mark.parametrize("limit", [1, 2, 3, 1000])
def test_browse_pages_every_state_in_order(
    store: Store, queue: str, clock: FakeClock, limit: int
) -> None:
    put(store, queue, msg("f1", priority=9), msg("f2", priority=9), msg("d", priority=9))
    f1, f2, d = take(store, queue, timeout=20)
    one(store, Reject(d.receipt))
    put(
        store,
        queue,
        msg("v0"),
        msg("v5", priority=5),
        g("v1-head", priority=1),
        g("v1-wait", priority=1),
        msg("late", delay=40),
        msg("v5b", priority=5),
    )
    (v5,) = take(store, queue, 1)
    one(store, Release(queue, [v5.receipt]))
    clock.advance(1.5)
    visible = walk(store, queue, "visible", limit)
    assert [names_of(m) for m in visible] == ["v5", "v5b", "v1-head", "v1-wait", "v0"]
    assert [m.state for m in visible] == ["visible"] * 5
    assert all(m.visible_in is None and m.dead_reason is None for m in visible)
    assert [m.deliveries for m in visible] == [1, 0, 0, 0, 0]
    assert [(m.group, m.priority) for m in visible] == [
        (None, 5),
        (None, 5),
        ("g", 1),
        ("g", 1),
        (None, 0),
    ]
    delayed = walk(store, queue, "delayed", limit)
    assert [(names_of(m), m.state, m.visible_in) for m in delayed] == [("late", "delayed", 38.5)]
    in_flight = walk(store, queue, "in_flight", limit)
    assert [(m.id, m.state, m.visible_in) for m in in_flight] == [
        (f1.id, "in_flight", 18.5),
        (f2.id, "in_flight", 18.5),
    ]
    dead = walk(store, queue, "dead", limit)
    assert [(m.id, m.dead_reason, m.visible_in, m.deliveries) for m in dead] == [
        (d.id, "rejected", None, 1)
    ]
    assert all(m.enqueued_at == 1_000_000.0 for m in visible + delayed + in_flight + dead)


def test_browse_changes_nothing_and_refuses_a_bad_limit(store: Store, queue: str) -> None:
    from gateway.core.errors import Invalid

    put(store, queue, msg("a"), msg("b"))
    walk(store, queue, "visible", 1)
    assert names(take(store, queue)) == ["a", "b"]
    assert isinstance(one(store, Browse(queue, "visible", 0)), Invalid)
    assert isinstance(one(store, Browse(queue, "visible", 1001)), Invalid)
    assert isinstance(one(store, Browse(queue + "-never", "visible", 10)), NotFound)


def test_browse_after_a_message_that_left_goes_on_after_it(store: Store, queue: str) -> None:
    put(store, queue, msg("a", priority=1), msg("b"), msg("c"))
    first = one(store, Browse(queue, "visible", 1))
    assert [names_of(m) for m in first.messages] == ["a"]
    (a,) = take(store, queue, 1)
    one(store, Ack(a.receipt))
    rest = one(store, Browse(queue, "visible", 10, int(first.next)))
    assert [names_of(m) for m in rest.messages] == ["b", "c"]
