"""The work-queue store: every durable read and write of the hot path.

=================  ==========================================================
``ops``            the vocabulary: operations and their typed results
``runner``         :class:`Store`: one transaction per batch of ops
``txn``            one open transaction, and the queue settings cache
``dialects``       the SQL that differs between SQLite and PostgreSQL
``enqueue``        inserts, idempotency keys, bounded queues
``leasing``        lease rounds, ack/nack/reject/extend/release, expiry
``groups``         ordering groups: one head per group, settled per batch
``operator``       stats, settings, browsing, purge, redrive, requeue, delete, cancel
``staging``        staged transactions (the Spark sink)
=================  ==========================================================

A new op is a dataclass in ``ops``, a function in the module it belongs to,
and one ``case`` in ``runner._apply_one``. A new message column is one line
of ``dialects.INSERT_COLUMNS`` and the row built in ``enqueue.insert``.
"""

from __future__ import annotations

from gateway.store.dialects import POSTGRESQL, SQLITE, Dialect
from gateway.store.ops import (
    AbortTxn,
    Ack,
    AckResult,
    AllStats,
    Browse,
    BrowsedMessage,
    BrowsePage,
    Cancel,
    CancelResult,
    CommitTxn,
    Configure,
    DeleteMessage,
    Delivered,
    Enqueue,
    EnqueueResult,
    EnsureQueue,
    Extend,
    Lease,
    LeaseResult,
    MessageCondition,
    Nack,
    Op,
    Purge,
    QueueStats,
    Redrive,
    Reject,
    Release,
    RequeueMessage,
    Result,
    Returns,
    Stage,
    Stats,
    TxnResult,
)
from gateway.store.runner import NOTIFY_CHANNEL, Store

__all__ = [
    "NOTIFY_CHANNEL",
    "POSTGRESQL",
    "SQLITE",
    "AbortTxn",
    "Ack",
    "AckResult",
    "AllStats",
    "Browse",
    "BrowsePage",
    "BrowsedMessage",
    "Cancel",
    "CancelResult",
    "CommitTxn",
    "Configure",
    "DeleteMessage",
    "Delivered",
    "Dialect",
    "Enqueue",
    "EnqueueResult",
    "EnsureQueue",
    "Extend",
    "Lease",
    "LeaseResult",
    "MessageCondition",
    "Nack",
    "Op",
    "Purge",
    "QueueStats",
    "Redrive",
    "Reject",
    "Release",
    "RequeueMessage",
    "Result",
    "Returns",
    "Stage",
    "Stats",
    "Store",
    "TxnResult",
]
