"""The one-statement enqueue on PostgreSQL (``gateway.store.enqueue_statement``).

Against a real PostgreSQL database: the statement writes exactly the rows the
general path writes (message, counter, task result row) and sends the same
notification; for a queue that does not exist or is bounded it writes nothing
and returns no id, so its caller can take the general path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gateway.core.protocol import EnqueueSpec
from gateway.store import NOTIFY_CHANNEL, Configure, EnsureQueue, Store
from gateway.store.enqueue import enqueue
from gateway.store.enqueue_statement import enqueue_in_one_statement, fits_one_statement
from gateway.store.tasks import NewTask, create
from tests.support.fakes import FakeClock

SHARD = 90  # a counter row no store process writes (tests compare sums)


@pytest.fixture
def pg(database: tuple[str, Callable[[], Any]]) -> Iterator[Any]:
    """An autocommit psycopg connection to the store's database (PostgreSQL only)."""
    kind, connect = database
    if kind != "postgres":
        pytest.skip("the one-statement enqueue is PostgreSQL's (SQLite has no INSERT in WITH)")
    conn = connect()
    yield conn
    conn.close()


def _task(queue: str, result_id: str, now: float) -> NewTask:
    return NewTask(
        result_id,
        backend="default",
        task_path="app.tasks.mail",
        queue=queue,
        priority=3,
        args_json=b'[1, "two"]',
        kwargs_json=b'{"to": "ada"}',
        enqueued_at=now,
        run_after=now + 5,
    )


def _row(conn: Any, table: str, key: str, value: Any, *, drop: tuple[str, ...]) -> dict[str, Any]:
    cur = conn.execute(f"SELECT * FROM {table} WHERE {key} = %s", (value,))
    found = cur.fetchone()
    assert found is not None, (table, value)
    names = [d.name for d in cur.description]
    return {n: v for n, v in zip(names, found, strict=True) if n not in drop}


def _counted(conn: Any, queue_id: int) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = conn.execute(
        "SELECT name, label, SUM(value) FROM leasecast_queue_counter WHERE queue_id = %s "
        "GROUP BY name, label",
        (queue_id,),
    ).fetchall()
    return rows


def _queue_id(conn: Any, name: str) -> int | None:
    found = conn.execute("SELECT id FROM leasecast_queue WHERE name = %s", (name,)).fetchone()
    return None if found is None else int(found[0])


def test_it_writes_what_the_general_path_writes(
    pg: Any, store: Store, queue: str, clock: FakeClock
) -> None:
    spec = EnqueueSpec(b'{"task": "mail"}', delay=5.0, priority=3, ttl=60.0)
    general, single = f"{queue}-general", f"{queue}-single"
    store.run([EnsureQueue(general), EnsureQueue(single)])
    with store.transaction() as txn:
        (enqueued,) = enqueue(txn, general, [spec])
        create(txn, _task(general, f"{queue}-a", clock()), int(enqueued.id))
    listener = store_listener(pg)
    msg_id = enqueue_in_one_statement(
        pg.cursor(),
        single,
        spec,
        now=clock(),
        shard=SHARD,
        task=_task(single, f"{queue}-b", clock()),
    )
    assert msg_id is not None and msg_id != int(enqueued.id)

    drop = ("id", "queue_id")
    assert _row(pg, "leasecast_message", "id", msg_id, drop=drop) == _row(
        pg, "leasecast_message", "id", int(enqueued.id), drop=drop
    )
    made = _row(pg, "leasecast_task", "id", f"{queue}-b", drop=("id", "queue"))
    assert made.pop("message_id") == msg_id
    expected = _row(pg, "leasecast_task", "id", f"{queue}-a", drop=("id", "queue"))
    assert expected.pop("message_id") == int(enqueued.id)
    assert made == expected and made["status"] == "READY" and made["args"] == [1, "two"]
    assert _counted(pg, _queue_id(pg, single) or 0) == [("enqueued", "", 1)]
    assert _counted(pg, _queue_id(pg, general) or 0) == [("enqueued", "", 1)]
    notes = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    assert notes == [f"admin {single}"]
    listener.close()


def test_a_message_without_a_task_is_written_alone(pg: Any, store: Store, queue: str) -> None:
    store.run([EnsureQueue(queue)])
    msg_id = enqueue_in_one_statement(pg.cursor(), queue, EnqueueSpec(b"[]"), now=10.0, shard=SHARD)
    assert msg_id is not None
    row = _row(pg, "leasecast_message", "id", msg_id, drop=())
    assert (row["state"], row["visible_at"], row["enqueued_at"], row["expires_at"]) == (
        0,
        10,
        10,
        None,
    )
    found = pg.execute("SELECT COUNT(*) FROM leasecast_task WHERE message_id = %s", (msg_id,))
    assert found.fetchone()[0] == 0


@pytest.mark.parametrize("kind", ["missing", "bounded"])
def test_a_queue_that_does_not_qualify_gets_nothing(
    pg: Any, store: Store, queue: str, clock: FakeClock, kind: str
) -> None:
    if kind == "bounded":
        store.run([Configure(queue, {"max_length": 10})])
    listener = store_listener(pg)
    task = _task(queue, f"{queue}-t", clock())
    msg_id = enqueue_in_one_statement(
        pg.cursor(), queue, EnqueueSpec(b"1"), now=clock(), shard=SHARD, task=task
    )
    assert msg_id is None
    queue_id = _queue_id(pg, queue)
    assert (queue_id is None) == (kind == "missing")
    if queue_id is not None:
        count = pg.execute(
            "SELECT COUNT(*) FROM leasecast_message WHERE queue_id = %s", (queue_id,)
        )
        assert count.fetchone()[0] == 0
        assert _counted(pg, queue_id) == []
    tasks = pg.execute("SELECT COUNT(*) FROM leasecast_task WHERE id = %s", (f"{queue}-t",))
    assert tasks.fetchone()[0] == 0
    assert list(listener.notifies(timeout=0.3)) == []
    listener.close()


def test_only_one_plain_message_fits() -> None:
    assert fits_one_statement([EnqueueSpec(b"1", delay=2.0, priority=-5, ttl=9.0)])
    assert not fits_one_statement([EnqueueSpec(b"1"), EnqueueSpec(b"2")])
    assert not fits_one_statement([EnqueueSpec(b"1", key="k")])
    assert not fits_one_statement([EnqueueSpec(b"1", group="g")])
    assert not fits_one_statement([])


def store_listener(pg: Any) -> Any:
    """A second connection to ``pg``'s database, listening on the wake channel."""
    import psycopg

    conn = psycopg.connect(pg.info.dsn, autocommit=True)
    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
    return conn
