"""Enqueue from Django code: ``gateway.enqueue`` and ``gateway.aenqueue``.

.. code-block:: python

    import gateway

    with transaction.atomic():
        order = Order.objects.create(...)
        gateway.enqueue("orders", {"order": order.pk}, group=f"customer-{order.customer_id}")
    # the message exists if and only if the order does; workers are woken on commit

**In process** (Leasecast is in ``INSTALLED_APPS``): the message is written
through the caller's own database connection, inside the caller's
transaction, so it commits or rolls back with the caller's rows (design
decision 12). Outside a transaction it commits at once. The gateways are
woken after the commit, never by polling (``gateway.host.on_django``).

**Remote** (Leasecast is not installed): the same call is an HTTP request to
the gateway at ``LEASECAST_URL`` with ``LEASECAST_TOKEN`` (Django settings or
environment). A message without an idempotency key gets a random one, so the
retries this module makes after a lost reply or a 503 cannot enqueue it twice.
A remote enqueue is not part of the caller's transaction: call it from
``transaction.on_commit`` if it must follow the commit.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import orjson
from asgiref.sync import sync_to_async
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from gateway.conf import client_setting
from gateway.core.errors import (
    Forbidden,
    ProtocolError,
    QueueFull,
    Unauthorized,
    Unavailable,
    error_for_code,
)
from gateway.core.protocol import EnqueueSpec, Limits, check_name, parse_enqueue_spec
from gateway.store.ops import EnqueueResult

__all__ = ["aenqueue", "enqueue", "enqueue_many"]

#: Attempts of a remote enqueue before giving up (a 503, a lost reply, a refused connection).
REMOTE_ATTEMPTS = 5
#: Poll interval while a ``block`` queue is full, in process.
_BLOCK_POLL = 0.05


def enqueue(
    queue: str,
    body: Any,
    *,
    key: str | None = None,
    delay: float = 0.0,
    group: str | None = None,
    priority: int = 0,
    ttl: float | None = None,
    using: str = "default",
) -> EnqueueResult:
    """Enqueue one message, in the caller's transaction when there is one.

    Args:
        queue: the queue's name (created on first use).
        body: any JSON value.
        key: idempotency key (protocol: Enqueue).
        delay: seconds before the message becomes visible.
        group, priority, ttl: protocol 1.1 fields (ordering group, -100..100, seconds).
        using: the Django database alias (in process only).

    Returns:
        The message's id, or the existing id of a duplicate ``key``.

    Raises:
        BadFrame, Invalid, TooLarge: a bad argument; nothing was enqueued.
        Backpressure: a bounded queue is full (``block`` queues are waited
            for, up to ``GATEWAY_BLOCK_WAIT``, when not inside a transaction).
        Unavailable: the remote gateway could not be reached.
        Unauthorized, Forbidden: the remote gateway refused ``LEASECAST_TOKEN``.
        ImproperlyConfigured: remote, and ``LEASECAST_URL`` or
            ``LEASECAST_TOKEN`` is not set.
    """
    message: dict[str, Any] = {"body": body, "delay": delay, "priority": priority}
    for name, value in (("key", key), ("group", group), ("ttl", ttl)):
        if value is not None:
            message[name] = value
    return enqueue_many(queue, [message], using=using)[0]


async def aenqueue(queue: str, body: Any, **options: Any) -> EnqueueResult:
    """:func:`enqueue` for async code (runs on Django's thread for the connection)."""
    result: EnqueueResult = await sync_to_async(enqueue, thread_sensitive=True)(
        queue, body, **options
    )
    return result


def enqueue_many(
    queue: str, messages: list[dict[str, Any]], *, using: str = "default"
) -> list[EnqueueResult]:
    """Enqueue several messages (``{"body", "key"?, "delay"?, "group"?, "priority"?,
    "ttl"?}``) all or nothing; see :func:`enqueue`."""
    check_name(queue)
    limits = _limits()
    specs = [parse_enqueue_spec(message, limits) for message in messages]
    if apps.is_installed("gateway"):
        return _enqueue_in_process(queue, specs, using)
    return _enqueue_remote(queue, specs)


def _limits() -> Limits:
    if apps.is_installed("gateway"):
        from gateway.conf import gateway_settings

        return gateway_settings().limits
    return Limits()


def _enqueue_in_process(queue: str, specs: list[EnqueueSpec], using: str) -> list[EnqueueResult]:
    from gateway.conf import gateway_settings
    from gateway.host.on_django import enqueue_on_django

    # Waiting for room inside the caller's transaction would hold its locks
    # (on SQLite, the whole database) while the workers need them: refuse.
    may_wait = not connections[using].in_atomic_block
    deadline = time.monotonic() + gateway_settings().block_wait
    while True:
        try:
            return enqueue_on_django(using, queue, specs)
        except QueueFull as exc:
            if not (exc.may_wait and may_wait and time.monotonic() < deadline):
                raise
        time.sleep(_BLOCK_POLL)


def _enqueue_remote(queue: str, specs: list[EnqueueSpec]) -> list[EnqueueResult]:
    url, token = client_setting("LEASECAST_URL"), client_setting("LEASECAST_TOKEN")
    if not url or not token:
        raise ImproperlyConfigured(
            "Leasecast is not in INSTALLED_APPS, so gateway.enqueue sends to a gateway over "
            "HTTP: set LEASECAST_URL and LEASECAST_TOKEN (Django settings or environment)"
        )
    items = []
    automatic = []
    for spec in specs:
        item: dict[str, Any] = {
            "body": orjson.Fragment(spec.body_json),
            # A key makes the retries below safe: a second copy is a duplicate.
            "key": spec.key or f"lc-{uuid.uuid4().hex}",
        }
        automatic.append(spec.key is None)
        if spec.delay:
            item["delay"] = spec.delay
        if spec.group is not None:
            item["group"] = spec.group
        if spec.priority:
            item["priority"] = spec.priority
        if spec.ttl is not None:
            item["ttl"] = spec.ttl
        items.append(item)
    request_body = orjson.dumps({"messages": items})
    endpoint = f"{url.rstrip('/')}/api/queues/{queue}/messages"
    delay = 0.2
    for attempt in range(REMOTE_ATTEMPTS):
        try:
            reply = _post(endpoint, token, request_body)
            return [
                # A duplicate of a key this call made up is its own earlier
                # attempt, whose reply was lost: to the caller, a new message.
                EnqueueResult(r["id"], r["duplicate"] and not auto)
                for r, auto in zip(reply["results"], automatic, strict=True)
            ]
        except (Unauthorized, Forbidden) as exc:
            raise type(exc)(
                f"the gateway at {url} refused LEASECAST_TOKEN for enqueue to {queue!r}: "
                f"{exc.detail}"
            ) from exc
        except (Unavailable, urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            if attempt == REMOTE_ATTEMPTS - 1:
                raise Unavailable(f"gateway at {url} unavailable: {exc}") from exc
        time.sleep(delay)
        delay = min(delay * 2, 3.0)
    raise AssertionError("unreachable")


def _post(endpoint: str, token: str, body: bytes) -> dict[str, Any]:
    request = urllib.request.Request(
        endpoint,
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            reply: dict[str, Any] = orjson.loads(response.read())
            return reply
    except urllib.error.HTTPError as exc:
        try:
            detail = orjson.loads(exc.read())
            code, text = str(detail["error"]), str(detail.get("detail", ""))
        except (ValueError, KeyError, TypeError):
            # Not the gateway's JSON: a proxy's error page, or not a gateway at all.
            code = "unavailable" if exc.code >= 500 else "not_found" if exc.code == 404 else ""
            text = f"HTTP {exc.code} from {endpoint}, not a Leasecast reply"
        error = error_for_code(code, text) if code else ProtocolError(text)
        raise error from exc
