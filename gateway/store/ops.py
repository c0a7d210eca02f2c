"""The store's vocabulary: the operations it applies and the results it returns.

Every operation is a dataclass (frozen, but for the hot few: see "Hot records"
in ``gateway.core.protocol``) that names the type of its result (``Returns[T]``),
so ``await engine.call(Stats("q"))`` is typed as :class:`QueueStats` and a
reader finds every op and every result here. A refused operation's result is
instead the :class:`~gateway.errors.ProtocolError` that refused it (and then
it changed nothing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Literal, TypeAlias, TypeVar

from gateway.core.errors import ProtocolError
from gateway.core.leases import QueueSettings
from gateway.core.protocol import EnqueueSpec, TaskOutcome
from gateway.core.wire import EnqueuedItem

__all__ = [
    "AbortTxn",
    "Ack",
    "AckResult",
    "Browse",
    "BrowsePage",
    "BrowsedMessage",
    "Cancel",
    "CancelResult",
    "CommitTxn",
    "Configure",
    "DeleteMessage",
    "Delivered",
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
    "TxnResult",
]

T = TypeVar("T")

#: The states a message can be browsed in (protocol 1.1: message browsing).
BrowseState: TypeAlias = Literal["visible", "delayed", "in_flight", "dead"]


class Returns(Generic[T]):
    """Base of every op: ``T`` is the type of its result."""

    __slots__ = ()


# -- results -------------------------------------------------------------------


@dataclass(slots=True)  # a hot record, not frozen (gateway.core.protocol, "Hot records")
class EnqueueResult:
    """The id given to an enqueued message, or the existing id of a duplicate key."""

    id: str
    duplicate: bool

    def as_json(self) -> EnqueuedItem:
        """The wire form ``{"id", "duplicate"}``."""
        return {"id": self.id, "duplicate": self.duplicate}


@dataclass(slots=True)  # a hot record, not frozen (gateway.core.protocol, "Hot records")
class Delivered:
    """One leased message, ready to be sent as a ``deliver`` frame."""

    id: str
    receipt: str
    body: str
    deliveries: int
    #: when the lease ends: its timeout, or the message's ttl if sooner
    expires_at: float
    group: str | None = None
    priority: int = 0


@dataclass(slots=True)
class LeaseResult:
    """What a lease round got: deliveries in queue order, and when to look again."""

    delivered: list[Delivered] = field(default_factory=list)
    dead_lettered: int = 0
    #: earliest time a leased, delayed or expiring message changes state
    next_due: float | None = None


@dataclass(frozen=True, slots=True)
class AckResult:
    """An ack's follow-up results, in order."""

    enqueued: list[EnqueueResult]


@dataclass(frozen=True, slots=True)
class CancelResult:
    """What a cancel did: ``cancelled`` is 1, or 0 if the message was already dead.

    ``receipt`` names the lease the cancel ended (the message was in flight),
    so the socket holding it can be told; None otherwise.
    """

    cancelled: int
    receipt: str | None = None


@dataclass(frozen=True, slots=True)
class TxnResult:
    """What a staging operation did: ``state`` is staged, committed or aborted."""

    state: str
    messages: int
    already: bool = False


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One queue's counts per state and its settings (``GET /api/queues/QUEUE``)."""

    name: str
    visible: int
    delayed: int
    in_flight: int
    dead: int
    oldest_visible_age: float | None
    settings: QueueSettings

    def as_json(self) -> dict[str, Any]:
        """The queue's ``GET`` document."""
        return {
            "name": self.name,
            "visible": self.visible,
            "delayed": self.delayed,
            "in_flight": self.in_flight,
            "dead": self.dead,
            "oldest_visible_age": self.oldest_visible_age,
            **self.settings.as_json(),
        }


