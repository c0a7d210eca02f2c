"""Schedules (protocol 1.2: Schedules) against real gateways, on SQLite and PostgreSQL.

- The API: the document as written, bad input refused with nothing changed,
  operator rights.
- Firing with no leader: three gateway processes share one database; one is
  killed (-9) and restarted, two more are killed; every tick of an
  ``every: 1`` schedule is enqueued exactly once (one message per key, one key
  per second, no gap while a process ran), including by a restarted process
  that has served no request.
- Catch-up: processes that start after downtime enqueue only the most recent
  due tick, once, however many of them start.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from tests.support.clients import ahttp, unique
from tests.support.databases import database, sqlite_database
from tests.support.gateways import GatewayProcess
from tests.support.waiting import wait_until

DOC_FIELDS = {
    "name",
    "queue",
    "body",
    "cron",
    "every",
    "timezone",
    "enabled",
    "group",
    "priority",
    "ttl",
    "next_tick",
    "last_tick",
    "fired",
}


def _seconds(label: str) -> float:
    return datetime.fromisoformat(label.replace("Z", "+00:00")).timestamp()


async def _schedule(gw: GatewayProcess, token: str, name: str) -> dict[str, Any]:
    status, doc = await ahttp("GET", f"{gw.http}/api/schedules/{name}", token)
    assert status == 200, doc
    return doc  # type: ignore[no-any-return]


async def _messages(gw: GatewayProcess, token: str, queue: str) -> list[dict[str, Any]]:
    status, page = await ahttp(
        "GET", f"{gw.http}/api/queues/{queue}/messages?state=visible&limit=1000", token
    )
    assert status == 200, page
    return page["messages"]  # type: ignore[no-any-return]


async def _settled(
    gw: GatewayProcess, token: str, name: str, queue: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The schedule's document and its queue's messages as of one moment.

    ``gw`` keeps firing every second: a tick committed between the two reads
    would put one message more than ``fired`` says. A tick's message and its
    ``fired`` commit together, so messages read between two equal documents
    are exactly those ticks'.
    """
    for _ in range(20):
        before = await _schedule(gw, token, name)
        messages = await _messages(gw, token, queue)
        after = await _schedule(gw, token, name)
        if before["fired"] == after["fired"]:
            return after, messages
    raise AssertionError(f"schedule {name} never stood still between two reads")


