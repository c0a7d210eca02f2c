"""Enqueue from Django code against real gateway processes (design decision 12).

**In process.** This test process is a Django program on the gateway's own
database (a second alias, ``leasecast``, on the gateway's SQLite file or
PostgreSQL database), so ``gateway.enqueue`` and ``LeasecastBackend.enqueue``
take their transactional path exactly as a view's would, in a process that
does not serve the gateway. A worker waiting on the gateway can only be fed
by the wake-up that follows the commit (``pg_notify`` on PostgreSQL, a
datagram beside the SQLite file): pumps never poll, which
``test_only_the_wake_up_feeds_a_waiting_worker`` shows.

**Remote.** A subprocess whose Django settings do not install ``gateway``
enqueues over HTTP to a live gateway with ``LEASECAST_URL`` and
``LEASECAST_TOKEN``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from django.db import connections, transaction
from django.test.utils import CaptureQueriesContext

import gateway as leasecast
from gateway.core.errors import Backpressure, BadFrame, Invalid, QueueFull, TooLarge
from gateway.host import on_django
from gateway.models import Message, Token
from tests.support.clients import Socket, ahttp, http, unique
from tests.support.databases import ROOT, django_alias, sqlite_database
from tests.support.gateways import GatewayProcess, both_servers

T = TypeVar("T")


# Django's connections belong to a thread: every database call of the async
# tests runs on this one thread (the event loop's thread may not touch them).
_DB = ThreadPoolExecutor(1, thread_name_prefix="test-db")


async def on_db(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run ``fn`` on the database thread."""
    return await asyncio.get_running_loop().run_in_executor(
        _DB, functools.partial(fn, *args, **kwargs)
    )


def _close(alias: str) -> None:
    connections[alias].close()


@pytest.fixture(scope="module")
def alias(database_env: tuple[dict[str, str], Path]) -> Iterator[str]:
    """A Django alias of this process on the gateway's database.

    One name per database: threads keep their connection objects of an
    alias, so a name is never reused for another database.
    """
    env, _ = database_env
    # Connections of other threads (asgiref's) close when the database is
    # dropped; without its settings, Django no longer lists them. The
    # database thread's is closed here.
    with django_alias(env, "leasecast", close=_close_on_db_thread) as name:
        yield name


def _close_on_db_thread(alias: str) -> None:
    _DB.submit(_close, alias).result()


class Boom(Exception):
    """The caller's own failure, after it enqueued."""


async def queue_state(gw: GatewayProcess, token: str, queue: str) -> dict[str, int]:
    """The queue's counts, all 0 for a queue that does not exist (404)."""
    status, body = await ahttp("GET", f"{gw.http}/api/queues/{queue}", token)
    if status == 404:
        return {"visible": 0, "delayed": 0, "in_flight": 0, "dead": 0}
    assert status == 200, body
    return {k: body[k] for k in ("visible", "delayed", "in_flight", "dead")}


def own_row(alias: str, name: str) -> None:
    """A row of the caller's own, written in the same transaction as its enqueue."""
    Token.objects.using(alias).create(name=name, token_hash=uuid.uuid4().hex, scopes=[])


def row_exists(alias: str, name: str) -> bool:
    return Token.objects.using(alias).filter(name=name).exists()


def worker_url(gw: GatewayProcess, queue: str, prefetch: int = 10) -> str:
    return f"{gw.ws}/ws/queues/{queue}/?prefetch={prefetch}"


# -- in process: transactions ------------------------------------------------------


async def test_rolled_back_enqueue_is_never_delivered(
    gateway: GatewayProcess, admin_token: str, alias: str
) -> None:
    q, row = unique("tx-rollback"), unique("row")

    def enqueue_then_fail() -> None:
        with pytest.raises(Boom), transaction.atomic(using=alias):
            own_row(alias, row)
            leasecast.enqueue(q, {"order": 1}, using=alias)
            leasecast.enqueue_many(q, [{"body": 2}, {"body": 3, "key": "k"}], using=alias)
            raise Boom

    async with await Socket.open(worker_url(gateway, q), admin_token) as worker:
        await on_db(enqueue_then_fail)
        await worker.quiet(1.0)
    assert await queue_state(gateway, admin_token, q) == {
        "visible": 0,
        "delayed": 0,
        "in_flight": 0,
        "dead": 0,
    }
    assert not await on_db(row_exists, alias, row)


