"""Every frame the gateway sends: one typed record per frame, and its encoder.

Pure: no Django, no I/O. A reader finds here each frame a socket can receive
(docs/protocol.md), as a ``TypedDict`` with a ``Literal`` op, and the one
function that turns it into text. The parser of client frames is
:mod:`gateway.core.protocol`; the close codes are :class:`CloseCode`, shared with the
clients (``leasecast.close_codes``).

Two ways to encode, one result:

- :func:`encode` dumps a typed frame with orjson, echoing the client frame's
  ``ref``; every reply that is not on the hot path goes this way.
- The hot frames (``enqueued``, ``acked``, ``deliver``, ``deliveries``,
  ``messages``, ``subscribed``) are spliced from strings, without building
  the dict: their stored bodies are canonical JSON already, their ids,
  receipts, queue and topic names need no escaping (``NAME_RE``, the store's
  integers), and a splice saves a dict and a dump per frame
  (docs/benchmarks.md). Each splice is tested equal to :func:`encode` of its
  typed frame (tests/unit/test_wire.py).
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypeAlias, TypedDict

import orjson
from leasecast.close_codes import CloseCode

__all__ = [
    "ACKED",
    "AckedFrame",
    "AckedManyFrame",
    "CancelFrame",
    "CloseCode",
    "DeliverFrame",
    "DeliveriesFrame",
    "DeliveryItem",
    "DisconnectedFrame",
    "EnqueuedFrame",
    "EnqueuedItem",
    "EnqueuedManyFrame",
    "ErrorFrame",
    "ExtendedFrame",
    "HistoryFrame",
    "JoinFrame",
    "LeaveFrame",
    "MessagesFrame",
    "NackedFrame",
    "PresenceFrame",
    "PresenceMember",
    "PublishedFrame",
    "Ref",
    "RefreshedFrame",
    "RejectedFrame",
    "ReplyFrame",
    "ServerFrame",
    "SnapshotFrame",
    "SubscribedFrame",
    "TopicItem",
    "UnsubscribedFrame",
    "encode",
    "encode_acked",
    "encode_acked_many",
    "encode_cancel",
    "encode_deliver",
    "encode_deliveries",
    "encode_disconnected",
    "encode_enqueued",
    "encode_enqueued_many",
    "encode_entry",
    "encode_error",
    "encode_extended",
    "encode_history",
    "encode_join",
    "encode_leave",
    "encode_messages",
    "encode_nacked",
    "encode_presence",
    "encode_published",
    "encode_refreshed",
    "encode_rejected",
    "encode_snapshot",
    "encode_subscribed",
    "encode_unsubscribed",
]

#: A client frame's ``ref``: echoed in the reply to it (protocol: Frames).
Ref: TypeAlias = str | int | float | None


class _Reply(TypedDict, total=False):
    """What every reply may carry: the ``ref`` of the frame it answers."""

    #: as the client sent it (an integer beyond 64 bits as its digits)
    ref: str | int | float | orjson.Fragment


# -- work queue -------------------------------------------------------------------


class EnqueuedItem(TypedDict):
    """One message's result: its id, or the id of the message its key already named."""

    id: str
    duplicate: bool


class EnqueuedFrame(_Reply):
    """``{"op": "enqueued", "id", "duplicate"}``: the reply to an ENQUEUE."""

    op: Literal["enqueued"]
    id: str
    duplicate: bool


class EnqueuedManyFrame(_Reply):
    """Extension: ``{"op": "enqueued_many", "results": [...]}``, one per message, in order."""

    op: Literal["enqueued_many"]
    results: list[EnqueuedItem]


class AckedFrame(_Reply):
    """``{"op": "acked", "enqueued"?: [...]}``; ``enqueued`` when the ack had follow-ups."""

    op: Literal["acked"]
    enqueued: NotRequired[list[EnqueuedItem]]


class AckedManyFrame(_Reply):
    """Extension: ``{"op": "acked_many", "acked": N, "stale": [RECEIPT, ...]}``."""

    op: Literal["acked_many"]
    acked: int
    stale: list[str]


class NackedFrame(_Reply):
    """``{"op": "nacked"}``."""

    op: Literal["nacked"]


