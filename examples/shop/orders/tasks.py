"""The shop's django.tasks task, run by ``python manage.py leasecast_worker --queue emails``."""

from __future__ import annotations

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
