"""The store's SQL on real SQLite and PostgreSQL, with a fake clock.

Each test uses its own queue names, so one migrated database per backend
serves the whole module.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.core.errors import NotFound, ProtocolError, StaleReceipt, Unavailable
from gateway.core.protocol import EnqueueSpec
from gateway.store import (
    Ack,
    AckResult,
    Enqueue,
    Extend,
    Nack,
    Purge,
    Redrive,
    Reject,
    Release,
    Stats,
    Store,
)
from tests.support.fakes import FakeClock
from tests.support.store import bodies, enqueue, lease, msg, one


def test_lease_in_enqueue_order_up_to_n(store: Store, queue: str) -> None:
    ids = enqueue(store, queue, "a", "b", "c")
    got = lease(store, queue, 2)
    assert [d.id for d in got.delivered] == ids[:2]
    assert bodies(got) == ['"a"', '"b"']
    assert all(d.deliveries == 1 for d in got.delivered)
    assert bodies(lease(store, queue, 5)) == ['"c"']
    assert lease(store, queue, 5).delivered == []


def test_ack_deletes_and_second_ack_is_stale(store: Store, queue: str) -> None:
    enqueue(store, queue, 1)
    (d,) = lease(store, queue).delivered
    assert isinstance(one(store, Ack(d.receipt)), AckResult)
    assert isinstance(one(store, Ack(d.receipt)), StaleReceipt)
    assert one(store, Stats(queue)).visible == 0


def test_expired_lease_is_visible_and_old_receipt_stale(
    store: Store, queue: str, clock: FakeClock
) -> None:
    enqueue(store, queue, 1)
    (first,) = lease(store, queue, timeout=5).delivered
    assert lease(store, queue).delivered == []
    clock.advance(5)
    (second,) = lease(store, queue).delivered
    assert second.deliveries == 2 and second.id == first.id
    for op in (Ack(first.receipt), Nack(queue, first.receipt), Reject(first.receipt)):
        assert isinstance(one(store, op), StaleReceipt)
    assert one(store, Stats(queue)).in_flight == 1  # the new lease is untouched
    assert isinstance(one(store, Ack(second.receipt)), AckResult)


def test_nack_with_delay_keeps_the_original_place(
    store: Store, queue: str, clock: FakeClock
) -> None:
    enqueue(store, queue, "old")
    (d,) = lease(store, queue).delivered
    assert one(store, Nack(queue, d.receipt, delay=10)) is None
    enqueue(store, queue, "new")
    assert one(store, Stats(queue)).delayed == 1
    assert bodies(lease(store, queue, 1)) == ['"new"']
    clock.advance(10)
    enqueue(store, queue, "newer")
    got = lease(store, queue, 5)
    assert bodies(got) == ['"old"', '"newer"']
    assert got.delivered[0].deliveries == 2


def test_reject_dead_letters_and_redrive_resets(store: Store, queue: str) -> None:
    enqueue(store, queue, 1)
    (d,) = lease(store, queue).delivered
    assert one(store, Reject(d.receipt)) is None
    stats = one(store, Stats(queue))
    assert (stats.dead, stats.visible) == (1, 0)
    assert one(store, Redrive(queue)) == 1
    (again,) = lease(store, queue).delivered
    assert again.deliveries == 1


def test_max_deliveries_dead_letters_instead_of_delivering(store: Store, queue: str) -> None:
    enqueue(store, queue, "poison", "fine")
    for attempt in range(1, 4):  # max_deliveries is 3
        got = lease(store, queue, 1)
        assert bodies(got) == ['"poison"'] and got.delivered[0].deliveries == attempt
        one(store, Nack(queue, got.delivered[0].receipt))
    got = lease(store, queue, 1)
    assert got.dead_lettered == 1
    assert bodies(got) == ['"fine"']  # the round refilled past the dead one
    stats = one(store, Stats(queue))
    assert stats.dead == 1
    assert stats.in_flight == 1


def test_dedup_within_window_even_after_ack(store: Store, queue: str, clock: FakeClock) -> None:
    (a,) = one(store, Enqueue(queue, [msg(1, key="k")]))
    (b,) = one(store, Enqueue(queue, [msg(2, key="k")]))
    assert not a.duplicate and b.duplicate and b.id == a.id
    (d,) = lease(store, queue).delivered
    one(store, Ack(d.receipt))
    (c,) = one(store, Enqueue(queue, [msg(3, key="k")]))
    assert c.duplicate and c.id == a.id
    clock.advance(61)  # past the 60 s window
    (e,) = one(store, Enqueue(queue, [msg(4, key="k")]))
    assert not e.duplicate and e.id != a.id


def test_same_key_twice_in_one_batch(store: Store, queue: str) -> None:
    results = one(store, Enqueue(queue, [msg(1, key="x"), msg(2), msg(3, key="x")]))
    assert [r.duplicate for r in results] == [False, False, True]
    assert results[2].id == results[0].id
    assert one(store, Stats(queue)).visible == 2


def test_keys_are_per_queue(store: Store, queue: str) -> None:
    (a,) = one(store, Enqueue(queue, [msg(1, key="k")]))
    (b,) = one(store, Enqueue(queue + "x", [msg(1, key="k")]))
    assert not b.duplicate and b.id != a.id


def test_ack_with_follow_ups_is_atomic(store: Store, queue: str) -> None:
    enqueue(store, queue, 1)
    (d,) = lease(store, queue).delivered
    other = queue + "-next"
    result = one(store, Ack(d.receipt, [(other, msg("f1")), (queue, msg("f2"))]))
    assert [r.duplicate for r in result.enqueued] == [False, False]
    assert one(store, Stats(other)).visible == 1
    # A stale ack enqueues nothing.
    stale = one(store, Ack(d.receipt, [(other, msg("f3"))]))
    assert isinstance(stale, StaleReceipt)
    assert one(store, Stats(other)).visible == 1


def test_release_makes_visible_at_once(store: Store, queue: str) -> None:
    enqueue(store, queue, 1, 2)
    got = lease(store, queue)
    assert one(store, Release(queue, [d.receipt for d in got.delivered] + ["junk"])) == 2
    again = lease(store, queue)
    assert [d.deliveries for d in again.delivered] == [2, 2]


def test_a_lease_no_client_saw_is_released_with_its_delivery_taken_back(
    store: Store, queue: str
) -> None:
    """A round's leftovers (the sockets closed or paused meanwhile) go back as
    they were: the next lease is their first delivery, or the same redelivery."""
    enqueue(store, queue, 1, 2)
    got = lease(store, queue)
    receipts = [d.receipt for d in got.delivered]
    assert one(store, Release(queue, receipts[:1], undelivered=True)) == 1
    assert one(store, Release(queue, receipts[1:])) == 1  # seen by a client: counted
    again = lease(store, queue)
    assert [d.deliveries for d in again.delivered] == [1, 2]
    receipts = [d.receipt for d in again.delivered]
    assert one(store, Release(queue, [*receipts, "junk"], undelivered=True)) == 2
    assert [d.deliveries for d in lease(store, queue).delivered] == [1, 2]
    # A stale receipt takes nothing back.
    assert one(store, Release(queue, receipts, undelivered=True)) == 0


def test_extend_moves_the_expiry(store: Store, queue: str, clock: FakeClock) -> None:
    enqueue(store, queue, 1)
    (d,) = lease(store, queue, timeout=5).delivered
    assert one(store, Extend(d.receipt, 100)) == clock.now + 100
    clock.advance(50)
    assert lease(store, queue).delivered == []
    assert isinstance(one(store, Ack(d.receipt)), AckResult)


def test_delayed_enqueue_and_next_due(store: Store, queue: str, clock: FakeClock) -> None:
    one(store, Enqueue(queue, [msg("later", delay=7)]))
    got = lease(store, queue)
    assert got.delivered == [] and got.next_due == clock.now + 7
    clock.advance(7)
    assert bodies(lease(store, queue)) == ['"later"']


def test_purge_spares_in_flight(store: Store, queue: str) -> None:
    enqueue(store, queue, 1, 2, 3)
    (held,) = lease(store, queue, 1).delivered
    assert one(store, Purge(queue)) == 2
    assert isinstance(one(store, Ack(held.receipt)), AckResult)


def test_unknown_queue_stats_not_found(store: Store, queue: str) -> None:
    assert isinstance(one(store, Stats(queue + "-never")), NotFound)


def test_mixed_batch_applies_in_order_and_batches_plain_acks(store: Store, queue: str) -> None:
    enqueue(store, queue, 1, 2, 3)
    got = lease(store, queue).delivered
    ops: list[Any] = [Ack(got[0].receipt), Ack(got[1].receipt), Ack(got[0].receipt)]
    ops += [Enqueue(queue, [msg(4)]), Ack("nonsense"), Nack(queue, got[2].receipt)]
    results = store.run(ops)
    assert isinstance(results[0], AckResult) and isinstance(results[1], AckResult)
    assert isinstance(results[2], StaleReceipt)  # same receipt twice: acked once
    assert results[3][0].duplicate is False
    assert isinstance(results[4], StaleReceipt)
    assert results[5] is None
    assert one(store, Stats(queue)).visible == 2


def test_a_poisoned_op_fails_alone(store: Store, queue: str) -> None:
    bad = Enqueue(queue, [EnqueueSpec(b"\xff\xfe", None, 0.0)])  # not UTF-8: the insert fails
    results = store.run([Enqueue(queue, [msg("ok")]), bad, Enqueue(queue, [msg("ok2")])])
    assert isinstance(results[1], Unavailable)
    assert not isinstance(results[0], Unavailable) and not isinstance(results[2], Unavailable)
    assert bodies(lease(store, queue)) == ['"ok"', '"ok2"']


def test_concurrent_stores_lease_disjoint_messages(
    database: tuple[str, Any], store: Store, queue: str, clock: FakeClock
) -> None:
    _, connect = database
    other = Store(connect, store.dialect, clock=clock, settings_ttl=0)
    enqueue(store, queue, *range(20))
    a = lease(store, queue, 7)
    b = lease(other, queue, 7)
    other.close()
    ids_a = {d.id for d in a.delivered}
    ids_b = {d.id for d in b.delivered}
    assert len(ids_a) == len(ids_b) == 7 and not ids_a & ids_b


def test_staged_messages_are_invisible_until_committed(store: Store, queue: str) -> None:
    from gateway.store import AbortTxn, CommitTxn, Stage

    txn = f"{queue}-q1-b0"
    assert one(store, Stage(txn, 0, queue, [msg("p0-a"), msg("p0-b")])).messages == 2
    assert one(store, Stage(txn, 1, queue, [msg("p1-old")])).messages == 1
    # A retried task replaces its partition's staging.
    assert one(store, Stage(txn, 1, queue, [msg("p1-a"), msg("k", key="once")])).messages == 2
    assert lease(store, queue).delivered == []  # invisible to workers and stats
    assert one(store, Stats(queue)).visible == 0
    committed = one(store, CommitTxn(txn))
    assert (committed.state, committed.messages, committed.already) == ("committed", 4, False)
    assert bodies(lease(store, queue)) == ['"p0-a"', '"p0-b"', '"p1-a"', '"k"']
    # Replays change nothing: commit again, stage again, then commit again.
    assert one(store, CommitTxn(txn)).already
    assert one(store, Stage(txn, 0, queue, [msg("dup")])).already
    assert one(store, CommitTxn(txn)).messages == 4
    assert lease(store, queue).delivered == []
    assert isinstance(one(store, AbortTxn(txn)), ProtocolError)  # committed stays committed


def test_aborted_staging_is_discarded(store: Store, queue: str) -> None:
    from gateway.store import AbortTxn, CommitTxn, Stage

    txn = f"{queue}-q1-b1"
    one(store, Stage(txn, 0, queue, [msg(1), msg(2)]))
    assert one(store, AbortTxn(txn)).messages == 2
    assert isinstance(one(store, CommitTxn(txn)), ProtocolError)
    assert one(store, Stats(queue)).visible == 0


def test_commit_of_an_empty_batch_is_remembered(store: Store, queue: str) -> None:
    from gateway.store import CommitTxn

    assert one(store, CommitTxn(f"{queue}-empty")).messages == 0
    assert one(store, CommitTxn(f"{queue}-empty")).already


def test_a_connection_closed_by_the_server_while_idle_is_replaced(
    database: tuple[str, Any], store: Store, queue: str
) -> None:
    """A PostgreSQL restart (or an idle timeout) kills the store's idle connection:
    the next batch reconnects and runs instead of answering ``unavailable``."""
    kind, connect = database
    if kind != "postgres":
        pytest.skip("SQLite has no server to close the connection")
    enqueue(store, queue, "before")
    with store.transaction() as txn:
        (pid,) = txn.exec("SELECT pg_backend_pid()").fetchone()
    killer = connect()
    try:
        killer.execute("SELECT pg_terminate_backend(%s)", (pid,))
    finally:
        killer.close()
    (result,) = store.run([Enqueue(queue, [EnqueueSpec(b'"after"')])])
    assert not isinstance(result, Exception), result


def test_one_batch_of_enqueues_maps_each_id_to_its_own_message(store: Store, queue: str) -> None:
    # Runs of plain enqueues share one INSERT whose ids are derived, not
    # returned per row (gateway.store.dialects): each op must still get the
    # ids of its own messages, in order, across queues and message counts.
    other = queue + "x"
    ops = [
        Enqueue(queue, [msg("a1"), msg("a2")]),
        Enqueue(other, [msg("b1")]),
        Enqueue(queue, [msg("a3")]),
        Enqueue(other, [msg("b2"), msg("b3"), msg("b4")]),
    ]
    results = store.run(ops)
    ids = [[r.id for r in result] for result in results]
    flat = [int(i) for group in ids for i in group]
    assert flat == sorted(flat) and len(set(flat)) == 7
    by_id = {d.id: d.body for d in lease(store, queue, 10).delivered}
    by_id |= {d.id: d.body for d in lease(store, other, 10).delivered}
    assert [[by_id[i] for i in group] for group in ids] == [
        ['"a1"', '"a2"'],
        ['"b1"'],
        ['"a3"'],
        ['"b2"', '"b3"', '"b4"'],
    ]


def test_a_run_of_acks_acks_current_receipts_only(store: Store, queue: str) -> None:
    enqueue(store, queue, 1, 2, 3)
    first, second, third = lease(store, queue).delivered
    assert isinstance(one(store, Ack(first.receipt)), AckResult)
    forged = f"{second.id}.{int(second.receipt.split('.')[1], 16) ^ 1:x}"  # right id, wrong token
    results = store.run(
        [Ack(first.receipt), Ack(forged), Ack(second.receipt), Ack(third.receipt), Ack("x")]
    )
    assert [type(r).__name__ for r in results] == [
        "StaleReceipt",
        "StaleReceipt",
        "AckResult",
        "AckResult",
        "StaleReceipt",
    ]
    assert lease(store, queue).delivered == []
