"""What a subscription to a topic asks for: its options, read from a URL or a frame.

Pure: no Django, no I/O. A subscriber socket (``/ws/topics/TOPIC/``) takes
these as query parameters, a ``subscribe`` frame on the multiplexed socket
``/ws/`` as fields, a server-sent event stream as query parameters again;
each has the same meaning and default (docs/protocol.md, "The multiplexed
socket"), so they are read here once, into one :class:`SubscribeOptions`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.core.errors import BadFrame, Invalid
from gateway.core.fanout import Policy

__all__ = [
    "MAX_CAPACITY",
    "MAX_PRIORITY",
    "SUBSCRIBE_FIELDS",
    "SubscribeOptions",
    "options_from_fields",
    "options_from_query",
]

#: Largest buffer a subscription may ask for.
MAX_CAPACITY = 1_000_000
#: Largest weight a subscription may ask for.
MAX_PRIORITY = 1000
#: Most initial credit a subscription may ask for.
MAX_CREDIT = 1_000_000_000
#: Largest offset ``since`` may name.
MAX_OFFSET = 2**63 - 1

#: The fields of a ``subscribe`` frame besides ``op``, ``topic`` and ``ref``.
SUBSCRIBE_FIELDS = (
    "capacity",
    "on_full",
    "priority",
    "credit",
    "since",
    "epoch",
    "recover",
    "presence",
)


@dataclass(frozen=True, slots=True)
class SubscribeOptions:
    """One subscription's buffer, flow control, resume and presence choices.

    The defaults are the subscriber socket's (protocol: Subscriber socket).
    ``since`` and ``epoch`` come together (a resume), or ``recover_latest``
    (cache mode), or neither (live messages only).
    """

    capacity: int = 1024
    policy: Policy = Policy.DROP_OLDEST
    priority: int = 1
    credit: int = 256
    since: int | None = None
    epoch: str | None = None
    recover_latest: bool = False
    #: receive ``join`` / ``leave`` / ``presence`` frames for the topic
    presence: bool = False

    @property
    def resumes(self) -> bool:
        """True if the subscription asked for ``since``/``epoch`` or ``recover=latest``."""
        return self.since is not None or self.recover_latest


def options_from_query(params: Mapping[str, str]) -> SubscribeOptions:
    """The options of a URL's query parameters (strings), each checked.

    Raises:
        Invalid: a value out of range or of the wrong form; the detail names it.
    """
    return _options(params, _QueryReader(params))


def options_from_fields(obj: Mapping[str, Any]) -> SubscribeOptions:
    """The options of a decoded ``subscribe`` frame (JSON values), each checked.

    Raises:
        BadFrame: a field of the wrong JSON type.
        Invalid: a value out of range; the detail names the field.
    """
    return _options(obj, _FieldReader(obj))


class _QueryReader:
    def __init__(self, params: Mapping[str, str]) -> None:
        self.params = params

    def integer(self, name: str) -> int | None:
        raw = self.params.get(name)
        if raw is None:
            return None
        try:
            return int(raw)
        except ValueError:
            raise Invalid(f"{name} must be an integer, got {raw[:40]!r}") from None

    def string(self, name: str) -> str | None:
        return self.params.get(name)

    def flag(self, name: str) -> bool:
        raw = self.params.get(name)
        if raw is None:
            return False
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise Invalid(f"{name} must be true or false, got {raw[:40]!r}")


class _FieldReader:
    def __init__(self, obj: Mapping[str, Any]) -> None:
        self.obj = obj

    def integer(self, name: str) -> int | None:
        value = self.obj.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadFrame(f"field {name!r} must be an integer")
        return value

    def string(self, name: str) -> str | None:
        value = self.obj.get(name)
        if value is None:
            return None
        if not isinstance(value, str):
            raise BadFrame(f"field {name!r} must be a string")
        return value

    def flag(self, name: str) -> bool:
        value = self.obj.get(name)
        if value is None:
            return False
        if not isinstance(value, bool):
            raise BadFrame(f"field {name!r} must be true or false")
        return value


def _ranged(
    reader: _QueryReader | _FieldReader, name: str, default: int, low: int, high: int
) -> int:
    value = reader.integer(name)
    if value is None:
        return default
    if not low <= value <= high:
        raise Invalid(f"{name} must be {low}..{high}, got {value}")
    return value


def _options(raw: Mapping[str, Any], reader: _QueryReader | _FieldReader) -> SubscribeOptions:
    capacity = _ranged(reader, "capacity", 1024, 1, MAX_CAPACITY)
    raw_policy = reader.string("on_full") or "drop_oldest"
    try:
        policy = Policy(raw_policy)
    except ValueError:
        choices = ", ".join(p.value for p in Policy)
        raise Invalid(f"on_full must be one of {choices}, got {raw_policy[:40]!r}") from None
    priority = _ranged(reader, "priority", 1, 1, MAX_PRIORITY)
    credit = _ranged(reader, "credit", 256, 0, MAX_CREDIT)
    presence = reader.flag("presence")
    recover = reader.string("recover")
    epoch = reader.string("epoch")
    has_since = raw.get("since") is not None
    if recover is not None:
        if recover != "latest":
            raise Invalid(f"recover must be 'latest', got {recover[:40]!r}")
        if has_since or epoch is not None:
            raise Invalid("recover=latest cannot be combined with since/epoch")
        return SubscribeOptions(capacity, policy, priority, credit, None, None, True, presence)
    if has_since != (epoch is not None):
        raise Invalid("since and epoch go together: send both, or neither")
    if epoch is None:
        return SubscribeOptions(capacity, policy, priority, credit, presence=presence)
    since = _ranged(reader, "since", 0, 0, MAX_OFFSET)
    if not 1 <= len(epoch) <= 64 or not epoch.isprintable():
        raise Invalid("epoch must be the 1..64 character string a subscribed frame gave")
    return SubscribeOptions(capacity, policy, priority, credit, since, epoch, False, presence)
