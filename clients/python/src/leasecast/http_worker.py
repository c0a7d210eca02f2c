"""A worker over plain HTTP, for programs that cannot hold a WebSocket open.

Serverless functions, cron jobs and scripts lease with ``POST
/api/queues/QUEUE/lease`` and end their leases with ``.../ack``, ``.../nack``,
``.../reject`` and ``.../extend`` (docs/protocol.md, HTTP workers). A lease
taken so belongs to no socket: it ends by ack, nack, reject, cancel or its
visibility timeout. Synchronous and standard library only:

.. code-block:: python

    from leasecast import HttpWorker

    worker = HttpWorker("http://127.0.0.1:8000", "emails", token=TOKEN)
    # Drain the queue and stop (a cron job): each message handled is acked,
    # one that raises is nacked (it comes again).
    worker.run(send_email_for, stop_when_empty=True)

    # Or by hand: wait up to 20 s for up to 10 messages.
    for delivery in worker.lease(max=10, wait=20):
        handle(delivery.body)
        delivery.ack()
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from leasecast.api import http_call
from leasecast.errors import LeasecastError, StaleReceipt
from leasecast.link import http_url, name_path

__all__ = ["Ended", "HttpDelivery", "HttpWorker"]

log = logging.getLogger("leasecast.client")

#: Seconds the HTTP call may take beyond the lease request's own ``wait``.
GRACE = 10.0


@dataclass(frozen=True)
class Ended:
    """What an ack, nack, reject or extend request did.

    Attributes:
        n: how many leases it applied to.
        stale: the receipts whose lease had already ended (acked, expired,
            cancelled, redelivered) or was not an HTTP lease: nothing changed.
        expires_in: extend only: seconds until the soonest of the extended
            leases ends.
    """

    n: int
    stale: list[str]
    expires_in: float | None = None


@dataclass
class HttpDelivery:
    """One message leased over HTTP. End the lease with one of ack, nack or reject.

    Attributes are those of :class:`~leasecast.worker.Delivery`: ``queue``,
    ``id``, ``receipt``, ``body``, ``deliveries``, ``expires_in``, ``group``
    and ``priority``.
    """

    queue: str
    id: str
    receipt: str
    body: Any
    deliveries: int
    expires_in: float
    group: str | None = None
    priority: int = 0
    _worker: HttpWorker = field(repr=False, compare=False, kw_only=True)

    def _one(self, ended: Ended) -> None:
        if ended.n == 0:
            raise StaleReceipt(f"the lease of message {self.id} had ended")

    def ack(self) -> None:
        """Delete the message.

        Raises:
            StaleReceipt: the lease had ended; nothing was applied.
        """
        self._one(self._worker.ack([self.receipt]))

    def nack(self, delay: float = 0.0) -> None:
        """Release the message; visible again after ``delay`` seconds.

        Raises:
            StaleReceipt: the lease had ended.
        """
        self._one(self._worker.nack([self.receipt], delay))

    def reject(self) -> None:
        """Dead-letter the message now.

        Raises:
            StaleReceipt: the lease had ended.
        """
        self._one(self._worker.reject([self.receipt]))

    def extend(self, timeout: float) -> float:
        """Make the lease end ``timeout`` seconds from now; returns the new ``expires_in``.

        Raises:
            StaleReceipt: the lease had ended.
        """
        ended = self._worker.extend([self.receipt], timeout)
        self._one(ended)
        self.expires_in = ended.expires_in if ended.expires_in is not None else timeout
        return self.expires_in


class HttpWorker:
    """Leases from one queue over the HTTP API.

    Args:
        url: the gateway, ``http://host:port``.
        queue: the queue name.
        token: a token with ``consume`` on the queue, or a function returning
            one (asked before each request).
        visibility_timeout: lease length in seconds (None: the queue's).
        timeout: seconds an ack, nack, reject or extend request may take.
    """

    def __init__(
        self,
        url: str,
        queue: str,
        *,
        token: str | Callable[[], str],
        visibility_timeout: float | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.url = url
        self.queue = queue
        self._token = token
        self.visibility_timeout = visibility_timeout
        self.timeout = timeout
        self._path = name_path("/api/queues/", queue).rstrip("/")

    def _post(self, action: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        """POST ``body`` to ``.../QUEUE/ACTION``; the decoded answer.

        Raises:
            ProtocolError: the gateway refused (its error code).
            LeasecastError: the gateway could not be reached or did not answer JSON.
        """
        url = http_url(self.url, f"{self._path}/{action}")
        token = self._token() if callable(self._token) else self._token
        request = urllib.request.Request(
            url,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        answer = http_call(request, timeout)
        if not isinstance(answer, dict):
            raise LeasecastError(f"{url} did not answer a JSON object")
        return answer

    def lease(self, max: int = 1, wait: float = 0.0) -> list[HttpDelivery]:
        """Lease up to ``max`` (1..100) messages, waiting up to ``wait`` (0..20)
        seconds for the first; an empty list if none came in time.

        Raises:
            Invalid: ``max`` or ``wait`` out of range.
            Forbidden: the token has no ``consume`` scope on the queue.
        """
        body: dict[str, Any] = {"max": max, "wait": wait}
        if self.visibility_timeout is not None:
            body["visibility_timeout"] = self.visibility_timeout
        answer = self._post("lease", body, timeout=float(wait) + GRACE)
        return [
            HttpDelivery(
                queue=item["queue"],
                id=item["id"],
                receipt=item["receipt"],
                body=item["body"],
                deliveries=int(item["deliveries"]),
                expires_in=float(item["expires_in"]),
                group=item.get("group"),
                priority=int(item.get("priority") or 0),
                _worker=self,
            )
            for item in answer["deliveries"]
        ]

    def _end(self, action: str, counted: str, receipts: Iterable[str], **extra: float) -> Ended:
        answer = self._post(action, {"receipts": list(receipts), **extra}, self.timeout)
        expires_in = answer.get("expires_in")
        return Ended(
            int(answer[counted]),
            list(answer.get("stale") or []),
            None if expires_in is None else float(expires_in),
        )

    def ack(self, receipts: Iterable[str]) -> Ended:
        """Delete the messages of these leases (1..1000 receipts)."""
        return self._end("ack", "acked", receipts)

    def nack(self, receipts: Iterable[str], delay: float = 0.0) -> Ended:
        """Release these leases; the messages are visible again after ``delay`` seconds."""
        return self._end("nack", "nacked", receipts, delay=delay)

    def reject(self, receipts: Iterable[str]) -> Ended:
        """Dead-letter the messages of these leases now."""
        return self._end("reject", "rejected", receipts)

    def extend(self, receipts: Iterable[str], timeout: float) -> Ended:
        """Make these leases end ``timeout`` seconds from now."""
        return self._end("extend", "extended", receipts, timeout=timeout)

    def run(
        self,
        handle: Callable[[HttpDelivery], object],
        *,
        max: int = 10,
        wait: float = 20.0,
        stop_when_empty: bool = False,
        retry_delay: float = 0.0,
        limit: int | None = None,
    ) -> int:
        """Lease and handle messages in a loop: each one ``handle`` returns from is
        acked (one request per lease), one it raises for is nacked (it comes again
        after ``retry_delay`` seconds, until the queue's ``max_deliveries``).

        Args:
            handle: called with each delivery, one at a time.
            max: most messages per lease request (1..100).
            wait: seconds each lease request waits for the first message.
            stop_when_empty: return once a lease request comes back empty
                (a cron job draining the queue); otherwise loop for ever.
            retry_delay: the nack's delay for a message ``handle`` failed.
            limit: return after this many messages.

        Returns:
            How many messages were handled (acked or nacked).
        """
        handled = 0
        while limit is None or handled < limit:
            room = max if limit is None else min(max, limit - handled)
            deliveries = self.lease(room, wait)
            if not deliveries:
                if stop_when_empty:
                    break
                continue
            done: list[str] = []
            for delivery in deliveries:
                try:
                    handle(delivery)
                except Exception:
                    log.exception("handling message %s failed; nacked", delivery.id)
                    self.nack([delivery.receipt], retry_delay)
                else:
                    done.append(delivery.receipt)
                handled += 1
            if done:
                ended = self.ack(done)
                if ended.stale:
                    log.warning("%d leases had ended before their ack", len(ended.stale))
        return handled
