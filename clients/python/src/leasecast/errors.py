"""The one error tree of Leasecast.

Every error a client can see is a :class:`ProtocolError` whose ``code`` is one
of the codes of ``docs/protocol.md`` (section Errors). Backend failures are
translated at the adapter with ``raise Unavailable(...) from exc``.

This module is part of the ``leasecast`` client distribution and imports
nothing but the standard library; the gateway uses the same classes through
``gateway.errors`` (a re-export), so client and server share one tree.

.. code-block:: text

    LeasecastError
    ├── ProtocolError                 (code, http_status)
    │   ├── BadFrame                  bad_frame      400
    │   ├── UnknownOp                 unknown_op     400
    │   ├── Invalid                   invalid        400
    │   ├── TooLarge                  too_large      413
    │   ├── Unauthorized              unauthorized   401  (and a browser socket's close 4401)
    │   ├── Forbidden                 forbidden      403
    │   ├── StaleReceipt              stale_receipt  409
    │   ├── NotFound                  not_found      404
    │   ├── Backpressure              backpressure   429
    │   │   └── QueueFull                 a bounded queue at max_length
    │   └── Unavailable               unavailable    503
    ├── ClientError                   (client SDK only)
    │   └── ConnectionClosed
    │       └── TokenExpired              close 4401: reconnect with a fresh token
    └── Cancelled                     a task whose message was cancelled (a result's error)
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "Backpressure",
    "BadFrame",
    "Cancelled",
    "ClientError",
    "ConnectionClosed",
    "Forbidden",
    "Invalid",
    "LeasecastError",
    "NotFound",
    "ProtocolError",
    "QueueFull",
    "StaleReceipt",
    "TokenExpired",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "UnknownOp",
    "error_for_code",
]


class LeasecastError(Exception):
    """Root of every error Leasecast raises."""


class ProtocolError(LeasecastError):
    """An error with a wire code, sent to the client as an ``error`` frame.

    Args:
        detail: human-readable explanation, sent as ``detail``.
    """

    code: ClassVar[str] = "internal"
    http_status: ClassVar[int] = 500

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail or self.code)
        self.detail = detail or self.code

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.detail!r})"


class BadFrame(ProtocolError):
    """Not JSON, not an object, or a field missing or of the wrong type."""

    code = "bad_frame"
    http_status = 400


class UnknownOp(ProtocolError):
    """The ``op`` is not known on this socket."""

    code = "unknown_op"
    http_status = 400


class Invalid(ProtocolError):
    """A parameter value is out of range."""

    code = "invalid"
    http_status = 400


class TooLarge(ProtocolError):
    """A body or frame is over the size limit."""

    code = "too_large"
    http_status = 413


class Unauthorized(ProtocolError):
    """No token, or a token that is unknown, revoked, expired or forged.

    HTTP 401; a socket handshake without ``Origin`` is refused with 403; one
    with ``Origin`` is told this code in an error frame, then closed with 4401.
    """

    code = "unauthorized"
    http_status = 401


class Forbidden(ProtocolError):
    """The token's scopes do not allow this operation on this name."""

    code = "forbidden"
    http_status = 403


class StaleReceipt(ProtocolError):
    """The receipt is not the current lease of a message held by this socket."""

    code = "stale_receipt"
    http_status = 409


class NotFound(ProtocolError):
    """The queue or topic does not exist."""

    code = "not_found"
    http_status = 404


class Backpressure(ProtocolError):
    """A bounded buffer stayed full past its wait; the work was refused.

    Args:
        detail: human-readable explanation.
        retry_after: seconds until the same frame would be admitted, when the
            gateway said (a per-token rate limit: the error frame's
            ``retry_after``); None otherwise.
    """

    code = "backpressure"
    http_status = 429

    def __init__(self, detail: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(detail)
        self.retry_after = retry_after


class QueueFull(Backpressure):
    """An enqueue would take a bounded queue past its ``max_length``; nothing was applied.

    Args:
        detail: human-readable explanation.
        queue: the queue that is full.
        may_wait: the queue's overflow policy is ``block``: the gateway retries
            until its block wait runs out before answering ``backpressure``.
    """

    def __init__(self, detail: str, *, queue: str = "", may_wait: bool = False) -> None:
        super().__init__(detail)
        self.queue = queue
        self.may_wait = may_wait


class Unavailable(ProtocolError):
    """A transient server-side failure; nothing was applied, the client may retry."""

    code = "unavailable"
    http_status = 503


class ClientError(LeasecastError):
    """Errors raised by the client SDK itself."""


class ConnectionClosed(ClientError):
    """The socket closed and the client will not reconnect."""


class TokenExpired(ConnectionClosed):
    """The gateway closed the socket with 4401: its token expired, was revoked or refused.

    Not final: the client reconnects with a fresh token (from its token
    callable). A refused token without a callable is :class:`Unauthorized`.
    """


class Cancelled(LeasecastError):
    """A task was cancelled (protocol 1.2, Cancel): its message was dead-lettered
    with reason ``cancelled``. A task's result names it as its error
    (``leasecast.errors.Cancelled``), and its topic is told so.
    """


_BY_CODE: dict[str, type[ProtocolError]] = {
    cls.code: cls
    for cls in (
        BadFrame,
        UnknownOp,
        Invalid,
        TooLarge,
        Unauthorized,
        Forbidden,
        StaleReceipt,
        NotFound,
        Backpressure,
        Unavailable,
    )
}


def error_for_code(
    code: str, detail: str = "", *, retry_after: float | None = None
) -> ProtocolError:
    """Build the error instance for a wire ``code`` (used by the client SDK).

    Args:
        code: the error frame's ``code``.
        detail: its ``detail``.
        retry_after: its ``retry_after`` (``backpressure`` only; ignored otherwise).
    """
    if code == Backpressure.code:
        return Backpressure(detail, retry_after=retry_after)
    cls = _BY_CODE.get(code)
    if cls is None:
        # A code this version does not know: a subclass that keeps it.
        cls = type(f"ProtocolError_{code}", (ProtocolError,), {"code": code})
    return cls(detail)
