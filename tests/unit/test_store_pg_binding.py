"""The store's PostgreSQL statements as the gateway's connection runs them.

The gateway's store connection binds parameters on the server and prepares
its statements (``gateway.engine._bind_on_server``); a Django connection left
as Django makes it quotes them into the text (``ClientCursor``). The batch
insert takes its rows as one JSON parameter and the batch ack its ids as
array literals: what goes in must come back exactly, either way, from the
first run of a statement (not prepared yet) to the later ones (prepared).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from gateway.core.protocol import EnqueueSpec
from gateway.engine import STORE_PREPARE_THRESHOLD, _bind_on_server
from gateway.store import POSTGRESQL, Ack, AckResult, Enqueue, Lease, LeaseResult, Store
from tests.support.fakes import FakeClock

BODIES = [
    {"t": 1764160000.123456},
    'quote " backslash \\ and a \\u0000 escape',
    "naïve ☃ 𝄞 \t\n",
    [1, 2.5, None, True, {"k": "v"}],
    "",
]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.support.databases import postgres_database, postgres_unavailable

    reason = postgres_unavailable()
    if reason:
        pytest.skip(reason)
    with postgres_database(tmp_path_factory.mktemp("pg-binding")) as env:
        yield env["DATABASE_URL"]


def gateway_connection(url: str) -> Any:
    """A connection made as Django makes it, then as the gateway's store sets it up."""
    import psycopg

    conn = psycopg.connect(url, autocommit=True, cursor_factory=psycopg.ClientCursor)
    conn.prepare_threshold = None
    _bind_on_server(conn, {})
    return conn


def django_connection(url: str) -> Any:
    """A connection as Django leaves it: parameters quoted client-side, nothing prepared."""
    import psycopg

    return psycopg.connect(
        url, autocommit=True, cursor_factory=psycopg.ClientCursor, prepare_threshold=None
    )


def test_the_store_connection_binds_on_the_server_and_prepares(url: str) -> None:
    import psycopg

    with gateway_connection(url) as conn:
        assert conn.cursor_factory is psycopg.Cursor
        assert conn.prepare_threshold == STORE_PREPARE_THRESHOLD
    # A prepare_threshold the project set in OPTIONS (None: never prepare,
    # for a pooler that does not keep prepared statements) is left alone.
    with django_connection(url) as conn:
        _bind_on_server(conn, {"prepare_threshold": None})
        assert conn.cursor_factory is psycopg.Cursor
        assert conn.prepare_threshold is None


@pytest.mark.parametrize("make", [gateway_connection, django_connection])
def test_batches_round_trip_exactly(url: str, make: Callable[[str], Any]) -> None:
    clock = FakeClock(1_764_160_000.1)
    store = Store(lambda: make(url), POSTGRESQL, clock=clock, settings_ttl=0)
    queue = f"binding-{make.__name__}"
    try:
        # Several runs of each statement: the first ones unprepared, then prepared.
        for round_ in range(STORE_PREPARE_THRESHOLD + 3):
            specs = [
                EnqueueSpec(
                    orjson.dumps(body),
                    key=None,
                    delay=0.0,
                    group=None,
                    priority=k % 3,
                    ttl=None if k % 2 else 3600.25,
                )
                for k, body in enumerate(BODIES)
            ]
            results = store.run([Enqueue(queue, specs[:2]), Enqueue(queue, specs[2:])])
            ids = [int(r.id) for batch in results for r in batch]  # type: ignore[union-attr]
            assert ids == sorted(ids) and len(set(ids)) == len(BODIES), round_
            (leased,) = store.run([Lease(queue, 100)])
            assert isinstance(leased, LeaseResult)
            got = {int(d.id): d for d in leased.delivered}
            assert sorted(got) == ids
            for msg_id, spec in zip(ids, specs, strict=True):
                assert got[msg_id].body == spec.body_json.decode()
                assert got[msg_id].priority == spec.priority
            with make(url) as conn:
                rows = conn.execute(
                    "SELECT id, visible_at, enqueued_at, expires_at FROM leasecast_message "
                    "WHERE id = ANY(%s)",
                    (ids,),
                ).fetchall()
            now = clock()
            for _, _, enqueued_at, expires_at in rows:
                assert enqueued_at == now  # a float read back exactly
                assert expires_at in (None, now + 3600.25)
            acked = store.run([Ack(d.receipt) for d in leased.delivered])
            assert all(isinstance(a, AckResult) for a in acked)
            # A second ack of the same receipts finds nothing to delete.
            again = store.run([Ack(d.receipt) for d in leased.delivered])
            assert not any(isinstance(a, AckResult) for a in again)
            clock.advance(0.37)
    finally:
        store.close()


@pytest.mark.parametrize("make", [gateway_connection, django_connection])
def test_a_stale_and_the_current_receipt_of_one_message_in_one_batch(
    url: str, make: Callable[[str], Any]
) -> None:
    clock = FakeClock(1_764_170_000.0)
    store = Store(lambda: make(url), POSTGRESQL, clock=clock, settings_ttl=0)
    queue = f"twice-{make.__name__}"
    try:
        for _ in range(STORE_PREPARE_THRESHOLD + 1):
            store.run([Enqueue(queue, [EnqueueSpec(b'"x"'), EnqueueSpec(b'"y"')])])
            (first,) = store.run([Lease(queue, 2, visibility_timeout=5)])
            assert isinstance(first, LeaseResult) and len(first.delivered) == 2
            clock.advance(6)  # both leases time out; the next round leases them again
            (second,) = store.run([Lease(queue, 2, visibility_timeout=5)])
            assert isinstance(second, LeaseResult) and len(second.delivered) == 2
            old_x, old_y = first.delivered
            new_x, new_y = second.delivered
            # One id twice (stale, then current), and a batch of distinct ids.
            results = store.run([Ack(old_x.receipt), Ack(new_x.receipt)])
            assert [isinstance(r, AckResult) for r in results] == [False, True]
            results = store.run([Ack(old_y.receipt)])
            assert [isinstance(r, AckResult) for r in results] == [False]
            results = store.run([Ack(new_y.receipt), Ack(new_x.receipt)])
            assert [isinstance(r, AckResult) for r in results] == [True, False]
    finally:
        store.close()