class RejectedFrame(_Reply):
    """``{"op": "rejected"}``."""

    op: Literal["rejected"]


class ExtendedFrame(_Reply):
    """``{"op": "extended", "expires_in": S}`` (seconds, to the millisecond)."""

    op: Literal["extended"]
    expires_in: float


class DeliveryItem(TypedDict):
    """One leased message: a ``deliver`` frame's fields, a ``deliveries`` item."""

    id: str
    receipt: str
    body: Any
    deliveries: int
    expires_in: float
    #: protocol 1.1, present when the message has a group or a priority
    priority: NotRequired[int]
    group: NotRequired[str]


class DeliverFrame(DeliveryItem):
    """``{"op": "deliver", "queue", "id", "receipt", "body", "deliveries", "expires_in"}``."""

    op: Literal["deliver"]
    queue: str


class DeliveriesFrame(TypedDict):
    """Extension: ``{"op": "deliveries", "queue", "items": [...]}`` (``?batch=N`` sockets)."""

    op: Literal["deliveries"]
    queue: str
    items: list[DeliveryItem]


class CancelFrame(TypedDict):
    """``{"op": "cancel", "queue", "id", "receipt"}`` (protocol 1.2: Cancel), no reply:
    the message this socket holds under ``receipt`` was cancelled (dead-lettered),
    and the lease is over."""

    op: Literal["cancel"]
    queue: str
    id: str
    receipt: str


# -- topics -------------------------------------------------------------------------


class TopicItem(TypedDict):
    """One message of a ``messages`` frame: the socket's ``seq``, the topic's ``offset``."""

    seq: int
    offset: int
    body: Any


class MessagesFrame(TypedDict):
    """``{"op": "messages", "topic", "items": [...], "dropped": N}``."""

    op: Literal["messages"]
    topic: str
    items: list[TopicItem]
    dropped: int


class SubscribedFrame(_Reply):
    """``{"op": "subscribed", "topic", "epoch", "offset", "recovered"}`` (protocol 1.1).

    On the multiplexed socket it is the reply to ``subscribe`` (echoing its
    ``ref``), and ``recovered`` is null when neither ``since`` nor
    ``recover`` was asked for.
    """

    op: Literal["subscribed"]
    topic: str
    epoch: str
    offset: int
    recovered: bool | None


class UnsubscribedFrame(_Reply):
    """``{"op": "unsubscribed", "topic", "reason"?}`` (multiplexed socket).

    The reply to ``unsubscribe`` has no reason; a subscription the gateway
    ends has one: ``slow_consumer`` or ``stream_restarted``.
    """

    op: Literal["unsubscribed"]
    topic: str
    reason: NotRequired[Literal["slow_consumer", "stream_restarted"]]


class PresenceMember(TypedDict):
    """One member of a topic with presence: ``{"client", "user", "info"}``."""

    client: str
    user: str
    info: Any


class JoinFrame(TypedDict):
    """``{"op": "join", "topic", "client", "user", "info"}``: a subscription arrived."""

    op: Literal["join"]
    topic: str
    client: str
    user: str
    info: Any


class LeaveFrame(TypedDict):
    """``{"op": "leave", "topic", "client", "user"}``: a subscription went."""

    op: Literal["leave"]
    topic: str
    client: str
    user: str


class PresenceFrame(TypedDict):
    """``{"op": "presence", "topic", "joins": [...], "leaves": [...]}``: several at once.

    The first frame of a subscription asking for presence: ``joins`` lists
    the topic's members then.
    """

    op: Literal["presence"]
    topic: str
    joins: list[PresenceMember]
    leaves: list[PresenceMember]


class PublishedFrame(_Reply):
    """``{"op": "published", "topic", "seq", "offset", "epoch"}``.

    ``seq`` (v1) is the offset, which grows by one per publish.
    """

    op: Literal["published"]
    topic: str
    seq: int
    offset: int
    epoch: str


# -- every socket ---------------------------------------------------------------------


class ErrorFrame(_Reply):
    """``{"op": "error", "code", "detail", "retry_after"?}`` (protocol: Errors).

    ``retry_after`` (seconds) comes with ``backpressure`` from a rate limit.
    """

    op: Literal["error"]
    code: str
    detail: str
    retry_after: NotRequired[float]


