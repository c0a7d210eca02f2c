"""Queue control (protocol 1.2: Pause, Concurrency and rate limits).

The pure rules (``gateway.core.queue_limits``) with a fake clock, then the
store applying them in its lease transaction on real SQLite and PostgreSQL:
pause, ``max_in_flight`` and the token bucket shared by several stores (each
a gateway process's connection), the settings' validation, and the
lease-length histogram's counters.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from gateway.core.errors import Invalid, StaleReceipt
from gateway.core.leases import QueueSettings, lease_seconds_bucket
from gateway.core.queue_limits import LIMIT_RECHECK, Bucket, allowance
from gateway.store import Ack, Configure, Enqueue, Lease, LeaseResult, Nack, Reject, Stats, Store
from tests.support.fakes import FakeClock
from tests.support.store import bodies, enqueue, lease, msg, one

# -- the pure rules -------------------------------------------------------------------


def test_the_bucket_never_grants_more_than_burst_plus_rate_times_t() -> None:
    """Random rounds at random times: over every window of the run, the leases
    granted stay within ``burst + rate * T``, and a full bucket is used whole."""
    rng = random.Random(7)
    rate, burst = 3.0, 5
    clock = FakeClock(1000.0)
    bucket = Bucket(0.0, 0.0)  # as stored for a new queue: refilled at the epoch
    first = allowance(8, now=clock(), rate=rate, burst=burst, bucket=bucket)
    assert first.n == burst  # a new bucket starts full
    grants: list[tuple[float, int]] = []
    for _ in range(2000):
        clock.advance(rng.choice([0.0, 0.001, 0.05, 0.2, 1.0, 3.0]))
        got = allowance(rng.randint(1, 8), now=clock(), rate=rate, burst=burst, bucket=bucket)
        granted = got.n
        grants.append((clock(), granted))
        spent = got.spent(granted)
        assert spent is not None and spent.tokens >= -1e-9
        bucket = spent
    for i, (start, _) in enumerate(grants):
        total = 0
        for at, n in grants[i:]:
            total += n
            assert total <= burst + rate * (at - start) + 1e-6, (start, at, total)


def test_a_full_bucket_grants_its_burst_then_one_per_token() -> None:
    got = allowance(10, now=100.0, rate=2.0, burst=4, bucket=Bucket(0.0, 0.0))
    assert got.n == 4
    after = got.spent(4)
    assert after == Bucket(0.0, 100.0)
    assert got.wake_at(4, 10) == pytest.approx(100.5)  # the next token
    assert allowance(10, now=100.4, rate=2.0, burst=4, bucket=after).n == 0
    assert allowance(10, now=100.5, rate=2.0, burst=4, bucket=after).n == 1
    assert allowance(10, now=200.0, rate=2.0, burst=4, bucket=after).n == 4  # capped


def test_a_clock_behind_the_stored_one_mints_nothing() -> None:
    """Processes' clocks differ: the later refill time is kept, and time going
    backwards adds no tokens."""
    stored = Bucket(0.0, 100.0)
    assert allowance(5, now=90.0, rate=10.0, burst=5, bucket=stored).n == 0
    assert stored.refilled(10.0, 5, 90.0) == Bucket(0.0, 100.0)


def test_max_in_flight_gives_the_room_left_and_rechecks_no_faster_than_a_second() -> None:
    full = allowance(10, now=50.0, max_in_flight=3, in_flight=3)
    assert full.n == 0 and full.held_by_in_flight
    assert full.wake_at(0, 10) == 50.0 + LIMIT_RECHECK >= 51.0
    some = allowance(10, now=50.0, max_in_flight=3, in_flight=1)
    assert some.n == 2
    assert some.wake_at(1, 10) is None  # the queue ran dry first: not the limit's doing
    assert allowance(2, now=50.0, max_in_flight=3, in_flight=1).wake_at(2, 2) is None
    both = allowance(10, now=50.0, max_in_flight=8, in_flight=0, rate=1.0, burst=2)
    assert both.n == 2 and not both.held_by_in_flight


def test_settings_accept_the_control_fields_and_refuse_bad_values_naming_them() -> None:
    s = QueueSettings().changed(
        {"paused": True, "max_in_flight": 4, "rate_limit": 2.5, "rate_burst": None}
    )
    assert (s.paused, s.max_in_flight, s.rate_limit, s.burst) == (True, 4, 2.5, 3)
    assert QueueSettings().burst == 1 and not QueueSettings().limited
    doc = s.changed({"rate_burst": 7}).as_json()
    assert {k: doc[k] for k in ("paused", "max_in_flight", "rate_limit", "rate_burst")} == {
        "paused": True,
        "max_in_flight": 4,
        "rate_limit": 2.5,
        "rate_burst": 7,
    }
    for change, named in [
        ({"paused": "yes"}, "paused"),
        ({"paused": 1}, "paused"),
        ({"max_in_flight": -1}, "max_in_flight"),
        ({"max_in_flight": 1.5}, "max_in_flight"),
        ({"max_in_flight": "3"}, "max_in_flight"),
        ({"rate_limit": -0.5}, "rate_limit"),
        ({"rate_limit": float("nan")}, "rate_limit"),
        ({"rate_limit": True}, "rate_limit"),
        ({"rate_burst": 0}, "rate_burst"),
        ({"rate_burst": "x"}, "rate_burst"),
        ({"max_inflight": 3}, "max_in_flight"),  # a typo: the detail lists the known ones
    ]:
        with pytest.raises(Invalid, match=named):
            QueueSettings().changed(change)


# -- the store, on SQLite and PostgreSQL ----------------------------------------------


def configure(store: Store, queue: str, **changes: Any) -> Any:
    result = one(store, Configure(queue, changes))
    assert not isinstance(result, Exception), result
    return result


def test_a_paused_queue_leases_nothing_but_takes_enqueues_acks_and_nacks(
    store: Store, queue: str
) -> None:
    enqueue(store, queue, "a", "b", "c")
    held = lease(store, queue, 2)
    assert bodies(held) == ['"a"', '"b"']
    doc = configure(store, queue, paused=True).as_json()
    assert doc["paused"] is True
    enqueue(store, queue, "d")
    paused = lease(store, queue, 10)
    assert paused.delivered == [] and paused.next_due is not None
    assert one(store, Ack(held.delivered[0].receipt)) is not None
    assert one(store, Nack(queue, held.delivered[1].receipt, 0.0)) is None
    assert lease(store, queue, 10).delivered == []
    assert one(store, Stats(queue)).visible == 3  # b (nacked), c, d
    configure(store, queue, paused=False)
    assert bodies(lease(store, queue, 10)) == ['"b"', '"c"', '"d"']


def test_pause_and_limits_stored_by_one_process_bind_another_at_once(
    database: tuple[str, Any], store: Store, queue: str, clock: FakeClock
) -> None:
    """Two stores on one database (two processes). The leasing one caches its
    settings for an hour, read while the queue was neither paused nor limited:
    what the other stores binds its very next lease round all the same."""
    stale = Store(store._connect, store.dialect, clock=clock, settings_ttl=3600)
    try:
        enqueue(stale, queue, *range(8))  # caches the queue: no pause, no limits
        configure(store, queue, paused=True)
        assert lease(stale, queue, 10).delivered == []
        configure(store, queue, paused=False, max_in_flight=2)
        assert len(lease(stale, queue, 10).delivered) == 2
        assert lease(store, queue, 10).delivered == []
        configure(store, queue, max_in_flight=0, rate_limit=1, rate_burst=3)
        assert len(lease(stale, queue, 10).delivered) == 3  # the cache followed
        configure(store, queue, rate_limit=0)
        assert len(lease(stale, queue, 10).delivered) == 3  # the rest: no bucket any more
    finally:
        stale.close()


def test_max_in_flight_counts_leases_of_every_store_and_frees_room_as_they_end(
    store: Store, queue: str, clock: FakeClock
) -> None:
    enqueue(store, queue, *range(10))
    configure(store, queue, max_in_flight=3)
    first = lease(store, queue, 2)
    second = lease(store, queue, 5)
    assert len(first.delivered) + len(second.delivered) == 3
    held = lease(store, queue, 5)
    assert held.delivered == []
    assert held.next_due is not None and held.next_due >= clock() + 1.0  # no faster poll
    one(store, Ack(first.delivered[0].receipt))
    assert one(store, Reject(second.delivered[0].receipt)) is None
    assert len(lease(store, queue, 5).delivered) == 2
    clock.advance(31)  # every lease times out: in flight no more
    assert len(lease(store, queue, 5).delivered) == 3


def test_the_rate_limit_is_a_shared_token_bucket(
    store: Store, queue: str, clock: FakeClock
) -> None:
    enqueue(store, queue, *range(20))
    configure(store, queue, rate_limit=2, rate_burst=3)
    assert len(lease(store, queue, 10).delivered) == 3  # the burst
    dry = lease(store, queue, 10)
    assert dry.delivered == [] and dry.next_due == pytest.approx(clock() + 0.5)
    clock.advance(1.0)
    assert len(lease(store, queue, 10).delivered) == 2
    clock.advance(100.0)
    assert len(lease(store, queue, 10).delivered) == 3  # never more than the burst


def test_concurrent_stores_never_exceed_max_in_flight(
    database: tuple[str, Any], store: Store, queue: str
) -> None:
    """Four stores lease and ack in threads at once (real clock, real locks):
    after every commit, the queue's leases in flight are at most the limit."""
    import time

    limit = 4
    enqueue(store, queue, *range(120))
    configure(store, queue, max_in_flight=limit)
    stores = [
        Store(store._connect, store.dialect, clock=time.time, settings_ttl=0) for _ in range(4)
    ]
    seen: list[int] = []
    errors: list[BaseException] = []

    def work(s: Store) -> None:
        try:
            for _ in range(40):
                got = lease(s, queue, 3)
                with s.transaction() as txn:
                    (n,) = txn.exec(
                        "SELECT COUNT(*) FROM leasecast_message AS m "
                        "JOIN leasecast_queue AS q ON q.id = m.queue_id "
                        "WHERE q.name = %s AND m.state = 1",
                        (queue,),
                    ).fetchone()
                seen.append(int(n))
                for d in got.delivered:
                    one(s, Ack(d.receipt))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            s.close()  # on its own thread (an SQLite connection belongs to one)

    threads = [threading.Thread(target=work, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert max(seen) <= limit
    assert max(seen) >= 1  # they did lease


def test_an_ack_is_counted_in_the_lease_length_histogram(
    store: Store, queue: str, clock: FakeClock
) -> None:
    one(store, Enqueue(queue, [msg(1), msg(2)]))
    first, second = lease(store, queue, 2).delivered
    clock.advance(0.3)
    one(store, Ack(first.receipt))
    clock.advance(4.0)
    one(store, Ack(second.receipt))
    assert isinstance(one(store, Ack(second.receipt)), StaleReceipt)  # not counted twice
    with store.transaction() as txn:
        rows = txn.exec(
            "SELECT c.name, c.label, SUM(c.value) FROM leasecast_queue_counter AS c "
            "JOIN leasecast_queue AS q ON q.id = c.queue_id "
            "WHERE q.name = %s AND c.name IN ('lease_seconds', 'lease_seconds_sum_ms') "
            "GROUP BY c.name, c.label",
            (queue,),
        ).fetchall()
    assert {(name, label): int(n) for name, label, n in rows} == {
        ("lease_seconds", lease_seconds_bucket(0.3)): 1,
        ("lease_seconds", lease_seconds_bucket(4.3)): 1,
        ("lease_seconds_sum_ms", ""): 4600,
    }


def test_a_lease_that_ends_wakes_the_workers_of_a_queue_at_its_limit_only(
    store: Store, queue: str
) -> None:
    """An ack or reject frees room under ``max_in_flight``: the queue is woken (its
    pumps here, and by NOTIFY on other processes); without a limit it is not."""
    free = f"{queue}-free"
    enqueue(store, queue, 1, 2)
    enqueue(store, free, 1)
    configure(store, queue, max_in_flight=2)
    a, b = lease(store, queue, 2).delivered
    (c,) = lease(store, free, 1).delivered
    store.run([Ack(c.receipt)])
    assert store.woken == set()
    store.run([Ack(a.receipt)])
    assert store.woken == {queue}
    store.run([Reject(b.receipt)])
    assert store.woken == {queue}


def test_two_stores_leasing_two_limited_queues_in_opposite_orders_never_deadlock(
    database: tuple[str, Any], store: Store, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each batch leases from two limited queues; two stores (processes) list
    them in opposite orders, at once, many times. Row locks taken in whatever
    order the batch has would deadlock (PostgreSQL then aborts a batch after a
    second and the store runs it again); the store never waits for a queue's
    lock out of order, so no batch fails."""
    import time

    first, second = f"{queue}-1", f"{queue}-2"
    for q in (first, second):
        enqueue(store, q, *range(400))
        configure(store, q, max_in_flight=1000)
    stores = [Store(store._connect, store.dialect, clock=time.time) for _ in range(2)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def work(s: Store, order: tuple[str, str]) -> None:
        try:
            for _ in range(60):
                barrier.wait()
                results = s.run([Lease(order[0], 2), Lease(order[1], 2)])
                assert all(isinstance(r, LeaseResult) for r in results), results
        except BaseException as exc:  # reported below
            errors.append(exc)
            barrier.abort()
        finally:
            s.close()

    caplog.set_level("WARNING", logger="leasecast.store")
    threads = [
        threading.Thread(target=work, args=(stores[0], (first, second))),
        threading.Thread(target=work, args=(stores[1], (second, first))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert not [r for r in caplog.records if "failed" in r.getMessage()], caplog.text[:2000]
