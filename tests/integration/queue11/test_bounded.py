"""Work queue 1.1: bounded queues and queue settings over HTTP (PATCH).

docs/protocol.md, "Work queue 1.1" (bounded queues, settings and browsing
over HTTP). ``max_length`` counts visible and delayed messages, not
those in flight; ``overflow`` is ``drop_newest`` (refused with
``backpressure``, HTTP 429, nothing applied, a batch refused whole),
``drop_oldest`` (the oldest visible dead-lettered with reason ``overflow``)
or ``block`` (wait up to ``GATEWAY_BLOCK_WAIT`` for room, then
``backpressure``). An idempotent duplicate never counts. Runs on SQLite and
on PostgreSQL, with a gateway whose block wait is short.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.integration.queue11.wq11 import (
    BLOCK_WAIT,
    NARROW,
    Deployment,
    ack,
    browse_all,
    counts,
    enqueue,
    error_code,
    patch,
    producer,
    stats,
    worker,
)
from tests.support.clients import ahttp, unique
from tests.support.gateways import GatewayProcess


def messages_url(gw: GatewayProcess, q: str) -> str:
    return f"{gw.http}/api/queues/{q}/messages"


async def test_drop_newest_refuses_by_socket_and_http_and_applies_nothing(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("bnd")
    doc = await patch(gateway, admin_token, q, max_length=3)
    assert (doc["max_length"], doc["overflow"]) == (3, "drop_newest")  # the default policy
    async with await producer(gateway, admin_token) as p:
        later = await enqueue(p, q, "later", delay=300)  # delayed messages count too
        first = await enqueue(p, q, "first", key="k-first")
        await enqueue(p, q, "second")
        assert counts(await stats(gateway, admin_token, q)) == (2, 1, 0, 0)
        assert await error_code(p, {"op": "enqueue", "queue": q, "body": "x"}) == "backpressure"
        assert (
            await error_code(p, {"op": "enqueue_many", "queue": q, "messages": [{"body": "x"}]})
            == "backpressure"
        )
        # A duplicate never counts: it is answered as usual.
        dup = await enqueue(p, q, "again", key="k-first")
        assert (dup["id"], dup["duplicate"]) == (first["id"], True)
        status, body = await ahttp(
            "POST", messages_url(gateway, q), admin_token, {"messages": [{"body": "x"}]}
        )
        assert (status, body["error"]) == (429, "backpressure"), body
        status, body = await ahttp(
            "POST",
            messages_url(gateway, q),
            admin_token,
            {"messages": [{"body": "y", "key": "k-first"}]},
        )
        assert status == 200 and body["results"] == [{"id": first["id"], "duplicate": True}]
        assert counts(await stats(gateway, admin_token, q)) == (2, 1, 0, 0)  # nothing applied
        async with await worker(gateway, admin_token, q, prefetch=1) as w:
            (d,) = await w.deliveries(1)  # in flight: no longer counted, room for one
            assert d["body"] == "first"
            status, body = await ahttp(
                "POST",
                messages_url(gateway, q),
                admin_token,
                {"messages": [{"body": "b1"}, {"body": "b2"}]},
            )
            assert (status, body["error"]) == (429, "backpressure"), body  # refused whole
            reply = await p.request(
                {"op": "enqueue_many", "queue": q, "messages": [{"body": "b1"}, {"body": "b2"}]}
            )
            assert reply["code"] == "backpressure", reply
            assert counts(await stats(gateway, admin_token, q)) == (1, 1, 1, 0)
            status, body = await ahttp(
                "POST", messages_url(gateway, q), admin_token, {"messages": [{"body": "b1"}]}
            )
            assert status == 200, body
            assert await error_code(p, {"op": "enqueue", "queue": q, "body": "x"}) == (
                "backpressure"
            )
            await ack(w, d)
            rest = []
            for _ in range(2):
                (dn,) = await w.deliveries(1)
                rest.append(dn["body"])
                await ack(w, dn)
            assert rest == ["second", "b1"]  # exactly what was accepted
            await w.quiet(0.3)
    assert await browse_all(gateway, admin_token, q, "visible") == []
    delayed = await browse_all(gateway, admin_token, q, "delayed")
    assert [m["id"] for m in delayed] == [later["id"]]
    assert await browse_all(gateway, admin_token, q, "dead") == []


async def test_drop_newest_refuses_ack_follow_ups_and_transaction_commits_whole(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q, src = unique("bnd"), unique("bndsrc")
    await patch(gateway, admin_token, q, max_length=2)
    async with await producer(gateway, admin_token) as p:
        await enqueue(p, q, "one")
        await enqueue(p, src, "seed")
        txn = f"{unique('txn')}-full"
        base = f"{gateway.http}/api/transactions/{txn}"
        status, body = await ahttp(
            "PUT",
            f"{base}/partitions/0",
            admin_token,
            {"queue": q, "messages": [{"body": "t1"}, {"body": "t2"}]},
        )
        assert status == 200, body
        status, body = await ahttp("POST", f"{base}/commit", admin_token, {"partitions": [0]})
        assert (status, body["error"]) == (429, "backpressure"), body
        assert counts(await stats(gateway, admin_token, q)) == (1, 0, 0, 0)
        async with await worker(gateway, admin_token, src, prefetch=1) as w:
            (seed,) = await w.deliveries(1)
            follow_ups = [{"queue": q, "body": "f1"}, {"queue": q, "body": "f2"}]
            reply = await w.request(
                {"op": "ack", "receipt": seed["receipt"], "enqueue": follow_ups}
            )
            assert reply["code"] == "backpressure", reply
            # All or nothing: the ack did not happen either.
            assert counts(await stats(gateway, admin_token, src)) == (0, 0, 1, 0)
            assert counts(await stats(gateway, admin_token, q)) == (1, 0, 0, 0)
            reply = await w.request(
                {"op": "ack", "receipt": seed["receipt"], "enqueue": follow_ups[:1]}
            )
            assert reply["op"] == "acked", reply
    assert [m["body"] for m in await browse_all(gateway, admin_token, q)] == ["one", "f1"]


async def test_drop_oldest_dead_letters_the_oldest_with_reason_overflow(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("bnd")
    doc = await patch(gateway, admin_token, q, max_length=2, overflow="drop_oldest")
    assert (doc["max_length"], doc["overflow"]) == (2, "drop_oldest")
    async with await producer(gateway, admin_token) as p:
        # "Oldest" is earliest enqueued, whatever the priority.
        m1 = await enqueue(p, q, "m1", priority=100, key="k1")
        m2 = await enqueue(p, q, "m2")
        m3 = await enqueue(p, q, "m3")
        assert counts(await stats(gateway, admin_token, q)) == (2, 0, 0, 1)
        status, body = await ahttp(
            "POST",
            messages_url(gateway, q),
            admin_token,
            {"messages": [{"body": "m4", "key": "k4"}, {"body": "m5"}]},
        )
        assert status == 200, body
        assert counts(await stats(gateway, admin_token, q)) == (2, 0, 0, 3)
        # Duplicates never count: nothing more is dead-lettered for them.
        dup = await enqueue(p, q, "m4 again", key="k4")
        assert dup["duplicate"] is True
        dup = await enqueue(p, q, "m1 again", key="k1")
        assert (dup["id"], dup["duplicate"]) == (m1["id"], True)
        many = await p.request({"op": "enqueue_many", "queue": q, "messages": [{"body": "m6"}]})
        assert many["op"] == "enqueued_many", many
    dead = await browse_all(gateway, admin_token, q, "dead")
    assert [(m["id"], m["dead_reason"]) for m in dead] == [
        (m1["id"], "overflow"),
        (m2["id"], "overflow"),
        (m3["id"], "overflow"),
        (body["results"][0]["id"], "overflow"),
    ]
    visible = await browse_all(gateway, admin_token, q, "visible")
    assert [m["body"] for m in visible] == ["m5", "m6"]
    assert counts(await stats(gateway, admin_token, q)) == (2, 0, 0, 4)


async def test_block_waits_for_room_and_is_accepted_when_a_worker_drains(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("bnd")
    doc = await patch(gateway, admin_token, q, max_length=1, overflow="block")
    assert (doc["max_length"], doc["overflow"]) == (1, "block")
    async with await producer(gateway, admin_token) as p:
        first = await enqueue(p, q, "first", key="k")
        # A duplicate is answered, never waits for room.
        dup = await enqueue(p, q, "dup", key="k")
        assert (dup["id"], dup["duplicate"]) == (first["id"], True)
        await p.send({"op": "enqueue", "queue": q, "body": "blocked", "ref": "blocked"})
        await p.quiet(0.5)  # no reply yet: the enqueue is waiting for room
        assert counts(await stats(gateway, admin_token, q)) == (1, 0, 0, 0)
        async with await worker(gateway, admin_token, q, prefetch=10) as w:
            (d,) = await w.deliveries(1)  # leased: room for one more
            assert d["body"] == "first"
            reply = await p.next(timeout=BLOCK_WAIT + 5)
            assert (reply["op"], reply["ref"]) == ("enqueued", "blocked"), reply
            (d2,) = await w.deliveries(1)
            assert d2["body"] == "blocked"
            await ack(w, d)
            await ack(w, d2)
    assert counts(await stats(gateway, admin_token, q)) == (0, 0, 0, 0)


@pytest.mark.parametrize("action", ["delete", "purge"])
async def test_block_is_accepted_when_room_is_made_by_delete_or_purge(
    gateway: GatewayProcess, admin_token: str, action: str
) -> None:
    q = unique("bnd")
    await patch(gateway, admin_token, q, max_length=1, overflow="block")
    async with await producer(gateway, admin_token) as p:
        first = await enqueue(p, q, "first")
        await p.send({"op": "enqueue", "queue": q, "body": "blocked", "ref": "blocked"})
        await p.quiet(0.3)  # waiting for room
        if action == "delete":
            url = f"{gateway.http}/api/queues/{q}/messages/{first['id']}"
            assert await ahttp("DELETE", url, admin_token) == (200, {"deleted": 1})
        else:
            url = f"{gateway.http}/api/queues/{q}/purge"
            assert await ahttp("POST", url, admin_token) == (200, {"purged": 1})
        reply = await p.next(timeout=BLOCK_WAIT + 5)
        assert (reply["op"], reply["ref"]) == ("enqueued", "blocked"), reply
    assert [m["body"] for m in await browse_all(gateway, admin_token, q)] == ["blocked"]


@pytest.mark.parametrize("path", ["http", "transaction"])
async def test_block_over_http_waits_for_room_and_is_accepted_when_a_worker_drains(
    gateway: GatewayProcess, admin_token: str, path: str
) -> None:
    q = unique("bnd")
    await patch(gateway, admin_token, q, max_length=1, overflow="block")
    async with await producer(gateway, admin_token) as p:
        await enqueue(p, q, "first")
    if path == "http":
        request = ahttp("POST", messages_url(gateway, q), admin_token, {"messages": [{"body": 2}]})
    else:
        txn = f"{unique('txn')}-b"
        base = f"{gateway.http}/api/transactions/{txn}"
        status, body = await ahttp(
            "PUT", f"{base}/partitions/0", admin_token, {"queue": q, "messages": [{"body": 2}]}
        )
        assert status == 200, body
        request = ahttp("POST", f"{base}/commit", admin_token)
    waiting = asyncio.ensure_future(request)
    await asyncio.sleep(0.5)  # the request reaches the gateway and waits for room
    async with await worker(gateway, admin_token, q, prefetch=10) as w:
        (d,) = await w.deliveries(1)  # leased: room for one more
        status, body = await asyncio.wait_for(waiting, BLOCK_WAIT + 5)
        assert status == 200, body
        (d2,) = await w.deliveries(1)
        assert d2["body"] == 2
        await ack(w, d)
        await ack(w, d2)


async def test_block_refuses_with_backpressure_after_the_wait(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("bnd")
    await patch(gateway, admin_token, q, max_length=1, overflow="block")
    async with await producer(gateway, admin_token) as p:
        await enqueue(p, q, "only")
        by_socket = p.request({"op": "enqueue", "queue": q, "body": "x"}, timeout=BLOCK_WAIT + 10)
        by_http = ahttp("POST", messages_url(gateway, q), admin_token, {"messages": [{"body": 1}]})
        reply, (status, body) = await asyncio.gather(by_socket, by_http)
        assert reply["op"] == "error" and reply["code"] == "backpressure", reply
        assert (status, body["error"]) == (429, "backpressure"), body
        assert counts(await stats(gateway, admin_token, q)) == (1, 0, 0, 0)  # nothing applied
        assert [m["body"] for m in await browse_all(gateway, admin_token, q)] == ["only"]
        # The socket is still usable.
        reply = await p.request({"op": "enqueue", "queue": unique("other"), "body": 1})
        assert reply["op"] == "enqueued"


SETTINGS = {
    "visibility_timeout": 7,
    "max_deliveries": 4,
    "dedup_window": 60,
    "max_length": 50,
    "overflow": "drop_oldest",
}


async def test_patch_applies_settings_and_get_shows_them(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("set")
    doc = await patch(gateway, admin_token, q, **SETTINGS)  # creates the queue
    assert {k: doc[k] for k in SETTINGS} == SETTINGS
    assert doc["name"] == q and counts(doc) == (0, 0, 0, 0)
    assert await stats(gateway, admin_token, q) == doc
    # visibility_timeout is in force: a worker without its own gets the queue's.
    async with await producer(gateway, admin_token) as p:
        await enqueue(p, q, "x")
    async with await worker(gateway, admin_token, q) as w:
        (d,) = await w.deliveries(1)
        assert 0 < d["expires_in"] <= 7
        await ack(w, d)
    # A partial PATCH changes only what it names.
    doc = await patch(gateway, admin_token, q, max_length=0, overflow="block")
    assert {k: doc[k] for k in SETTINGS} == {**SETTINGS, "max_length": 0, "overflow": "block"}


async def test_get_of_a_queue_made_by_use_shows_the_default_bounds(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("set")
    async with await producer(gateway, admin_token) as p:
        await enqueue(p, q, "x")
    doc = await stats(gateway, admin_token, q)
    assert (doc["max_length"], doc["overflow"]) == (0, "drop_newest")


@pytest.mark.parametrize(
    "change",
    [
        {"max_length": -1},
        {"overflow": "explode"},
        {"overflow": ""},
        {"visibility_timeout": 0},
        {"visibility_timeout": -3},
        {"max_deliveries": -1},
        {"dedup_window": -5},
        {"max_length": 5, "overflow": "nope"},  # one bad value: nothing at all changes
        {"visibility_timeout": 3, "max_length": -2},
    ],
)
async def test_patch_with_an_invalid_value_is_400_invalid_and_changes_nothing(
    gateway: GatewayProcess, admin_token: str, change: dict[str, Any]
) -> None:
    q = unique("set")
    before = await patch(gateway, admin_token, q, **SETTINGS)
    status, body = await ahttp("PATCH", f"{gateway.http}/api/queues/{q}", admin_token, change)
    assert (status, body["error"]) == (400, "invalid"), body
    assert await stats(gateway, admin_token, q) == before


@pytest.mark.parametrize(
    "change", [{"max_length": "ten"}, {"overflow": 3}, {"visibility_timeout": [1]}]
)
async def test_patch_with_a_mistyped_value_is_400_and_changes_nothing(
    gateway: GatewayProcess, admin_token: str, change: dict[str, Any]
) -> None:
    q = unique("set")
    before = await patch(gateway, admin_token, q, **SETTINGS)
    status, body = await ahttp("PATCH", f"{gateway.http}/api/queues/{q}", admin_token, change)
    # Wrong JSON type: bad_frame by the conventions; "invalid" by PATCH's own rule.
    assert status == 400 and body["error"] in ("bad_frame", "invalid"), body
    assert await stats(gateway, admin_token, q) == before


async def test_patch_needs_the_admin_scope(
    v11: Deployment, gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique(NARROW)
    before = await patch(gateway, admin_token, q, **SETTINGS)
    narrow = v11.consumer  # consume and enqueue on q, not admin
    status, body = await ahttp("PATCH", f"{gateway.http}/api/queues/{q}", narrow, {"max_length": 1})
    assert (status, body["error"]) == (403, "forbidden"), body
    assert await stats(gateway, admin_token, q) == before
