"""The public path of the error tree: ``gateway.errors``.

The code is in :mod:`gateway.core.errors`; this module only hands its public names on,
so that what users import and run keeps working.
"""

from __future__ import annotations

from gateway.core.errors import (
    Backpressure,
    BadFrame,
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
