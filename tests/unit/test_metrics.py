"""Metrics (protocol 1.1: Metrics): the store's durable queue counters on real
SQLite and PostgreSQL, one test per path that moves messages; the in-memory
registry; the exposition; sharing through a real Redis.

The HTTP endpoint, its auth, the socket and HTTP enqueue paths and two
processes sharing Redis and PostgreSQL are in tests/integration/test_metrics.py.
"""

from __future__ import annotations

import sqlite3
import uuid
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.core.errors import QueueFull, StaleReceipt
from gateway.runtime import metrics
from gateway.store import (
    Ack,
    CommitTxn,
    Configure,
    Enqueue,
    Lease,
    LeaseResult,
    Nack,
    Redrive,
    Reject,
    RequeueMessage,
    Stage,
    Store,
)
from tests.support.fakes import FakeClock
from tests.support.store import msg, one

# -- the store's counters -------------------------------------------------------------


def counters(store: Store, queue: str) -> dict[str, int]:
    """The queue's counters as a scrape reads them (summed over shards);
    ``dead_lettered:REASON`` per reason."""
    with store.transaction() as txn:
        rows = txn.exec(
            "SELECT c.name, c.label, SUM(c.value) FROM leasecast_queue_counter AS c "
            "JOIN leasecast_queue AS q ON q.id = c.queue_id WHERE q.name = %s "
            "GROUP BY c.name, c.label",
            (queue,),
        ).fetchall()
    return {
        (f"{name}:{label}" if label else name): int(n)
        for name, label, n in rows
        if not name.startswith("lease_seconds")  # the histogram's rows: see its own test
    }


def lease(store: Store, queue: str, n: int = 10, timeout: float | None = None) -> LeaseResult:
    result = one(store, Lease(queue, n, timeout))
    assert isinstance(result, LeaseResult)
    return result


def test_enqueue_counts_each_new_message_once(store: Store, queue: str) -> None:
    one(store, Enqueue(queue, [msg(1), msg(2)]))  # plain: one INSERT for the run
    one(store, Enqueue(queue, [msg(3, key="k"), msg(4, key="k")]))  # a duplicate inside
    one(store, Enqueue(queue, [msg(5, key="k")]))  # a duplicate of an earlier batch
    assert counters(store, queue) == {"enqueued": 3}


def test_a_batch_of_runs_counts_every_op(store: Store, queue: str) -> None:
    other = queue + "-b"
    store.run(
        [Enqueue(queue, [msg(1)]), Enqueue(other, [msg(2), msg(3)]), Enqueue(queue, [msg(4)])]
    )
    assert counters(store, queue) == {"enqueued": 2}
    assert counters(store, other) == {"enqueued": 2}


def test_lease_ack_and_redelivery(store: Store, queue: str, clock: FakeClock) -> None:
    one(store, Enqueue(queue, [msg(1), msg(2)]))
    first = lease(store, queue, timeout=5).delivered
    assert len(first) == 2
    one(store, Ack(first[0].receipt))  # a plain ack
    clock.advance(5)  # the second lease times out
    (again,) = lease(store, queue).delivered
    assert again.deliveries == 2
    one(store, Nack(queue, again.receipt))
    (third,) = lease(store, queue).delivered
    store.run([Ack(third.receipt), Ack(third.receipt)])  # repeated in a batch: acks once
    assert isinstance(one(store, Ack(third.receipt)), StaleReceipt)
    assert counters(store, queue) == {
        "enqueued": 2,
        "delivered": 4,
        "redelivered": 2,
        "acked": 2,
    }


def test_ack_with_follow_ups_counts_the_ack_and_the_enqueues(store: Store, queue: str) -> None:
    other = queue + "-next"
    one(store, Enqueue(queue, [msg(1)]))
    (d,) = lease(store, queue).delivered
    one(store, Ack(d.receipt, [(other, msg("a")), (other, msg("b")), (queue, msg("c"))]))
    assert counters(store, queue) == {"enqueued": 2, "delivered": 1, "acked": 1}
    assert counters(store, other) == {"enqueued": 2}
    # A stale ack with follow-ups counts nothing.
    assert isinstance(one(store, Ack(d.receipt, [(other, msg("x"))])), StaleReceipt)
    assert counters(store, other) == {"enqueued": 2}


