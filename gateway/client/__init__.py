"""Deprecated name of the Python client: use ``leasecast`` (``clients/python/``).

A thin re-export kept for code that still imports ``gateway.client`` (the
Spark tests and the task worker's unit tests); new code imports ``leasecast``.
"""

from __future__ import annotations

from leasecast import (
    Delivery,
    EnqueueResult,
    Message,
    Producer,
    PublishResult,
    Subscriber,
    Worker,
)

__all__ = [
    "Delivery",
    "EnqueueResult",
    "Message",
    "Producer",
    "PublishResult",
    "Subscriber",
    "Worker",
]
