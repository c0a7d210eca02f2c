"""The wire protocol's client side: typed client frames and their parser.

Pure: no Django, no I/O. The consumers, the HTTP views and the client SDK all
use it, so a rule of ``docs/protocol.md`` is written down once, here.

Parsing turns one text frame into one of the frame dataclasses below, or raises
a :class:`~gateway.errors.ProtocolError` whose code says what was wrong
(``bad_frame`` for shape and type, ``invalid`` for values out of range,
``too_large`` for sizes, ``unknown_op`` for an op the socket does not know).
Bodies are kept as their canonical JSON bytes (``body_json``): the store keeps
them as text and the ``deliver`` encoder splices them back in without parsing.
Every frame the gateway sends is built in :mod:`gateway.core.wire`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import orjson

from gateway.core.errors import BadFrame, Invalid, TooLarge, UnknownOp
from gateway.core.leases import MAX_TIMEOUT
from gateway.core.subscribe import SubscribeOptions, options_from_fields
from gateway.core.wire import Ref

__all__ = [
    "ENQUEUE_FIELDS",
    "FOLLOW_UP_FIELDS",
    "MAX_BATCH",
    "MAX_DELAY",
    "MAX_GROUP_LENGTH",
    "MAX_KEY_LENGTH",
    "MAX_PRIORITY",
    "MAX_TIMEOUT",
    "MAX_TTL",
    "MESSAGE_FIELDS",
    "NAME_RE",
    "REFRESH_OP",
    "SUBSCRIPTION_OPS",
    "AckFrame",
    "AckManyFrame",
    "ClientFrame",
    "CreditFrame",
    "DisconnectFrame",
    "EnqueueFrame",
    "EnqueueManyFrame",
    "EnqueueSpec",
    "ExtendFrame",
    "Limits",
    "NackFrame",
    "PublishFrame",
    "Ref",
    "RefreshFrame",
    "RejectFrame",
    "SubscribeFrame",
    "SubscriptionFrame",
    "TaskOutcome",
    "UnsubscribeFrame",
    "check_name",
    "decode_object",
    "parse_enqueue_spec",
    "parse_frame",
    "parse_refresh",
    "parse_subscription_frame",
    "unknown_fields",
]

# Hot records: those made once or more per message of a work-queue cycle
# (EnqueueSpec, EnqueueFrame, AckFrame here; Enqueue, Ack, EnqueueResult and
# Delivered in gateway.store.ops) are slotted dataclasses that are not frozen.
# A frozen one pays object.__setattr__ per field when it is made (EnqueueSpec:
# 626 against 149 ns on the benchmark machine), about 2 us a cycle in all.
# Nothing assigns to them after construction; every other record is frozen.

#: Queue and topic names: 1-200 characters of ``[A-Za-z0-9._-]`` (protocol: Authentication).
NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,200}")
#: Longest idempotency key accepted.
MAX_KEY_LENGTH = 512
#: Longest delay accepted: one year, in seconds.
MAX_DELAY = 365 * 24 * 3600.0
#: Longest ordering group name (protocol 1.1: groups).
MAX_GROUP_LENGTH = 200
#: Priorities run -MAX_PRIORITY..MAX_PRIORITY (protocol 1.1: priority).
MAX_PRIORITY = 100
#: Longest ``ttl`` accepted: one year, in seconds.
MAX_TTL = 365 * 24 * 3600.0
#: Most follow-up messages one ``ack`` may enqueue.
MAX_FOLLOW_UPS = 1000
#: Most messages of one ``enqueue_many`` or receipts of one ``ack_many``.
MAX_BATCH = 10_000


@dataclass(frozen=True, slots=True)
class Limits:
    """Size limits that apply while parsing (settings ``GATEWAY_MAX_BODY_BYTES``)."""

    max_body_bytes: int = 256 * 1024


@dataclass(slots=True)  # a hot record, not frozen (see above)
class EnqueueSpec:
    """One message to enqueue: its canonical JSON body and the ENQUEUE options.

    ``group``, ``priority`` and ``ttl`` are the protocol 1.1 fields; their
    defaults are what a v1 client gets.
    """

    body_json: bytes
    key: str | None = None
    delay: float = 0.0
    group: str | None = None
    priority: int = 0
    ttl: float | None = None


@dataclass(slots=True)  # a hot record, not frozen (see above)
class EnqueueFrame:
    """``{"op": "enqueue", "queue"?, "body", "key"?, "delay"?}``."""

    queue: str | None
    message: EnqueueSpec
    ref: Ref = None
    op: Literal["enqueue"] = "enqueue"


#: The states a task outcome can record (``django.tasks`` result statuses).
TaskStatus: TypeAlias = Literal["SUCCESSFUL", "FAILED", "READY"]
_TASK_STATUSES: tuple[TaskStatus, ...] = ("SUCCESSFUL", "FAILED", "READY")
#: Longest task id and traceback kept.
MAX_TASK_ID = 64
MAX_TRACEBACK = 64 * 1024


@dataclass(frozen=True, slots=True)
class TaskOutcome:
    """Extension: a task's outcome, recorded in the transaction of the ack or
    nack that ends its message's lease (``gateway.tasks``, docs/protocol.md).

    ``status`` READY means "failed, will be retried" (with a nack).
    """

    task_id: str
    status: TaskStatus
    worker_id: str
    started_at: float
    return_json: bytes | None = None
    #: (exception class path, traceback) of a failed attempt
    error: tuple[str, str] | None = None


@dataclass(slots=True)  # a hot record, not frozen (see above)
class AckFrame:
    """``{"op": "ack", "receipt", "enqueue"?: [ENQUEUE, ...], "task"?: OUTCOME}``."""

    receipt: str
    follow_ups: tuple[tuple[str | None, EnqueueSpec], ...] = ()
    ref: Ref = None
    task: TaskOutcome | None = None
    op: Literal["ack"] = "ack"


@dataclass(frozen=True, slots=True)
class NackFrame:
    """``{"op": "nack", "receipt", "delay"?, "task"?: OUTCOME}``."""

    receipt: str
    delay: float = 0.0
    ref: Ref = None
    task: TaskOutcome | None = None
    op: Literal["nack"] = "nack"


@dataclass(frozen=True, slots=True)
class RejectFrame:
    """``{"op": "reject", "receipt"}``."""

    receipt: str
    ref: Ref = None
    op: Literal["reject"] = "reject"


@dataclass(frozen=True, slots=True)
class ExtendFrame:
    """``{"op": "extend", "receipt", "timeout"}``."""

    receipt: str
    timeout: float
    ref: Ref = None
    op: Literal["extend"] = "extend"


@dataclass(frozen=True, slots=True)
class EnqueueManyFrame:
    """Extension: ``{"op": "enqueue_many", "queue"?, "messages": [...]}``, all or nothing."""

    queue: str | None
    messages: tuple[EnqueueSpec, ...]
    ref: Ref = None
    op: Literal["enqueue_many"] = "enqueue_many"


@dataclass(frozen=True, slots=True)
class AckManyFrame:
    """Extension: ``{"op": "ack_many", "receipts": [R, ...]}``; each receipt acked or stale."""

    receipts: tuple[str, ...]
    ref: Ref = None
    op: Literal["ack_many"] = "ack_many"


@dataclass(frozen=True, slots=True)
class PublishFrame:
    """``{"op": "publish", "topic", "body"}``."""

    topic: str
    body_json: bytes
    ref: Ref = None
    op: Literal["publish"] = "publish"


@dataclass(frozen=True, slots=True)
class DisconnectFrame:
    """Dashboard extension: ``{"op": "disconnect", "process", "socket"}`` closes a socket."""

    process: str
    socket: int
    ref: Ref = None
    op: Literal["disconnect"] = "disconnect"


@dataclass(frozen=True, slots=True)
class CreditFrame:
    """``{"op": "credit", "n", "topic"?}``; has no reply.

    ``topic`` names the subscription on the multiplexed socket; other
    sockets ignore it.
    """

    n: int
    ref: Ref = None
    op: Literal["credit"] = "credit"
    topic: str | None = None


@dataclass(frozen=True, slots=True)
class RefreshFrame:
    """``{"op": "refresh", "token"}``: a new signed token for this socket (protocol 1.1).

    Taken by every socket kind, so it is not part of :data:`ClientFrame`
    (each socket's ``ops``): ``consumers.base`` handles it before them.
    Reply ``{"op": "refreshed", "expires_in": S}`` or an error ``forbidden``.
    """

    token: str
    ref: Ref = None
    op: Literal["refresh"] = "refresh"


#: The op of :class:`RefreshFrame`.
REFRESH_OP = "refresh"


@dataclass(frozen=True, slots=True)
class SubscribeFrame:
    """``{"op": "subscribe", "topic", ...options}`` on the multiplexed socket ``/ws/``.

    Like :class:`RefreshFrame`, not part of :data:`ClientFrame`: only the
    multiplexed socket takes it (``consumers.base`` hands it to that socket's
    ``handle_subscription``).
    """

    topic: str
    options: SubscribeOptions
    ref: Ref = None
    op: Literal["subscribe"] = "subscribe"


@dataclass(frozen=True, slots=True)
class UnsubscribeFrame:
    """``{"op": "unsubscribe", "topic"}`` on the multiplexed socket ``/ws/``."""

    topic: str
    ref: Ref = None
    op: Literal["unsubscribe"] = "unsubscribe"


#: A frame about the subscriptions of the multiplexed socket.
SubscriptionFrame: TypeAlias = SubscribeFrame | UnsubscribeFrame
#: The ops of :data:`SubscriptionFrame`.
SUBSCRIPTION_OPS = frozenset({"subscribe", "unsubscribe"})


ClientFrame: TypeAlias = (
    EnqueueFrame
    | EnqueueManyFrame
    | AckFrame
    | AckManyFrame
    | NackFrame
    | RejectFrame
    | ExtendFrame
    | PublishFrame
    | CreditFrame
    | DisconnectFrame
)


# -- field readers -----------------------------------------------------------


_NUMBER_TYPES = (int, float)


def _is_number(value: object) -> bool:
    # JSON true/false decode to bool, a subclass of int: never a number here.
    return isinstance(value, _NUMBER_TYPES) and not isinstance(value, bool)


def read_number(obj: dict[str, Any], field: str, default: float | None = None) -> float:
    """Read a finite number field; ``bad_frame`` if missing (without default) or mistyped."""
    if field not in obj or obj[field] is None:
        if default is None:
            raise BadFrame(f"missing field {field!r}")
        return default
    value = obj[field]
    if not _is_number(value):
        raise BadFrame(f"field {field!r} must be a number")
    number = float(value)
    if not math.isfinite(number):
        raise Invalid(f"field {field!r} must be finite")
    return number


def _read_str(obj: dict[str, Any], field: str) -> str:
    value = obj.get(field)
    if value is None:
        raise BadFrame(f"missing field {field!r}")
    if not isinstance(value, str):
        raise BadFrame(f"field {field!r} must be a string")
    return value


def check_name(name: object, what: str = "queue") -> str:
    """Return ``name`` if it is a valid queue or topic name, else raise.

    Raises:
        BadFrame: not a string.
        Invalid: not 1-200 characters of ``[A-Za-z0-9._-]``.
    """
    if not isinstance(name, str):
        raise BadFrame(f"{what} name must be a string")
    if NAME_RE.fullmatch(name) is None:
        raise Invalid(f"{what} name must be 1-200 characters of [A-Za-z0-9._-], got {name[:60]!r}")
    return name


def _read_delay(obj: dict[str, Any]) -> float:
    delay = read_number(obj, "delay", 0.0)
    if delay < 0:
        raise Invalid("delay must be >= 0")
    if delay > MAX_DELAY:
        raise Invalid(f"delay must be <= {MAX_DELAY:.0f} seconds")
    return delay


def _read_body(obj: dict[str, Any], limits: Limits) -> bytes:
    if "body" not in obj:
        raise BadFrame("missing field 'body'")
    try:
        body_json = orjson.dumps(obj["body"])
    except TypeError as exc:  # integers beyond 64 bits, for instance
        raise Invalid(f"body cannot be stored: {exc}") from exc
    if len(body_json) > limits.max_body_bytes:
        raise TooLarge(f"body is {len(body_json)} bytes; the limit is {limits.max_body_bytes}")
    # orjson's result sits in an over-allocated buffer (about 8 KiB for a
    # 1 KB body). Bodies can wait a long time in subscriber buffers, so keep
    # an exact-size copy: measured, 25,000 buffered 1 KB bodies took 195 MiB
    # of RSS without the copy and 26 MiB with it.
    return bytes(memoryview(body_json))


#: The fields of one message: an ``enqueue_many`` item, an HTTP item, a staged
#: message. Any other field is ``invalid`` (protocol 1.2: General): a typo such
#: as ``dealy`` would otherwise enqueue the message without its delay.
MESSAGE_FIELDS = frozenset({"body", "key", "delay", "group", "priority", "ttl"})
#: The fields of an ENQUEUE frame.
ENQUEUE_FIELDS = MESSAGE_FIELDS | {"op", "queue", "ref"}
#: The fields of an ack's follow-up: an ENQUEUE object (the JavaScript client
#: sends each with its ``op``).
FOLLOW_UP_FIELDS = ENQUEUE_FIELDS


def unknown_fields(obj: dict[str, Any], known: frozenset[str], what: str) -> Invalid:
    """The ``invalid`` error for a document with fields outside ``known``.

    Call it only when ``obj`` has a field outside ``known``.
    """
    unknown = sorted(obj.keys() - known)
    names = ", ".join(repr(name[:40]) for name in unknown[:5])
    plural = "s" if len(unknown) > 1 else ""
    return Invalid(
        f"unknown {what} field{plural} {names}; known fields: {', '.join(sorted(known))}"
    )


def parse_enqueue_spec(
    obj: object,
    limits: Limits,
    *,
    known: frozenset[str] = MESSAGE_FIELDS,
    others: int = 0,
) -> EnqueueSpec:
    """Validate one message of an ENQUEUE frame, an HTTP ``messages`` list, an
    ``enqueue_many`` frame, an ack's follow-ups or a staged partition.

    Args:
        obj: the decoded message.
        limits: size limits.
        known: every field ``obj`` may hold (``MESSAGE_FIELDS`` for a list item).
        others: how many fields outside ``MESSAGE_FIELDS`` the caller found in
            ``obj`` (an ENQUEUE frame's ``op``, ``ref`` and ``queue``).

    Raises:
        BadFrame: not an object, a field of the wrong type, no ``body``.
        Invalid: a value out of range, or a field outside ``known``.
        TooLarge: the body is over the limit.
    """
    if not isinstance(obj, dict):
        raise BadFrame("a message must be a JSON object")
    # Fields are counted as they are read: the set difference that names an
    # unknown field runs only when the count falls short of the object's size,
    # so a well-formed message pays a few dict lookups for the check.
    present = others + 1  # body: _read_body refuses a message without it
    key = None
    if "key" in obj:
        present += 1
        key = obj["key"]
        if key is not None:
            if not isinstance(key, str):
                raise BadFrame("field 'key' must be a string")
            if not 1 <= len(key) <= MAX_KEY_LENGTH:
                raise Invalid(f"key must be 1-{MAX_KEY_LENGTH} characters")
            if "\x00" in key:
                # PostgreSQL cannot store U+0000 in text: refused here, the same
                # on every backend, rather than failing in the store.
                raise Invalid("key must not contain U+0000")
    # The protocol 1.1 fields are read only when present: most messages have
    # none of them, and each reader costs a call on the hot path.
    delay = 0.0
    if "delay" in obj:
        present += 1
        delay = _read_delay(obj)
    group = None
    if "group" in obj:
        present += 1
        group = _read_group(obj)
    priority = 0
    if "priority" in obj:
        present += 1
        priority = _read_priority(obj)
    ttl = None
    if "ttl" in obj:
        present += 1
        ttl = _read_ttl(obj)
    if len(obj) > present:
        raise unknown_fields(obj, known, "message")
    return EnqueueSpec(_read_body(obj, limits), key, delay, group, priority, ttl)


def _read_group(obj: dict[str, Any]) -> str | None:
    group = obj.get("group")
    if group is None:
        return None
    if not isinstance(group, str):
        raise BadFrame("field 'group' must be a string")
    if not 1 <= len(group) <= MAX_GROUP_LENGTH:
        raise Invalid(f"group must be 1-{MAX_GROUP_LENGTH} characters")
    if "\x00" in group:
        raise Invalid("group must not contain U+0000")
    return group


def _read_priority(obj: dict[str, Any]) -> int:
    priority = read_number(obj, "priority", 0.0)
    # JSON has one number type: 5.0 is the integer 5, 5.5 is out of range.
    if priority != int(priority) or not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise Invalid(f"priority must be an integer -{MAX_PRIORITY}..{MAX_PRIORITY}")
    return int(priority)


def _read_ttl(obj: dict[str, Any]) -> float | None:
    if obj.get("ttl") is None:
        return None
    ttl = read_number(obj, "ttl")
    if not 0 < ttl <= MAX_TTL:
        raise Invalid(f"ttl must be > 0 and <= {MAX_TTL:.0f} seconds")
    return ttl


def _read_queue(obj: dict[str, Any]) -> str | None:
    queue = obj.get("queue")
    return None if queue is None else check_name(queue, "queue")


def _read_timeout(obj: dict[str, Any]) -> float:
    timeout = read_number(obj, "timeout")
    if not 0 < timeout <= MAX_TIMEOUT:
        raise Invalid(f"timeout must be > 0 and <= {MAX_TIMEOUT:.0f} seconds")
    return timeout


def read_ref(obj: dict[str, Any]) -> Ref:
    """The frame's ``ref`` if it is a string or number, else None."""
    ref = obj.get("ref")
    if ref is None or isinstance(ref, str) or _is_number(ref):
        return ref  # type: ignore[no-any-return,unused-ignore]
    return None


# orjson turns integers outside 64 bits into floats without a word. A frame
# with a long run of digits is decoded again by the exact stdlib parser, so
# such a number is refused (``invalid``) instead of being silently changed.
# JSON numbers are ASCII digits: [0-9] is exact here, and the search runs over
# every frame at about two thirds of the cost of \d (Unicode digits).
_LONG_DIGITS = re.compile(r"[0-9]{19}")


def _reject_constant(name: str) -> None:
    raise BadFrame(f"not JSON: {name} is not a JSON number")


def decode_object(text: str | bytes) -> dict[str, Any]:
    """Decode one frame into a JSON object, or raise ``bad_frame``."""
    try:
        obj = orjson.loads(text)
        if isinstance(text, str) and _LONG_DIGITS.search(text):
            obj = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:  # JSONDecodeError of either parser, or an int over 4300 digits
        raise BadFrame(f"not JSON: {exc}") from exc
    except RecursionError:
        # orjson takes 1023 levels; the exact parser runs out of stack sooner.
        raise BadFrame("not JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise BadFrame("a frame must be a JSON object")
    return obj


def parse_frame(obj: dict[str, Any], allowed: frozenset[str], limits: Limits) -> ClientFrame:
    """Turn a decoded frame into its typed form.

    Args:
        obj: the decoded JSON object.
        allowed: the ops this socket accepts; others are ``unknown_op``.
        limits: size limits.

    Raises:
        ProtocolError: ``bad_frame``, ``unknown_op``, ``invalid`` or ``too_large``.
    """
    op = obj.get("op")
    if not isinstance(op, str):
        raise BadFrame("missing or non-string field 'op'")
    if op not in allowed:
        raise UnknownOp(f"op {op[:40]!r} is not known on this socket")
    ref = obj.get("ref")
    if ref is not None and read_ref(obj) is None:
        raise BadFrame("field 'ref' must be a string or a number")
    if op == "enqueue":
        # op is there; ref and queue are counted so that a typo beside them is found
        others = 1 + ("ref" in obj) + ("queue" in obj)
        spec = parse_enqueue_spec(obj, limits, known=ENQUEUE_FIELDS, others=others)
        return EnqueueFrame(_read_queue(obj), spec, ref)
    if op == "ack":
        return AckFrame(
            _read_str(obj, "receipt"),
            _read_follow_ups(obj, limits),
            ref,
            _read_task_outcome(obj, limits),
        )
    if op == "enqueue_many":
        return EnqueueManyFrame(_read_queue(obj), _read_messages(obj, limits), ref)
    if op == "ack_many":
        return AckManyFrame(_read_receipts(obj), ref)
    if op == "nack":
        return NackFrame(
            _read_str(obj, "receipt"), _read_delay(obj), ref, _read_task_outcome(obj, limits)
        )
    if op == "reject":
        return RejectFrame(_read_str(obj, "receipt"), ref)
    if op == "extend":
        return ExtendFrame(_read_str(obj, "receipt"), _read_timeout(obj), ref)
    if op == "publish":
        return PublishFrame(check_name(obj.get("topic"), "topic"), _read_body(obj, limits), ref)
    if op == "disconnect":
        process, sid = obj.get("process"), obj.get("socket")
        if not isinstance(process, str) or not isinstance(sid, int) or isinstance(sid, bool):
            raise BadFrame("disconnect needs 'process' (a string) and 'socket' (an integer)")
        return DisconnectFrame(process, sid, ref)
    if op == "credit":
        n = obj.get("n")
        if not isinstance(n, int) or isinstance(n, bool):
            raise BadFrame("field 'n' must be an integer")
        if not 0 <= n <= 1_000_000_000:
            raise Invalid("credit n must be 0..1000000000")
        topic = obj.get("topic")
        return CreditFrame(n, ref, topic=None if topic is None else check_name(topic, "topic"))
    raise UnknownOp(f"op {op[:40]!r} is not known on this socket")


def parse_subscription_frame(obj: dict[str, Any]) -> SubscriptionFrame:
    """Turn a decoded ``subscribe`` or ``unsubscribe`` frame into its typed form.

    Raises:
        BadFrame: ``topic`` missing or not a string, a mistyped option, a bad ``ref``.
        Invalid: a bad topic name or an option out of range.
    """
    if "ref" in obj and obj["ref"] is not None and read_ref(obj) is None:
        raise BadFrame("field 'ref' must be a string or a number")
    ref = read_ref(obj)
    if "topic" not in obj:
        raise BadFrame("missing field 'topic'")
    topic = check_name(obj["topic"], "topic")
    if obj.get("op") == "unsubscribe":
        return UnsubscribeFrame(topic, ref)
    return SubscribeFrame(topic, options_from_fields(obj), ref)


def parse_refresh(obj: dict[str, Any]) -> RefreshFrame:
    """Turn a decoded ``refresh`` frame into its typed form.

    Raises:
        BadFrame: ``token`` missing or not a string, or a bad ``ref``.
    """
    if "ref" in obj and obj["ref"] is not None and read_ref(obj) is None:
        raise BadFrame("field 'ref' must be a string or a number")
    token = obj.get("token")
    if not isinstance(token, str):
        raise BadFrame("refresh needs 'token' (a string)")
    return RefreshFrame(token, read_ref(obj))


def _read_task_outcome(obj: dict[str, Any], limits: Limits) -> TaskOutcome | None:
    """The optional ``task`` object of an ack or nack (extension, ``gateway.tasks``)."""
    task = obj.get("task")
    if task is None:
        return None
    if not isinstance(task, dict):
        raise BadFrame("field 'task' must be an object")
    task_id = _read_str(task, "id")
    if not 1 <= len(task_id) <= MAX_TASK_ID or "\x00" in task_id:
        raise Invalid(f"task id must be 1-{MAX_TASK_ID} characters")
    status = _read_str(task, "status")
    checked = next((s for s in _TASK_STATUSES if s == status), None)
    if checked is None:
        raise Invalid(f"task status must be one of {', '.join(_TASK_STATUSES)}")
    worker_id = _read_str(task, "worker_id")[:MAX_TASK_ID]
    started_at = read_number(task, "started_at")
    return_json = (
        _read_body({"body": task["return_value"]}, limits) if "return_value" in task else None
    )
    error: tuple[str, str] | None = None
    if task.get("error") is not None:
        raw = task["error"]
        if not isinstance(raw, dict):
            raise BadFrame("field 'task.error' must be an object")
        path = _read_str(raw, "exception_class_path")[:400]
        traceback = _read_str(raw, "traceback")
        if len(traceback) > MAX_TRACEBACK:  # the end of a traceback says the most
            traceback = "...\n" + traceback[-MAX_TRACEBACK:]
        error = (path, traceback.replace("\x00", ""))
    return TaskOutcome(task_id, checked, worker_id, started_at, return_json, error)


def _read_messages(obj: dict[str, Any], limits: Limits) -> tuple[EnqueueSpec, ...]:
    items = obj.get("messages")
    if not isinstance(items, list):
        raise BadFrame("field 'messages' must be a list of messages")
    if not 1 <= len(items) <= MAX_BATCH:
        raise Invalid(f"'messages' must hold 1-{MAX_BATCH} messages")
    specs = []
    for index, item in enumerate(items):
        try:
            specs.append(parse_enqueue_spec(item, limits))
        except (BadFrame, Invalid, TooLarge) as exc:
            raise type(exc)(f"messages[{index}]: {exc.detail}") from exc
    return tuple(specs)


def _read_receipts(obj: dict[str, Any]) -> tuple[str, ...]:
    receipts = obj.get("receipts")
    if not isinstance(receipts, list) or not all(isinstance(r, str) for r in receipts):
        raise BadFrame("field 'receipts' must be a list of strings")
    if not 1 <= len(receipts) <= MAX_BATCH:
        raise Invalid(f"'receipts' must hold 1-{MAX_BATCH} receipts")
    return tuple(receipts)


def _read_follow_ups(
    obj: dict[str, Any], limits: Limits
) -> tuple[tuple[str | None, EnqueueSpec], ...]:
    items = obj.get("enqueue")
    if items is None:
        return ()
    if not isinstance(items, list):
        raise BadFrame("field 'enqueue' must be a list of ENQUEUE objects")
    if len(items) > MAX_FOLLOW_UPS:
        raise TooLarge(f"at most {MAX_FOLLOW_UPS} follow-up messages per ack")
    follow_ups = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadFrame(f"enqueue[{index}] must be an object")
        try:
            others = ("op" in item) + ("queue" in item) + ("ref" in item)
            spec = parse_enqueue_spec(item, limits, known=FOLLOW_UP_FIELDS, others=others)
            follow_ups.append((_read_queue(item), spec))
        except (BadFrame, Invalid, TooLarge) as exc:
            raise type(exc)(f"enqueue[{index}]: {exc.detail}") from exc
    return tuple(follow_ups)