@dataclass(frozen=True, slots=True)
class BrowsedMessage:
    """One message as ``GET /api/queues/QUEUE/messages`` shows it."""

    id: str
    state: BrowseState
    body_json: str
    deliveries: int
    enqueued_at: float
    group: str | None
    priority: int
    dead_reason: str | None
    visible_in: float | None
    key: str | None
    expires_in: float | None
    #: when it became or becomes visible (in flight: its lease's end), Unix
    #: seconds; what a conditional requeue or delete names (MessageCondition)
    visible_at: float

    def as_json(self) -> dict[str, Any]:
        """The wire form; ``body`` is the stored JSON, parsed."""
        import orjson

        return {
            "id": self.id,
            "state": self.state,
            "body": orjson.Fragment(self.body_json),
            "deliveries": self.deliveries,
            "enqueued_at": self.enqueued_at,
            "enqueued_at_iso": iso_utc(self.enqueued_at),
            "group": self.group,
            "priority": self.priority,
            "dead_reason": self.dead_reason,
            "visible_in": self.visible_in,
            "key": self.key,
            "expires_in": self.expires_in,
            "visible_at": self.visible_at,
            "visible_at_iso": iso_utc(self.visible_at),
        }


def iso_utc(seconds: float) -> str | None:
    """Unix seconds as ISO 8601 in UTC to the millisecond, ``Z`` for the zone
    (``2026-11-26T03:00:00.250Z``); None if no calendar date has them."""
    try:
        moment = datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return moment.isoformat(timespec="milliseconds").removesuffix("+00:00") + "Z"


@dataclass(frozen=True, slots=True)
class BrowsePage:
    """A page of browsed messages; ``next`` is the ``after`` of the next page, or None."""

    messages: list[BrowsedMessage]
    next: str | None

    def as_json(self) -> dict[str, Any]:
        """``{"messages": [...], "next": ID or null}``."""
        return {"messages": [m.as_json() for m in self.messages], "next": self.next}


# -- operations ------------------------------------------------------------------


@dataclass(slots=True)  # a hot record, not frozen (gateway.core.protocol, "Hot records")
class Enqueue(Returns[list[EnqueueResult]]):
    """Enqueue messages to one queue, all or nothing."""

    queue: str
    messages: Sequence[EnqueueSpec]


@dataclass(frozen=True, slots=True)
class Lease(Returns[LeaseResult]):
    """Lease up to ``n`` visible messages for ``visibility_timeout`` (None: the queue's)."""

    queue: str
    n: int
    visibility_timeout: float | None = None


@dataclass(slots=True)  # a hot record, not frozen (gateway.core.protocol, "Hot records")
class Ack(Returns[AckResult]):
    """Delete a leased message, and enqueue ``follow_ups`` in the same transaction.

    ``task``: the outcome of the task the message carries, recorded with it.
    """

    receipt: str
    follow_ups: Sequence[tuple[str, EnqueueSpec]] = ()
    task: TaskOutcome | None = None


@dataclass(frozen=True, slots=True)
class Nack(Returns[None]):
    """Release a leased message of ``queue``, visible again after ``delay`` seconds.

    ``task``: a failed attempt's outcome (status READY), recorded with it.
    """

    queue: str
    receipt: str
    delay: float = 0.0
    task: TaskOutcome | None = None


@dataclass(frozen=True, slots=True)
class Reject(Returns[None]):
    """Dead-letter a leased message now (reason ``rejected``)."""

    receipt: str


@dataclass(frozen=True, slots=True)
class Extend(Returns[float]):
    """Make a lease end ``timeout`` seconds from now; returns when it now ends."""

    receipt: str
    timeout: float


@dataclass(frozen=True, slots=True)
class Release(Returns[int]):
    """Release leases of ``queue`` at once (receipts that went stale are skipped).

    ``undelivered``: the leases never reached a client (what a lease round
    leased for sockets that closed or paused meanwhile), so their delivery is
    taken back: ``deliveries`` as before the round.
    """

    queue: str
    receipts: Sequence[str]
    undelivered: bool = False


@dataclass(frozen=True, slots=True)
class EnsureQueue(Returns[QueueSettings]):
    """Create a queue with the default settings if it does not exist; returns its settings."""

    queue: str


@dataclass(frozen=True, slots=True)
class Configure(Returns[QueueStats]):
    """Change some of a queue's stored settings, creating it if needed.

    ``changes`` maps setting names to values as decoded from JSON; they are
    checked (``QueueSettings.changed``) before anything is written, and applied
    to the settings as stored now, not as cached.
    """

    queue: str
    changes: Mapping[str, object]


