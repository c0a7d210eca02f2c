"""Two stores on one PostgreSQL database (two gateway processes) never give a group two heads.

Of a group's messages exactly one, the head, may be leased; the others wait
(``gateway.store.groups``). Each store settles its groups at the end of its
batch, and on PostgreSQL two transactions cannot see each other's uncommitted
settling, so each takes the groups' advisory locks first
(``Dialect.lock_groups``). These tests interleave two batches
deterministically: the first stops inside its transaction (after settling, or
before it) until the second has finished or is waiting on a lock, and then
commits. With the locks, every interleaving leaves each group with exactly one
head. Without them (a dialect whose ``lock_groups`` returns None) the same
interleavings give a group two heads, or messages and no head at all: that is
what the locks are for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import orjson
import pytest

from gateway.core.protocol import EnqueueSpec
from gateway.store import (
    POSTGRESQL,
    Ack,
    Delivered,
    Dialect,
    Enqueue,
    EnsureQueue,
    Lease,
    LeaseResult,
    Op,
    Purge,
    Result,
    Store,
)
from gateway.store.dialects import Statement
from gateway.store.groups import settle
from gateway.store.txn import Txn
from tests.support.databases import postgres_database, postgres_unavailable
from tests.support.fakes import FakeClock

pytestmark = pytest.mark.postgres

PauseAt = Literal["settle", "commit"]
_queues = iter(range(10**6))


class Unguarded(type(POSTGRESQL)):  # type: ignore[misc]
    """PostgreSQL without the per-group advisory locks."""

    def lock_groups(self, keys: Sequence[tuple[int, str]]) -> Statement | None:
        return None


UNGUARDED: Dialect = Unguarded()


class PausingStore(Store):
    """A store whose next transaction stops inside, until the test lets it go.

    ``pause_at="commit"``: after settling its groups (holding their locks),
    just before ``COMMIT``. ``pause_at="settle"``: after its ops, before
    settling (so it holds the row locks of what it changed, not the groups').
    """

    def __init__(self, *args: Any, pause_at: PauseAt, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pause_at = pause_at
        self.reached = threading.Event()
        self.go = threading.Event()
        self.armed = True

    @contextmanager
    def transaction(self, *, relaxed: bool = False) -> Iterator[Txn]:
        with super().transaction(relaxed=relaxed) as txn:
            yield txn
            if self.armed:
                self.armed = False  # a retry of a failed batch runs through
                if self.pause_at == "commit":
                    settle(txn)  # the store settles next; then it finds nothing left
                self.reached.set()
                if not self.go.wait(30):
                    raise TimeoutError("the test never let the paused transaction go")


@pytest.fixture(scope="module")
def connect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Any]]:
    reason = postgres_unavailable()
    if reason:
        pytest.skip(reason)
    import psycopg

    var: Path = tmp_path_factory.mktemp("groups-concurrency")
    with postgres_database(var) as env:
        url = env["DATABASE_URL"]
        yield lambda: psycopg.connect(url, autocommit=True)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000.0)


@pytest.fixture
def queue(connect: Callable[[], Any], clock: FakeClock) -> str:
    name = f"race{next(_queues)}"
    # Created beforehand: two first uses racing would wait on the queue's row.
    store = Store(connect, POSTGRESQL, clock=clock, settings_ttl=0)
    store.run([EnsureQueue(name)])
    store.close()
    return name


def spec(body: str, group: str = "g") -> EnqueueSpec:
    return EnqueueSpec(orjson.dumps(body), group=group)


def lock_waits(connect: Callable[[], Any]) -> int:
    """How many sessions on this test's database wait for a lock now."""
    with connect() as conn:
        row = conn.execute(
            "SELECT COUNT(*) FROM pg_locks WHERE NOT granted AND pid IN "
            "(SELECT pid FROM pg_stat_activity WHERE datname = current_database())"
        ).fetchone()
    return int(row[0])


def race(
    connect: Callable[[], Any],
    clock: FakeClock,
    dialect: Dialect,
    first: Sequence[Op],
    second: Sequence[Op],
    pause_at: PauseAt,
) -> tuple[list[Result], list[Result], bool]:
    """Run ``first`` until it pauses inside its transaction, then ``second`` until it
    finishes or waits on a lock, then let ``first`` commit.

    Returns both batches' results and whether ``second`` had to wait for ``first``.
    """
    a = PausingStore(connect, dialect, clock=clock, settings_ttl=0, pause_at=pause_at)
    b = Store(connect, dialect, clock=clock, settings_ttl=0)
    results: dict[str, list[Result]] = {}
    ta = threading.Thread(target=lambda: results.__setitem__("first", a.run(first)))
    tb = threading.Thread(target=lambda: results.__setitem__("second", b.run(second)))
    try:
        ta.start()
        assert a.reached.wait(10), "the first batch never reached its pause"
        tb.start()
        deadline = time.monotonic() + 10
        while tb.is_alive() and not lock_waits(connect):
            assert time.monotonic() < deadline, "the second batch neither ended nor waited"
            time.sleep(0.01)
        waited = tb.is_alive()
    finally:
        a.go.set()
        ta.join(30)
        tb.join(30)
        a.close()
        b.close()
    assert not ta.is_alive() and not tb.is_alive()
    return results["first"], results["second"], waited


def assert_applied(*batches: list[Result]) -> None:
    """No op of these batches was refused or failed."""
    for results in batches:
        assert not any(isinstance(r, Exception) for r in results), results


def group_rows(connect: Callable[[], Any], queue: str, group: str = "g") -> list[tuple[int, int]]:
    """(id, stored state) of the group's messages that are not dead."""
    with connect() as conn:
        rows = conn.execute(
            "SELECT m.id, m.state FROM leasecast_message AS m JOIN leasecast_queue AS q "
            'ON q.id = m.queue_id WHERE q.name = %s AND m."group" = %s AND m.state <> 2 '
            "ORDER BY m.id",
            (queue, group),
        ).fetchall()
    return [(int(i), int(s)) for i, s in rows]


def heads(connect: Callable[[], Any], queue: str) -> list[int]:
    """Ids of the group's heads: READY, LEASED or DELAYED."""
    return [i for i, state in group_rows(connect, queue) if state in (0, 1, 3)]


def leasable(connect: Callable[[], Any], clock: FakeClock, queue: str) -> list[Delivered]:
    store = Store(connect, POSTGRESQL, clock=clock, settings_ttl=0)
    (result,) = store.run([Lease(queue, 10)])
    store.close()
    assert isinstance(result, LeaseResult)
    return result.delivered


def leased_head(connect: Callable[[], Any], clock: FakeClock, queue: str) -> Delivered:
    """Enqueue the group's first message and lease it: the head, in flight."""
    store = Store(connect, POSTGRESQL, clock=clock, settings_ttl=0)
    store.run([Enqueue(queue, [spec("head")])])
    store.close()
    (head,) = leasable(connect, clock, queue)
    return head


# -- two enqueues to an empty group --------------------------------------------


def test_two_enqueues_to_an_empty_group_make_one_head(
    connect: Callable[[], Any], clock: FakeClock, queue: str
) -> None:
    first, second, waited = race(
        connect,
        clock,
        POSTGRESQL,
        [Enqueue(queue, [spec("a")])],
        [Enqueue(queue, [spec("b")])],
        "commit",
    )
    assert_applied(first, second)
    assert waited, "the second settling must wait for the first one's group lock"
    assert len(group_rows(connect, queue)) == 2
    assert len(heads(connect, queue)) == 1
    assert len(leasable(connect, clock, queue)) == 1


def test_without_the_group_locks_two_enqueues_make_two_heads(
    connect: Callable[[], Any], clock: FakeClock, queue: str
) -> None:
    _, _, waited = race(
        connect,
        clock,
        UNGUARDED,
        [Enqueue(queue, [spec("a")])],
        [Enqueue(queue, [spec("b")])],
        "commit",
    )
    assert not waited
    # Each transaction saw the group without a head and made its own message one.
    assert len(heads(connect, queue)) == 2
    assert len(leasable(connect, clock, queue)) == 2  # two messages of one group in flight


@pytest.mark.parametrize("pause_at", ["settle", "commit"])
def test_two_enqueues_interleaved_before_settling_make_one_head(
    connect: Callable[[], Any], clock: FakeClock, queue: str, pause_at: PauseAt
) -> None:
    race(
        connect,
        clock,
        POSTGRESQL,
        [Enqueue(queue, [spec("a1"), spec("a2")])],
        [Enqueue(queue, [spec("b1")]), Enqueue(queue, [spec("b2")])],
        pause_at,
    )
    assert len(group_rows(connect, queue)) == 4
    assert len(heads(connect, queue)) == 1
    assert len(leasable(connect, clock, queue)) == 1


# -- the head acked while a message is enqueued ----------------------------------


@pytest.mark.parametrize("pause_at", ["settle", "commit"])
@pytest.mark.parametrize("ack_first", [True, False], ids=["ack-first", "enqueue-first"])
def test_ack_of_the_head_racing_an_enqueue_leaves_the_new_message_the_head(
    connect: Callable[[], Any], clock: FakeClock, queue: str, pause_at: PauseAt, ack_first: bool
) -> None:
    head = leased_head(connect, clock, queue)
    ack: list[Op] = [Ack(head.receipt)]
    enqueue: list[Op] = [Enqueue(queue, [spec("next")])]
    first, second, waited = race(
        connect,
        clock,
        POSTGRESQL,
        ack if ack_first else enqueue,
        enqueue if ack_first else ack,
        pause_at,
    )
    assert_applied(first, second)
    if pause_at == "commit":
        assert waited, "the second settling must wait for the first one's group lock"
    rows = group_rows(connect, queue)
    assert len(rows) == 1 and heads(connect, queue) == [rows[0][0]]  # never headless
    (got,) = leasable(connect, clock, queue)
    assert orjson.loads(got.body) == "next"


@pytest.mark.parametrize("ack_first", [True, False], ids=["ack-first", "enqueue-first"])
def test_without_the_group_locks_the_race_leaves_a_group_without_a_head(
    connect: Callable[[], Any], clock: FakeClock, queue: str, ack_first: bool
) -> None:
    head = leased_head(connect, clock, queue)
    ack: list[Op] = [Ack(head.receipt)]
    enqueue: list[Op] = [Enqueue(queue, [spec("next")])]
    race(
        connect,
        clock,
        UNGUARDED,
        ack if ack_first else enqueue,
        enqueue if ack_first else ack,
        "commit",
    )
    assert len(group_rows(connect, queue)) == 1
    assert heads(connect, queue) == []  # "next" waits for a head that is gone
    assert leasable(connect, clock, queue) == []


# -- a purge racing the head's ack and an enqueue --------------------------------


@pytest.mark.parametrize("pause_at", ["settle", "commit"])
def test_purge_racing_an_ack_and_an_enqueue_leaves_one_head(
    connect: Callable[[], Any], clock: FakeClock, queue: str, pause_at: PauseAt
) -> None:
    # The head is in flight (a purge spares it); "waiting" waits behind it.
    store = Store(connect, POSTGRESQL, clock=clock, settings_ttl=0)
    store.run([Enqueue(queue, [spec("head"), spec("waiting")])])
    store.close()
    (head,) = leasable(connect, clock, queue)
    # The purge deletes "waiting" while the other batch acks the head and
    # promotes the earliest waiting message it sees: "waiting". Unless the
    # purge settles the group too, that promotion finds its row deleted and
    # "new" is left without a head. (Paused before settling, the two wait for
    # each other; PostgreSQL breaks the deadlock, and the store retries.)
    first, second, waited = race(
        connect,
        clock,
        POSTGRESQL,
        [Purge(queue)],
        [Ack(head.receipt), Enqueue(queue, [spec("new")])],
        pause_at,
    )
    assert_applied(first, second)  # (after the store's retry, if they deadlocked)
    assert waited
    rows = group_rows(connect, queue)
    assert len(rows) == 1 and heads(connect, queue) == [rows[0][0]], rows
    (got,) = leasable(connect, clock, queue)
    assert orjson.loads(got.body) == "new"
