"""Cancel for the Django admin: dead-letter messages now, whatever their state.

The same rule as ``POST /api/queues/QUEUE/messages/ID/cancel`` (protocol 1.2:
Cancel), applied on Django's own connection in the admin's transaction
(``gateway.host.on_django``). A message in flight has its lease ended, and
the worker socket holding it, on whichever gateway process, is sent a
``cancel`` frame once the transaction commits: through the cancel's own
``NOTIFY`` on PostgreSQL, through a datagram to the gateway processes of the
file on SQLite (``gateway.engine.notify.announce_cancelled``).
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.core.errors import NotFound
from gateway.engine.notify import announce_cancelled
from gateway.host.on_django import django_transaction
from gateway.host.task_cancel import tell_cancelled_tasks
from gateway.models import Message
from gateway.store.operator import cancel_message

__all__ = ["cancel"]


def cancel(messages: Iterable[Message], using: str = "default") -> int:
    """Cancel ``messages``; returns how many were cancelled (not dead already, not gone)."""
    cancelled = 0
    waiting: list[int] = []  # cancelled before a worker had them: tasks told here
    with django_transaction(using) as txn:
        for message in messages:
            q = txn.queue(txn.queues.name_of(txn, message.queue_id), create=False)
            try:
                outcome = cancel_message(txn, q, message.pk)
            except NotFound:
                continue  # acked or deleted meanwhile
            cancelled += outcome.cancelled
            if outcome.receipt is not None:
                # Sent when the admin's transaction commits, not before.
                announce_cancelled(q.name, str(message.pk), outcome.receipt, using)
            elif outcome.cancelled:
                waiting.append(message.pk)
        tell_cancelled_tasks(waiting, using=using)
    return cancelled
