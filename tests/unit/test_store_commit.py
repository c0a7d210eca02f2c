"""How a store transaction begins and ends on PostgreSQL (``gateway.store.runner``).

The counters' upsert, the notifications and ``COMMIT`` go as one simple
query, their values written into the text by the driver; a lease-only batch
begins with ``synchronous_commit`` off in the same round trip as ``BEGIN``.
Against a real PostgreSQL database: values that need quoting arrive intact,
and a failure at the commit takes the whole transaction back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from gateway.core.leases import QueueSettings
from gateway.store import NOTIFY_CHANNEL, POSTGRESQL, Enqueue, Store
from gateway.store.enqueue import enqueue
from tests.support.fakes import FakeClock
from tests.support.store import msg, one

#: a queue name with everything a literal must quote
ODD = 'o\'dd \\ "name"; -- é'


@pytest.fixture
def pg_store(database: tuple[str, Callable[[], Any]], clock: FakeClock) -> Iterator[Store]:
    """A store on PostgreSQL that announces its wake-ups as ``gw``."""
    kind, connect = database
    if kind != "postgres":
        pytest.skip("SQLite's commit is a call in this process: no round trips to save")
    store = Store(
        connect,
        POSTGRESQL,
        clock=clock,
        defaults=QueueSettings(visibility_timeout=30, max_deliveries=3, dedup_window=60),
        settings_ttl=0,
        announce_as="gw",
    )
    yield store
    store.close()


@pytest.fixture
def pg(database: tuple[str, Callable[[], Any]]) -> Iterator[Any]:
    """An autocommit connection to the same database."""
    _, connect = database
    conn = connect()
    yield conn
    conn.close()


def _counted(pg: Any, queue: str) -> dict[str, int]:
    rows = pg.execute(
        "SELECT c.name, SUM(c.value) FROM leasecast_queue_counter c "
        "JOIN leasecast_queue q ON q.id = c.queue_id WHERE q.name = %s GROUP BY c.name",
        (queue,),
    ).fetchall()
    return {name: int(total) for name, total in rows}


def test_the_commit_sends_counters_and_notifications_with_their_values_intact(
    pg_store: Store, pg: Any
) -> None:
    listener = psycopg.connect(pg.info.dsn, autocommit=True)
    try:
        listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        (results,) = pg_store.run([Enqueue(ODD, [msg(1), msg(2)])])
        assert isinstance(results, list) and len(results) == 2
        notes = [n.payload for n in listener.notifies(timeout=5, stop_after=1)]
    finally:
        listener.close()
    assert notes == [f"gw {ODD}"]
    assert _counted(pg, ODD) == {"enqueued": 2}
    assert pg.execute(
        "SELECT COUNT(*) FROM leasecast_message m JOIN leasecast_queue q ON q.id = m.queue_id "
        "WHERE q.name = %s",
        (ODD,),
    ).fetchone() == (2,)


def test_a_statement_failing_at_the_commit_takes_the_transaction_back(
    pg_store: Store, pg: Any, queue: str
) -> None:
    one(pg_store, Enqueue(queue, [msg("first")]))  # the queue exists, one message
    with pytest.raises(psycopg.errors.StringDataRightTruncation), pg_store.transaction() as txn:
        enqueue(txn, queue, [msg("lost")])
        # A counter name longer than its column: the upsert in the commit's
        # query fails, and PostgreSQL skips the COMMIT after it.
        txn.count(txn.queue(queue, create=False).id, "n" * 40)
    assert _counted(pg, queue) == {"enqueued": 1}
    bodies = pg.execute(
        "SELECT m.body FROM leasecast_message m JOIN leasecast_queue q ON q.id = m.queue_id "
        "WHERE q.name = %s",
        (queue,),
    ).fetchall()
    assert bodies == [('"first"',)]
    # The connection is usable again: the next transaction commits.
    one(pg_store, Enqueue(queue, [msg("next")]))
    assert _counted(pg, queue) == {"enqueued": 2}


@pytest.mark.parametrize("relaxed", [False, True])
def test_only_a_relaxed_transaction_commits_without_waiting_for_the_flush(
    pg_store: Store, relaxed: bool
) -> None:
    with pg_store.transaction(relaxed=relaxed) as txn:
        (setting,) = txn.exec("SHOW synchronous_commit").fetchone()
    assert setting == ("off" if relaxed else "on")
    with pg_store.transaction() as txn:  # SET LOCAL: the next one is back to the default
        assert txn.exec("SHOW synchronous_commit").fetchone() == ("on",)