def test_staged_commit_counts_once(store: Store, queue: str) -> None:
    txn = f"{queue}-spark-b0"
    one(store, Stage(txn, 0, queue, [msg(1), msg(2)]))
    one(store, Stage(txn, 1, queue, [msg(3)]))
    assert counters(store, queue) == {}  # staged is not enqueued
    assert one(store, CommitTxn(txn)).messages == 3
    assert one(store, CommitTxn(txn)).already  # a replayed commit
    assert counters(store, queue) == {"enqueued": 3}


def test_dead_letters_by_reason(store: Store, queue: str, clock: FakeClock) -> None:
    # max_deliveries is 3 in the store fixture: the fourth lease dead-letters.
    one(store, Enqueue(queue, [msg("poison"), msg("bad"), msg("old", ttl=10)]))
    leased = lease(store, queue, 2, timeout=1).delivered
    bad = next(d for d in leased if d.body == '"bad"')
    one(store, Reject(bad.receipt))
    for _ in range(2):
        clock.advance(1)
        assert [d.body for d in lease(store, queue, 1, timeout=1).delivered] == ['"poison"']
    clock.advance(1)
    got = lease(store, queue, 5, timeout=1)
    assert got.dead_lettered == 1 and [d.body for d in got.delivered] == ['"old"']
    clock.advance(10)  # "old" expires in flight
    lease(store, queue)
    found = counters(store, queue)
    assert found["dead_lettered:rejected"] == 1
    assert found["dead_lettered:max_deliveries"] == 1
    assert found["dead_lettered:expired"] == 1
    assert found["delivered"] == 5 and found["redelivered"] == 2


def test_overflow_dead_letters_and_a_refusal_counts_nothing(store: Store, queue: str) -> None:
    one(store, Configure(queue, {"max_length": 2, "overflow": "drop_oldest"}))
    one(store, Enqueue(queue, [msg(1), msg(2), msg(3)]))
    assert counters(store, queue) == {"enqueued": 3, "dead_lettered:overflow": 1}
    full = queue + "-full"
    one(store, Configure(full, {"max_length": 1, "overflow": "drop_newest"}))
    one(store, Enqueue(full, [msg(1)]))
    assert isinstance(one(store, Enqueue(full, [msg(2, key="k")])), QueueFull)
    # A refused op among others in one batch: the others count, it does not.
    results = store.run([Enqueue(queue, [msg(4)]), Enqueue(full, [msg(3)])])
    assert isinstance(results[1], QueueFull)
    assert counters(store, full) == {"enqueued": 1}
    assert counters(store, queue)["enqueued"] == 4


def test_requeue_and_redrive_count_as_enqueues(store: Store, queue: str) -> None:
    one(store, Enqueue(queue, [msg(1), msg(2), msg(3)]))
    leased = lease(store, queue).delivered
    for d in leased:
        one(store, Reject(d.receipt))
    assert one(store, RequeueMessage(queue, int(leased[0].id))) == 1
    assert one(store, RequeueMessage(queue, int(leased[0].id))) == 0  # visible now: unchanged
    assert one(store, Redrive(queue)) == 2
    found = counters(store, queue)
    assert found["enqueued"] == 3 + 1 + 2
    assert found["dead_lettered:rejected"] == 3


def test_a_failed_batch_counts_what_its_retries_commit(store: Store, queue: str) -> None:
    from gateway.core.protocol import EnqueueSpec

    bad = Enqueue(queue, [EnqueueSpec(b"\xff\xfe", None, 0.0)])  # not UTF-8: the insert fails
    # The batch rolls back (its counts with it), then each op runs alone.
    results = store.run([Enqueue(queue, [msg(1)]), bad, Enqueue(queue, [msg(2)])])
    assert [type(r).__name__ for r in results] == ["list", "Unavailable", "list"]
    assert counters(store, queue) == {"enqueued": 2}


