"""Schedules in the Django admin (protocol 1.2: Schedules), against a live gateway.

The admin checks a schedule as ``PUT /api/schedules/NAME`` does and refuses
what the API refuses; a schedule added there is what the API shows, and the
gateway fires it.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.clients import ahttp, unique
from tests.support.databases import sqlite_database
from tests.support.gateways import GatewayProcess
from tests.support.sessions import PASSWORD, Client
from tests.support.waiting import wait_until


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    var: Path = tmp_path_factory.mktemp("admin-schedules")
    with sqlite_database(var) as env:
        process = GatewayProcess(env, var, name="admin-schedules")
        process.start()
        process.manage(
            "shell",
            "-c",
            "from django.contrib.auth.models import User;"
            f"User.objects.create_superuser('root', 'r@example.com', {PASSWORD!r})",
        )
        try:
            yield process
        finally:
            process.stop()


def _add(client: Client, fields: dict[str, str]) -> tuple[int, str]:
    path = "/admin/gateway/schedule/add/"
    client.request("GET", path)
    form = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": client.cookie("csrftoken") or "", **fields}
    ).encode()
    reply = client.request(
        "POST", path, form, {"Content-Type": "application/x-www-form-urlencoded"}
    )
    return reply.status, reply.text


async def test_admin_adds_checked_schedules_that_fire(site: GatewayProcess) -> None:
    client = Client(site.http)
    client.login("root")
    token = site.issue_token("admin", name="admin")
    name, queue = unique("adm"), unique()
    base = {"name": name, "queue": queue, "body": '{"from": "admin"}', "timezone": "UTC"}
    base |= {"enabled": "on", "priority": "0"}
    for bad, says in [
        ({"cron": "0 0 30 2 *"}, "day-of-month"),
        ({"every": "0.5"}, "every must be"),
        ({"cron": "* * * * *", "every": "5"}, "exactly one"),
        ({"every": "5", "timezone": "Mars/Olympus"}, "unknown timezone"),
        ({"every": "5", "body": "{not json"}, "not JSON"),
    ]:
        status, page = await _run(client, {**base, **bad})
        assert status == 200 and says in page, (bad, page[-2000:])  # the form again, with the error
        status, _ = await ahttp("GET", f"{site.http}/api/schedules/{name}", token)
        assert status == 404, bad
    status, page = await _run(client, {**base, "every": "1"})
    assert status == 302, page[-2000:]
    status, doc = await ahttp("GET", f"{site.http}/api/schedules/{name}", token)
    assert status == 200 and (doc["every"], doc["body"], doc["queue"]) == (
        1,
        {"from": "admin"},
        queue,
    )

    async def fired() -> int:
        status, doc = await ahttp("GET", f"{site.http}/api/schedules/{name}", token)
        return int(doc["fired"]) if status == 200 else 0

    await wait_until(fired, "the gateway fires the admin's schedule")
    listing = client.request("GET", "/admin/gateway/schedule/").text
    assert name in listing and "every 1 s" in listing


async def _run(client: Client, fields: dict[str, str]) -> tuple[int, str]:
    import asyncio

    return await asyncio.to_thread(_add, client, fields)


async def test_sessions_need_queue_permissions_for_schedules(site: GatewayProcess) -> None:
    """Staff is not enough: reading schedules over the API with a session needs
    ``gateway.view_queue``, changing them ``gateway.change_queue``."""
    site.manage(
        "shell",
        "-c",
        "from django.contrib.auth.models import Permission, User\n"
        "for name, perm in (('plain', None), ('viewer', 'view_queue'),\n"
        "                   ('changer', 'change_queue')):\n"
        f"    u = User.objects.create_user(name, password={PASSWORD!r}, is_staff=True)\n"
        "    if perm: u.user_permissions.add(Permission.objects.get(codename=perm))\n",
    )
    name = unique("perm")
    body = json.dumps({"queue": unique(), "every": 60}).encode()

    def calls(user: str) -> tuple[int, int, int]:
        client = Client(site.http)
        client.login(user)
        headers = {
            "Content-Type": "application/json",
            "X-CSRFToken": client.cookie("csrftoken") or "",
        }
        listed = client.request("GET", "/api/schedules").status
        put = client.request("PUT", f"/api/schedules/{name}", body, headers).status
        read = client.request("GET", f"/api/schedules/{name}").status
        return listed, put, read

    import asyncio

    assert await asyncio.to_thread(calls, "plain") == (403, 403, 403)
    assert await asyncio.to_thread(calls, "viewer") == (200, 403, 404)  # nothing was made
    assert await asyncio.to_thread(calls, "changer") == (200, 200, 200)