@dataclass(frozen=True, slots=True)
class Stats(Returns[QueueStats]):
    """Counts per state of one queue (NotFound if never used)."""

    queue: str


@dataclass(frozen=True, slots=True)
class AllStats(Returns[list[QueueStats]]):
    """Counts per state of every queue, by name."""


@dataclass(frozen=True, slots=True)
class Purge(Returns[int]):
    """Delete every message of a queue that is not in flight."""

    queue: str


@dataclass(frozen=True, slots=True)
class Redrive(Returns[int]):
    """Move every dead message of a queue back to visible with its delivery count reset."""

    queue: str


@dataclass(frozen=True, slots=True)
class Browse(Returns[BrowsePage]):
    """A page of one queue's messages in one state, without leasing or changing them."""

    queue: str
    state: BrowseState = "visible"
    limit: int = 100
    after: int | None = None


@dataclass(frozen=True, slots=True)
class MessageCondition:
    """What an operator's action expects of a message, as a listing showed it.

    Each field that is not None must still hold, checked in the action's own
    transaction; otherwise the action changes nothing. ``visible_at`` tells
    one lease from the next (a lease's end), ``deliveries`` one dead-lettering
    from a later one.
    """

    state: BrowseState | None = None
    deliveries: int | None = None
    visible_at: float | None = None


@dataclass(frozen=True, slots=True)
class RequeueMessage(Returns[int]):
    """Make one dead or in-flight message visible again, delivery count reset (0 or 1).

    With ``expect``, only if the message still matches it (else 0).
    """

    queue: str
    id: int
    expect: MessageCondition | None = None


@dataclass(frozen=True, slots=True)
class DeleteMessage(Returns[int]):
    """Delete one message in any state (1, or NotFound).

    With ``expect``, only if the message still matches it (else 0).
    """

    queue: str
    id: int
    expect: MessageCondition | None = None


@dataclass(frozen=True, slots=True)
class Cancel(Returns[CancelResult]):
    """Dead-letter one message at once with reason ``cancelled``, whatever its
    state (protocol 1.2: Cancel); NotFound if ``queue`` has no such message."""

    queue: str
    id: int


@dataclass(frozen=True, slots=True)
class Stage(Returns[TxnResult]):
    """Replace partition ``partition`` of transaction ``txn`` with ``messages`` for ``queue``."""

    txn: str
    partition: int
    queue: str
    messages: Sequence[EnqueueSpec]
    #: who stages (a stored token, a signed token's subject, a user): the first
    #: to touch the name owns it; None (in-process callers) skips the check
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class CommitTxn(Returns[TxnResult]):
    """Enqueue everything staged under ``txn`` at once; a second commit changes nothing.

    With ``partitions``, only those partitions are enqueued and any other staging
    of ``txn`` is discarded: what an earlier, differently partitioned attempt of
    the same batch left behind must not be committed with it.
    """

    txn: str
    partitions: frozenset[int] | None = None
    #: who commits: only the transaction's owner may (None skips the check)
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class AbortTxn(Returns[TxnResult]):
    """Discard what is staged under ``txn``."""

    txn: str
    #: who aborts: only the transaction's owner may (None skips the check)
    owner: str | None = None
    #: an ``admin`` token: may abort any transaction
    any_owner: bool = False


Op: TypeAlias = (
    Enqueue
    | Lease
    | Ack
    | Nack
    | Reject
    | Extend
    | Release
    | EnsureQueue
    | Configure
    | Stats
    | AllStats
    | Purge
    | Redrive
    | Browse
    | RequeueMessage
    | DeleteMessage
    | Cancel
    | Stage
    | CommitTxn
    | AbortTxn
)

#: What :meth:`Store.run` gives back for one op: its value, or the error that refused it.
Result: TypeAlias = (
    list[EnqueueResult]
    | LeaseResult
    | AckResult
    | float
    | int
    | QueueSettings
    | QueueStats
    | list[QueueStats]
    | BrowsePage
    | CancelResult
    | TxnResult
    | ProtocolError
    | None
)
