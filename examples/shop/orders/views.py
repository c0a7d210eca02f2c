"""Placing an order: the order, its message and its task commit together or not at all."""

from __future__ import annotations

import json

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

import gateway
from orders.models import Order
from orders.tasks import send_receipt


class PaymentDeclined(Exception):
    """The card was refused: nothing of the order may remain."""


def charge(order: Order, card: str) -> None:
    """A stand-in for a payment provider: the card "declined" is refused."""
    if card == "declined":
        raise PaymentDeclined(f"card refused for order {order.pk}")


@csrf_exempt  # a JSON endpoint for the example's HTTP clients; forms would keep CSRF
@require_POST
def place_order(request: HttpRequest) -> HttpResponse:
    """``POST /orders/`` with ``{"customer", "total_cents", "card"}``.

    The order row, a message to the ``orders.placed`` queue (one at a time
    per customer) and the receipt task commit in one transaction. A declined
    card raises after both were enqueued: the transaction rolls back and no
    worker ever hears of the order.
    """
    data = json.loads(request.body or b"{}")
    attempted: dict[str, object] = {}
    try:
        with transaction.atomic():
            order = Order.objects.create(
                customer=data["customer"], total_cents=int(data["total_cents"])
            )
            placed = gateway.enqueue(
                "orders.placed",
                {"order": order.pk, "customer": order.customer},
                group=f"customer-{order.customer}",
            )
            receipt = send_receipt.enqueue(order.pk)
            attempted = {"order": order.pk, "message": placed.id, "receipt_task": receipt.id}
            charge(order, data.get("card", ""))
    except PaymentDeclined as exc:
        return JsonResponse({"error": str(exc), "rolled_back": attempted}, status=402)
    return JsonResponse(attempted, status=201)


@require_GET
def order_detail(request: HttpRequest, pk: int) -> HttpResponse:
    order = get_object_or_404(Order, pk=pk)
    return JsonResponse({"order": order.pk, "customer": order.customer, "total": order.total_cents})


@require_GET
def task_result(request: HttpRequest, result_id: str) -> HttpResponse:
    """The receipt task's result, from any process (the result is in the database)."""
    try:
        result = send_receipt.get_result(result_id)
    except Exception as exc:  # TaskResultDoesNotExist, from django.tasks or django_tasks
        if type(exc).__name__ != "TaskResultDoesNotExist":
            raise
        return JsonResponse({"error": "no such task result"}, status=404)
    return JsonResponse({"status": str(result.status), "args": result.args})
