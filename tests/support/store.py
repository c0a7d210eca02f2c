"""Shorthands for the store's unit tests: one op at a time, messages by their bodies.

The store runs batches of typed ops (``Store.run``); a test usually runs one
and reads its one result. The fixtures (a store per database, its fake clock,
a fresh queue name) are in tests/unit/conftest.py.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.core.protocol import EnqueueSpec
from gateway.store import Enqueue, Lease, LeaseResult, Store

__all__ = ["bodies", "enqueue", "lease", "msg", "one"]


def msg(
    body: object = 1,
    key: str | None = None,
    delay: float = 0.0,
    *,
    group: str | None = None,
    priority: int = 0,
    ttl: float | None = None,
) -> EnqueueSpec:
    return EnqueueSpec(orjson.dumps(body), key, delay, group, priority, ttl)


def one(store: Store, op: Any) -> Any:
    (result,) = store.run([op])
    return result


def enqueue(store: Store, queue: str, *bodies: object) -> list[str]:
    return [r.id for r in one(store, Enqueue(queue, [msg(b) for b in bodies]))]


def lease(store: Store, queue: str, n: int = 10, timeout: float | None = None) -> LeaseResult:
    result = one(store, Lease(queue, n, timeout))
    assert isinstance(result, LeaseResult)
    return result


def bodies(result: LeaseResult) -> list[str]:
    return [d.body for d in result.delivered]
