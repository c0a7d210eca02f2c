"""Operator actions on queues and messages, for the Django admin and the dashboard.

They run on the caller's thread through Django's connection, each in one
transaction, with the store's own functions (``gateway.store.operator``), so
the admin applies exactly the rules the API does, ordering groups included.
Then they wake the queue's pumps (this process directly; other gateways
through ``NOTIFY`` on PostgreSQL), so waiting workers see requeued or
redriven messages at once. Every action is recorded in Django's admin log by
the caller.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.core.errors import NotFound
from gateway.host.on_django import django_transaction
from gateway.models import Message, Queue
from gateway.store import operator as store_operator

__all__ = ["audit", "delete", "purge", "redrive", "requeue"]


def requeue(messages: Iterable[Message]) -> int:
    """Make dead or in-flight messages visible again (see ``operator.requeue_ids``).

    The delivery count starts again from 0: an operator's requeue is a fresh
    start. An in-flight message's old receipt is stale from now on. A message
    of a group waits for its group's head, or goes first if it is earlier
    than a head not yet leased. Returns how many messages changed.
    """
    with django_transaction() as txn:
        return store_operator.requeue_ids(txn, [m.pk for m in messages])


def delete(messages: Iterable[Message]) -> int:
    """Delete messages in any state; a deleted group head lets its group's next go."""
    deleted = 0
    with django_transaction() as txn:
        for message in messages:
            q = txn.queue(txn.queues.name_of(txn, message.queue_id), create=False)
            try:
                deleted += store_operator.delete_message(txn, q, message.pk)
            except NotFound:
                continue  # deleted meanwhile
    return deleted


def purge(queue: Queue) -> int:
    """Delete every message of ``queue`` that is not in flight (as ``POST .../purge``)."""
    with django_transaction() as txn:
        return store_operator.purge(txn, txn.queue(queue.name, create=False))


def redrive(queue: Queue) -> int:
    """Move every dead message back to visible with its delivery count reset."""
    with django_transaction() as txn:
        return store_operator.redrive(txn, txn.queue(queue.name, create=False))


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
