"""Work queue 1.1: ordering groups and priority, against a real gateway and real sockets.

docs/protocol.md, "Work queue 1.1": messages of one group are
delivered one at a time in enqueue order; a message of a group is not leased
while an earlier one of the group is still in the queue (visible, delayed or
in flight); acking or dead-lettering it lets the next go; different groups go
in parallel. Among visible messages a higher priority goes first; within a
group enqueue order wins. Runs on SQLite and on PostgreSQL (conftest.py).
"""

from __future__ import annotations

from typing import Any

from tests.integration.queue11.wq11 import (
    ack,
    browse_all,
    counts,
    enqueue,
    first_frame,
    patch,
    producer,
    stats,
    worker,
)
from tests.support.clients import ahttp, unique
from tests.support.gateways import GatewayProcess


async def test_one_in_flight_per_group_in_enqueue_order(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("grp")
    sent: dict[str, str] = {}
    async with await producer(gateway, admin_token) as p:
        for body, group in [
            ("a1", "a"),
            ("a2", "a"),
            ("b1", "b"),
            ("a3", "a"),
            ("b2", "b"),
            ("n1", None),
        ]:
            extra = {"group": group} if group else {}
            sent[body] = (await enqueue(p, q, body, **extra))["id"]
    async with await worker(gateway, admin_token, q, prefetch=10) as w:
        first = await w.deliveries(3)
        # Only each group's first message, and the message without a group.
        assert [d["body"] for d in first] == ["a1", "b1", "n1"]
        assert [d.get("group") for d in first] == ["a", "b", None]
        assert all(d["id"] == sent[d["body"]] for d in first)
        await w.quiet(0.4)  # a2, a3 and b2 wait although the worker has room
        assert counts(await stats(gateway, admin_token, q)) == (3, 0, 3, 0)
        a1, b1, n1 = first
        await ack(w, a1)  # acking a group's message lets the next one go
        (a2,) = await w.deliveries(1)
        assert (a2["body"], a2["group"], a2["deliveries"]) == ("a2", "a", 1)
        await w.quiet(0.3)
        await ack(w, b1)
        (b2,) = await w.deliveries(1)
        assert b2["body"] == "b2"
        await ack(w, a2)
        (a3,) = await w.deliveries(1)
        assert a3["body"] == "a3"
        for d in (n1, b2, a3):
            await ack(w, d)
        await w.quiet(0.3)
    assert counts(await stats(gateway, admin_token, q)) == (0, 0, 0, 0)


async def test_two_workers_get_different_groups_at_once(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("grp")
    async with await producer(gateway, admin_token) as p:
        for body in ("a1", "a2", "b1", "b2"):
            await enqueue(p, q, body, group=body[0])
    async with await worker(gateway, admin_token, q, prefetch=1) as w1:
        (d1,) = await w1.deliveries(1)
        assert d1["body"] == "a1"
        async with await worker(gateway, admin_token, q, prefetch=1) as w2:
            (d2,) = await w2.deliveries(1)
            assert d2["body"] == "b1"  # not a2: group a is busy, group b is not
            assert counts(await stats(gateway, admin_token, q)) == (2, 0, 2, 0)
            await ack(w1, d1)
            await ack(w2, d2)
            (e1,) = await w1.deliveries(1)
            (e2,) = await w2.deliveries(1)
            assert {e1["body"], e2["body"]} == {"a2", "b2"}
            await ack(w1, e1)
            await ack(w2, e2)
    assert counts(await stats(gateway, admin_token, q)) == (0, 0, 0, 0)


async def test_nack_with_and_without_delay_keeps_the_group_waiting(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("grp")
    async with await producer(gateway, admin_token) as p:
        for i in range(3):
            await enqueue(p, q, f"m{i}", group="g")
        await enqueue(p, q, "other", group="h")
    async with await worker(gateway, admin_token, q, prefetch=5) as w:
        d0, other = await w.deliveries(2)
        assert (d0["body"], other["body"]) == ("m0", "other")
        await ack(w, other)
        reply = await w.request({"op": "nack", "receipt": d0["receipt"]})
        assert reply["op"] == "nacked"
        (again,) = await w.deliveries(1)
        assert (again["body"], again["deliveries"]) == ("m0", 2)  # not m1
        # Nacked with a delay, m0 is delayed but still in the queue: m1 waits for it.
        reply = await w.request({"op": "nack", "receipt": again["receipt"], "delay": 1})
        assert reply["op"] == "nacked"
        (third,) = await w.deliveries(1)
        assert (third["body"], third["deliveries"]) == ("m0", 3)
        await ack(w, third)
        (m1,) = await w.deliveries(1)
        assert (m1["body"], m1["deliveries"]) == ("m1", 1)
        await ack(w, m1)
        (m2,) = await w.deliveries(1)
        assert m2["body"] == "m2"
        await ack(w, m2)


async def test_visibility_timeout_keeps_the_group_order(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("grp")
    async with await producer(gateway, admin_token) as p:
        for i in range(2):
            await enqueue(p, q, f"m{i}", group="g")
    async with await worker(gateway, admin_token, q, prefetch=5, visibility_timeout=1) as w:
        (d0,) = await w.deliveries(1)
        assert d0["body"] == "m0"
        # Not acked: the lease expires and m0 comes again, before m1.
        (again,) = await w.deliveries(1)
        assert (again["body"], again["id"], again["deliveries"]) == ("m0", d0["id"], 2)
        stale = await w.request({"op": "ack", "receipt": d0["receipt"]})
        assert stale["code"] == "stale_receipt"
        await ack(w, again)
        (m1,) = await w.deliveries(1)
        assert (m1["body"], m1["deliveries"]) == ("m1", 1)
        await ack(w, m1)


async def test_socket_close_keeps_the_group_order(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("grp")
    async with await producer(gateway, admin_token) as p:
        for i in range(3):
            await enqueue(p, q, f"m{i}", group="g")
    doomed = await worker(gateway, admin_token, q, prefetch=5, visibility_timeout=300)
    (d0,) = await doomed.deliveries(1)
    assert d0["body"] == "m0"
    async with await worker(gateway, admin_token, q, prefetch=5) as w:
        await w.quiet(0.4)  # m1 waits for m0, which the first socket holds
        await doomed.abort()  # the TCP connection dies: m0 is released at once
        (again,) = await w.deliveries(1, timeout=10)  # long before the 300 s timeout
        assert (again["body"], again["id"], again["deliveries"]) == ("m0", d0["id"], 2)
        await ack(w, again)
        (m1,) = await w.deliveries(1)
        assert m1["body"] == "m1"
        await ack(w, m1)
        (m2,) = await w.deliveries(1)
        assert m2["body"] == "m2"
        await ack(w, m2)


async def test_admin_requeue_of_an_in_flight_message_keeps_the_group_order(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("grp")
    async with await producer(gateway, admin_token) as p:
        ids = [(await enqueue(p, q, f"m{i}", group="g"))["id"] for i in range(3)]
    async with await worker(gateway, admin_token, q, prefetch=1, visibility_timeout=300) as w1:
        (d0,) = await w1.deliveries(1)
        assert d0["body"] == "m0"
        async with await worker(gateway, admin_token, q, prefetch=1) as w2:
            await w2.quiet(0.3)
            url = f"{gateway.http}/api/queues/{q}/messages/{ids[0]}/requeue"
            assert await ahttp("POST", url, admin_token) == (200, {"requeued": 1})
            holder, again = await first_frame(w1, w2)
            # m0 again (its delivery count reset), never m1 ahead of it.
            assert (again["body"], again["id"], again["deliveries"]) == ("m0", ids[0], 1)
            stale = await w1.request({"op": "ack", "receipt": d0["receipt"]})
            assert stale["code"] == "stale_receipt"  # the open lease became stale
            await ack(holder, again)
            _, m1 = await first_frame(w1, w2)
            assert m1["body"] == "m1"


async def test_admin_requeue_of_a_dead_message_puts_it_first_in_its_group(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("grp")
    async with await producer(gateway, admin_token) as p:
        ids = [(await enqueue(p, q, f"m{i}", group="g"))["id"] for i in range(3)]
    async with await worker(gateway, admin_token, q, prefetch=5) as w:
        (d0,) = await w.deliveries(1)
        assert (await w.request({"op": "reject", "receipt": d0["receipt"]}))["op"] == "rejected"
        (d1,) = await w.deliveries(1)  # dead-lettering m0 let m1 go
        assert d1["body"] == "m1"
        url = f"{gateway.http}/api/queues/{q}/messages/{ids[0]}/requeue"
        assert await ahttp("POST", url, admin_token) == (200, {"requeued": 1})
        await ack(w, d1)
        # m0 is earlier in the group than m2: it goes first.
        (again,) = await w.deliveries(1)
        assert (again["body"], again["id"], again["deliveries"]) == ("m0", ids[0], 1)
        await w.quiet(0.3)
        await ack(w, again)
        (d2,) = await w.deliveries(1)
        assert d2["body"] == "m2"
        await ack(w, d2)


async def test_reject_and_max_deliveries_dead_lettering_let_the_next_go(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("grp")
    await patch(gateway, admin_token, q, max_deliveries=2)
    async with await producer(gateway, admin_token) as p:
        ids = [(await enqueue(p, q, f"m{i}", group="g"))["id"] for i in range(3)]
    async with await worker(gateway, admin_token, q, prefetch=5) as w:
        (d0,) = await w.deliveries(1)
        assert (await w.request({"op": "reject", "receipt": d0["receipt"]}))["op"] == "rejected"
        for attempt in (1, 2):
            (d1,) = await w.deliveries(1)
            assert (d1["body"], d1["deliveries"]) == ("m1", attempt)
            assert (await w.request({"op": "nack", "receipt": d1["receipt"]}))["op"] == "nacked"
        # A third delivery would exceed max_deliveries: m1 is dead-lettered, m2 goes.
        (d2,) = await w.deliveries(1)
        assert (d2["body"], d2["deliveries"]) == ("m2", 1)
        await ack(w, d2)
    dead = await browse_all(gateway, admin_token, q, "dead")
    assert [(m["id"], m["dead_reason"], m["group"]) for m in dead] == [
        (ids[0], "rejected", "g"),
        (ids[1], "max_deliveries", "g"),
    ]


async def test_higher_priority_first_equal_priority_in_enqueue_order(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("prio")
    sent: list[tuple[str, int | None]] = [
        ("low", -5),
        ("high", 50),
        ("mid", None),
        ("high2", 50),
        ("top", 100),
        ("bottom", -100),
        ("zero", 0),
    ]
    async with await producer(gateway, admin_token) as p:
        for body, priority in sent:
            extra = {} if priority is None else {"priority": priority}
            await enqueue(p, q, body, **extra)
    got: list[dict[str, Any]] = []
    async with await worker(gateway, admin_token, q, prefetch=1) as w:
        for _ in sent:
            (d,) = await w.deliveries(1)
            got.append(d)
            await ack(w, d)
        await w.quiet(0.3)
    assert [d["body"] for d in got] == ["top", "high", "high2", "mid", "zero", "low", "bottom"]
    # deliver carries priority when the message has one (0 is the default: may be left out).
    assert [d.get("priority", 0) for d in got] == [100, 50, 50, 0, 0, -5, -100]


async def test_within_a_group_enqueue_order_wins_over_priority(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("prio")
    async with await producer(gateway, admin_token) as p:
        await enqueue(p, q, "g-low-first", group="g", priority=-10)
        await enqueue(p, q, "g-high-second", group="g", priority=100)
        await enqueue(p, q, "h-mid", group="h", priority=5)
    order = []
    async with await worker(gateway, admin_token, q, prefetch=1) as w:
        for _ in range(3):
            (d,) = await w.deliveries(1)
            order.append((d["body"], d["group"], d["priority"]))
            await ack(w, d)
    # g-high-second may not pass g-low-first; among what may go, priority decides.
    assert order == [("h-mid", "h", 5), ("g-low-first", "g", -10), ("g-high-second", "g", 100)]


async def test_batched_deliveries_items_carry_group_and_priority(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q = unique("prio")
    async with await producer(gateway, admin_token) as p:
        await enqueue(p, q, "x", group="g", priority=3)
        await enqueue(p, q, "y", priority=-2)
        await enqueue(p, q, "z", group="g", priority=9)  # waits for x
    async with await worker(gateway, admin_token, q, prefetch=5, batch=5) as w:
        items: list[dict[str, Any]] = []
        while len(items) < 2:
            frame = await w.next()
            assert frame["op"] == "deliveries", frame
            items += frame["items"]
        await w.quiet(0.3)
        assert [(i["body"], i.get("group"), i["priority"]) for i in items] == [
            ("x", "g", 3),
            ("y", None, -2),
        ]
