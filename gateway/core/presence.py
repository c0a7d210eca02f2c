"""Presence: who is subscribed to a topic, as soft state (docs/protocol.md, "Presence").

Pure: no Django, no I/O. A topic whose ``presence`` setting is on has a
member per subscription (subscriber socket, multiplexed subscription or
event stream), on every gateway process. A member is who subscribed
(``user``), what the application said about them (``info``, a signed
token's optional claim) and an id unique to the subscription (``client``).

Members are soft state with a lease (docs/design.md): a process keeps its
own and refreshes them where every process can read them; one that dies
stops refreshing, and its members expire (``gateway.topics.presence``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.core.errors import Invalid

__all__ = [
    "MAX_INFO_BYTES",
    "Member",
    "check_info",
]

#: Largest ``info`` claim of a signed token, as compact JSON.
MAX_INFO_BYTES = 1024


def check_info(info: object) -> str | None:
    """A signed token's ``info`` claim as compact JSON text, or None without one.

    Raises:
        Invalid: not a JSON object, or over :data:`MAX_INFO_BYTES` as compact JSON.
    """
    if info is None:
        return None
    if not isinstance(info, dict):
        raise Invalid("info must be a JSON object")
    try:
        text = orjson.dumps(info)
    except TypeError as exc:  # not from JSON, e.g. a key that is not a string
        raise Invalid(f"info must be a JSON object: {exc}") from None
    if len(text) > MAX_INFO_BYTES:
        raise Invalid(f"info must be at most {MAX_INFO_BYTES} bytes of JSON, got {len(text)}")
    return text.decode()


@dataclass(frozen=True, slots=True)
class Member:
    """One subscription of a topic with presence.

    Args:
        client: unique per subscription (on every process).
        user: the signed token's ``sub``, the stored token's name, or the
            session user's username.
        info: the signed token's ``info`` claim as compact JSON text, or None.
    """

    client: str
    user: str
    info: str | None = field(default=None)

    def as_json(self) -> dict[str, Any]:
        """``{"client", "user", "info"}`` as the presence document lists it."""
        return {
            "client": self.client,
            "user": self.user,
            "info": None if self.info is None else orjson.loads(self.info),
        }

    def encode(self) -> bytes:
        """The member as stored where processes share it (one JSON object)."""
        return orjson.dumps({"client": self.client, "user": self.user, "info": self.info})

    @classmethod
    def decode(cls, data: bytes | str) -> Member:
        """The member :meth:`encode` stored.

        Raises:
            ValueError: not what :meth:`encode` writes.
        """
        obj = orjson.loads(data)
        if not isinstance(obj, dict):
            raise ValueError("a member is a JSON object")
        client, user, info = obj.get("client"), obj.get("user"), obj.get("info")
        if not isinstance(client, str) or not isinstance(user, str):
            raise ValueError("a member needs 'client' and 'user' strings")
        if info is not None and not isinstance(info, str):
            raise ValueError("a member's 'info' is JSON text or null")
        return cls(client, user, info)