async def test_schedule_documents_and_bad_input(gateway: GatewayProcess, admin_token: str) -> None:
    name, queue = unique("s"), unique()
    url = f"{gateway.http}/api/schedules/{name}"
    before = time.time()
    status, doc = await ahttp(
        "PUT",
        url,
        admin_token,
        {
            "queue": queue,
            "body": {"report": "daily"},
            "cron": "30 2 * * *",
            "timezone": "Europe/Berlin",
            "group": "reports",
            "priority": 5,
            "ttl": 600,
        },
    )
    assert status == 200, doc
    assert set(doc) == DOC_FIELDS
    assert doc["name"] == name and doc["queue"] == queue and doc["body"] == {"report": "daily"}
    assert (doc["cron"], doc["every"], doc["timezone"]) == ("30 2 * * *", None, "Europe/Berlin")
    assert (doc["enabled"], doc["group"], doc["priority"], doc["ttl"]) == (True, "reports", 5, 600)
    assert (doc["last_tick"], doc["fired"]) == (None, 0)
    next_tick = _seconds(doc["next_tick"])
    assert doc["next_tick"].endswith("Z") and before < next_tick <= before + 2 * 86400
    local = datetime.fromtimestamp(next_tick, UTC).astimezone(ZoneInfo("Europe/Berlin"))
    assert (local.hour, local.minute) == (2, 30)
    assert await _schedule(gateway, admin_token, name) == doc
    status, listing = await ahttp("GET", f"{gateway.http}/api/schedules", admin_token)
    assert status == 200 and doc in listing["schedules"]

    # Every refusal is 400 invalid naming the problem, and changes nothing.
    for bad, named in [
        ({"queue": queue, "every": 0.5}, "every"),
        ({"queue": queue, "cron": "0 0 30 2 *"}, "cron"),
        ({"queue": queue, "cron": "* * * *"}, "five fields"),
        ({"queue": queue, "every": 60, "cron": "* * * * *"}, "exactly one"),
        ({"queue": queue}, "exactly one"),
        ({"queue": queue, "every": 60, "timezone": "Mars/Olympus"}, "timezone"),
        ({"queue": queue, "every": 60, "dealy": 5}, "dealy"),
        ({"queue": queue, "every": 60, "priority": 1000}, "priority"),
        ({"queue": queue, "every": 60, "enabled": "yes"}, "enabled"),
        ({"queue": "bad name", "every": 60}, "queue"),
        ({"every": 60}, "queue"),
    ]:
        status, error = await ahttp("PUT", url, admin_token, bad)
        assert (status, error["error"]) == (400, "invalid"), (bad, error)
        assert named in error["detail"], (bad, error)
    status, error = await ahttp("PUT", f"{gateway.http}/api/schedules/bad%20name", admin_token, {})
    assert (status, error["error"]) == (400, "invalid")
    assert await _schedule(gateway, admin_token, name) == doc

    # Replacing: disabled has no next tick.
    status, off = await ahttp(
        "PUT", url, admin_token, {"queue": queue, "every": 60, "enabled": False}
    )
    assert status == 200 and off["next_tick"] is None and off["every"] == 60
    assert off["body"] is None and off["cron"] is None and off["timezone"] == "UTC"

    # Operator rights: reading needs view_queue, changing change_queue.
    consumer = gateway.issue_token(f"consume:{queue}", name="no-admin")
    for method in ("GET", "PUT", "DELETE"):
        status, error = await ahttp(method, url, consumer, {"queue": queue, "every": 60})
        assert (status, error["error"]) == (403, "forbidden")
    status, error = await ahttp("GET", url, None)
    assert status == 401

    status, deleted = await ahttp("DELETE", url, admin_token)
    assert (status, deleted) == (200, {"deleted": 1})
    for method in ("GET", "DELETE"):
        status, error = await ahttp(method, url, admin_token)
        assert (status, error["error"]) == (404, "not_found")
    status, error = await ahttp("POST", url, admin_token, {})
    assert (status, error["error"]) == (405, "invalid")


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_env(request: pytest.FixtureRequest) -> Iterator[tuple[dict[str, str], Path]]:
    """A database of the test's own: no other gateway fires its schedules."""
    with database(request.param, "leasecast-sched-") as found:
        yield found


