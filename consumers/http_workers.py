"""HTTP workers (protocol 1.2: HTTP workers, pull): lease and end leases over HTTP.

For programs that cannot hold a WebSocket open (serverless functions, cron
jobs, shell scripts), with scope ``consume`` on the queue:

- ``POST /api/queues/QUEUE/lease`` ``{"max", "wait", "visibility_timeout"}``
  leases with the same store op as a worker socket's pump, so every queue
  rule applies (groups, priority, ttl, ``max_deliveries``, pause, limits).
  With ``wait``, a request that finds nothing joins the queue's pump as a
  waiting worker would: it is woken by what wakes the pump (an enqueue or a
  release on any process, the timer of the next due message, room under
  the queue's limits), never by polling.
- ``.../ack``, ``.../nack``, ``.../reject``, ``.../extend`` end or extend
  1..1000 leases at once, each applied or reported stale on its own; the
  ops go to the group committer together, so they share its transactions.

A lease taken here belongs to no socket: it ends by ack, nack, reject,
cancel or its visibility timeout. Its receipt is marked as an HTTP one
(``gateway.core.pull``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
from django.http import HttpRequest, HttpResponse

from consumers.http import _body, _json, api
from gateway.core.errors import ProtocolError, StaleReceipt
from gateway.core.protocol import check_name
from gateway.core.pull import EndRequest, LeaseRequest, http_receipt, parse_end, parse_lease
from gateway.core.scopes import Principal
from gateway.engine import Engine
from gateway.runtime import current_runtime
from gateway.store import Ack, Delivered, Extend, Lease, Nack, Reject, Returns

__all__ = ["ack", "extend", "lease", "nack", "reject"]

#: Most lease rounds one request runs at once when rounds only dead-letter.
_ROUNDS = 5


class _Waiter:
    """A lease request waiting for messages, attached to its queue's pump like a
    worker socket (``gateway.engine.pump.WorkerSink``): it takes one share of a
    lease round, then wants no more."""

    def __init__(self, n: int, timeout: float | None) -> None:
        self._n = n
        self._timeout = timeout
        self.items: list[Delivered] = []
        self.done = asyncio.Event()

    @property
    def demand(self) -> int:
        return 0 if self.done.is_set() else self._n

    @property
    def room(self) -> int:
        return self.demand

    @property
    def visibility_timeout(self) -> float | None:
        return self._timeout

    def deliver(self, items: list[Delivered]) -> None:
        self.items = items
        self.done.set()

    def give_up(self) -> None:
        """The wait is over: take nothing more."""
        self.done.set()


async def _wait_for_messages(engine: Engine, queue: str, asked: LeaseRequest) -> list[Delivered]:
    waiter = _Waiter(asked.max, asked.visibility_timeout)
    engine.attach(queue, waiter)  # runs a round at once if one may find work
    try:
        await asyncio.wait_for(waiter.done.wait(), asked.wait)
    except TimeoutError:
        pass
    finally:
        # Also when the client went away: nothing more is handed to it. What
        # it was handed already comes back through its visibility timeout.
        waiter.give_up()
        engine.detach(queue, waiter)
    return waiter.items


def _item(queue: str, d: Delivered, now: float) -> dict[str, Any]:
    """A lease's item: a ``deliver`` frame's fields without ``op``."""
    item: dict[str, Any] = {
        "queue": queue,
        "id": d.id,
        "receipt": http_receipt(queue, d.receipt),
        "body": orjson.Fragment(d.body),
        "deliveries": d.deliveries,
        "expires_in": round(max(0.0, d.expires_at - now), 3),
    }
    # As in deliver frames (protocol 1.1): present when the message has them.
    if d.group is not None or d.priority:
        item["priority"] = d.priority
    if d.group is not None:
        item["group"] = d.group
    return item


@api("POST")
async def lease(request: HttpRequest, principal: Principal, queue: str) -> HttpResponse:
    """Lease up to ``max`` messages, waiting up to ``wait`` seconds for the first:
    ``{"deliveries": [ITEM, ...]}`` (empty when none came in time)."""
    check_name(queue)
    principal.require("consume", queue)
    asked = parse_lease(_body(request) if request.body else {})
    engine = current_runtime().engine
    delivered: list[Delivered] = []
    for _ in range(_ROUNDS):
        result = await engine.call(Lease(queue, asked.max, asked.visibility_timeout))
        engine.leased(queue, len(result.delivered))  # as a pump's round: room made
        delivered = result.delivered
        # A round that only dead-lettered (max_deliveries) may have made a
        # group's next message its head, leasable from the next round on.
        if delivered or not result.dead_lettered:
            break
    if not delivered and asked.wait > 0:
        delivered = await _wait_for_messages(engine, queue, asked)
    now = time.time()
    return _json({"deliveries": [_item(queue, d, now) for d in delivered]})


async def _outcome(engine: Engine, op: Returns[Any]) -> object:
    """The op's result, or the ProtocolError that refused it."""
    try:
        return await engine.call(op)
    except ProtocolError as exc:
        return exc