def test_each_run_returns_what_its_commits_counted(store: Store, queue: str) -> None:
    """The dashboard's per-process rates (dashboard.live) see every path too:
    the Spark sink's staged commits showed 0 enqueued/s before (issue 13). The
    store calls no metrics: each run returns its counts (``Store.counted``),
    which the committer hands to the runtime's registry, as here."""
    registry = metrics.Registry("host:1")

    def counted() -> None:
        registry.queue_counted(store.counted)

    one(store, Enqueue(queue, [msg(1), msg(2)]))
    assert store.counted == {(queue, "enqueued", ""): 2}
    counted()
    one(store, Stage(f"{queue}-b0", 0, queue, [msg(3), msg(4), msg(5)]))
    assert store.counted == {}  # staged: nothing is in the queue yet
    one(store, CommitTxn(f"{queue}-b0"))
    counted()
    (d,) = lease(store, queue, 1).delivered
    counted()
    one(store, Reject(d.receipt))
    counted()
    one(store, RequeueMessage(queue, int(d.id)))
    counted()
    mine = registry.queue_counters()[queue]
    assert (mine["enqueued"], mine["delivered"], mine["dead_lettered"]) == (2 + 3 + 1, 1, 1)


# -- the registry and the exposition ------------------------------------------------


def test_registry_totals_pending_and_sockets() -> None:
    registry = metrics.Registry("host:1")
    registry.count("topic_published", ("t",), 2)
    registry.count("topic_dropped", ("t", "drop_oldest"), 1)
    registry.count("topic_published", ("t",), 0)  # nothing
    pending = registry.take_pending()
    assert pending == {("topic_published", ("t",)): 2, ("topic_dropped", ("t", "drop_oldest")): 1}
    registry.count("topic_published", ("t",), 1)
    registry.restore_pending(pending)  # a failed flush gives them back
    assert registry.take_pending()[("topic_published", ("t",))] == 3
    assert registry.totals()[("topic_published", ("t",))] == 3
    registry.socket_opened("worker")
    registry.socket_opened("worker")
    registry.socket_closed("worker")
    registry.socket_closed("subscriber")  # never below 0
    assert registry.sockets() == {"worker": 1, "subscriber": 0}


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_render_names_types_and_labels() -> None:
    figures = metrics.Deployment(
        queue_counters={
            ("q<1>", "enqueued", ""): 5,
            ("q<1>", "dead_lettered", "expired"): 2,
        },
        queue_messages={("q<1>", "visible"): 3, ("q<1>", "dead"): 2},
        counters={
            ("topic_published", ('t"x',)): 7,
            ("topic_dropped", ("t", "drop_newest")): 1,
            ("slow_consumers_closed", ("t",)): 1,
        },
        sockets={"h:1": {"worker": 2}},
    )
    text = metrics.render(figures)
    assert b"# TYPE leasecast_queue_enqueued_total counter" in text
    assert b"# TYPE leasecast_queue_messages gauge" in text
    assert b"# TYPE leasecast_sockets gauge" in text
    samples = _samples(text)
    assert samples[("leasecast_queue_enqueued_total", (("queue", "q<1>"),))] == 5
    assert (
        samples[("leasecast_queue_dead_lettered_total", (("queue", "q<1>"), ("reason", "expired")))]
        == 2
    )
    assert samples[("leasecast_queue_messages", (("queue", "q<1>"), ("state", "visible")))] == 3
    assert samples[("leasecast_topic_published_total", (("topic", 't"x'),))] == 7
    key = (("policy", "drop_newest"), ("topic", "t"))
    assert samples[("leasecast_topic_dropped_total", key)] == 1
    assert samples[("leasecast_slow_consumers_closed_total", (("topic", "t"),))] == 1
    assert samples[("leasecast_sockets", (("kind", "worker"), ("process", "h:1")))] == 2


def test_queue_figures_from_the_database(database: tuple[str, Any], queue: str) -> None:
    kind, connect = database
    clock = FakeClock(2_000_000.0)
    from gateway.store import POSTGRESQL, SQLITE

    store = Store(connect, SQLITE if kind == "sqlite" else POSTGRESQL, clock=clock)
    try:
        one(store, Enqueue(queue, [msg(1), msg(2), msg(3, delay=60), msg(4, ttl=5)]))
        (d,) = lease(store, queue, 1, timeout=100).delivered
        clock.advance(10)  # message 4 is past its ttl, not yet swept
        conn = connect()
        try:
            cursor = conn.cursor()
            figures = metrics.read_queue_figures(
                cursor, clock(), "?" if isinstance(conn, sqlite3.Connection) else "%s"
            )
        finally:
            conn.close()
    finally:
        store.close()
    states = {s: figures.queue_messages[(queue, s)] for s in metrics.STATES}
    assert states == {"visible": 1, "delayed": 1, "in_flight": 1, "dead": 1}, d
    assert figures.queue_counters[(queue, "enqueued", "")] == 4
    assert figures.queue_counters[(queue, "delivered", "")] == 1