class RefreshedFrame(_Reply):
    """``{"op": "refreshed", "expires_in": S}``: the reply to ``refresh`` (protocol 1.1)."""

    op: Literal["refreshed"]
    expires_in: int


# -- dashboard -----------------------------------------------------------------------


class SnapshotFrame(TypedDict):
    """``{"op": "snapshot", ...}``, every second on the dashboard socket."""

    op: Literal["snapshot"]
    queues: Any
    processes: list[dict[str, Any]]
    alerts: list[dict[str, Any]]
    oldest_alert: float
    samples: list[dict[str, Any]]
    labels: Any
    #: the task each leased message of a worker row carries, by message id
    running_tasks: NotRequired[dict[str, dict[str, str]]]


class HistoryFrame(TypedDict):
    """``{"op": "history", "bucket", "keep", "queue_series", "topic_series", "samples"}``, once."""

    op: Literal["history"]
    bucket: int
    keep: int | None
    queue_series: Any
    topic_series: Any
    samples: list[dict[str, Any]]


class DisconnectedFrame(_Reply):
    """Dashboard extension: ``{"op": "disconnected", "socket": ID}``."""

    op: Literal["disconnected"]
    socket: int


#: The frames that answer a client frame, and so may echo its ``ref``.
ReplyFrame: TypeAlias = (
    EnqueuedFrame
    | EnqueuedManyFrame
    | AckedFrame
    | AckedManyFrame
    | NackedFrame
    | RejectedFrame
    | ExtendedFrame
    | PublishedFrame
    | ErrorFrame
    | RefreshedFrame
    | DisconnectedFrame
    | SubscribedFrame
    | UnsubscribedFrame
)

#: Every frame the gateway sends.
ServerFrame: TypeAlias = (
    EnqueuedFrame
    | EnqueuedManyFrame
    | AckedFrame
    | AckedManyFrame
    | NackedFrame
    | RejectedFrame
    | ExtendedFrame
    | DeliverFrame
    | DeliveriesFrame
    | CancelFrame
    | MessagesFrame
    | SubscribedFrame
    | UnsubscribedFrame
    | JoinFrame
    | LeaveFrame
    | PresenceFrame
    | PublishedFrame
    | ErrorFrame
    | RefreshedFrame
    | SnapshotFrame
    | HistoryFrame
    | DisconnectedFrame
)


# -- encoding ---------------------------------------------------------------------------

_I64_MIN = -(2**63)
_U64_MAX = 2**64 - 1


def encode(frame: ReplyFrame, ref: Ref = None) -> str:
    """Encode a reply, echoing ``ref`` when the client frame had one."""
    if ref is not None:
        if isinstance(ref, int) and not _I64_MIN <= ref <= _U64_MAX:
            # orjson refuses integers beyond 64 bits; the ref is echoed as sent
            # (its digits are exactly what the client wrote, decoded exactly).
            frame["ref"] = orjson.Fragment(str(ref))
        else:
            frame["ref"] = ref
    return orjson.dumps(frame).decode()


# -- the work queue's replies and deliveries

#: ``{"op": "acked"}`` without a ``ref``: the reply to most acks, made once.
ACKED = encode({"op": "acked"})


def encode_enqueued(msg_id: str, duplicate: bool, ref: Ref = None) -> str:
    """:class:`EnqueuedFrame`, the reply to every ENQUEUE.

    Without a ``ref`` the frame is spliced: ids are the store's integers as
    text, which JSON needs no escaping for.
    """
    if ref is not None:
        return encode({"op": "enqueued", "id": msg_id, "duplicate": duplicate}, ref)
    return f'{{"op":"enqueued","id":"{msg_id}","duplicate":{"true" if duplicate else "false"}}}'


def encode_enqueued_many(results: list[EnqueuedItem], ref: Ref = None) -> str:
    """:class:`EnqueuedManyFrame`."""
    return encode({"op": "enqueued_many", "results": results}, ref)


def encode_acked(ref: Ref = None, enqueued: list[EnqueuedItem] | None = None) -> str:
    """:class:`AckedFrame`; :data:`ACKED` when there is neither ``ref`` nor follow-up."""
    if enqueued is None:
        return ACKED if ref is None else encode({"op": "acked"}, ref)
    return encode({"op": "acked", "enqueued": enqueued}, ref)