@both_servers
async def test_committed_enqueue_wakes_a_waiting_worker_once(
    gateway: GatewayProcess, admin_token: str, alias: str
) -> None:
    q, row = unique("tx-commit"), unique("row")

    def enqueue_and_commit() -> Any:
        with transaction.atomic(using=alias):
            own_row(alias, row)
            return leasecast.enqueue(q, {"order": 42}, using=alias)

    async with await Socket.open(worker_url(gateway, q), admin_token) as worker:
        await worker.quiet(0.3)  # the pump waits, with nothing to deliver
        result = await on_db(enqueue_and_commit)
        (delivery,) = await worker.deliveries(1, timeout=10)
        assert (delivery["id"], delivery["body"], delivery["deliveries"]) == (
            result.id,
            {"order": 42},
            1,
        )
        assert result.duplicate is False
        await worker.quiet(0.5)  # once
        state = await queue_state(gateway, admin_token, q)
        assert (state["visible"], state["in_flight"]) == (0, 1)
    assert await on_db(row_exists, alias, row)


async def test_enqueue_outside_a_transaction_commits_at_once(
    gateway: GatewayProcess, admin_token: str, alias: str
) -> None:
    q = unique("tx-autocommit")
    async with await Socket.open(worker_url(gateway, q), admin_token) as worker:
        result = await on_db(leasecast.enqueue, q, "now", using=alias)
        (delivery,) = await worker.deliveries(1, timeout=10)
        assert (delivery["id"], delivery["body"]) == (result.id, "now")


def test_the_enqueue_shows_in_djangos_query_log(gateway: GatewayProcess, alias: str) -> None:
    """Django's query log (``assertNumQueries``, the debug toolbar) sees the
    enqueue; on PostgreSQL one message to an existing queue is one statement
    on its own, and that statement and a savepoint's two in the caller's
    transaction."""
    q = unique("tx-logged")

    def enqueue_logged(atomic: bool) -> tuple[str, list[str]]:
        connection = connections[alias]  # the database thread's
        leasecast.enqueue(q, "first, which creates the queue", using=alias)
        with CaptureQueriesContext(connection) as captured:
            if atomic:
                with transaction.atomic(using=alias):
                    leasecast.enqueue(q, "in a transaction", using=alias)
            else:
                leasecast.enqueue(q, "alone", using=alias)
        return connection.vendor, [query["sql"] for query in captured.captured_queries]

    for atomic in (False, True):
        vendor, logged = _DB.submit(enqueue_logged, atomic).result()
        assert any("INSERT INTO leasecast_message" in sql for sql in logged), logged
        if vendor == "postgresql":
            own = [sql for sql in logged if sql not in ("BEGIN", "COMMIT")]  # the test's
            assert len(own) == (3 if atomic else 1), logged
        else:
            assert len(logged) > 3, logged  # the general path's statements


def test_the_enqueue_goes_through_djangos_execute_wrappers_without_query_logging(
    gateway: GatewayProcess, alias: str
) -> None:
    """With Django's query log off (``DEBUG`` off: SQLite then gets ``?``
    placeholders on the driver's own cursor), ``connection.execute_wrapper``
    hooks still see every statement of an enqueue, and a database error
    still arrives as Django's class."""
    from django.db import DatabaseError

    q = unique("tx-wrapped")

    def enqueue_wrapped(fail: bool) -> tuple[bool, list[str]]:
        connection = connections[alias]  # the database thread's
        seen: list[str] = []

        def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            seen.append(sql)
            if fail and "INSERT INTO leasecast_message" in sql:
                raise DatabaseError("refused by the test's wrapper")
            return execute(sql, params, many, context)

        assert not connection.queries_logged
        with connection.execute_wrapper(wrapper):
            try:
                leasecast.enqueue(q, "wrapped", using=alias)
            except DatabaseError:
                return True, seen
        return False, seen

    refused, seen = _DB.submit(enqueue_wrapped, False).result()
    assert not refused
    assert any("INSERT INTO leasecast_message" in sql for sql in seen), seen
    before = _DB.submit(lambda: Message.objects.using(alias).filter(queue__name=q).count()).result()
    refused, seen = _DB.submit(enqueue_wrapped, True).result()
    assert refused, seen
    # The failed enqueue wrote nothing.
    assert (
        _DB.submit(lambda: Message.objects.using(alias).filter(queue__name=q).count()).result()
        == before
        == 1
    )


