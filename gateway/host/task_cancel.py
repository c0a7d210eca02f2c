"""``gateway.tasks.cancel(result_id)``: cancel a task (protocol 1.2, Tasks: Cancel).

The task's message is dead-lettered with reason ``cancelled`` by the queue's
cancel rule (:func:`gateway.store.operator.cancel_message`), on Django's own
connection, in the caller's transaction (at once outside one). If it was
running, the worker holding it is sent the ``cancel`` frame when the
transaction commits, on whichever gateway process its socket is: an ``async``
task is cancelled, a sync one sees ``gateway.tasks.cancelled()`` turn true,
and the worker publishes FAILED with ``leasecast.errors.Cancelled`` on the
task's topic. A task that had not started is published FAILED here, after
the commit: through this process's runtime when it serves the gateway, else
over HTTP to ``LEASECAST_URL`` with ``LEASECAST_TOKEN`` when they are set
(the token needs ``publish:task.*``); otherwise the topic is not told (the
result says FAILED all the same).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable
from urllib.parse import quote

import orjson
from django.db import transaction

from gateway.conf import client_setting
from gateway.core.errors import LeasecastError, NotFound
from gateway.core.task_decisions import cancelled_update, task_topic
from gateway.engine.notify import announce_cancelled
from gateway.host.on_django import django_transaction
from gateway.host.producer import _post
from gateway.runtime import publish_from_thread
from gateway.store.operator import cancel_message

__all__ = ["cancel", "tell_cancelled_tasks"]

log = logging.getLogger("leasecast.tasks")


def cancel(result_id: str, *, using: str = "default") -> bool:
    """Cancel the task whose result id is ``result_id``.

    Args:
        result_id: the task's result id (``TaskResult.id``).
        using: the Django database the gateway serves (the backend's
            ``database`` option).

    Returns:
        True if the task was cancelled now; False if it had already ended
        (finished, or its message dead-lettered or deleted before).

    Raises:
        TaskResultDoesNotExist: no such result.
    """
    from gateway.host.tasks import TaskResultDoesNotExist
    from gateway.models import TaskRecord

    row = TaskRecord.objects.using(using).filter(id=result_id).values_list("queue", "message_id")
    found = row.first()
    if found is None:
        raise TaskResultDoesNotExist(result_id)
    queue, message_id = found
    if not message_id:
        return False
    with django_transaction(using) as txn:
        try:
            q = txn.queue(queue, create=False)
            outcome = cancel_message(txn, q, int(message_id))
        except NotFound:
            return False  # acked (finished) or deleted
        if outcome.receipt is not None:
            # Running: its worker is told when this commits, and publishes.
            announce_cancelled(q.name, str(message_id), outcome.receipt, using)
        elif outcome.cancelled:
            body = orjson.dumps(cancelled_update("the task was cancelled before it ran"))
            topic = task_topic(result_id)
            transaction.on_commit(lambda: _tell(topic, body), using=using)
    return bool(outcome.cancelled)


def tell_cancelled_tasks(message_ids: Iterable[int], *, using: str = "default") -> None:
    """Publish FAILED (``leasecast.errors.Cancelled``) on the task topic of every
    task among ``message_ids``: messages a cancel by message id (the HTTP
    endpoint, the admin, the dashboard) dead-lettered before any worker ran
    them. A running one's worker publishes for itself. Inside a transaction
    the topics are told when it commits; messages that are no task are skipped.
    """
    from gateway.models import TaskRecord

    ids = [int(i) for i in message_ids]
    if not ids:
        return
    rows = TaskRecord.objects.using(using).filter(message_id__in=ids).values_list("id", flat=True)
    body = orjson.dumps(cancelled_update("the task was cancelled before it ran"))
    for result_id in rows:
        topic = task_topic(result_id)
        transaction.on_commit(functools.partial(_tell, topic, body), using=using)


def _tell(topic: str, body: bytes) -> None:
    """Publish ``body`` to ``topic``: in process if this is a gateway, else over HTTP
    if a gateway is configured; never raises (the cancel is committed already)."""
    if publish_from_thread(topic, body):
        return
    url, token = client_setting("LEASECAST_URL"), client_setting("LEASECAST_TOKEN")
    if not url or not token:
        return
    endpoint = f"{url.rstrip('/')}/api/topics/{quote(topic, safe='')}/messages"
    try:
        _post(endpoint, token, b'{"messages":[{"body":%s}]}' % body)
    except (LeasecastError, OSError) as exc:
        log.warning("cancelled, but cannot tell %s: %s", topic, exc)