@pytest.mark.serial
@pytest.mark.slow
async def test_every_tick_once_across_processes_crashes_and_catch_up(
    fresh_env: tuple[dict[str, str], Path],
) -> None:
    env, var = fresh_env
    gws = [GatewayProcess(env, var, name=f"gw{i}") for i in range(3)]
    a, b, c = gws
    try:
        for gw in gws:
            gw.start()
        token = a.issue_token("admin", name="admin")
        name, queue = unique("s"), unique()
        hourly, hourly_queue = unique("h"), unique()
        status, doc = await ahttp(
            "PUT", f"{a.http}/api/schedules/{name}", token, {"queue": queue, "every": 1}
        )
        assert status == 200, doc
        created = time.time()
        status, doc = await ahttp(
            "PUT",
            f"{a.http}/api/schedules/{hourly}",
            token,
            {"queue": hourly_queue, "body": "hourly", "every": 3600},
        )
        assert status == 200, doc

        async def fired_at_least(gw: GatewayProcess, n: int) -> int:
            fired = (await _schedule(gw, token, name))["fired"]
            return fired if fired >= n else 0

        first = await wait_until(lambda: fired_at_least(c, 3), "three ticks on three processes")
        b.kill()
        after_kill = await wait_until(lambda: fired_at_least(c, first + 3), "ticks with b dead")
        b.start()  # b serves no request from here on
        after_restart = await wait_until(
            lambda: fired_at_least(c, after_kill + 3), "ticks with b back"
        )
        a.kill()
        c.kill()
        alone = time.time()
        # Only b runs, and it has answered nothing but /healthz since it started:
        # it fires because its runtime was built when its server started.
        await wait_until(
            lambda: _fired_directly(b, name, after_restart + 4), "ticks fired by b alone"
        )
        doc, messages = await _settled(b, token, name, queue)
        keys = [m["key"] for m in messages]
        ticks = sorted(_seconds(key.split(":", 2)[2]) for key in keys)
        assert len(keys) == len(set(keys)) == doc["fired"], "one message per tick"
        assert all(key.startswith(f"schedule:{name}:") for key in keys)
        assert ticks == [ticks[0] + i for i in range(len(ticks))], "a tick was skipped"
        assert ticks[0] >= math.floor(created)  # no tick from before the schedule
        assert ticks[-1] > alone, "b fired alone"
        assert doc["last_tick"] == keys[-1].split(":", 2)[2]

        # Downtime: nothing runs; the hourly schedule last fired three hours ago.
        b.stop()
        hour = math.floor(time.time() / 3600) * 3600
        a.manage(
            "shell",
            "-c",
            "from gateway.models import Schedule; "
            f"Schedule.objects.filter(name={hourly!r}).update("
            f"last_tick={hour - 3 * 3600}, active_since={hour - 4 * 3600})",
        )
        a.start()
        c.start()
        await wait_until(lambda: _fired_directly(a, hourly, 1), "the hourly schedule catches up")
        caught = await _messages(a, token, hourly_queue)
        expected = [f"schedule:{hourly}:{_label(h)}" for h in (hour, hour + 3600)]
        # The most recent due tick, once (two processes started); not the two
        # before it. (The next one only if the hour turned during the test.)
        assert [m["key"] for m in caught][:1] == expected[:1]
        assert [m["key"] for m in caught] == expected[: len(caught)]
        assert [m["body"] for m in caught][:1] == ["hourly"]
        doc = await _schedule(a, token, hourly)
        assert doc["fired"] == len(caught)
    finally:
        for gw in gws:
            gw.stop()


def _metrics(gw: GatewayProcess, token: str) -> str:
    request = urllib.request.Request(f"{gw.http}/metrics")
    request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.read().decode()  # type: ignore[no-any-return]