def test_an_enqueue_takes_a_held_write_lock_in_short_steps(
    gateway: GatewayProcess, alias: str, database_env: tuple[dict[str, str], Path]
) -> None:
    """On SQLite an enqueue outside a transaction that finds the write lock
    held tries its ``BEGIN IMMEDIATE`` again and again (SQLite's own handler
    would try once and sleep 1 ms, 2 ms, 5 ms... inside it), and commits
    once the lock is free."""
    env, _ = database_env
    if "GATEWAY_SQLITE_PATH" not in env:
        pytest.skip("SQLite's write lock (PostgreSQL has none to wait for)")
    q = unique("tx-locked")
    path = env["GATEWAY_SQLITE_PATH"]
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.3, holder.execute, ["ROLLBACK"])

    def enqueue_logged() -> list[str]:
        with CaptureQueriesContext(connections[alias]) as captured:
            release.start()
            leasecast.enqueue(q, "after the lock", using=alias)
        return [query["sql"] for query in captured.captured_queries]

    try:
        logged = _DB.submit(enqueue_logged).result()
    finally:
        release.join()
        holder.close()
    assert logged.count("BEGIN IMMEDIATE") > 3, logged
    assert (
        _DB.submit(lambda: Message.objects.using(alias).filter(queue__name=q).count()).result() == 1
    )


async def test_aenqueue_from_async_code(
    gateway: GatewayProcess, admin_token: str, alias: str
) -> None:
    q = unique("tx-async")
    async with await Socket.open(worker_url(gateway, q), admin_token) as worker:
        result = await leasecast.aenqueue(q, {"async": True}, using=alias, priority=3)
        (delivery,) = await worker.deliveries(1, timeout=10)
        assert (delivery["id"], delivery["body"], delivery["priority"]) == (
            result.id,
            {"async": True},
            3,
        )


async def test_a_rolled_back_savepoint_takes_only_its_own_messages(
    gateway: GatewayProcess, admin_token: str, alias: str
) -> None:
    q = unique("tx-savepoint")

    def outer_commits_inner_fails() -> None:
        with transaction.atomic(using=alias):
            leasecast.enqueue(q, "kept", using=alias)
            with pytest.raises(Boom), transaction.atomic(using=alias):
                leasecast.enqueue(q, "rolled back", using=alias)
                raise Boom
            leasecast.enqueue(q, "kept too", using=alias)

    async with await Socket.open(worker_url(gateway, q), admin_token) as worker:
        await on_db(outer_commits_inner_fails)
        got = await worker.deliveries(2, timeout=10)
        assert [d["body"] for d in got] == ["kept", "kept too"]
        await worker.quiet(0.5)