def encode_acked_many(acked: int, stale: list[str], ref: Ref = None) -> str:
    """:class:`AckedManyFrame`."""
    return encode({"op": "acked_many", "acked": acked, "stale": stale}, ref)


def encode_nacked(ref: Ref = None) -> str:
    """:class:`NackedFrame`."""
    return encode({"op": "nacked"}, ref)


def encode_rejected(ref: Ref = None) -> str:
    """:class:`RejectedFrame`."""
    return encode({"op": "rejected"}, ref)


def encode_extended(expires_in: float, ref: Ref = None) -> str:
    """:class:`ExtendedFrame`; ``expires_in`` is rounded to the millisecond."""
    return encode({"op": "extended", "expires_in": round(expires_in, 3)}, ref)


def _extra_fields(group: str | None, priority: int) -> str:
    """The protocol 1.1 fields of a delivery, present when the message has them."""
    if group is None and priority == 0:
        return ""
    text = f',"priority":{priority}'
    if group is not None:
        text += f',"group":{orjson.dumps(group).decode()}'
    return text


def encode_deliver(
    queue: str,
    msg_id: str,
    receipt: str,
    body_json: str,
    deliveries: int,
    expires_in: float,
    group: str | None = None,
    priority: int = 0,
) -> str:
    """:class:`DeliverFrame`, spliced: the stored body JSON goes in unparsed.

    The body was validated and canonicalised on enqueue, so splicing is safe;
    ``expires_in`` is written to the millisecond.
    """
    return (
        f'{{"op":"deliver","queue":"{queue}","id":"{msg_id}","receipt":"{receipt}",'
        f'"body":{body_json},"deliveries":{deliveries},"expires_in":{expires_in:.3f}'
        f"{_extra_fields(group, priority)}}}"
    )


def encode_deliveries(
    queue: str, items: list[tuple[str, str, str, int, float, str | None, int]]
) -> str:
    """:class:`DeliveriesFrame`, spliced as :func:`encode_deliver` is.

    ``items`` are ``(id, receipt, body_json, deliveries, expires_in, group, priority)``.
    """
    parts = [
        f'{{"id":"{msg_id}","receipt":"{receipt}","body":{body_json},'
        f'"deliveries":{deliveries},"expires_in":{expires_in:.3f}'
        f"{_extra_fields(group, priority)}}}"
        for msg_id, receipt, body_json, deliveries, expires_in, group, priority in items
    ]
    return f'{{"op":"deliveries","queue":"{queue}","items":[{",".join(parts)}]}}'


def encode_cancel(queue: str, msg_id: str, receipt: str) -> str:
    """:class:`CancelFrame`."""
    frame: CancelFrame = {"op": "cancel", "queue": queue, "id": msg_id, "receipt": receipt}
    return orjson.dumps(frame).decode()


# -- topics


def encode_entry(offset: int, body: bytes) -> bytes:
    """A :class:`TopicItem` without its ``seq``, made once per publish (not per socket)."""
    return b'"offset":%d,"body":%s' % (offset, body)


def encode_messages(topic: str, items: list[tuple[int, bytes]], dropped: int) -> str:
    """:class:`MessagesFrame`, spliced from ``(seq, encode_entry(...))`` pairs.

    Each item's payload is :func:`encode_entry`'s; the dispatcher stores it as
    the message, so the offset rides along without the fan-out core knowing.
    """
    parts = b",".join(b'{"seq":%d,%s}' % (seq, payload) for seq, payload in items)
    return f'{{"op":"messages","topic":"{topic}","items":[{parts.decode()}],"dropped":{dropped}}}'


def encode_subscribed(
    topic: str, epoch: str, offset: int, recovered: bool | None, ref: Ref = None
) -> str:
    """:class:`SubscribedFrame`, spliced (epochs are short hex strings, names need no escaping)."""
    if ref is not None:
        frame: SubscribedFrame = {
            "op": "subscribed",
            "topic": topic,
            "epoch": epoch,
            "offset": offset,
            "recovered": recovered,
        }
        return encode(frame, ref)
    flag = "null" if recovered is None else "true" if recovered else "false"
    return (
        f'{{"op":"subscribed","topic":"{topic}","epoch":"{epoch}",'
        f'"offset":{offset},"recovered":{flag}}}'
    )