def _label(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _fired_directly(gw: GatewayProcess, name: str, n: int) -> bool:
    """Whether schedule ``name`` fired ``n`` times, read from the database (``gw`` is
    sent no request)."""
    from gateway.models import Schedule

    return gw.on_database(lambda db: Schedule.objects.using(db).get(name=name).fired) >= n


def _task_result(gw: GatewayProcess, result_id: str) -> list[str]:
    """The task result's status and args, as the tasks backend reads them."""
    out = gw.manage(
        "shell",
        "-c",
        "from tests.tasksite.tasks import add; "
        f"r = add.get_backend().get_result({result_id!r}); "
        "print(r.status, r.args, r.task.module_path)",
    )
    return out.strip().splitlines()[-1].split(" ", 1)


async def test_leasecast_schedules_enqueue_tasks_as_the_backend(
    database_env: tuple[dict[str, str], Path],
) -> None:
    env, var = database_env
    name, other = unique("adder"), unique("beat")
    queue = "default"  # tests.tasksite.tasks.add's queue
    entries = {name: {"task": "tests.tasksite.tasks.add", "every": 1, "args": [2, 3]}}
    site = {
        **env,
        "DJANGO_SETTINGS_MODULE": "tests.schedulesite.settings",
        "SCHEDULESITE_SCHEDULES": json.dumps(entries),
    }
    gw = GatewayProcess(site, var, name="tasks-gw")
    gw.start()
    try:
        token = gw.issue_token("admin", name="admin")

        async def fired(n: int) -> dict[str, Any] | None:
            status, doc = await ahttp("GET", f"{gw.http}/api/schedules/{name}", token)
            return doc if status == 200 and doc["fired"] >= n else None

        doc = await wait_until(lambda: fired(2), "the settings' schedule fires")
        assert doc is not None and (doc["queue"], doc["every"]) == (queue, 1)
        assert doc["body"]["task"] == "tests.tasksite.tasks.add"
        mine = [
            m for m in await _messages(gw, token, queue) if m["key"].startswith(f"schedule:{name}:")
        ]
        assert len(mine) >= 2
        body = mine[0]["body"]
        assert list(body) == ["task", "id", "args", "kwargs", "takes_context"]
        assert (body["task"], body["args"], body["kwargs"]) == (
            "tests.tasksite.tasks.add",
            [2, 3],
            {},
        )
        assert body["id"] != mine[1]["body"]["id"]  # a result of its own per tick
        assert _task_result(gw, body["id"]) == ["READY", "[2, 3] tests.tasksite.tasks.add"]

        # GET /metrics counts what each schedule enqueued, from the rows.
        text = await asyncio.to_thread(_metrics, gw, token)
        (line,) = [
            x
            for x in text.splitlines()
            if x.startswith(f'leasecast_schedule_fired_total{{schedule="{name}"}}')
        ]
        assert float(line.split()[-1]) >= 2

        # The API does not change what the setting keeps.
        status, error = await ahttp(
            "PUT", f"{gw.http}/api/schedules/{name}", token, {"queue": queue, "every": 5}
        )
        assert (status, error["error"]) == (400, "invalid") and "LEASECAST_SCHEDULES" in error[
            "detail"
        ]

        # The entry goes and another comes: sync_schedules follows the setting.
        site["SCHEDULESITE_SCHEDULES"] = json.dumps(
            {
                other: {
                    "task": "tests.tasksite.tasks.add",
                    "cron": "0 3 * * *",
                    "kwargs": {"a": 1, "b": 2},
                }
            }
        )
        gw.env = site
        assert "1 created, 0 changed, 1 deleted" in gw.manage("sync_schedules")
        status, _ = await ahttp("GET", f"{gw.http}/api/schedules/{name}", token)
        assert status == 404
        status, doc = await ahttp("GET", f"{gw.http}/api/schedules/{other}", token)
        assert (
            status == 200 and doc["cron"] == "0 3 * * *" and doc["next_tick"].endswith("03:00:00Z")
        )
        site["SCHEDULESITE_SCHEDULES"] = json.dumps(
            {other: {"task": "tests.nowhere.task", "every": 1}}
        )
        with pytest.raises(RuntimeError, match="cannot import"):
            gw.manage("sync_schedules")
    finally:
        gw.stop()


@pytest.mark.parametrize("server", ["daphne", "uvicorn"])
async def test_a_process_that_served_nothing_fires(server: str, tmp_path: Path) -> None:
    """The runtime (and its schedule loop) is built when the server starts, under
    both servers: a gateway sent no request but ``/healthz`` fires a schedule
    written straight into the database."""
    if server == "uvicorn" and importlib.util.find_spec("uvicorn") is None:
        pytest.skip("uvicorn is not installed (it is in the dev extra)")
    with sqlite_database(tmp_path) as env:
        gw = GatewayProcess(env, tmp_path, name=f"quiet-{server}", server=server)
        gw.start()
        try:
            gw.manage(
                "shell",
                "-c",
                "import time; from gateway.models import Schedule; Schedule.objects.create("
                "name='quiet', queue='quiet', every=1, active_since=time.time())",
            )
            await wait_until(lambda: _fired_directly(gw, "quiet", 2), f"{server} fires")
        finally:
            gw.stop()