async def _end(
    request: HttpRequest, principal: Principal, queue: str, action: str
) -> tuple[EndRequest, list[object], list[str]]:
    """Apply ``action`` to every HTTP receipt of the request; the results in the
    request's order, and the receipts reported stale."""
    check_name(queue)
    principal.require("consume", queue)
    asked = parse_end(action, queue, _body(request))
    engine = current_runtime().engine
    ops: list[Ack | Nack | Reject | Extend] = []
    for receipt in asked.receipts.values():
        match action:
            case "ack":
                ops.append(Ack(receipt))
            case "nack":
                ops.append(Nack(queue, receipt, asked.delay))
            case "reject":
                ops.append(Reject(receipt))
            case _:
                ops.append(Extend(receipt, asked.timeout))
    # Submitted together: the committer applies them in one batch.
    results = await asyncio.gather(*(_outcome(engine, op) for op in ops))
    stale = list(asked.foreign)
    for given, result in zip(asked.receipts, results, strict=True):
        if isinstance(result, StaleReceipt):
            stale.append(given)
        elif isinstance(result, ProtocolError):
            # The store failed (unavailable): say so. The others of the
            # request were applied or not on their own; asking again
            # reports those that were as stale.
            raise result
    return asked, results, stale


def _applied(results: list[object]) -> int:
    return sum(1 for r in results if not isinstance(r, ProtocolError))


@api("POST")
async def ack(request: HttpRequest, principal: Principal, queue: str) -> HttpResponse:
    """Delete the messages of these leases: ``{"acked": n, "stale": [R, ...]}``."""
    _, results, stale = await _end(request, principal, queue, "ack")
    acked = _applied(results)
    return _json({"acked": acked, "stale": stale})


@api("POST")
async def nack(request: HttpRequest, principal: Principal, queue: str) -> HttpResponse:
    """Release these leases, visible again after ``delay``: ``{"nacked": n, "stale": [...]}``."""
    _, results, stale = await _end(request, principal, queue, "nack")
    return _json({"nacked": _applied(results), "stale": stale})


@api("POST")
async def reject(request: HttpRequest, principal: Principal, queue: str) -> HttpResponse:
    """Dead-letter these leases' messages: ``{"rejected": n, "stale": [...]}``."""
    _, results, stale = await _end(request, principal, queue, "reject")
    return _json({"rejected": _applied(results), "stale": stale})


#: An extended lease ending this much sooner than ``timeout`` was cut short by its ttl.
_CUT_SHORT = 1.0


@api("POST")
async def extend(request: HttpRequest, principal: Principal, queue: str) -> HttpResponse:
    """Make these leases end ``timeout`` seconds from now:
    ``{"extended": n, "stale": [...], "expires_in": S}``.

    ``expires_in`` is the soonest end among them (a message's ttl may cut its
    lease short), or ``timeout`` if none was extended.
    """
    asked, results, stale = await _end(request, principal, queue, "extend")
    ends = [r for r in results if isinstance(r, float)]
    now = time.time()
    # The store counted ``timeout`` from its transaction's start, a moment
    # ago: an end that far off is the timeout asked, reported as asked (S);
    # only an end a message's ttl cut short is reported as what is left.
    cut = [end - now for end in ends if end < now + asked.timeout - _CUT_SHORT]
    soonest = min(cut) if cut else asked.timeout
    return _json({"extended": len(ends), "stale": stale, "expires_in": round(max(0.0, soonest), 3)})
