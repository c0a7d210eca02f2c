"""The shop's django.tasks tasks, run by ``python manage.py leasecast_worker``.

``send_receipt`` goes to the ``emails`` queue, ``pack_order`` (the progress
page's) to ``default``.
"""

from __future__ import annotations

import time

try:  # Django 6.0 and later
    from django.tasks import task  # type: ignore[import-not-found]
except ImportError:  # Django 5.2 with the django-tasks package
    from django_tasks import task

from orders.models import Order


@task(queue_name="emails")
def send_receipt(order_id: int) -> str:
    """Email the receipt of an order (here: say so). The order is always there: the
    task was enqueued in the transaction that created it."""
    order = Order.objects.get(pk=order_id)
    return f"receipt for {order.total_cents / 100:.2f} sent to {order.customer}"


@task()
def pack_order(order_id: int, steps: int = 20, step_seconds: float = 0.5) -> str:
    """Pack an order in ``steps`` steps, telling the page after each one.

    ``progress()`` publishes to the task's topic, which the progress page
    watches (``watchTask`` in the JavaScript client); ``cancelled()`` turns
    true if someone cancels the task (``gateway.tasks.cancel``).
    """
    from gateway.tasks import cancelled, progress

    order = Order.objects.get(pk=order_id)
    for done in range(1, steps + 1):
        if cancelled():
            return f"order {order.pk}: packing stopped after {done - 1} of {steps} steps"
        time.sleep(step_seconds)
        progress({"done": done, "of": steps})
    return f"order {order.pk} of {order.customer} packed"