@both_servers
async def test_only_the_wake_up_feeds_a_waiting_worker(
    gateway: GatewayProcess, admin_token: str, alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pumps never poll: a commit without its wake-up stays undelivered until one comes.

    So the prompt deliveries above came from the commit's wake-up: a
    datagram from this process to the gateway's (SQLite) or the NOTIFY
    sent in the transaction (PostgreSQL), whether the enqueue took the general
    path or, on PostgreSQL, the one statement whose NOTIFY is its own part.
    """
    q = unique("tx-wake")
    # The general path, whose wake-up can be left out: the one-statement
    # enqueue cannot be made without its own.
    monkeypatch.setattr(on_django, "fits_one_statement", lambda specs: False)
    monkeypatch.setattr(on_django, "_announce", lambda *args, **kwargs: None)
    async with await Socket.open(worker_url(gateway, q), admin_token) as worker:
        await worker.quiet(0.3)
        result = await on_db(leasecast.enqueue, q, "unannounced", using=alias)
        await worker.quiet(1.5)  # committed, but nobody said so
        monkeypatch.undo()
        # Any later commit on the queue wakes its pump, which finds both.
        await on_db(leasecast.enqueue, q, "announced", using=alias)
        got = await worker.deliveries(2, timeout=10)
        assert got[0]["id"] == result.id
        assert [d["body"] for d in got] == ["unannounced", "announced"]


# -- in process: message options, bounded queues, bad arguments ------------------------


async def test_group_priority_ttl_and_key_pass_through(
    gateway: GatewayProcess, admin_token: str, alias: str
) -> None:
    q = unique("tx-options")

    def enqueue_all() -> list[Any]:
        with transaction.atomic(using=alias):
            return [
                leasecast.enqueue(q, "low", using=alias, priority=-5),
                leasecast.enqueue(q, "high", using=alias, priority=9, ttl=600, key="k-high"),
                leasecast.enqueue(q, "g1", using=alias, group="customer-7"),
                leasecast.enqueue(q, "g2", using=alias, group="customer-7", priority=50),
                leasecast.enqueue(q, "later", using=alias, delay=3600),
            ]

    low, high, g1, g2, later = await on_db(enqueue_all)
    again = await on_db(leasecast.enqueue, q, "high, again", using=alias, key="k-high")
    assert (again.id, again.duplicate) == (high.id, True)

    def stored(message_id: str) -> Message:
        return Message.objects.using(alias).get(pk=int(message_id))

    row = await on_db(stored, high.id)
    assert row.expires_at == pytest.approx(row.enqueued_at + 600)
    assert (await on_db(stored, later.id)).visible_at > time.time() + 3000

    async with await Socket.open(worker_url(gateway, q, prefetch=1), admin_token) as worker:
        got = []
        for _ in range(4):
            (delivery,) = await worker.deliveries(1)
            got.append(delivery)
            assert (await worker.request({"op": "ack", "receipt": delivery["receipt"]}))[
                "op"
            ] == "acked"
        await worker.quiet(0.3)  # the delayed one waits
    # Priority first; a group's messages in enqueue order whatever their priority.
    assert [d["body"] for d in got] == ["high", "g1", "g2", "low"]
    assert [(d.get("group"), d.get("priority", 0)) for d in got] == [
        (None, 9),
        ("customer-7", 0),
        ("customer-7", 50),
        (None, -5),
    ]
    assert [d["id"] for d in got] == [high.id, g1.id, g2.id, low.id]


async def test_a_full_bounded_queue_raises_backpressure_and_rolls_back_the_caller(
    gateway: GatewayProcess, admin_token: str, alias: str
) -> None:
    q, row = unique("tx-full"), unique("row")
    status, _ = await ahttp(
        "PATCH", f"{gateway.http}/api/queues/{q}", admin_token, {"max_length": 1}
    )
    assert status == 200
    await on_db(leasecast.enqueue, q, "fits", using=alias)

    def one_too_many() -> None:
        with transaction.atomic(using=alias):
            own_row(alias, row)
            leasecast.enqueue(q, "does not fit", using=alias)

    with pytest.raises(Backpressure) as refused:
        await on_db(one_too_many)
    assert isinstance(refused.value, QueueFull)
    assert not await on_db(row_exists, alias, row)
    assert (await queue_state(gateway, admin_token, q))["visible"] == 1


@both_servers
async def test_a_full_block_queue_waits_for_room_outside_a_transaction_only(
    gateway: GatewayProcess, admin_token: str, alias: str
) -> None:
    q = unique("tx-block")
    status, _ = await ahttp(
        "PATCH",
        f"{gateway.http}/api/queues/{q}",
        admin_token,
        {"max_length": 1, "overflow": "block"},
    )
    assert status == 200
    await on_db(leasecast.enqueue, q, "first", using=alias)

    def inside_a_transaction() -> None:
        with transaction.atomic(using=alias):
            leasecast.enqueue(q, "refused", using=alias)

    # Waiting would hold the caller's transaction (on SQLite: the database) open.
    started = time.monotonic()
    with pytest.raises(QueueFull):
        await on_db(inside_a_transaction)
    assert time.monotonic() - started < 5.0  # refused, not waited for (GATEWAY_BLOCK_WAIT is 10 s)

    # Outside one it waits until a worker's lease makes room.
    waiting = asyncio.ensure_future(on_db(leasecast.enqueue, q, "second", using=alias))
    await asyncio.sleep(0.5)
    assert not waiting.done()
    async with await Socket.open(worker_url(gateway, q), admin_token) as worker:
        (first,) = await worker.deliveries(1)
        second = await asyncio.wait_for(waiting, 9)
        (delivery,) = await worker.deliveries(1)
    assert (first["body"], delivery["body"], delivery["id"]) == ("first", "second", second.id)


BAD_ARGUMENTS: list[tuple[dict[str, Any], type[Exception]]] = [
    ({"queue": "no spaces"}, Invalid),
    ({"queue": ""}, Invalid),
    ({"queue": 7}, BadFrame),
    ({"body": object()}, Invalid),
    ({"body": "x" * (256 * 1024)}, TooLarge),
    ({"priority": 101}, Invalid),
    ({"priority": 1.5}, Invalid),
    ({"priority": "high"}, BadFrame),
    ({"delay": -1}, Invalid),
    ({"delay": "soon"}, BadFrame),
    ({"ttl": 0}, Invalid),
    ({"ttl": float("inf")}, Invalid),
    ({"group": ""}, Invalid),
    ({"group": 7}, BadFrame),
    ({"key": ""}, Invalid),
    ({"key": 5}, BadFrame),
]


# Ids without memory addresses: every parallel worker must collect the same ids.
@pytest.mark.parametrize(
    ("arguments", "error"),
    BAD_ARGUMENTS,
    ids=lambda v: re.sub(r" at 0x[0-9a-f]+", "", repr(v))[:40],
)
def test_bad_arguments_raise_and_enqueue_nothing(
    gateway: GatewayProcess,
    admin_token: str,
    alias: str,
    arguments: dict[str, Any],
    error: type[Exception],
) -> None:
    q, row = unique("tx-bad"), unique("row")
    call = {"queue": q, "body": {"ok": True}, **arguments}
    queue, body = call.pop("queue"), call.pop("body")
    with pytest.raises(error), transaction.atomic(using=alias):
        own_row(alias, row)
        leasecast.enqueue(q, "a good one first", using=alias)
        leasecast.enqueue(queue, body, using=alias, **call)
    assert not row_exists(alias, row)
    # Nor out of a transaction, nor in a batch with good messages.
    with pytest.raises(error):
        leasecast.enqueue(queue, body, using=alias, **call)
    with pytest.raises(error):
        leasecast.enqueue_many(queue, [{"body": 1}, {"body": body, **call}], using=alias)
    status, reply = http("GET", f"{gateway.http}/api/queues/{q}", admin_token)
    assert status == 404, reply


# -- remote: Leasecast not installed, HTTP to LEASECAST_URL ---------------------------

#: A Django program without Leasecast in INSTALLED_APPS. argv[1]: settings
#: (JSON); argv[2]: calls of ``gateway.enqueue`` or ``enqueue_many``. Prints
#: one JSON line per call: the results, or the error's class and text.
REMOTE_PROGRAM = r"""
import json, sys
import django
from django.apps import apps
from django.conf import settings

settings.configure(INSTALLED_APPS=["django.contrib.contenttypes"], **json.loads(sys.argv[1]))
django.setup()
assert not apps.is_installed("gateway")
import gateway

for name, args, kwargs in json.loads(sys.argv[2]):
    try:
        results = getattr(gateway, name)(*args, **kwargs)
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__, "detail": str(exc)}), flush=True)
    else:
        results = results if isinstance(results, list) else [results]
        print(json.dumps([[r.id, r.duplicate] for r in results]), flush=True)
