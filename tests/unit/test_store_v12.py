"""Store rules of protocol 1.2 on real SQLite and PostgreSQL: one op's failure
fails that op alone, and a staged transaction belongs to its first stager."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import orjson

from gateway.core.errors import Forbidden, Invalid, ProtocolError, Unavailable
from gateway.core.protocol import EnqueueSpec
from gateway.store import (
    AbortTxn,
    CommitTxn,
    Enqueue,
    Lease,
    LeaseResult,
    Stage,
    Stats,
    Store,
    TxnResult,
)
from gateway.store.txn import Txn


def msg(body: object) -> EnqueueSpec:
    return EnqueueSpec(orjson.dumps(body))


def one(store: Store, op: Any) -> Any:
    (result,) = store.run([op])
    return result


class CountingStore(Store):
    """A real store that counts the transactions it opens (a rerun opens more)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.transactions = 0

    @contextmanager
    def transaction(self, *, relaxed: bool = False) -> Iterator[Txn]:
        self.transactions += 1
        with super().transaction(relaxed=relaxed) as txn:
            yield txn


def counting(store: Store) -> CountingStore:
    """A counting store on the same database, clock and settings as ``store``."""
    return CountingStore(
        store._connect,
        store.dialect,
        clock=store._clock,
        defaults=store._queues.defaults,
        settings_ttl=store._queues.ttl,
    )


# -- one failing op in a group-commit batch (issue 22.8)


def test_a_failing_operator_op_fails_alone_and_its_neighbours_land_once(
    store: Store, queue: str
) -> None:
    """A partition number past the column's range fails its Stage in the database
    (SQLite: OverflowError binding it; PostgreSQL: integer out of range). Before,
    the whole batch was rolled back and every op run again on its own."""
    counted = counting(store)
    bad = Stage(f"{queue}-t", 10**22, queue, [msg("staged")])
    results = counted.run(
        [Enqueue(queue, [msg("a")]), bad, Enqueue(queue, [msg("b")]), Stats(queue)]
    )
    counted.close()
    assert isinstance(results[1], Unavailable)
    assert [r.duplicate for r in results[0] + results[2]] == [False, False]
    assert results[3].visible == 2  # the op after the failure saw both enqueues
    assert counted.transactions == 1  # one commit: nothing was rolled back and run again
    got = one(store, Lease(queue, 10, None))
    assert isinstance(got, LeaseResult)
    assert [d.body for d in got.delivered] == ['"a"', '"b"']  # each exactly once


def test_a_refused_operator_op_undoes_what_it_wrote(store: Store, queue: str) -> None:
    """A refusal changes nothing even when the op wrote first (the claim of a name)."""
    txn = f"{queue}-t"
    assert isinstance(one(store, Stage(txn, 0, queue, [msg(1)], "token:1")), TxnResult)
    refused = store.run([Enqueue(queue, [msg("x")]), CommitTxn(txn, None, "token:2")])
    assert isinstance(refused[1], Forbidden)
    assert one(store, Stats(queue)).visible == 1  # the enqueue landed, the commit did not
    assert one(store, CommitTxn(txn, None, "token:1")).messages == 1


def test_a_failing_hot_op_is_retried_alone_and_the_others_land_once(
    store: Store, queue: str
) -> None:
    """Hot ops run without savepoints: the batch is rerun around the failure, in order."""
    bad = Enqueue(queue, [EnqueueSpec(b"\xff\xfe")])  # not UTF-8: the insert fails
    ops: list[Any] = [Enqueue(queue, [msg(1)]), Lease(f"{queue}-other", 1, None), bad]
    ops += [Enqueue(queue, [msg(2)]), Stats(queue)]
    results = store.run(ops)
    assert isinstance(results[2], Unavailable)
    assert not any(isinstance(r, ProtocolError) for i, r in enumerate(results) if i != 2)
    assert results[4].visible == 2
    got = one(store, Lease(queue, 10, None))
    assert [d.body for d in got.delivered] == ["1", "2"]


# -- transactions belong to their first stager (issue 22.2)


def test_another_principal_can_neither_stage_commit_nor_abort(store: Store, queue: str) -> None:
    txn = f"{queue}-orders"
    assert one(store, Stage(txn, 0, queue, [msg(1), msg(2)], "token:orders")).messages == 2
    for op in (
        Stage(txn, 0, queue, [], "token:emails"),  # emptied the partition before
        Stage(txn, 1, queue, [msg("mine")], "token:emails"),
        CommitTxn(txn, None, "token:emails"),
        AbortTxn(txn, "token:emails"),
    ):
        refused = one(store, op)
        assert isinstance(refused, Forbidden), op
        # Says nothing about the transaction: no state, count, queue or owner.
        assert refused.detail == f"transaction {txn!r} belongs to another principal"
    assert one(store, Stats(queue)).visible == 0
    committed = one(store, CommitTxn(txn, None, "token:orders"))
    assert (committed.messages, committed.already) == (2, False)
    assert one(store, Stats(queue)).visible == 2
    # Finished, it stays its owner's: a replay by another is refused too.
    assert isinstance(one(store, CommitTxn(txn, None, "token:emails")), Forbidden)
    assert one(store, CommitTxn(txn, None, "token:orders")).already


def test_an_admin_may_abort_any_transaction_but_not_commit_it(store: Store, queue: str) -> None:
    txn = f"{queue}-stuck"
    one(store, Stage(txn, 0, queue, [msg(1)], "sub:spark-job"))
    assert isinstance(one(store, CommitTxn(txn, None, "token:admin")), Forbidden)
    aborted = one(store, AbortTxn(txn, "token:admin", any_owner=True))
    assert (aborted.messages, aborted.already) == (1, False)
    assert isinstance(one(store, CommitTxn(txn, None, "sub:spark-job")), Invalid)  # aborted


def test_a_commit_before_the_owner_stages_binds_the_name_to_the_committer(
    store: Store, queue: str
) -> None:
    """Before, the owner's later stage answered ``already`` and its messages were lost
    without a word; now the name is the committer's, and the owner is told."""
    txn = f"{queue}-early"
    assert one(store, CommitTxn(txn, None, "token:other")).messages == 0
    assert isinstance(one(store, Stage(txn, 0, queue, [msg(1)], "token:owner")), Forbidden)


def test_staging_after_a_failed_commit_still_works(store: Store, queue: str) -> None:
    """A commit refused for its owner leaves the transaction open and staged."""
    txn = f"{queue}-open"
    one(store, Stage(txn, 0, queue, [msg(1)], "token:1"))
    assert isinstance(one(store, AbortTxn(txn, "token:2")), Forbidden)
    assert one(store, Stage(txn, 1, queue, [msg(2)], "token:1")).state == "staged"
    assert one(store, CommitTxn(txn, None, "token:1")).messages == 2
