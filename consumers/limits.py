"""The per-token limits of this process (``gateway.core.ratelimit``), for sockets and the API.

One :class:`~gateway.core.ratelimit.TokenLimiter` per process, keyed by the
caller: a token, or a staff user. Sockets over ``GATEWAY_TOKEN_MAX_SOCKETS``
are accepted, told ``backpressure`` in one error frame and closed with 4429;
frames over ``GATEWAY_TOKEN_RATE`` are answered ``backpressure`` (with
``retry_after``) and change nothing; the socket stays open. The HTTP API
answers 429 with ``Retry-After`` (docs/protocol.md, Leasecast additions).
"""

from __future__ import annotations

import math
from collections.abc import Hashable

from gateway.core.errors import Backpressure
from gateway.core.protocol import AckFrame, AckManyFrame, ClientFrame, CreditFrame, EnqueueManyFrame
from gateway.core.ratelimit import Decision
from gateway.core.scopes import Principal
from gateway.core.wire import Ref, encode_error

__all__ = [
    "RateLimited",
    "frame_cost",
    "limit_key",
    "too_many_sockets",
]


def limit_key(principal: Principal) -> Hashable:
    """Whose allowance a call uses: the token's, or the staff user's."""
    if principal.token_id is not None:
        return ("token", principal.token_id)
    if principal.user_id is not None:
        return ("user", principal.user_id)
    return ("name", principal.name)


def frame_cost(frame: ClientFrame) -> int:
    """Messages a frame carries. ``credit`` is free: it has no reply to refuse it with."""
    match frame:
        case CreditFrame():
            return 0
        case EnqueueManyFrame():
            return len(frame.messages)
        case AckManyFrame():
            return len(frame.receipts)
        case AckFrame():
            return 1 + len(frame.follow_ups)
        case _:
            return 1


class RateLimited(Backpressure):
    """``backpressure`` for a caller over its message rate, with the wait."""

    def __init__(self, principal: Principal, decision: Decision, rate: float) -> None:
        super().__init__(
            f"{principal.name!r} is over its rate of {rate:g} messages/s "
            f"(GATEWAY_TOKEN_RATE); nothing was applied; retry in {decision.retry_after:.3f} s"
        )
        self.retry_after = decision.retry_after
        self.wait: float = decision.retry_after

    def error_frame(self, ref: Ref = None) -> str:
        """The error frame, with the extension field ``retry_after`` (seconds)."""
        return encode_error(self.code, self.detail, ref, retry_after=self.wait)

    def retry_after_header(self) -> str:
        """``Retry-After``: whole seconds, at least 1."""
        return str(max(1, math.ceil(self.wait)))


def too_many_sockets(principal: Principal, limit: int) -> Backpressure:
    """``backpressure`` for a socket over its token's socket limit (``limit`` sockets)."""
    return Backpressure(
        f"{principal.name!r} already holds {limit} sockets on this gateway process "
        "(GATEWAY_TOKEN_MAX_SOCKETS); close one and retry"
    )
