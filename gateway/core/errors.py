"""The one error tree of Leasecast, shared by the gateway and its clients.

The classes live in the ``leasecast`` client distribution
(``clients/python/src/leasecast/errors.py``), which the gateway depends on, so
a client and the server raise and catch the very same classes; this module
re-exports them under their historical name. See that module for the tree.
"""

from __future__ import annotations

from leasecast.errors import (
    Backpressure,
    BadFrame,
    Cancelled,
    ClientError,
    ConnectionClosed,
    Forbidden,
    Invalid,
    LeasecastError,
    NotFound,
    ProtocolError,
    QueueFull,
    StaleReceipt,
    TokenExpired,
    TooLarge,
    Unauthorized,
    Unavailable,
    UnknownOp,
    error_for_code,
)

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
