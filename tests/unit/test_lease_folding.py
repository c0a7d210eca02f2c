"""A lease round in the transaction of the enqueues before it (the latency path).

An idle worker's delivery leaves with the enqueue's commit: the committer
folds the pump's next round into a batch that enqueues, runs lease rounds
after the batch's other ops, and the store says which queues such a round
caught up with, so their pumps are not woken for a round that would find
nothing. Real SQLite and PostgreSQL stores (tests/unit/conftest.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from gateway.engine.committer import Committer
from gateway.store import POSTGRESQL, SQLITE, Ack, Enqueue, Lease, LeaseResult, Result, Store
from tests.support.store import lease, msg


def test_a_round_after_the_enqueue_catches_the_queue_up(store: Store, queue: str) -> None:
    _, leased = store.run([Enqueue(queue, [msg("a")]), Lease(queue, 10)])
    assert isinstance(leased, LeaseResult)
    assert [d.body for d in leased.delivered] == ['"a"']
    assert store.woken == {queue}
    assert store.caught_up == {queue}


def test_a_round_before_the_enqueue_does_not(store: Store, queue: str) -> None:
    leased, _ = store.run([Lease(queue, 10), Enqueue(queue, [msg("a")])])
    assert isinstance(leased, LeaseResult) and leased.delivered == []
    assert store.woken == {queue}
    assert store.caught_up == set()


def test_a_group_head_promoted_at_commit_is_a_wake_after_the_round(
    store: Store, queue: str
) -> None:
    store.run([Enqueue(queue, [msg("1", group="g"), msg("2", group="g")])])
    (first,) = lease(store, queue).delivered
    # The ack ends the head; the next message of the group becomes the head
    # when the transaction settles its groups, after the round ran.
    _, leased = store.run([Ack(first.receipt), Lease(queue, 10)])
    assert isinstance(leased, LeaseResult) and leased.delivered == []
    assert queue in store.woken
    assert store.caught_up == set()
    (second,) = lease(store, queue).delivered
    assert second.body == '"2"'


async def test_a_round_waiting_in_a_batch_runs_after_its_enqueues(
    database: tuple[str, Callable[[], Any]], queue: str
) -> None:
    kind, connect = database
    # A store of the committer's thread (the fixture's belongs to this one).
    dialect = SQLITE if kind == "sqlite" else POSTGRESQL
    committer = Committer(lambda: Store(connect, dialect, clock=time.time))
    results: dict[str, Result] = {}
    done = asyncio.Event()

    def keep(name: str) -> Callable[[Result], None]:
        def got(result: Result) -> None:
            results[name] = result
            if len(results) == 3:
                done.set()

        return got

    # The first op starts a batch at once; the next two wait and share one,
    # the round asked for before the enqueue.
    committer.submit(Enqueue(queue + "-other", [msg("x")]), keep("other"))
    committer.submit(Lease(queue, 10), keep("lease"))
    committer.submit(Enqueue(queue, [msg("a")]), keep("enqueue"))
    try:
        await asyncio.wait_for(done.wait(), 10)
    finally:
        committer.close()
    leased = results["lease"]
    assert isinstance(leased, LeaseResult)
    assert [d.body for d in leased.delivered] == ['"a"']
    assert committer.batches == 2
