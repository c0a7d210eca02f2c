"""Schedules in the store (gateway.store.schedules) and the firing turn
(gateway.engine.schedules.Scheduler.turn), on real SQLite and PostgreSQL with a fake clock.

Two schedulers on two connections stand for two gateway processes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import orjson
import pytest

from gateway.core.leases import QueueSettings
from gateway.core.protocol import Limits
from gateway.core.schedules import ScheduleSpec, parse_schedule, tick_key
from gateway.engine.schedules import Scheduler
from gateway.store import Browse, Configure, Store
from gateway.store.schedules import (
    ManagedTask,
    all_schedules,
    fire,
    fire_many,
    get_schedule,
    put_schedule,
    sync_managed,
)
from tests.support.fakes import FakeClock


def _spec(queue: str, **fields: object) -> ScheduleSpec:
    return parse_schedule("s", {"queue": queue, **fields}, Limits(), now=0.0)


@pytest.fixture
def peer(store: Store) -> Iterator[Store]:
    """A second store on the same database and clock: another gateway process."""
    other = Store(
        store._connect,
        store.dialect,
        clock=store._clock,
        defaults=QueueSettings(visibility_timeout=30, max_deliveries=3, dedup_window=60),
        settings_ttl=0,
    )
    yield other
    other.close()


def _keys(store: Store, queue: str) -> list[str]:
    (page,) = store.run([Browse(queue, "visible", 1000, None)])
    return [m.key for m in page.messages]


def _turn(store: Store, scheduler: Scheduler) -> dict[str, str]:
    with store.transaction() as txn:
        return dict(scheduler.turn(txn).outcomes)


def test_two_processes_fire_every_tick_once_past_the_dedup_window(
    store: Store, peer: Store, clock: FakeClock, queue: str
) -> None:
    clock.now = 1_000_000.5
    with store.transaction() as txn:
        put_schedule(txn, "s" + queue, _spec(queue, every=10, body={"n": 1}))
    one, two = Scheduler(lambda: store, start=False), Scheduler(lambda: peer, start=False)
    try:
        # 20 ticks over 200 s: past the queue's 60 s dedup window, so the keys
        # alone could not keep a late process from firing a tick again.
        for _ in range(20):
            clock.advance(10)
            first, second = (one, store), (two, peer)
            if clock.now % 20 > 10:
                first, second = second, first  # either process may come first
            got = _turn(first[1], first[0])
            late = _turn(second[1], second[0])
            assert got.get("s" + queue) == "fired" and "s" + queue not in late
        with store.transaction() as txn:
            (row,) = [r for r in all_schedules(txn) if r.name == "s" + queue]
            stale = row
        # A process that read the row before the last tick fired, once the
        # key is forgotten: the compare-and-set still refuses it.
        clock.advance(61)
        store.forget_expired_keys()
        with store.transaction() as txn:
            assert fire(txn, stale, row.last_tick or 0) == "taken"
    finally:
        one._executor.shutdown()
        two._executor.shutdown()
    keys = _keys(store, queue)
    assert len(keys) == len(set(keys)) == 20 == row.fired
    assert keys[0] == tick_key("s" + queue, 1_000_010.0)
    assert keys[-1] == tick_key("s" + queue, 1_000_200.0)


def test_duplicate_key_is_not_counted(store: Store, clock: FakeClock, queue: str) -> None:
    name = "d" + queue
    with store.transaction() as txn:
        row = put_schedule(txn, name, _spec(queue, every=60))
        assert fire(txn, row, 1_000_020.0) == "fired"
    # Deleted and made again within the dedup window: the same tick's key is
    # remembered, so its message is not enqueued twice nor counted.
    with store.transaction() as txn:
        txn.exec("DELETE FROM leasecast_schedule WHERE name = %s", (name,))
        again = put_schedule(txn, name, _spec(queue, every=60))
        assert fire(txn, again, 1_000_020.0) == "duplicate"
        assert get_schedule(txn, name).fired == 0  # type: ignore[union-attr]
        assert get_schedule(txn, name).last_tick == 1_000_020.0  # type: ignore[union-attr]
    assert len(_keys(store, queue)) == 1


def test_full_queue_follows_its_overflow_rule(
    store: Store, clock: FakeClock, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = "f" + queue
    store.run([Configure(queue, {"max_length": 1, "overflow": "block"})])
    with store.transaction() as txn:
        row = put_schedule(txn, name, _spec(queue, every=60))
        assert fire(txn, row, 1_000_020.0) == "fired"
    with store.transaction() as txn:
        # block: left for a later try while the wait lasts, then refused, loudly
        assert fire(txn, row, 1_000_080.0, may_wait=True) == "waiting"
        assert get_schedule(txn, name).last_tick == 1_000_020.0  # type: ignore[union-attr]
        with caplog.at_level(logging.WARNING, "leasecast.schedules"):
            assert fire(txn, row, 1_000_080.0, may_wait=False) == "refused"
        assert "refused" in caplog.text and name in caplog.text
        after = get_schedule(txn, name)
        assert after is not None and (after.last_tick, after.fired) == (1_000_080.0, 1)
    store.run([Configure(queue, {"overflow": "drop_oldest"})])
    with store.transaction() as txn:
        row = get_schedule(txn, name)  # type: ignore[assignment]
        assert fire(txn, row, 1_000_140.0) == "fired"
    assert _keys(store, queue) == [tick_key(name, 1_000_140.0)]  # the oldest went dead
    (dead,) = store.run([Browse(queue, "dead", 10, None)])
    assert [m.dead_reason for m in dead.messages] == ["overflow"]


def test_catch_up_fires_only_the_latest_tick(store: Store, clock: FakeClock, queue: str) -> None:
    name = "c" + queue
    clock.now = 1_000_000.0
    with store.transaction() as txn:
        put_schedule(txn, name, _spec(queue, every=60))
    scheduler = Scheduler(lambda: store, start=False)
    try:
        clock.advance(3600 + 30)  # an hour with no process running
        assert _turn(store, scheduler).get(name) == "fired"
        assert name not in _turn(store, scheduler)
    finally:
        scheduler._executor.shutdown()
    assert _keys(store, queue) == [tick_key(name, 1_003_620.0)]  # 60 s multiples


def test_settings_schedules_make_task_records(store: Store, clock: FakeClock, queue: str) -> None:
    template = {"task": "app.tasks.report", "args": [1], "kwargs": {"a": 2}, "takes_context": False}
    spec = ScheduleSpec(queue, orjson.dumps(template).decode(), _spec(queue, every=60).rule)
    name = "t" + queue
    with store.transaction() as txn:
        assert sync_managed(txn, {name: ManagedTask(spec, "default")}) == (1, 0, 0)
        assert sync_managed(txn, {name: ManagedTask(spec, "default")}) == (0, 0, 0)
        put_schedule(txn, "api" + queue, _spec(queue, every=60))  # not the setting's
        row = get_schedule(txn, name)
        assert row is not None and row.managed
        assert fire(txn, row, 1_000_020.0) == "fired"
        record = txn.exec(
            "SELECT id, backend, task_path, queue, status, message_id FROM leasecast_task "
            "WHERE task_path = %s AND queue = %s",
            ("app.tasks.report", queue),
        ).fetchone()
    (page,) = store.run([Browse(queue, "visible", 10, None)])
    (message,) = page.messages
    body = orjson.loads(message.body_json)
    assert body == {**template, "id": record[0]}
    assert list(body) == ["task", "id", "args", "kwargs", "takes_context"]
    assert record[1:] == (record[1], "app.tasks.report", queue, "READY", int(message.id))
    assert record[1] == "default"
    with store.transaction() as txn:
        assert sync_managed(txn, {}) == (0, 0, 1)  # the entry went: so does its schedule
        assert [r.name for r in all_schedules(txn) if queue in r.name] == ["api" + queue]


def test_fire_many_batches_plain_ticks_and_keeps_every_rule(
    store: Store, clock: FakeClock, queue: str
) -> None:
    bounded = queue + "b"
    store.run([Configure(bounded, {"max_length": 1, "overflow": "drop_newest"})])
    names = [f"m{i}{queue}" for i in range(3)]
    with store.transaction() as txn:
        rows = [put_schedule(txn, name, _spec(queue, every=60)) for name in names]
        full = put_schedule(txn, "full" + queue, _spec(bounded, every=60))
        assert fire(txn, full, 1_000_020.0) == "fired"  # fills the bounded queue
        # The first's key is already claimed (it was deleted and made again).
        assert fire(txn, rows[0], 1_000_080.0) == "fired"
        txn.exec("UPDATE leasecast_schedule SET last_tick = NULL WHERE id = %s", (rows[0].id,))
        stale = [get_schedule(txn, name) for name in names]
        full = get_schedule(txn, "full" + queue)  # type: ignore[assignment]
    due = [(row, 1_000_080.0) for row in stale if row is not None] + [(full, 1_000_080.0)]
    with store.transaction() as txn:
        outcomes = fire_many(txn, due, block_wait=10)
        again = fire_many(txn, due, block_wait=10)  # a second process, same ticks
        fired = {r.name: r.fired for r in all_schedules(txn)}
    assert outcomes == {
        names[0]: "duplicate",
        names[1]: "fired",
        names[2]: "fired",
        "full" + queue: "refused",
    }
    assert set(again.values()) == {"taken"}
    assert [fired[n] for n in names] == [1, 1, 1] and fired["full" + queue] == 1
    assert sorted(_keys(store, queue)) == sorted(tick_key(n, 1_000_080.0) for n in names)