# -- sharing through Redis ----------------------------------------------------------


@pytest.fixture
def redis_client() -> Any:
    from tests.support.databases import REDIS_URL, redis_unavailable

    reason = redis_unavailable()
    if reason:
        pytest.skip(reason)
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


def test_two_registries_share_through_redis_without_double_counting(redis_client: Any) -> None:
    prefix = f"lctm{uuid.uuid4().hex[:8]}"
    share = metrics.RedisShare(redis_client, prefix)
    a, b = metrics.Registry("a:1"), metrics.Registry("b:2")
    try:
        a.count("topic_published", ("t",), 3)
        b.count("topic_published", ("t",), 4)
        b.count("topic_dropped", ("t", "drop_oldest"), 1)
        a.socket_opened("subscriber")
        b.socket_opened("worker")
        share.flush(a)
        share.flush(b)
        share.flush(a)  # nothing new: nothing added twice
        counters, sockets = share.read()
        assert counters == {
            ("topic_published", ("t",)): 7,
            ("topic_dropped", ("t", "drop_oldest")): 1,
        }
        assert sockets == {"a:1": {"subscriber": 1}, "b:2": {"worker": 1}}
        # A process that stops flushing: its sockets expire, its counts stay.
        assert 0 < redis_client.ttl(f"{prefix}:metrics:sockets:b:2") <= metrics.SOCKETS_TTL
        redis_client.delete(f"{prefix}:metrics:sockets:b:2")  # as the expiry would
        counters, sockets = share.read()
        assert counters[("topic_published", ("t",))] == 7 and "b:2" not in sockets
    finally:
        for key in redis_client.scan_iter(match=f"{prefix}:*"):
            redis_client.delete(key)


def test_a_failed_flush_keeps_the_counts(redis_client: Any) -> None:
    import redis

    registry = metrics.Registry("c:3")
    registry.count("topic_delivered", ("t",), 5)
    broken = metrics.RedisShare(redis.Redis(host="127.0.0.1", port=1, socket_timeout=1), "x")
    with pytest.raises(redis.ConnectionError):
        broken.flush(registry)
    prefix = f"lctm{uuid.uuid4().hex[:8]}"
    share = metrics.RedisShare(redis_client, prefix)
    try:
        share.flush(registry)
        assert share.read()[0] == {("topic_delivered", ("t",)): 5}
    finally:
        for key in redis_client.scan_iter(match=f"{prefix}:*"):
            redis_client.delete(key)


# -- the scope ------------------------------------------------------------------------


def test_the_bare_metrics_scope_allows_metrics_only() -> None:
    from gateway.core.errors import Invalid
    from gateway.core.scopes import Principal, parse_scope

    scraper = Principal.from_scopes("scraper", ["metrics"])
    assert scraper.allows("metrics")
    assert not scraper.allows("admin") and not scraper.allows("enqueue", "q")
    assert Principal.from_scopes("ops", ["admin"]).allows("metrics")
    assert not Principal.from_scopes("w", ["consume:*", "enqueue:*"]).allows("metrics")
    with pytest.raises(Invalid):
        parse_scope("metrics:q")  # bare only


def test_counters_for_topics_past_the_limit_go_to_other() -> None:
    from gateway.runtime.metrics import OTHER_TOPICS, Registry

    registry = Registry("p", max_topics=2)
    for topic in ("a", "b", "c", "d", "a"):
        registry.count("topic_published", (topic,), 1)
    registry.count("topic_dropped", ("e", "drop_oldest"), 3)
    assert registry.totals() == {
        ("topic_published", ("a",)): 2,
        ("topic_published", ("b",)): 1,
        ("topic_published", (OTHER_TOPICS,)): 2,
        ("topic_dropped", (OTHER_TOPICS, "drop_oldest")): 3,
    }