def encode_unsubscribed(
    topic: str,
    reason: Literal["slow_consumer", "stream_restarted"] | None = None,
    ref: Ref = None,
) -> str:
    """:class:`UnsubscribedFrame`: the reply to ``unsubscribe``, or the gateway's end of one."""
    frame: UnsubscribedFrame = {"op": "unsubscribed", "topic": topic}
    if reason is not None:
        frame["reason"] = reason
    return encode(frame, ref)


def _info(info: str | None) -> Any:
    """A member's ``info`` (kept as compact JSON text), spliced back as JSON."""
    return None if info is None else orjson.Fragment(info)


def encode_join(topic: str, client: str, user: str, info: str | None) -> str:
    """:class:`JoinFrame`; ``info`` is compact JSON text (a signed token's claim) or None."""
    return orjson.dumps(
        {"op": "join", "topic": topic, "client": client, "user": user, "info": _info(info)}
    ).decode()


def encode_leave(topic: str, client: str, user: str) -> str:
    """:class:`LeaveFrame`."""
    frame: LeaveFrame = {"op": "leave", "topic": topic, "client": client, "user": user}
    return orjson.dumps(frame).decode()


def encode_presence(
    topic: str,
    joins: list[tuple[str, str, str | None]],
    leaves: list[tuple[str, str, str | None]] = [],  # noqa: B006 - never changed
) -> str:
    """:class:`PresenceFrame` from ``(client, user, info)`` triples (``info`` as JSON text)."""

    def member(client: str, user: str, info: str | None) -> dict[str, Any]:
        return {"client": client, "user": user, "info": _info(info)}

    return orjson.dumps(
        {
            "op": "presence",
            "topic": topic,
            "joins": [member(*m) for m in joins],
            "leaves": [member(*m) for m in leaves],
        }
    ).decode()


def encode_published(topic: str, offset: int, epoch: str, ref: Ref = None) -> str:
    """:class:`PublishedFrame`."""
    return encode(
        {"op": "published", "topic": topic, "seq": offset, "offset": offset, "epoch": epoch}, ref
    )


# -- every socket


def encode_error(
    code: str, detail: str, ref: Ref = None, *, retry_after: float | None = None
) -> str:
    """:class:`ErrorFrame`; ``retry_after`` is rounded to the millisecond."""
    frame: ErrorFrame = {"op": "error", "code": code, "detail": detail}
    if retry_after is not None:
        frame["retry_after"] = round(retry_after, 3)
    return encode(frame, ref)


def encode_refreshed(expires_in: int, ref: Ref = None) -> str:
    """:class:`RefreshedFrame`."""
    return encode({"op": "refreshed", "expires_in": expires_in}, ref)


# -- dashboard


def encode_snapshot(
    *,
    queues: Any,
    processes: list[dict[str, Any]],
    alerts: list[dict[str, Any]],
    oldest_alert: float,
    samples: list[dict[str, Any]],
    labels: Any,
    running_tasks: dict[str, dict[str, str]] | None = None,
) -> str:
    """:class:`SnapshotFrame`; values orjson cannot take (a ``Decimal``...) as text."""
    frame: SnapshotFrame = {
        "op": "snapshot",
        "queues": queues,
        "processes": processes,
        "alerts": alerts,
        "oldest_alert": oldest_alert,
        "samples": samples,
        "labels": labels,
    }
    if running_tasks is not None:
        frame["running_tasks"] = running_tasks
    return orjson.dumps(frame, default=str).decode()


def encode_history(
    *,
    bucket: int,
    keep: int | None,
    queue_series: Any,
    topic_series: Any,
    samples: list[dict[str, Any]],
) -> str:
    """:class:`HistoryFrame`."""
    frame: HistoryFrame = {
        "op": "history",
        "bucket": bucket,
        "keep": keep,
        "queue_series": queue_series,
        "topic_series": topic_series,
        "samples": samples,
    }
    return orjson.dumps(frame).decode()


def encode_disconnected(socket: int, ref: Ref = None) -> str:
    """:class:`DisconnectedFrame`."""
    return encode({"op": "disconnected", "socket": socket}, ref)