"""


def run_remote(
    calls: list[tuple[str, list[Any], dict[str, Any]]],
    settings: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Run :data:`REMOTE_PROGRAM` with ``calls``; one decoded line per call."""
    done = subprocess.run(
        [sys.executable, "-c", REMOTE_PROGRAM, json.dumps(settings or {}), json.dumps(calls)],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture(scope="module")
def remote(gateway_server: str) -> Iterator[tuple[GatewayProcess, str, str]]:
    """A gateway (SQLite) with an admin token and a token that may only enqueue ``remote-*``."""
    var = Path(tempfile.mkdtemp(prefix="leasecast-remote-"))
    with sqlite_database(var) as env:
        gw = GatewayProcess(env, var, name="remote", server=gateway_server)
        gw.start()
        try:
            yield gw, gw.issue_token("admin", name="admin"), gw.issue_token("enqueue:remote-*")
        finally:
            gw.stop()


class ReplyDroppingProxy:
    """An HTTP proxy on loopback that forwards each request to ``upstream`` and
    drops the connection instead of the reply for the first ``drop`` of them:
    the request was applied, the caller never heard so."""

    def __init__(self, upstream_port: int, drop: int) -> None:
        self.upstream_port = upstream_port
        self.drop = drop
        self.requests: list[bytes] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            with client:
                request = _read_request(client)
                self.requests.append(request)
                with socket.create_connection(("127.0.0.1", self.upstream_port)) as upstream:
                    upstream.sendall(request)
                    reply = b""
                    while chunk := upstream.recv(65536):
                        reply += chunk
                if len(self.requests) > self.drop:
                    client.sendall(reply)

    def close(self) -> None:
        self.server.close()


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


@both_servers
def test_remote_enqueue_over_http_without_the_app(remote: tuple[GatewayProcess, str, str]) -> None:
    gw, admin, narrow = remote
    q = unique("remote-")

    async def consume() -> list[dict[str, Any]]:
        async with await Socket.open(worker_url(gw, q), admin) as worker:
            await worker.quiet(0.2)
            results = await asyncio.to_thread(
                run_remote,
                [
                    ("enqueue", [q, {"order": 1}], {"group": "c-1", "priority": 4}),
                    ("enqueue", [q, {"order": 2}], {"key": "order-2", "ttl": 60}),
                    ("enqueue", [q, {"order": 2}], {"key": "order-2"}),
                    ("enqueue_many", [q, [{"body": 3}, {"body": 4, "delay": 3600}]], {}),
                ],
                {"LEASECAST_URL": gw.http, "LEASECAST_TOKEN": narrow},
            )
            got = await worker.deliveries(3)
            await worker.quiet(0.3)
            return [results, got]

    (one, two, duplicate, many), got = asyncio.run(consume())
    assert two[0][1] is False and duplicate == [[two[0][0], True]]
    assert [d["id"] for d in got] == [one[0][0], two[0][0], many[0][0]]
    assert [(d["body"], d.get("group"), d.get("priority")) for d in got] == [
        ({"order": 1}, "c-1", 4),
        ({"order": 2}, None, None),
        (3, None, None),
    ]
    status, stats = http("GET", f"{gw.http}/api/queues/{q}", admin)
    assert (status, stats["in_flight"], stats["delayed"]) == (200, 0, 1)


def test_remote_settings_may_come_from_the_environment(
    remote: tuple[GatewayProcess, str, str],
) -> None:
    gw, admin, narrow = remote
    q = unique("remote-")
    (result,) = run_remote(
        [("enqueue", [q, "from env"], {})],
        env={"LEASECAST_URL": gw.http + "/", "LEASECAST_TOKEN": narrow},
    )
    assert result[0][1] is False
    status, stats = http("GET", f"{gw.http}/api/queues/{q}", admin)
    assert (status, stats["visible"]) == (200, 1)


@both_servers
def test_remote_retry_after_a_dropped_reply_enqueues_once(
    remote: tuple[GatewayProcess, str, str],
) -> None:
    gw, admin, narrow = remote
    q = unique("remote-")
    proxy = ReplyDroppingProxy(gw.port, drop=1)
    try:
        (result,) = run_remote(
            [("enqueue", [q, {"charge": 100}], {})],
            {"LEASECAST_URL": f"http://127.0.0.1:{proxy.port}", "LEASECAST_TOKEN": narrow},
        )
    finally:
        proxy.close()
    assert len(proxy.requests) == 2  # the first reply was lost, so the call was retried
    # Both attempts carried the same automatic idempotency key: one message.
    status, stats = http("GET", f"{gw.http}/api/queues/{q}", admin)
    assert (status, stats["visible"]) == (200, 1)
    status, page = http("GET", f"{gw.http}/api/queues/{q}/messages", admin)
    assert [m["id"] for m in page["messages"]] == [result[0][0]]
    # The caller's one call enqueued one new message: not a duplicate, to it.
    assert result[0][1] is False


def test_remote_errors_are_clear(remote: tuple[GatewayProcess, str, str]) -> None:
    gw, admin, narrow = remote
    q = unique("remote-")
    closed = socket.create_server(("127.0.0.1", 0))
    dead_port = closed.getsockname()[1]
    closed.close()
    calls: list[tuple[str, list[Any], dict[str, Any]]] = [("enqueue", [q, 1], {})]
    refused = run_remote(calls, {"LEASECAST_URL": gw.http, "LEASECAST_TOKEN": "lc_not-a-token"})
    out_of_scope = run_remote(
        [("enqueue", ["elsewhere", 1], {})], {"LEASECAST_URL": gw.http, "LEASECAST_TOKEN": narrow}
    )
    unset = run_remote(calls, {"LEASECAST_URL": gw.http})
    bad = run_remote(
        [("enqueue", [q, 1], {"priority": 500}), ("enqueue", ["no spaces", 1], {})],
        {"LEASECAST_URL": f"http://127.0.0.1:{dead_port}", "LEASECAST_TOKEN": narrow},
    )
    down = run_remote(
        calls, {"LEASECAST_URL": f"http://127.0.0.1:{dead_port}", "LEASECAST_TOKEN": narrow}
    )
    assert refused[0]["error"] == "Unauthorized"
    assert "LEASECAST_TOKEN" in refused[0]["detail"] and gw.http in refused[0]["detail"]
    assert out_of_scope[0]["error"] == "Forbidden"
    assert "elsewhere" in out_of_scope[0]["detail"]
    assert unset[0]["error"] == "ImproperlyConfigured"
    assert "LEASECAST_TOKEN" in unset[0]["detail"]
    # Bad arguments are refused before any request (the gateway is down here).
    assert [line["error"] for line in bad] == ["Invalid", "Invalid"]
    assert down[0]["error"] == "Unavailable" and str(dead_port) in down[0]["detail"]
    assert http("GET", f"{gw.http}/api/queues/{q}", admin)[0] == 404


# -- django.tasks: LeasecastBackend.enqueue and get_result (no task worker here) ------

try:  # Django 6.0 and later
    from django.tasks import task, task_backends  # type: ignore[import-not-found]
except ImportError:  # Django 5.2 with the django-tasks package
    from django_tasks import task, task_backends

from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.test import override_settings  # noqa: E402

from gateway.host.tasks import InvalidTaskError, TaskResultDoesNotExist  # noqa: E402
from gateway.models import TaskRecord  # noqa: E402


@task()
def add(a: int, b: int) -> int:
    """A task of this module (importable by any process: get_result imports it)."""
    return a + b


@pytest.fixture(scope="module")
def backends(alias: str) -> Iterator[None]:
    """``lc``: Leasecast on the gateway's database, any queue; ``lc-strict``: some queues."""
    leasecast = {"BACKEND": "gateway.tasks.LeasecastBackend", "OPTIONS": {"database": alias}}
    default = type(task_backends["default"])  # whatever this process's settings have
    with override_settings(
        TASKS={
            "default": {"BACKEND": f"{default.__module__}.{default.__qualname__}"},
            "lc": {**leasecast, "QUEUES": []},
            "lc-strict": {**leasecast, "QUEUES": ["default", "bad name"]},
            "lc-typo": {**leasecast, "OPTIONS": {"databse": alias}},
        }
    ):
        yield


#: A process of its own that reads a result: the standalone settings on the gateway's database.
GET_RESULT_PROGRAM = r"""
import json, sys
import django
django.setup()
from gateway.host.tasks import LeasecastBackend
result = LeasecastBackend("lc", {"QUEUES": []}).get_result(sys.argv[1])
print(json.dumps({
    "status": str(result.status),
    "task": result.task.module_path,
    "args": result.args,
    "kwargs": result.kwargs,
    "enqueued_at": result.enqueued_at.timestamp(),
    "errors": [e.traceback for e in result.errors],
}))
"""


def result_elsewhere(gw: GatewayProcess, result_id: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", GET_RESULT_PROGRAM, result_id],
        cwd=ROOT,
        env=gw.env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    decoded: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return decoded


def records(alias: str) -> int:
    return TaskRecord.objects.using(alias).count()


async def test_task_enqueued_in_a_rolled_back_transaction_leaves_nothing(
    gateway: GatewayProcess, admin_token: str, alias: str, backends: None
) -> None:
    q = unique("task-rollback")
    before = await on_db(records, alias)

    def enqueue_then_fail() -> Any:
        results = []
        with pytest.raises(Boom), transaction.atomic(using=alias):
            results.append(add.using(backend="lc", queue_name=q).enqueue(1, 2))
            raise Boom
        return results[0]

    async with await Socket.open(worker_url(gateway, q), admin_token) as worker:
        result = await on_db(enqueue_then_fail)
        await worker.quiet(1.0)
    assert await on_db(records, alias) == before
    assert (await queue_state(gateway, admin_token, q))["visible"] == 0
    with pytest.raises(TaskResultDoesNotExist):
        await on_db(task_backends["lc"].get_result, result.id)


async def test_committed_task_is_ready_with_its_message_everywhere(
    gateway: GatewayProcess, admin_token: str, alias: str, backends: None
) -> None:
    q = unique("task-commit")

    def enqueue_and_commit() -> Any:
        with transaction.atomic(using=alias):
            return add.using(backend="lc", queue_name=q).enqueue(2, b=3)

    result = await on_db(enqueue_and_commit)
    assert (result.status, result.args, result.kwargs, result.backend) == (
        "READY",
        [2],
        {"b": 3},
        "lc",
    )
    assert result.enqueued_at is not None and result.task.func is add.func

    record = await on_db(TaskRecord.objects.using(alias).get, id=result.id)
    assert (record.status, record.queue, record.task_path, record.args, record.kwargs) == (
        "READY",
        q,
        f"{__name__}.add",
        [2],
        {"b": 3},
    )
    elsewhere = await asyncio.to_thread(result_elsewhere, gateway, result.id)
    assert elsewhere == {
        "status": "READY",
        "task": f"{__name__}.add",
        "args": [2],
        "kwargs": {"b": 3},
        "enqueued_at": pytest.approx(result.enqueued_at.timestamp()),
        "errors": [],
    }

    async with await Socket.open(worker_url(gateway, q), admin_token) as worker:
        (delivery,) = await worker.deliveries(1)
        assert int(delivery["id"]) == record.message_id
        assert delivery["body"] == {
            "task": f"{__name__}.add",
            "id": result.id,
            "args": [2],
            "kwargs": {"b": 3},
            "takes_context": False,
        }
        # Leased: RUNNING, here and in another process.
        running = await on_db(task_backends["lc"].get_result, result.id)
        assert running.status == "RUNNING"
        assert (await asyncio.to_thread(result_elsewhere, gateway, result.id))[
            "status"
        ] == "RUNNING"
    # Released with its socket: ready again, for the next worker.
    await asyncio.sleep(0.3)
    assert (await on_db(task_backends["lc"].get_result, result.id)).status == "READY"


async def test_task_priority_and_run_after_are_the_messages(
    gateway: GatewayProcess, admin_token: str, alias: str, backends: None
) -> None:
    q = unique("task-options")
    later = datetime.now(UTC) + timedelta(hours=1)

    def enqueue_three() -> list[Any]:
        return [
            add.using(backend="lc", queue_name=q).enqueue(0, 0),
            add.using(backend="lc", queue_name=q, priority=10).enqueue(10, 0),
            add.using(backend="lc", queue_name=q, run_after=later).enqueue(99, 0),
        ]

    plain, urgent, deferred = await on_db(enqueue_three)
    status, page = await ahttp(
        "GET", f"{gateway.http}/api/queues/{q}/messages?state=delayed", admin_token
    )
    assert status == 200
    (delayed,) = page["messages"]
    assert delayed["body"]["id"] == deferred.id
    assert delayed["visible_in"] == pytest.approx(3600, abs=60)
    async with await Socket.open(worker_url(gateway, q), admin_token) as worker:
        got = await worker.deliveries(2)
        await worker.quiet(0.3)
    assert [d["body"]["id"] for d in got] == [urgent.id, plain.id]
    assert got[0]["priority"] == 10


async def test_task_aenqueue_and_aget_result(
    gateway: GatewayProcess, admin_token: str, alias: str, backends: None
) -> None:
    q = unique("task-async")
    result = await add.using(backend="lc", queue_name=q).aenqueue(5, 6)
    again = await task_backends["lc"].aget_result(result.id)
    assert (again.id, again.status, again.args) == (result.id, "READY", [5, 6])
    assert (await queue_state(gateway, admin_token, q))["visible"] == 1


async def test_a_dead_lettered_task_message_is_a_failed_result(
    gateway: GatewayProcess, admin_token: str, alias: str, backends: None
) -> None:
    q = unique("task-dead")
    result = await on_db(add.using(backend="lc", queue_name=q).enqueue, 1, 1)
    async with await Socket.open(worker_url(gateway, q), admin_token) as worker:
        (delivery,) = await worker.deliveries(1)
        reply = await worker.request({"op": "reject", "receipt": delivery["receipt"]})
        assert reply["op"] == "rejected"
    failed = await on_db(task_backends["lc"].get_result, result.id)
    assert failed.status == "FAILED"
    assert "rejected" in failed.errors[-1].traceback


def nested_task_function() -> Any:
    def not_module_level() -> None:
        pass

    return task(backend="lc")(not_module_level)


@pytest.mark.parametrize(
    ("enqueue", "error"),
    [
        (nested_task_function, InvalidTaskError),
        (lambda: add.using(backend="lc").enqueue(object(), 1), TypeError),
        (lambda: add.using(backend="lc").enqueue(1, b={1: "non-string key"}), TypeError),
        (lambda: add.using(backend="lc").enqueue("x" * (300 * 1024), 1), InvalidTaskError),
        (lambda: add.using(backend="lc-typo").enqueue(1, 1), ImproperlyConfigured),
        (lambda: add.using(backend="lc", run_after=datetime.now()).enqueue(1, 1), InvalidTaskError),
        (
            lambda: add.using(backend="lc-strict", queue_name="other").enqueue(1, 1),
            InvalidTaskError,
        ),
        (
            lambda: add.using(backend="lc-strict", queue_name="bad name").enqueue(1, 1),
            InvalidTaskError,
        ),
        (lambda: add.using(backend="lc", priority=101).enqueue(1, 1), InvalidTaskError),
    ],
    ids=[
        "not-module-level",
        "non-json-argument",
        "non-string-key",
        "too-large",
        "unknown-option",
        "naive-run-after",
        "queue-not-in-QUEUES",
        "not-a-queue-name",
        "priority-out-of-range",
    ],
)
def test_bad_tasks_are_refused_at_enqueue_and_store_nothing(
    gateway: GatewayProcess,
    alias: str,
    backends: None,
    enqueue: Callable[[], Any],
    error: type[Exception],
) -> None:
    before = records(alias), Message.objects.using(alias).count()
    with pytest.raises(error) as refused, transaction.atomic(using=alias):
        enqueue()
    assert str(refused.value)  # says what is wrong
    assert (records(alias), Message.objects.using(alias).count()) == before
