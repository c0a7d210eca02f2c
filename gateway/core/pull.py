"""HTTP workers (protocol 1.2: HTTP workers, pull): their requests and receipts, pure.

A program that cannot hold a WebSocket open leases with ``POST
/api/queues/QUEUE/lease`` and ends its leases with ``.../ack``, ``.../nack``,
``.../reject`` and ``.../extend``, each naming 1..1000 receipts. This module
checks those request bodies (every refusal is ``invalid``, naming the field;
unknown fields too) and marks the receipts it hands out.

A receipt names one delivery (``gateway.core.leases.format_receipt``); an HTTP
lease's receipt is that string behind :data:`HTTP_RECEIPT_PREFIX` and a tag
of its queue's name (``hTAG.ID.HEX``). The protocol says an HTTP receipt is
ended over HTTP and a socket's on its socket: with the mark, a socket's
receipt sent over HTTP is told stale without touching the store, and an HTTP
receipt sent on a socket is stale there because no socket holds it. The tag
keeps a request to one queue from ending a lease of another (the store ends
leases by receipt alone): such a receipt is stale too.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Any

from gateway.core.errors import Invalid
from gateway.core.leases import MAX_TIMEOUT, parse_receipt
from gateway.core.protocol import MAX_DELAY, unknown_fields

__all__ = [
    "HTTP_RECEIPT_PREFIX",
    "MAX_LEASE",
    "MAX_RECEIPTS",
    "MAX_WAIT",
    "EndRequest",
    "LeaseRequest",
    "http_receipt",
    "parse_end",
    "parse_lease",
    "split_http_receipt",
    "store_receipt",
]

#: Most messages one lease request takes.
MAX_LEASE = 100
#: Longest a lease request waits for a message, in seconds.
MAX_WAIT = 20.0
#: Most receipts one ack, nack, reject or extend request names.
MAX_RECEIPTS = 1000
#: Marks a receipt handed out over HTTP (receipts are otherwise ``ID.HEX``).
HTTP_RECEIPT_PREFIX = "h"

_LEASE_FIELDS = frozenset({"max", "wait", "visibility_timeout"})
#: The fields of each ending request, by its action.
_END_FIELDS: dict[str, frozenset[str]] = {
    "ack": frozenset({"receipts"}),
    "nack": frozenset({"receipts", "delay"}),
    "reject": frozenset({"receipts"}),
    "extend": frozenset({"receipts", "timeout"}),
}


@dataclass(frozen=True, slots=True)
class LeaseRequest:
    """``POST .../lease``: up to ``max`` messages, waiting up to ``wait`` seconds."""

    max: int = 1
    wait: float = 0.0
    #: the lease length; None: the queue's
    visibility_timeout: float | None = None


@dataclass(frozen=True, slots=True)
class EndRequest:
    """``POST .../ack`` (``nack``, ``reject``, ``extend``).

    ``receipts`` are the store's receipts of the request's HTTP receipts, in
    order and without repeats; ``foreign`` the receipts that are well formed
    but not HTTP leases (a socket's), reported stale as they are.
    """

    action: str
    receipts: dict[str, str]  # HTTP receipt -> store receipt
    foreign: list[str]
    delay: float = 0.0
    timeout: float = 0.0


def _tag(queue: str) -> str:
    return f"{zlib.crc32(queue.encode()):08x}"


def http_receipt(queue: str, receipt: str) -> str:
    """The receipt an HTTP worker is given for the store's ``receipt`` of ``queue``."""
    return f"{HTTP_RECEIPT_PREFIX}{_tag(queue)}.{receipt}"


def split_http_receipt(receipt: str) -> tuple[str, str] | None:
    """``(tag, store receipt)`` of an HTTP receipt, or None if ``receipt`` is not one."""
    if not receipt.startswith(HTTP_RECEIPT_PREFIX):
        return None
    tag, dot, inner = receipt[len(HTTP_RECEIPT_PREFIX) :].partition(".")
    if not dot or len(tag) != 8 or parse_receipt(inner) is None:
        return None
    return tag, inner


def store_receipt(queue: str, receipt: str) -> str | None:
    """The store's receipt behind an HTTP receipt of ``queue``, or None if
    ``receipt`` is not one (not an HTTP receipt, or another queue's)."""
    split = split_http_receipt(receipt)
    return split[1] if split is not None and split[0] == _tag(queue) else None


def _number(data: dict[str, Any], name: str) -> float:
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Invalid(f"{name} must be a number, got {str(value)[:40]!r}")
    return float(value)


def parse_lease(data: dict[str, Any]) -> LeaseRequest:
    """Check a lease request's body (every field optional).

    Raises:
        Invalid: an unknown field, or ``max`` not an integer 1..100, ``wait``
            not 0..20 seconds, ``visibility_timeout`` not in (0, 12 h].
    """
    if data.keys() - _LEASE_FIELDS:
        raise unknown_fields(data, _LEASE_FIELDS, "lease")
    n = data.get("max", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_LEASE:
        raise Invalid(f"max must be an integer 1..{MAX_LEASE}, got {str(n)[:40]!r}")
    wait = 0.0 if data.get("wait") is None else _number(data, "wait")
    if not 0 <= wait <= MAX_WAIT:
        raise Invalid(f"wait must be 0..{MAX_WAIT:g} seconds, got {wait:g}")
    timeout = None
    if data.get("visibility_timeout") is not None:
        timeout = _number(data, "visibility_timeout")
        if not 0 < timeout <= MAX_TIMEOUT:
            raise Invalid(f"visibility_timeout must be > 0 and <= {MAX_TIMEOUT:.0f} seconds")
    return LeaseRequest(n, wait, timeout)


def parse_end(action: str, queue: str, data: dict[str, Any]) -> EndRequest:
    """Check the body of an ack, nack, reject or extend request to ``queue``.

    A socket's receipt, and an HTTP receipt of another queue, are well formed
    but not this request's to end: they go to ``foreign``, reported stale.

    Raises:
        Invalid: an unknown field; ``receipts`` not a list of 1..1000
            receipts (a string that is no receipt at all names its index);
            a ``delay`` (nack, default 0) or ``timeout`` (extend, required)
            out of range.
    """
    known = _END_FIELDS[action]
    if data.keys() - known:
        raise unknown_fields(data, known, action)
    receipts = data.get("receipts")
    if not isinstance(receipts, list) or not 1 <= len(receipts) <= MAX_RECEIPTS:
        raise Invalid(f"receipts must be a list of 1..{MAX_RECEIPTS} receipts")
    mine: dict[str, str] = {}
    foreign: list[str] = []
    for index, receipt in enumerate(receipts):
        if not isinstance(receipt, str):
            raise Invalid(f"receipts[{index}] is not a receipt: {str(receipt)[:60]!r}")
        inner = store_receipt(queue, receipt)
        if inner is not None:
            mine.setdefault(receipt, inner)
        elif split_http_receipt(receipt) is not None or parse_receipt(receipt) is not None:
            if receipt not in foreign:
                foreign.append(receipt)  # another queue's, or a socket's
        else:
            raise Invalid(f"receipts[{index}] is not a receipt: {receipt[:60]!r}")
    delay = timeout = 0.0
    if action == "nack" and data.get("delay") is not None:
        delay = _number(data, "delay")
        if not 0 <= delay <= MAX_DELAY:
            raise Invalid(f"delay must be 0..{MAX_DELAY:.0f} seconds")
    if action == "extend":
        if data.get("timeout") is None:
            raise Invalid("extend needs a timeout (seconds)")
        timeout = _number(data, "timeout")
        if not 0 < timeout <= MAX_TIMEOUT:
            raise Invalid(f"timeout must be > 0 and <= {MAX_TIMEOUT:.0f} seconds")
    return EndRequest(action, mine, foreign, delay, timeout)
