"""A session socket keeps only the rights its user still has (issue 22, item 4).

Protocol 1.2, "General": a socket authenticated by a Django session is closed
with 4401 within 5 s of its user being deactivated, losing the rights it was
opened with, or logging out (the session deleted, or its password changed,
which makes the session's hash invalid). Real logins through the admin's
login form, a real daphne process, changes made as an operator would make
them (``manage.py shell``, the admin's logout).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.clients import Socket, unique
from tests.support.databases import sqlite_database
from tests.support.gateways import GatewayProcess
from tests.support.sessions import PASSWORD, Client, open_socket, own_origin

#: Alone, after the parallel run: the protocol's bound is checked on a quiet machine.
pytestmark = pytest.mark.serial

#: The protocol's bound on closing a socket whose session lost its rights.
BOUND = 5.0
#: Slack for the scheduling of this test's own processes (a busy 2-core machine).
SLACK = 2.0

USERS = ("keeps", "deactivated", "demoted", "repassworded", "loggedout")


@pytest.fixture(scope="module")
def site() -> Iterator[GatewayProcess]:
    var = Path(tempfile.mkdtemp(prefix="leasecast-session-rights-"))
    with sqlite_database(var) as env:
        gw = GatewayProcess(env, var, name="sessions")
        gw.manage(
            "shell",
            "-c",
            "from django.contrib.auth.models import User;"
            f"[User.objects.create_superuser(n, n + '@example.com', {PASSWORD!r}) "
            f"for n in {USERS!r}]",
        )
        gw.start()
        yield gw
        gw.stop()


async def closed_with(s: Socket, within: float) -> int | None:
    """The socket's close code once it closed, or None if it is still open after ``within``."""
    try:
        await asyncio.wait_for(asyncio.shield(s.reader), within)
    except TimeoutError:
        return None
    return s.conn.close_code


async def still_working(s: Socket) -> bool:
    """The producer socket still enqueues (and so has not lost its rights)."""
    reply = await s.request({"op": "enqueue", "queue": unique("sr"), "body": 1})
    return reply["op"] == "enqueued"


async def test_session_sockets_close_4401_when_their_user_loses_the_session_or_rights(
    site: GatewayProcess,
) -> None:
    clients = {}
    for name in USERS:
        clients[name] = Client(site.http)
        clients[name].login(name)
    origin = own_origin(site)
    sockets: dict[str, dict[str, Socket]] = {}
    for name, client in clients.items():
        cookie = client.cookie_header()
        sockets[name] = {
            "producer": await open_socket(f"{site.ws}/ws/produce/", cookie=cookie, origin=origin),
            "dashboard": await open_socket(
                f"{site.ws}/ws/dashboard/", cookie=cookie, origin=origin
            ),
        }
        assert await still_working(sockets[name]["producer"]), name
        assert (await sockets[name]["dashboard"].next())["op"] == "snapshot", name

    # What operators do: deactivate, demote, change a password.
    site.manage(
        "shell",
        "-c",
        "from django.contrib.auth.models import User;"
        "User.objects.filter(username='deactivated').update(is_active=False);"
        "User.objects.filter(username='demoted').update(is_superuser=False, is_staff=False);"
        "u = User.objects.get(username='repassworded'); u.set_password('new one'); u.save()",
    )
    # And a user logs out (the admin's logout deletes the session).
    loggedout = clients["loggedout"]
    reply = loggedout.request(
        "POST",
        "/admin/logout/",
        b"csrfmiddlewaretoken=" + (loggedout.cookie("csrftoken") or "").encode(),
        {"Content-Type": "application/x-www-form-urlencoded", "Origin": origin},
    )
    assert reply.status in (200, 302), reply.text[:300]

    lost = [name for name in USERS if name != "keeps"]
    watched = {f"{n} {kind}": s for n in lost for kind, s in sockets[n].items()}
    codes = await asyncio.gather(*(closed_with(s, BOUND + SLACK) for s in watched.values()))
    closes = dict(zip(watched, codes, strict=True))
    assert closes == dict.fromkeys(closes, 4401)
    # The user who kept everything keeps its sockets, and they still work.
    assert await still_working(sockets["keeps"]["producer"])
    dashboard = sockets["keeps"]["dashboard"]
    assert "snapshot" in [(await dashboard.next())["op"] for _ in range(3)]
    for name in USERS:
        for s in sockets[name].values():
            await s.close()
