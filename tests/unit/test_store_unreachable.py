"""A database that cannot be reached answers a whole batch ``unavailable`` at once.

Found by cutting a gateway host off from its database host
(tests/cluster/test_partitions.py): a batch whose connection was lost was run
again op by op, and each op waited for a connection attempt of its own
(libpq's ``connect_timeout``) before being answered ``unavailable``, so a
batch of a few ops took many times the connect timeout to be answered, and
every op behind it waited as long.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.core.errors import Unavailable
from gateway.core.leases import QueueSettings
from gateway.store import POSTGRESQL, SQLITE, Enqueue, Store
from tests.support.fakes import FakeClock
from tests.support.store import bodies, lease, msg, one


class Reachability:
    """Connects to the real database while ``up``; refuses as a host that is gone."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self.up = True
        self.attempts = 0
        self.opened: list[Any] = []

    def __call__(self) -> Any:
        self.attempts += 1
        if not self.up:
            raise OSError("connection timeout expired")
        conn = self._connect()
        self.opened.append(conn)
        return conn


def test_a_lost_database_answers_every_op_of_the_batch_after_one_connection_attempt(
    database: tuple[str, Any], queue: str
) -> None:
    kind, connect = database
    reach = Reachability(connect)
    store = Store(
        reach,
        SQLITE if kind == "sqlite" else POSTGRESQL,
        clock=FakeClock(1_000_000.0),
        defaults=QueueSettings(visibility_timeout=30),
        settings_ttl=0,
    )
    try:
        one(store, Enqueue(queue, [msg("before")]))
        # The database goes away: the open connection breaks, and no new one can be made.
        reach.up = False
        reach.opened[-1].close()
        reach.attempts = 0
        ops = [Enqueue(queue, [msg(f"lost-{n}")]) for n in range(8)]
        results = store.run(ops)
        assert all(isinstance(r, Unavailable) for r in results), results
        # One attempt for the batch (before: one per op, each waiting its connect_timeout).
        assert reach.attempts == 1, reach.attempts
        assert "unreachable" in str(results[0].detail)
        # Back: the next batch connects again, and nothing of the refused one was applied.
        reach.up = True
        one(store, Enqueue(queue, [msg("after")]))
        assert sorted(bodies(lease(store, queue))) == ['"after"', '"before"']
    finally:
        store.close()


def test_the_store_session_tells_the_server_to_give_up_on_a_silent_gateway() -> None:
    """The server side of the partition: the store's PostgreSQL sessions carry TCP
    keepalives and a user timeout, so the database drops a session (and the open
    transaction it was cut in, with its row locks) within seconds, not hours."""
    import psycopg
    import pytest

    from gateway.engine import SERVER_NETWORK_SETTINGS, _bound_server_waits
    from tests.support.databases import PG_ADMIN_URL, postgres_unavailable

    reason = postgres_unavailable()
    if reason:
        pytest.skip(reason)
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        _bound_server_waits(conn)
        for name, value in SERVER_NETWORK_SETTINGS:
            shown = conn.execute(f"SHOW {name}").fetchone()
            assert shown is not None
            # SHOW adds units: 2 -> "2", 5000 -> "5s".
            assert shown[0] in (value, f"{int(value) // 1000}s"), (name, shown)
