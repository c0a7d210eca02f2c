"""Leasecast as a reusable Django app: the example shop (examples/shop) served by real daphne.

The shop is a Django project of its own that installs Leasecast
(``INSTALLED_APPS``, ``gateway.api_urls``, ``gateway.routing``). One daphne
process serves its ASGI application: the shop's views, its admin and its own
socket, and Leasecast's HTTP API and sockets. Its view places an order and
hands work to Leasecast (a queue message and a ``django.tasks`` task) in one
transaction; a declined card rolls all of it back. On SQLite (the shop's
default) and on PostgreSQL (``DATABASE_URL``).
"""

from __future__ import annotations

import asyncio
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import Socket, ahttp, http
from tests.support.databases import postgres_database, postgres_unavailable, sqlite_database
from tests.support.shop import ShopProcess, shop_env


@pytest.fixture(
    scope="module",
    params=[("sqlite", "1"), ("sqlite", "0"), ("postgres", "1"), ("postgres", "0")],
    ids=["sqlite-debug", "sqlite-nodebug", "postgres-debug", "postgres-nodebug"],
)
def shop(request: pytest.FixtureRequest) -> Iterator[tuple[ShopProcess, str]]:
    """The running shop and an admin token of its Leasecast, with ``DEBUG`` on and off.

    With ``DEBUG`` on, Django's debug cursor renders every statement with ``%``
    (``connection.queries``): the store's statements must survive that too.
    """
    kind, debug = request.param
    if kind == "postgres":
        reason = postgres_unavailable()
        if reason:
            pytest.skip(reason)
    var = Path(tempfile.mkdtemp(prefix=f"leasecast-shop-{kind}-"))
    with ExitStack() as stack:
        database = sqlite_database(var) if kind == "sqlite" else postgres_database(var)
        env = shop_env(stack.enter_context(database))
        env["SHOP_DEBUG"] = debug
        process = ShopProcess(env, var, name="shop")
        process.manage("migrate", "--noinput", "-v0")  # the shop's own tables
        token = process.issue_token("admin", name="shop-admin")
        process.start()
        stack.callback(process.stop)
        yield process, token


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


def page(url: str) -> tuple[int, str | None]:
    """GET a page without following redirects: its status and ``Location``."""
    opener = urllib.request.build_opener(_NoRedirects)
    try:
        with opener.open(url, timeout=30) as response:
            return response.status, response.headers.get("Location")
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Location")


def worker(shop: ShopProcess, token: str, queue: str) -> Any:
    return Socket.open(f"{shop.ws}/ws/queues/{queue}/?prefetch=10", token)


async def place(shop: ShopProcess, **order: Any) -> tuple[int, dict[str, Any]]:
    status, body = await ahttp("POST", f"{shop.http}/orders/", body=order)
    return status, body


async def test_the_shop_serves_leasecast_beside_its_own_pages(
    shop: tuple[ShopProcess, str],
) -> None:
    process, token = shop
    assert http("GET", f"{process.http}/healthz") == (200, {"status": "ok"})
    # Leasecast's API, with its auth, on the shop's URLconf.
    assert http("GET", f"{process.http}/api/queues/never-used", token)[0] == 404
    assert http("GET", f"{process.http}/api/queues/never-used")[0] == 401
    status, stats = http("GET", f"{process.http}/api/stats", token)
    assert status == 200 and "queues" in stats
    # The dashboard sends a visitor to the shop's own admin to log in.
    status, location = page(f"{process.http}/dashboard/")
    assert (status, location) == (302, "/admin/login/?next=/dashboard/")
    assert page(f"{process.http}/admin/login/")[0] == 200
    # Leasecast's sockets refuse a caller without a token; the shop's own socket
    # (beside them in the shop's router) answers anyone.
    with pytest.raises(Exception, match="403"):
        await Socket.open(f"{process.ws}/ws/queues/orders.placed/")
    async with await Socket.open(f"{process.ws}/ws/orders/count/") as own:
        assert "orders" in await own.next()


async def test_a_placed_order_reaches_a_worker_with_its_task(
    shop: tuple[ShopProcess, str],
) -> None:
    process, token = shop
    async with (
        await worker(process, token, "orders.placed") as orders,
        await worker(process, token, "emails") as emails,
    ):
        status, placed = await place(process, customer="ada", total_cents=1250, card="ok")
        assert status == 201, placed
        (message,) = await orders.deliveries(1)
        assert (message["id"], message["body"], message["group"]) == (
            placed["message"],
            {"order": placed["order"], "customer": "ada"},
            "customer-ada",
        )
        (task,) = await emails.deliveries(1)
        assert task["body"]["task"] == "orders.tasks.send_receipt"
        assert (task["body"]["id"], task["body"]["args"]) == (
            placed["receipt_task"],
            [placed["order"]],
        )
        # The order committed with them; the task's result is READY (RUNNING while leased).
        assert http("GET", f"{process.http}/orders/{placed['order']}")[1]["customer"] == "ada"
        status, result = http("GET", f"{process.http}/tasks/{placed['receipt_task']}")
        assert (status, result["status"]) == (200, "RUNNING")
        for frame in (message, task):
            sock = orders if frame is message else emails
            assert (await sock.request({"op": "ack", "receipt": frame["receipt"]}))["op"] == "acked"
        await orders.quiet(0.3)


async def test_a_declined_order_leaves_no_order_message_or_task(
    shop: tuple[ShopProcess, str],
) -> None:
    process, token = shop
    async with (
        await worker(process, token, "orders.placed") as orders,
        await worker(process, token, "emails") as emails,
    ):
        status, refused = await place(process, customer="bob", total_cents=999, card="declined")
        assert status == 402, refused
        attempted = refused["rolled_back"]
        await asyncio.gather(orders.quiet(1.0), emails.quiet(0.1))
    assert http("GET", f"{process.http}/orders/{attempted['order']}")[0] == 404
    assert http("GET", f"{process.http}/tasks/{attempted['receipt_task']}")[0] == 404
    status, page = http("GET", f"{process.http}/api/queues/orders.placed/messages", token)
    assert status == 200
    assert attempted["message"] not in [m["id"] for m in page["messages"]]
    for queue in ("orders.placed", "emails"):
        status, stats = http("GET", f"{process.http}/api/queues/{queue}", token)
        assert (stats["visible"], stats["in_flight"]) == (0, 0), (queue, stats)


async def test_orders_of_one_customer_go_one_at_a_time(shop: tuple[ShopProcess, str]) -> None:
    process, token = shop
    async with await worker(process, token, "orders.placed") as orders:
        first = (await place(process, customer="cy", total_cents=1, card="ok"))[1]
        second = (await place(process, customer="cy", total_cents=2, card="ok"))[1]
        other = (await place(process, customer="di", total_cents=3, card="ok"))[1]
        got = await orders.deliveries(2)
        # The customer's second order waits for the first to be acked.
        assert {m["id"] for m in got} == {first["message"], other["message"]}
        await orders.quiet(0.5)
        held = next(m for m in got if m["id"] == first["message"])
        assert (await orders.request({"op": "ack", "receipt": held["receipt"]}))["op"] == "acked"
        (after,) = await orders.deliveries(1)
        assert after["id"] == second["message"]
