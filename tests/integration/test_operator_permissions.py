"""Staff is not enough for operator rights (issue 22, item 5).

Protocol 1.2, "General": operator actions over HTTP and WebSocket with a
session need a superuser, or a staff user with the matching Django
permission: reading (stats, browse, metrics, the dashboard) needs
``gateway.view_queue``; acting on queues and messages (purge, redrive,
requeue, delete, cancel, settings, disconnect) ``gateway.change_queue``; topic
settings ``gateway.change_topic``. A stored token's ``admin`` scope is
unchanged. Real users logged in through the admin's form, a real daphne.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import http, unique
from tests.support.databases import sqlite_database
from tests.support.gateways import GatewayProcess
from tests.support.sessions import PASSWORD, Client, open_socket, own_origin, socket_outcome

#: user -> its gateway permissions ("root" is a superuser with none).
USERS: dict[str, list[str]] = {
    "root": [],
    "nobody": [],
    "viewer": ["view_queue"],
    "changer": ["change_queue"],
    "topics": ["change_topic"],
}
#: Who may do what: the rule, as the test expects it.
MAY = {
    "read": {"root", "viewer", "changer"},
    "act": {"root", "changer"},
    "topic": {"root", "topics"},
}


@pytest.fixture(scope="module")
def site() -> Iterator[GatewayProcess]:
    var = Path(tempfile.mkdtemp(prefix="leasecast-operators-"))
    with sqlite_database(var) as env:
        gw = GatewayProcess(env, var, name="operators")
        gw.manage(
            "shell",
            "-c",
            "import json; from django.contrib.auth.models import User, Permission;"
            f"users = json.loads({json.dumps(json.dumps(USERS))});"
            f"User.objects.create_superuser('root', 'r@example.com', {PASSWORD!r});"
            "[User.objects.create_user(n, n + '@example.com', "
            f"{PASSWORD!r}, is_staff=True).user_permissions.add("
            "*Permission.objects.filter(content_type__app_label='gateway', codename__in=p))"
            " for n, p in users.items() if n != 'root']",
        )
        gw.start()
        yield gw
        gw.stop()


@pytest.fixture(scope="module")
def admin(site: GatewayProcess) -> str:
    return site.issue_token("admin", name="operators-admin")


@pytest.fixture(scope="module")
def clients(site: GatewayProcess) -> dict[str, Client]:
    logged_in = {}
    for name in USERS:
        logged_in[name] = Client(site.http)
        logged_in[name].login(name)
    return logged_in


def fill(site: GatewayProcess, admin: str, queue: str) -> list[str]:
    """Three visible messages in ``queue``; their ids."""
    status, body = http(
        "POST", f"{site.http}/api/queues/{queue}/messages", admin, {"messages": [{"body": 1}] * 3}
    )
    assert status == 200, body
    return [r["id"] for r in body["results"]]


def counts(site: GatewayProcess, admin: str, queue: str) -> dict[str, Any]:
    status, body = http("GET", f"{site.http}/api/queues/{queue}", admin)
    assert status == 200, body
    return {k: body[k] for k in ("visible", "in_flight", "dead")}


def send(site: GatewayProcess, client: Client, method: str, path: str, body: Any = None) -> int:
    headers = {
        "X-CSRFToken": client.cookie("csrftoken") or "",
        "Origin": own_origin(site),
        "Content-Type": "application/json",
    }
    data = None if body is None else json.dumps(body).encode()
    return client.request(method, path, data, headers).status


def test_http_operator_actions_need_the_matching_permission(
    site: GatewayProcess, admin: str, clients: dict[str, Client]
) -> None:
    allowed: dict[str, set[str]] = {}
    for name, client in clients.items():
        queue = unique("op")
        ids = fill(site, admin, queue)
        before = counts(site, admin, queue)
        reads = {
            "stats": client.request("GET", "/api/stats").status,
            "browse": client.request("GET", f"/api/queues/{queue}/messages").status,
            "queue": client.request("GET", f"/api/queues/{queue}").status,
            "metrics": client.request("GET", "/metrics").status,
            "dashboard page": client.request("GET", "/dashboard/").status,
        }
        # Acting: each refused one must change nothing, so the counts are checked after each.
        acts = {}
        for what, method, path, body in [
            ("settings", "PATCH", f"/api/queues/{queue}", {"max_deliveries": 7}),
            ("requeue", "POST", f"/api/queues/{queue}/messages/{ids[0]}/requeue", None),
            ("delete", "DELETE", f"/api/queues/{queue}/messages/{ids[1]}", None),
            ("cancel", "POST", f"/api/queues/{queue}/messages/{ids[2]}/cancel", None),
            ("redrive", "POST", f"/api/queues/{queue}/redrive", None),
            ("purge", "POST", f"/api/queues/{queue}/purge", None),
        ]:
            acts[what] = send(site, client, method, path, body)
            if acts[what] != 200:
                assert counts(site, admin, queue) == before, (name, what)
        topic = unique("opt")
        topic_status = send(site, client, "PATCH", f"/api/topics/{topic}", {"history_size": 5})
        for kind, statuses in (
            ("read", reads),
            ("act", acts),
            ("topic", {"settings": topic_status}),
        ):
            codes = set(statuses.values())
            assert len(codes) == 1, (name, kind, statuses)  # all or nothing per kind
            (code,) = codes
            assert code in (200, 403), (name, kind, statuses)
            if code == 200:
                allowed.setdefault(kind, set()).add(name)
    assert {kind: allowed.get(kind, set()) for kind in MAY} == MAY


def test_every_staff_session_works_as_a_client_whatever_its_permissions(
    site: GatewayProcess, admin: str, clients: dict[str, Client]
) -> None:
    """Enqueueing and publishing are a client's work, not operator actions:
    staff sessions may use every endpoint for them (before, a staff user
    without permissions got 403)."""
    for name, client in clients.items():
        queue, topic = unique("cl"), unique("clt")
        sent = send(
            site, client, "POST", f"/api/queues/{queue}/messages", {"messages": [{"body": 1}]}
        )
        published = send(
            site, client, "POST", f"/api/topics/{topic}/messages", {"messages": [{"body": 1}]}
        )
        assert (name, sent, published) == (name, 200, 200)
        assert counts(site, admin, queue)["visible"] == 1, name


async def test_the_dashboard_socket_needs_view_and_disconnect_needs_change(
    site: GatewayProcess, clients: dict[str, Client]
) -> None:
    url = f"{site.ws}/ws/dashboard/"
    origin = own_origin(site)
    opened = {}
    for name, client in clients.items():
        s = await open_socket(url, cookie=client.cookie_header(), origin=origin)
        if name in MAY["read"]:
            assert (await s.next())["op"] == "snapshot", name
            reply = await s.request({"op": "disconnect", "process": "nowhere", "socket": 1})
            # Allowed: told there is no such socket; refused: forbidden, and the socket stays.
            opened[name] = reply["code"]
            assert (await s.next())["op"] in ("snapshot", "history"), name
            await s.close()
        else:
            opened[name] = await socket_outcome(s)
    assert opened == {
        "root": "not_found",
        "changer": "not_found",
        "viewer": "forbidden",
        "nobody": "forbidden 4403",
        "topics": "forbidden 4403",
    }


async def test_a_session_socket_closes_when_its_user_loses_the_permission(
    site: GatewayProcess,
) -> None:
    client = Client(site.http)
    name = unique("loses")
    site.manage(
        "shell",
        "-c",
        "from django.contrib.auth.models import User, Permission;"
        f"u = User.objects.create_user({name!r}, 'l@example.com', {PASSWORD!r}, is_staff=True);"
        "u.user_permissions.add(*Permission.objects.filter(content_type__app_label='gateway',"
        " codename__in=['view_queue', 'change_topic']))",
    )
    client.login(name)
    s = await open_socket(
        f"{site.ws}/ws/dashboard/", cookie=client.cookie_header(), origin=own_origin(site)
    )
    assert (await s.next())["op"] == "snapshot"
    site.manage(
        "shell",
        "-c",
        "from django.contrib.auth.models import User, Permission;"
        f"User.objects.get(username={name!r}).user_permissions.remove("
        "Permission.objects.get(content_type__app_label='gateway', codename='change_topic'))",
    )
    # Within the protocol's 5 s (and slack for this busy machine): 4401.
    await asyncio.wait_for(asyncio.shield(s.reader), 7.0)
    assert s.conn.close_code == 4401


def test_an_admin_token_is_unchanged(site: GatewayProcess, admin: str) -> None:
    queue = unique("tok")
    fill(site, admin, queue)
    assert http("GET", f"{site.http}/api/stats", admin)[0] == 200
    assert http("POST", f"{site.http}/api/queues/{queue}/purge", admin)[1] == {"purged": 3}
    status, _ = http("PATCH", f"{site.http}/api/topics/{unique('tt')}", admin, {"history_size": 2})
    assert status == 200
    worker = site.issue_token("consume:*", "enqueue:*", name=unique("worker"))
    assert http("GET", f"{site.http}/api/stats", worker)[0] == 403
    assert http("POST", f"{site.http}/api/queues/{queue}/purge", worker)[0] == 403
