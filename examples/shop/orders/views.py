"""Placing an order: the order, its message and its task commit together or not at all.

And the packing page: an order whose packing task's progress the browser shows
live (``gateway.tasks.progress`` in the task, ``watchTask`` on the page).
"""

from __future__ import annotations

import json

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST

import gateway
from gateway.tokens import signed_token
from orders.models import Order
from orders.tasks import pack_order, send_receipt


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


# -- the packing page: a task's live progress in the browser ------------------------

#: How long a page's signed token lives; the page asks for a new one before then.
TOKEN_TTL = 600


def task_token(result_id: str) -> str:
    """A signed token that may only follow this task's topic (``task.RESULT_ID``).

    Minted here, stored nowhere (docs/protocol.md, "Signed connection
    tokens"); the key is the ``GATEWAY_SIGNING_KEY`` setting.
    """
    return signed_token(f"shop-page:{result_id}", [f"subscribe:task.{result_id}"], TOKEN_TTL)


def _bounded(data: dict[str, object], name: str, default: float, low: float, high: float) -> float:
    value = data.get(name, default)
    if not isinstance(value, int | float) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be a number from {low:g} to {high:g}")
    return float(value)


@csrf_exempt  # POST is a JSON endpoint for the page's fetch(); a form would keep CSRF
@require_http_methods(["GET", "POST"])
def packing(request: HttpRequest) -> HttpResponse:
    """``GET /orders/pack/``: the page that places an order and shows its packing live;
    ``POST``: place one (:func:`pack`)."""
    if request.method == "POST":
        return pack(request)
    return render(request, "orders/pack.html")


def pack(request: HttpRequest) -> HttpResponse:
    """``POST /orders/pack/`` with ``{"customer", "total_cents", "steps"?, "step_seconds"?}``.

    The order and its packing task commit in one transaction. Answers the
    task's result id and a token scoped to its topic, for ``watchTask``.
    """
    try:
        data = json.loads(request.body or b"{}")
        customer, total = str(data["customer"]), int(data["total_cents"])
        steps = int(_bounded(data, "steps", 20, 1, 100))
        step_seconds = _bounded(data, "step_seconds", 0.5, 0, 5)
    except (ValueError, KeyError, TypeError) as exc:
        return JsonResponse({"error": f"invalid order: {exc}"}, status=400)
    with transaction.atomic():
        order = Order.objects.create(customer=customer, total_cents=total)
        # In the order's transaction: no order, no task; no task, no order.
        result = pack_order.enqueue(order.pk, steps=steps, step_seconds=step_seconds)
    return JsonResponse(
        {"order": order.pk, "result_id": result.id, "token": task_token(result.id)}, status=201
    )


@require_GET
def pack_token(request: HttpRequest, result_id: str) -> HttpResponse:
    """``GET /orders/pack/<result id>/token``: a fresh token for a reloaded page.

    The example has no customer accounts; a real shop checks here that the
    task's order belongs to the requesting user before it mints the token.
    """
    try:
        pack_order.get_result(result_id)
    except Exception as exc:  # TaskResultDoesNotExist, from django.tasks or django_tasks
        if type(exc).__name__ != "TaskResultDoesNotExist":
            raise
        return JsonResponse({"error": "no such task"}, status=404)
    return JsonResponse({"token": task_token(result_id)})
