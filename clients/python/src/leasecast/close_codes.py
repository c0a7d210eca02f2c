"""The WebSocket close codes of Leasecast (docs/protocol.md, Errors).

One table for the gateway, which closes sockets with them, and the clients,
which decide from them whether to reconnect. The JavaScript client
(``clients/js/leasecast.js``) exports the same names and numbers as
``CloseCode``; a unit test checks that the two agree.

This module is part of the ``leasecast`` client distribution and imports
nothing but the standard library.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["CloseCode"]


class CloseCode(IntEnum):
    """A close code the gateway sends or a client acts on.

    Final for the socket (reconnecting with the same URL and token cannot
    help): ``INVALID``, ``FORBIDDEN``, and ``UNAUTHORIZED`` unless a new token
    can be had. Every other code is retried with backoff.
    """

    #: A client closed its socket (``close()``).
    NORMAL_CLOSURE = 1000
    #: The gateway process is stopping (SIGTERM): reconnect, to another process.
    GOING_AWAY = 1001
    #: No close frame: the connection was lost (a client's own code, never sent).
    ABNORMAL_CLOSURE = 1006
    #: A frame over ``GATEWAY_MAX_FRAME_BYTES``.
    MESSAGE_TOO_BIG = 1009
    #: An operator disconnected the socket from the dashboard.
    DISCONNECTED_BY_OPERATOR = 4000
    #: A ``block`` subscriber whose buffer stayed full past the block wait.
    SLOW_CONSUMER = 4008
    #: The socket's URL was invalid (after one ``invalid`` error frame).
    INVALID = 4400
    #: The token expired, was revoked or was refused, or the session ended.
    UNAUTHORIZED = 4401
    #: The URL is outside the token's scopes (after one ``forbidden`` error frame).
    FORBIDDEN = 4403
    #: The topic's offsets restarted (a new epoch, e.g. Redis lost its data):
    #: resubscribe; ``since``/``epoch`` is answered ``recovered: false``. Not
    #: 1012: daphne lets an application close only with 1000 or 3000-4999.
    STREAM_RESTARTED = 4409
    #: The token already holds ``GATEWAY_TOKEN_MAX_SOCKETS`` sockets on the process.
    TOO_MANY_SOCKETS = 4429
    #: A transient failure while opening (``unavailable``): retry with backoff.
    UNAVAILABLE = 4503
