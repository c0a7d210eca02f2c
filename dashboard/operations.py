"""Operator actions on queues and messages, for the Django admin and the dashboard.

They run on the caller's thread through Django's connection, each in one
transaction, apply the same rules as the store, and then wake the queue's
pumps (this process directly; other gateways through ``NOTIFY`` on
PostgreSQL), so waiting workers see requeued or redriven messages at once.
Every action is recorded in Django's admin log by the caller.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from django.db import connection, transaction
from django.db.models import Q

from gateway.engine import wake_from_thread
from gateway.leases import StoredState
from gateway.models import Message, Queue
from gateway.store import NOTIFY_CHANNEL

__all__ = ["audit", "purge", "redrive", "requeue"]


def _in_flight(now: float) -> Q:
    return Q(state=StoredState.LEASED, visible_at__gt=now)


def _announce(queues: Iterable[str]) -> None:
    names = sorted(set(queues))
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for name in names:
                # Signed "admin": every gateway's listener takes it (each skips
                # only its own store's notifications).
                cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, f"admin {name}"])
    transaction.on_commit(lambda: wake_from_thread(names))


def requeue(messages: Iterable[Message]) -> int:
    """Make dead or in-flight messages visible again, keeping their place.

    The delivery count starts again from 0 (as in :func:`redrive`): an
    operator's requeue is a fresh start, so a message dead-lettered for
    exceeding ``max_deliveries`` is delivered at the next lease instead of
    being dead-lettered again. An in-flight message's lease ends here: its
    lease token is cleared, so its old receipt is stale from now on (the next
    lease issues a new one). Messages waiting for a lease (ready or delayed) are
    left alone.
    Returns how many messages changed.
    """
    ids = [m.pk for m in messages]
    with transaction.atomic():
        rows = Message.objects.filter(pk__in=ids, state__in=[StoredState.DEAD, StoredState.LEASED])
        queues = set(rows.values_list("queue__name", flat=True))
        changed = rows.update(
            state=StoredState.READY, visible_at=time.time(), deliveries=0, lease_token=None
        )
        _announce(queues)
    return changed


def purge(queue: Queue) -> int:
    """Delete every message of ``queue`` that is not in flight (as ``POST .../purge``)."""
    now = time.time()
    with transaction.atomic():
        deleted, _ = Message.objects.filter(queue=queue).exclude(_in_flight(now)).delete()
    return deleted


def redrive(queue: Queue) -> int:
    """Move every dead message back to visible with its delivery count reset."""
    with transaction.atomic():
        moved = Message.objects.filter(queue=queue, state=StoredState.DEAD).update(
            state=StoredState.READY, visible_at=time.time(), deliveries=0, lease_token=None
        )
        _announce([queue.name])
    return moved


def audit(user_id: int | None, obj: Any, message: str) -> None:
    """Record an operator action done outside the admin (the dashboard) in the admin log.

    ``obj`` is a model instance, or a description of something that is not a
    row (a socket). Token-authenticated calls have no user and are not logged.
    """
    if user_id is None:
        return
    from django.contrib.admin.models import CHANGE, LogEntry
    from django.contrib.contenttypes.models import ContentType

    if isinstance(obj, str):
        LogEntry.objects.create(
            user_id=user_id, object_repr=obj[:200], action_flag=CHANGE, change_message=message
        )
    else:
        LogEntry.objects.create(
            user_id=user_id,
            content_type=ContentType.objects.get_for_model(obj),
            object_id=str(obj.pk),
            object_repr=str(obj)[:200],
            action_flag=CHANGE,
            change_message=message,
        )
