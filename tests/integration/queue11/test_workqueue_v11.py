"""Work queue 1.1: expiry (ttl), message browsing, per-message requeue and delete,
bad input for the new fields, and the new fields on every enqueue path.

Written from docs/protocol.md ("Work queue 1.1"), against a real gateway and
real sockets, on SQLite and on PostgreSQL (conftest.py). Groups and priority:
test_groups.py and test_groups_cluster.py; bounded queues and PATCH:
test_bounded.py.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.integration.queue11.wq11 import (
    BROWSE_FIELDS,
    NARROW,
    Deployment,
    ack,
    browse,
    browse_all,
    counts,
    enqueue,
    error_code,
    first_frame,
    producer,
    stats,
    worker,
)
from tests.support.clients import Socket, ahttp, unique
from tests.support.gateways import GatewayProcess
from tests.support.waiting import wait_until

# -- ttl


async def dead_ids(gw: GatewayProcess, token: str, q: str, reason: str) -> set[str]:
    """Ids of ``q``'s dead messages with ``dead_reason`` ``reason``."""
    return {m["id"] for m in await browse_all(gw, token, q, "dead") if m["dead_reason"] == reason}


async def test_message_not_acked_within_ttl_is_dead_expired_and_never_delivered(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("ttl")
    async with await producer(gateway, admin_token) as p:
        short = await enqueue(p, q, "short", ttl=1)
        await enqueue(p, q, "long", ttl=3600)
        await enqueue(p, q, "none")

    async def expired() -> bool:
        return short["id"] in await dead_ids(gateway, admin_token, q, "expired")

    await wait_until(expired, "the ttl=1 message dead with reason 'expired'")
    (dead,) = await browse_all(gateway, admin_token, q, "dead")
    assert (dead["body"], dead["state"], dead["deliveries"]) == ("short", "dead", 0)
    assert counts(await stats(gateway, admin_token, q)) == (2, 0, 0, 1)
    async with await worker(gateway, admin_token, q, prefetch=10) as w:
        got = await w.deliveries(2)
        assert [d["body"] for d in got] == ["long", "none"]
        await w.quiet(0.4)  # the expired message is never delivered
        for d in got:
            await ack(w, d)


async def test_expired_message_of_a_group_lets_the_next_go(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("ttl")
    async with await producer(gateway, admin_token) as p:
        await enqueue(p, q, "m0", group="g")
        m1 = await enqueue(p, q, "m1", group="g", ttl=1)
        await enqueue(p, q, "m2", group="g")
    async with await worker(gateway, admin_token, q, prefetch=5) as w:
        (d0,) = await w.deliveries(1)
        assert d0["body"] == "m0"

        async def expired() -> bool:
            return m1["id"] in await dead_ids(gateway, admin_token, q, "expired")

        await wait_until(expired, "m1 (waiting behind m0) dead with reason 'expired'")
        await ack(w, d0)
        (d2,) = await w.deliveries(1)
        assert (d2["body"], d2["deliveries"]) == ("m2", 1)  # m1 expired: never delivered
        await ack(w, d2)
        await w.quiet(0.3)


async def test_expiry_ends_the_lease_and_its_receipt_is_stale(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("ttl")
    async with await producer(gateway, admin_token) as p:
        m = await enqueue(p, q, "brief", ttl=1.5)
    async with await worker(gateway, admin_token, q, prefetch=1, visibility_timeout=60) as w:
        (d,) = await w.deliveries(1)
        assert d["id"] == m["id"]
        assert 0 < d["expires_in"] <= 1.5  # the lease cannot outlive the message

        async def expired() -> bool:
            return m["id"] in await dead_ids(gateway, admin_token, q, "expired")

        await wait_until(expired, "the leased message dead with reason 'expired'")
        for frame in (
            {"op": "extend", "receipt": d["receipt"], "timeout": 30},
            {"op": "nack", "receipt": d["receipt"]},
            {"op": "reject", "receipt": d["receipt"]},
            {"op": "ack", "receipt": d["receipt"]},
        ):
            assert await error_code(w, frame) == "stale_receipt", frame
        await w.quiet(0.3)  # never delivered again
    assert counts(await stats(gateway, admin_token, q)) == (0, 0, 0, 1)
    (dead,) = await browse_all(gateway, admin_token, q, "dead")
    assert (dead["id"], dead["dead_reason"]) == (m["id"], "expired")  # not "rejected"


# -- browsing


async def test_browse_pages_through_250_messages_exactly_once_in_order(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("brw")
    status, body = await ahttp(
        "POST",
        f"{gateway.http}/api/queues/{q}/messages",
        admin_token,
        {"messages": [{"body": i} for i in range(250)]},
    )
    assert status == 200, body
    ids = [r["id"] for r in body["results"]]
    now = time.time()
    # limit 100: two full pages and a last one of 50 whose next is null.
    sizes, after = [], None
    for _ in range(3):
        status, page = await browse(gateway, admin_token, q, limit=100, after=after)
        assert status == 200, page
        sizes.append(len(page["messages"]))
        after = page["next"]
    assert sizes == [100, 100, 50] and after is None
    # limit 7: 36 pages, every message exactly once, in order.
    got: list[dict[str, Any]] = []
    after, pages = None, 0
    while True:
        status, page = await browse(gateway, admin_token, q, state="visible", limit=7, after=after)
        assert status == 200, page
        assert len(page["messages"]) <= 7
        got += page["messages"]
        pages += 1
        after = page["next"]
        if after is None:
            break
        assert pages < 100, "paging never ends"
    assert pages == 36
    assert [m["id"] for m in got] == ids
    assert [m["body"] for m in got] == list(range(250))
    for m in got:
        assert set(m) >= BROWSE_FIELDS, m
        assert (m["state"], m["deliveries"], m["group"], m["dead_reason"], m["visible_in"]) == (
            "visible",
            0,
            None,
            None,
            None,
        ), m
        assert m["priority"] in (0, None), m
        assert abs(m["enqueued_at"] - now) < 600, m  # Unix seconds
        # ... and the same moments in ISO 8601, UTC (protocol 1.2 browse fields).
        for field in ("enqueued_at", "visible_at"):
            iso = datetime.fromisoformat(m[f"{field}_iso"])
            assert m[f"{field}_iso"].endswith("Z") and iso.utcoffset() == timedelta(0), m
            assert abs(iso.timestamp() - m[field]) < 0.001, m
    # Browsing leased and changed nothing.
    assert counts(await stats(gateway, admin_token, q)) == (250, 0, 0, 0)
    async with await worker(gateway, admin_token, q, prefetch=1) as w:
        (d,) = await w.deliveries(1)
        assert (d["id"], d["deliveries"]) == (ids[0], 1)


async def test_browse_order_is_delivery_order_with_priorities(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("brw")
    n = 30
    priorities = [(i * 7) % 5 - 2 for i in range(n)]
    status, body = await ahttp(
        "POST",
        f"{gateway.http}/api/queues/{q}/messages",
        admin_token,
        {"messages": [{"body": i, "priority": priorities[i]} for i in range(n)]},
    )
    assert status == 200, body
    expected = sorted(range(n), key=lambda i: (-priorities[i], i))
    browsed = await browse_all(gateway, admin_token, q, "visible", limit=4)
    assert [m["body"] for m in browsed] == expected
    assert [m["priority"] for m in browsed] == [priorities[i] for i in expected]
    delivered = []
    async with await worker(gateway, admin_token, q, prefetch=1) as w:
        for _ in range(n):
            (d,) = await w.deliveries(1)
            delivered.append(d["body"])
            await ack(w, d)
    assert delivered == expected


async def test_browse_each_state_with_its_fields_without_changing_anything(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("brw")
    async with await producer(gateway, admin_token) as p:
        x = await enqueue(p, q, "x", priority=10)
        f = await enqueue(p, q, "f", priority=9)
        async with await worker(gateway, admin_token, q, prefetch=1) as w1:
            (dx,) = await w1.deliveries(1)
            assert dx["id"] == x["id"]
            assert (await w1.request({"op": "reject", "receipt": dx["receipt"]}))["op"] == (
                "rejected"
            )
            (df,) = await w1.deliveries(1)
            assert df["id"] == f["id"]
            # Hand f to a socket that keeps holding it: closing w1 releases f.
            w2 = await worker(gateway, admin_token, q, prefetch=1, visibility_timeout=30)
            await w2.quiet(0.2)
        (df,) = await w2.deliveries(1)
        assert df["id"] == f["id"]
        v = await enqueue(p, q, "v", group="g", priority=5)
        d = await enqueue(p, q, "d", delay=60, group="dg", priority=-3)
    before = counts(await stats(gateway, admin_token, q))
    assert before == (1, 1, 1, 1)
    pages = {
        state: await browse_all(gateway, admin_token, q, state)
        for state in ("visible", "delayed", "in_flight", "dead")
    }
    for state, msgs in pages.items():
        assert len(msgs) == 1, (state, msgs)
        assert set(msgs[0]) >= BROWSE_FIELDS
        assert msgs[0]["state"] == state
        assert isinstance(msgs[0]["enqueued_at"], int | float)
    (mv,), (md,), (mf,), (mx,) = pages.values()
    assert (mv["id"], mv["body"], mv["group"], mv["priority"]) == (v["id"], "v", "g", 5)
    assert (mv["deliveries"], mv["dead_reason"], mv["visible_in"]) == (0, None, None)
    assert (md["id"], md["body"], md["group"], md["priority"]) == (d["id"], "d", "dg", -3)
    assert (md["deliveries"], md["dead_reason"]) == (0, None) and 0 < md["visible_in"] <= 60
    assert (mf["id"], mf["body"], mf["deliveries"], mf["dead_reason"]) == (f["id"], "f", 2, None)
    assert mf["group"] is None and mf["priority"] == 9 and 0 < mf["visible_in"] <= 30
    assert (mx["id"], mx["body"], mx["deliveries"], mx["dead_reason"]) == (
        x["id"],
        "x",
        1,
        "rejected",
    )
    assert mx["visible_in"] is None
    # Nothing was leased or changed by browsing: the lease is still good.
    assert counts(await stats(gateway, admin_token, q)) == before
    await w2.quiet(0.2)
    await ack(w2, df)
    await w2.close()
    # Bad parameters.
    for query in ({"state": "acked"}, {"limit": 0}, {"limit": 1001}, {"limit": "ten"}):
        status, body = await browse(gateway, admin_token, q, **query)
        assert (status, body["error"]) == (400, "invalid"), (query, body)


async def test_browse_scope_is_admin_or_consume_on_the_queue(
    v11: Deployment, gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique(NARROW)
    async with await producer(gateway, admin_token) as p:
        await enqueue(p, q, 1)
    consumer = v11.consumer  # consume and enqueue on narrow-*
    status, body = await browse(gateway, consumer, q)
    assert status == 200 and [m["body"] for m in body["messages"]] == [1]
    mid = body["messages"][0]["id"]
    status, body = await browse(gateway, consumer, unique("other"))
    assert (status, body["error"]) == (403, "forbidden"), body
    status, body = await browse(gateway, v11.producer, q)  # enqueue only
    assert (status, body["error"]) == (403, "forbidden"), body
    # Requeue and delete are admin only.
    for method, suffix in (("POST", "/requeue"), ("DELETE", "")):
        url = f"{gateway.http}/api/queues/{q}/messages/{mid}{suffix}"
        status, body = await ahttp(method, url, consumer)
        assert (status, body["error"]) == (403, "forbidden"), body
    assert counts(await stats(gateway, admin_token, q)) == (1, 0, 0, 0)


async def test_requeue_a_dead_message_over_http(gateway: GatewayProcess, admin_token: str) -> None:
    q = unique("req")
    async with await producer(gateway, admin_token) as p:
        a = await enqueue(p, q, "a")
    async with await worker(gateway, admin_token, q, prefetch=1) as w:
        (d,) = await w.deliveries(1)
        assert (await w.request({"op": "reject", "receipt": d["receipt"]}))["op"] == "rejected"
    (dead,) = await browse_all(gateway, admin_token, q, "dead")
    assert (dead["id"], dead["deliveries"], dead["dead_reason"]) == (a["id"], 1, "rejected")
    url = f"{gateway.http}/api/queues/{q}/messages/{a['id']}/requeue"
    assert await ahttp("POST", url, admin_token) == (200, {"requeued": 1})
    # Visible again, its delivery count reset.
    (m,) = await browse_all(gateway, admin_token, q, "visible")
    assert (m["id"], m["deliveries"], m["dead_reason"]) == (a["id"], 0, None)
    assert await browse_all(gateway, admin_token, q, "dead") == []
    async with await worker(gateway, admin_token, q) as w:
        (d,) = await w.deliveries(1)
        assert (d["id"], d["deliveries"]) == (a["id"], 1)
        await ack(w, d)


async def test_requeue_an_in_flight_message_over_http_makes_its_lease_stale(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("req")
    async with await producer(gateway, admin_token) as p:
        b = await enqueue(p, q, "b")
    async with (
        await worker(gateway, admin_token, q, prefetch=1, visibility_timeout=300) as w1,
    ):
        (d,) = await w1.deliveries(1)
        async with await worker(gateway, admin_token, q, prefetch=1) as w2:
            await w2.quiet(0.2)
            url = f"{gateway.http}/api/queues/{q}/messages/{b['id']}/requeue"
            assert await ahttp("POST", url, admin_token) == (200, {"requeued": 1})
            holder, again = await first_frame(w1, w2)
            # Delivered again long before the 300 s lease would end, count reset.
            assert (again["id"], again["deliveries"]) == (b["id"], 1)
            assert await error_code(w1, {"op": "ack", "receipt": d["receipt"]}) == ("stale_receipt")
            await ack(holder, again)
    assert counts(await stats(gateway, admin_token, q)) == (0, 0, 0, 0)


def _listed(m: dict[str, Any]) -> str:
    """The ``if_*`` query of a per-message action on ``m`` as a listing showed it."""
    return urlencode(
        {"if_state": m["state"], "if_deliveries": m["deliveries"], "if_visible_at": m["visible_at"]}
    )


async def test_a_conditional_requeue_leaves_a_message_that_moved_since_it_was_listed(
    gateway: GatewayProcess, admin_token: str
) -> None:
    # The race the dashboard's check alone could not close: the listed lease
    # is requeued by another operator and the message leased again, with the
    # same state and delivery count; only the lease's end tells them apart.
    q = unique("cond")
    async with await producer(gateway, admin_token) as p:
        m = await enqueue(p, q, "m")
    base = f"{gateway.http}/api/queues/{q}/messages/{m['id']}"
    async with await worker(gateway, admin_token, q, prefetch=1, visibility_timeout=300) as w1:
        (first,) = await w1.deliveries(1)
        (listed,) = await browse_all(gateway, admin_token, q, "in_flight")
        assert (listed["id"], listed["deliveries"]) == (first["id"], 1), listed
        async with await worker(gateway, admin_token, q, prefetch=1, visibility_timeout=300) as w2:
            await w2.quiet(0.2)
            assert await ahttp("POST", f"{base}/requeue", admin_token) == (200, {"requeued": 1})
            holder, again = await first_frame(w1, w2)
            (now,) = await browse_all(gateway, admin_token, q, "in_flight")
            assert (now["state"], now["deliveries"]) == (listed["state"], listed["deliveries"])
            assert now["visible_at"] != listed["visible_at"]
            for method, url, field in (
                ("POST", f"{base}/requeue?{_listed(listed)}", "requeued"),
                ("DELETE", f"{base}?{_listed(listed)}", "deleted"),
                ("POST", f"{base}/requeue?if_state=dead", "requeued"),
                ("DELETE", f"{base}?if_deliveries=2", "deleted"),
            ):
                assert await ahttp(method, url, admin_token) == (200, {field: 0}), (method, url)
            # The new lease still holds: its ack lands.
            await ack(holder, again)
    assert counts(await stats(gateway, admin_token, q)) == (0, 0, 0, 0)


async def test_a_conditional_requeue_and_delete_act_on_a_message_still_as_listed(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("cond")
    async with await producer(gateway, admin_token) as p:
        a = await enqueue(p, q, "a")
        b = await enqueue(p, q, "b")
    async with await worker(gateway, admin_token, q, prefetch=1) as w:
        (d,) = await w.deliveries(1)
        assert (await w.request({"op": "reject", "receipt": d["receipt"]}))["op"] == "rejected"
        await w.deliveries(1)  # b, held
        (dead,) = await browse_all(gateway, admin_token, q, "dead")
        (held,) = await browse_all(gateway, admin_token, q, "in_flight")
    assert (dead["id"], held["id"]) == (a["id"], b["id"])
    base = f"{gateway.http}/api/queues/{q}/messages"
    # The worker's socket closed: b is visible again, no longer as listed.
    assert await ahttp("DELETE", f"{base}/{b['id']}?{_listed(held)}", admin_token) == (
        200,
        {"deleted": 0},
    )
    assert await ahttp("POST", f"{base}/{a['id']}/requeue?{_listed(dead)}", admin_token) == (
        200,
        {"requeued": 1},
    )
    (visible_b,) = [m for m in await browse_all(gateway, admin_token, q) if m["id"] == b["id"]]
    assert await ahttp("DELETE", f"{base}/{b['id']}?{_listed(visible_b)}", admin_token) == (
        200,
        {"deleted": 1},
    )
    assert [m["id"] for m in await browse_all(gateway, admin_token, q)] == [a["id"]]


@pytest.mark.parametrize(
    "query",
    [
        "if_state=gone",
        "if_state=",
        "if_deliveries=one",
        "if_deliveries=-1",
        "if_visible_at=soon",
        "if_visible_at=nan",
        "if_visible_at=inf",
    ],
)
async def test_a_bad_condition_is_invalid_and_changes_nothing(
    gateway: GatewayProcess, admin_token: str, query: str
) -> None:
    q = unique("cond")
    async with await producer(gateway, admin_token) as p:
        m = await enqueue(p, q, "m")
    base = f"{gateway.http}/api/queues/{q}/messages/{m['id']}"
    for method, url in (("POST", f"{base}/requeue?{query}"), ("DELETE", f"{base}?{query}")):
        status, body = await ahttp(method, url, admin_token)
        assert (status, body["error"]) == (400, "invalid"), (method, url, body)
        assert body["detail"], body
    assert [x["id"] for x in await browse_all(gateway, admin_token, q)] == [m["id"]]


async def test_delete_one_message_over_http_in_each_state(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("del")
    base = f"{gateway.http}/api/queues/{q}/messages"
    async with await producer(gateway, admin_token) as p:
        x, c, d, later = [
            await enqueue(p, q, body, **extra)
            for body, extra in (("x", {}), ("c", {}), ("d", {}), ("later", {"delay": 300}))
        ]
    async with await worker(gateway, admin_token, q, prefetch=1, visibility_timeout=300) as w:
        (dx,) = await w.deliveries(1)
        assert (await w.request({"op": "reject", "receipt": dx["receipt"]}))["op"] == "rejected"
        (dc,) = await w.deliveries(1)
        assert dc["id"] == c["id"]
        assert counts(await stats(gateway, admin_token, q)) == (1, 1, 1, 1)
        for m in (d, later, x, c):  # visible, delayed, dead, in flight
            assert await ahttp("DELETE", f"{base}/{m['id']}", admin_token) == (
                200,
                {"deleted": 1},
            )
        assert await error_code(w, {"op": "ack", "receipt": dc["receipt"]}) == "stale_receipt"
        for method, url in (
            ("DELETE", f"{base}/{c['id']}"),
            ("POST", f"{base}/{c['id']}/requeue"),
            ("DELETE", f"{base}/999999999"),
            ("POST", f"{base}/999999999/requeue"),
        ):
            status, body = await ahttp(method, url, admin_token)
            assert (status, body["error"]) == (404, "not_found"), (method, url, body)
        for method, url in (
            ("DELETE", f"{base}/not-an-id"),
            ("POST", f"{base}/not-an-id/requeue"),
        ):
            status, body = await ahttp(method, url, admin_token)
            assert (status, body["error"]) == (400, "invalid"), (method, url, body)
        await w.quiet(0.3)
    assert counts(await stats(gateway, admin_token, q)) == (0, 0, 0, 0)


# -- bad input for the new fields

BAD_FIELDS: list[tuple[dict[str, Any], str]] = [
    ({"group": 5}, "bad_frame"),
    ({"group": ["g"]}, "bad_frame"),
    ({"group": ""}, "invalid"),
    ({"group": "g" * 201}, "invalid"),
    ({"group": "a\u0000b"}, "invalid"),
    ({"priority": 101}, "invalid"),
    ({"priority": -101}, "invalid"),
    ({"priority": 1.5}, "invalid"),
    ({"priority": "high"}, "bad_frame"),
    ({"priority": True}, "bad_frame"),
    ({"ttl": 0}, "invalid"),
    ({"ttl": -1}, "invalid"),
    ({"ttl": 365 * 24 * 3600 + 1}, "invalid"),
    ({"ttl": "5"}, "bad_frame"),
    ({"ttl": [1]}, "bad_frame"),
]

GOOD_EDGES: list[dict[str, Any]] = [
    {"group": "g" * 200},
    {"group": "é ☃"},
    {"priority": 100},
    {"priority": -100},
    {"ttl": 365 * 24 * 3600},
    {"ttl": 0.5, "group": "x", "priority": 1},
]


async def test_bad_new_fields_on_sockets_get_their_error_and_apply_nothing(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q, src = unique("bad"), unique("badsrc")
    async with (
        await producer(gateway, admin_token) as p,
        await worker(gateway, admin_token, src, prefetch=1) as w,
    ):
        await enqueue(p, src, "seed")
        (seed,) = await w.deliveries(1)
        for fields, code in BAD_FIELDS:
            frame = {"op": "enqueue", "queue": q, "body": 1, **fields}
            assert await error_code(p, frame) == code, fields
            # On the worker socket, to its own queue.
            assert await error_code(w, {"op": "enqueue", "body": 1, **fields}) == code, fields
            reply = await p.request(
                {
                    "op": "enqueue_many",
                    "queue": q,
                    "messages": [{"body": 1}, {"body": 2, **fields}],
                }
            )
            assert reply["code"] == code and "messages[1]" in reply["detail"], (fields, reply)
            reply = await w.request(
                {
                    "op": "ack",
                    "receipt": seed["receipt"],
                    "enqueue": [{"queue": q, "body": 1}, {"queue": q, "body": 2, **fields}],
                }
            )
            assert reply["op"] == "error" and reply["code"] == code, (fields, reply)
        # Nothing was applied: q was never made, the seed is still leased, the
        # worker's own queue holds only the seed.
        status, body = await ahttp("GET", f"{gateway.http}/api/queues/{q}", admin_token)
        assert status == 404, body
        assert counts(await stats(gateway, admin_token, src)) == (0, 0, 1, 0)
        await w.quiet(0.2)
        # Both sockets are still usable, and the edges of each range are accepted.
        for fields in GOOD_EDGES:
            await enqueue(p, q, "edge", **fields)
        await ack(w, seed)
    s = await stats(gateway, admin_token, q)
    assert s["visible"] + s["dead"] == len(GOOD_EDGES), s  # the ttl=0.5 one may be dead


async def test_bad_new_fields_over_http_and_staged_transactions_apply_nothing(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("bad")
    txn = f"{unique('txn')}-bad"
    for fields, code in BAD_FIELDS:
        messages = {"messages": [{"body": 1}, {"body": 2, **fields}]}
        status, body = await ahttp(
            "POST", f"{gateway.http}/api/queues/{q}/messages", admin_token, messages
        )
        assert status == 400 and body["error"] == code, (fields, body)
        assert "messages[1]" in body["detail"], body
        status, body = await ahttp(
            "PUT",
            f"{gateway.http}/api/transactions/{txn}/partitions/0",
            admin_token,
            {"queue": q, **messages},
        )
        assert status == 400 and body["error"] == code, (fields, body)
    # Nothing was staged: committing the transaction enqueues nothing.
    status, body = await ahttp("POST", f"{gateway.http}/api/transactions/{txn}/commit", admin_token)
    assert status == 200 and body["committed"] == 0, body
    status, body = await ahttp("GET", f"{gateway.http}/api/queues/{q}", admin_token)
    assert status == 404, body
    status, body = await ahttp(
        "POST",
        f"{gateway.http}/api/queues/{q}/messages",
        admin_token,
        {"messages": [{"body": "edge", **fields} for fields in GOOD_EDGES]},
    )
    assert status == 200 and len(body["results"]) == len(GOOD_EDGES), body


# -- every enqueue path takes group, priority and ttl

NEW_FIELDS: list[dict[str, Any]] = [
    {"body": "a", "group": "g", "priority": 7},
    {"body": "b", "group": "g", "priority": 9},  # after a in its group: waits for a
    {"body": "c", "ttl": 1},  # expires
]
PATHS = ["enqueue", "worker_enqueue", "enqueue_many", "http", "ack_follow_ups", "transaction"]


async def enqueue_by(
    path: str, gw: GatewayProcess, token: str, p: Socket, q: str, messages: list[dict[str, Any]]
) -> None:
    """Enqueue ``messages`` to ``q`` by ``path``, all of which must be accepted."""
    if path == "enqueue":
        for m in messages:
            assert (await p.request({"op": "enqueue", "queue": q, **m}))["op"] == "enqueued"
    elif path == "worker_enqueue":
        async with await worker(gw, token, unique("other"), prefetch=1) as w:
            for m in messages:
                assert (await w.request({"op": "enqueue", "queue": q, **m}))["op"] == "enqueued"
    elif path == "enqueue_many":
        reply = await p.request({"op": "enqueue_many", "queue": q, "messages": messages})
        assert reply["op"] == "enqueued_many" and len(reply["results"]) == len(messages), reply
    elif path == "http":
        status, body = await ahttp(
            "POST", f"{gw.http}/api/queues/{q}/messages", token, {"messages": messages}
        )
        assert status == 200 and len(body["results"]) == len(messages), body
    elif path == "ack_follow_ups":
        src = unique("src")
        await enqueue(p, src, "seed")
        async with await worker(gw, token, src, prefetch=1) as w:
            (seed,) = await w.deliveries(1)
            reply = await w.request(
                {
                    "op": "ack",
                    "receipt": seed["receipt"],
                    "enqueue": [{"queue": q, **m} for m in messages],
                }
            )
            assert reply["op"] == "acked" and len(reply["enqueued"]) == len(messages), reply
    else:
        base = f"{gw.http}/api/transactions/{unique('txn')}-paths"
        status, body = await ahttp(
            "PUT", f"{base}/partitions/0", token, {"queue": q, "messages": messages}
        )
        assert status == 200 and body["staged"] == len(messages), body
        status, body = await ahttp("POST", f"{base}/commit", token, {"partitions": [0]})
        assert (status, body) == (200, {"committed": len(messages), "already": False})


async def test_every_enqueue_path_takes_group_priority_and_ttl(
    gateway: GatewayProcess, admin_token: str
) -> None:
    queues = {path: unique(f"path-{path}-") for path in PATHS}
    async with await producer(gateway, admin_token) as p:
        for path, q in queues.items():
            await enqueue_by(path, gateway, admin_token, p, q, NEW_FIELDS)
    for path, q in queues.items():
        visible = {m["body"]: m for m in await browse_all(gateway, admin_token, q)}
        assert (visible["a"]["group"], visible["a"]["priority"]) == ("g", 7), path
        assert (visible["b"]["group"], visible["b"]["priority"]) == ("g", 9), path

    async def all_expired() -> bool:
        for q in queues.values():
            dead = await browse_all(gateway, admin_token, q, "dead")
            if [(m["body"], m["dead_reason"]) for m in dead] != [("c", "expired")]:
                return False
        return True

    await wait_until(all_expired, "c (ttl 1) dead with reason 'expired' on every path")
    for path, q in queues.items():
        async with await worker(gateway, admin_token, q, prefetch=5) as w:
            (da,) = await w.deliveries(1)
            assert (da["body"], da["group"], da["priority"]) == ("a", "g", 7), path
            await w.quiet(0.2)  # b waits for a; c expired
            await ack(w, da)
            (db,) = await w.deliveries(1)
            assert (db["body"], db["group"], db["priority"]) == ("b", "g", 9), path
            await ack(w, db)
        assert counts(await stats(gateway, admin_token, q)) == (0, 0, 0, 1), path


@pytest.mark.parametrize("path", ["enqueue", "http"])
async def test_a_v1_message_has_no_group_and_default_priority(
    gateway: GatewayProcess, admin_token: str, path: str
) -> None:
    q = unique("v1")
    async with await producer(gateway, admin_token) as p:
        await enqueue_by(path, gateway, admin_token, p, q, [{"body": "plain"}])
    (m,) = await browse_all(gateway, admin_token, q)
    assert (m["group"], m["priority"], m["dead_reason"]) == (None, 0, None)
    async with await worker(gateway, admin_token, q) as w:
        (d,) = await w.deliveries(1)
        assert d.get("group") is None and d.get("priority", 0) == 0
        await ack(w, d)
