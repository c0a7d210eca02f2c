"""The Producer against the in-test gateway of ``test_client_worker``."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from leasecast import EnqueueResult, Producer, PublishResult
from leasecast.producer import CHUNK

from gateway.core.errors import BadFrame, ConnectionClosed, Forbidden, Invalid, Unauthorized
from tests.support.fake_gateway import TOKEN, FakeGateway


@pytest.fixture
async def gateway() -> AsyncIterator[FakeGateway]:
    async with FakeGateway() as gw:
        yield gw


async def test_enqueue_with_keys_and_publish(gateway: FakeGateway) -> None:
    async with Producer(gateway.http, token=TOKEN) as producer:
        assert producer.url == f"{gateway.ws}/ws/produce/"
        first = await producer.enqueue("emails", {"to": "ada"}, key="signup-1")
        assert first == EnqueueResult(id="m1", duplicate=False)
        again = await producer.enqueue("emails", {"to": "ada"}, key="signup-1")
        assert again == EnqueueResult(id="m1", duplicate=True)
        await producer.enqueue("emails", "later", delay=60)
        assert await producer.publish("prices", {"EURUSD": 1.09}) == PublishResult("prices", 1)
        assert (await producer.publish("prices", {"EURUSD": 1.1})).seq == 2
    assert [m.body for m in gateway.queues["emails"]] == [{"to": "ada"}, "later"]
    assert gateway.published == [("prices", {"EURUSD": 1.09}), ("prices", {"EURUSD": 1.1})]
    enqueue = gateway.received[0]
    assert enqueue == {
        "op": "enqueue",
        "queue": "emails",
        "body": {"to": "ada"},
        "delay": 0,
        "key": "signup-1",
        "ref": enqueue["ref"],
    }


async def test_enqueue_many_pipelines_chunks_and_keeps_order(gateway: FakeGateway) -> None:
    n = 2 * CHUNK + 500
    async with Producer(gateway.ws, token=TOKEN) as producer:
        results = await producer.enqueue_many("bulk", [{"body": i} for i in range(n)])
        assert await producer.enqueue_many("bulk", []) == []
    assert [r.id for r in results] == [f"m{i + 1}" for i in range(n)]
    assert [m.body for m in gateway.queues["bulk"]] == list(range(n))
    frames = gateway.received
    assert [f["op"] for f in frames] == ["enqueue_many"] * 3
    assert [len(f["messages"]) for f in frames] == [CHUNK, CHUNK, 500]
    # Pipelined: the gateway had every frame before it answered the first.
    assert len({f["ref"] for f in frames}) == 3


async def test_enqueue_many_falls_back_to_single_frames_on_a_v1_gateway() -> None:
    async with FakeGateway(batch_op=False) as gateway:
        async with Producer(gateway.ws, token=TOKEN) as producer:
            messages = [{"body": i, "key": f"k{i % 1500}"} for i in range(1500 + 3)]
            results = await producer.enqueue_many("bulk", messages)
            again = await producer.enqueue_many("bulk", [{"body": "x"}])
        assert [r.duplicate for r in results] == [False] * 1500 + [True] * 3
        assert results[1500].id == results[0].id
        assert again == [EnqueueResult("m1501", False)]
        ops = [f["op"] for f in gateway.received]
        # Two refused batch frames, then one frame per message; the next call
        # remembers and sends no batch frame at all.
        assert ops == ["enqueue_many"] * 2 + ["enqueue"] * (1500 + 3 + 1)


async def test_enqueue_many_reports_which_part_was_refused(gateway: FakeGateway) -> None:
    messages: list[dict[str, object]] = [{"body": i} for i in range(CHUNK + 10)]
    messages[CHUNK + 2]["delay"] = -1  # in the second frame
    async with Producer(gateway.ws, token=TOKEN) as producer:
        with pytest.raises(Invalid, match=r"messages\[2\]") as caught:
            await producer.enqueue_many("bulk", messages)
    assert caught.value.__notes__ == [
        f"enqueue_many: messages {CHUNK}..{CHUNK + 9} were refused; "
        "1 of 2 frames failed, the others were applied"
    ]
    assert len(gateway.queues["bulk"]) == CHUNK  # the first frame stands, alone


async def test_enqueue_sends_group_priority_ttl_only_when_set(gateway: FakeGateway) -> None:
    async with Producer(gateway.ws, token=TOKEN) as producer:
        await producer.enqueue("orders", "v1", priority=0)  # the default: nothing to send
        await producer.enqueue("orders", "step 1", group="order-7", priority=5, ttl=3600)
        await producer.enqueue("orders", "low", priority=-100, ttl=0.25)
    v1, grouped, low = gateway.received
    assert v1 == {"op": "enqueue", "queue": "orders", "body": "v1", "delay": 0, "ref": v1["ref"]}
    assert {k: grouped.get(k) for k in ("key", "group", "priority", "ttl")} == {
        "key": None,
        "group": "order-7",
        "priority": 5,
        "ttl": 3600,
    }
    assert "group" not in low and (low["priority"], low["ttl"]) == (-100, 0.25)
    stored = [(m.body, m.group, m.priority, m.ttl) for m in gateway.queues["orders"]]
    assert stored == [
        ("v1", None, 0, None),
        ("step 1", "order-7", 5, 3600),
        ("low", None, -100, 0.25),
    ]


@pytest.mark.parametrize("batch_op", [True, False])
async def test_enqueue_many_applies_defaults_a_message_can_override(batch_op: bool) -> None:
    messages = [
        {"body": 0},
        {"body": 1, "group": "own", "priority": 9, "ttl": 5},
        {"body": 2, "group": None},  # explicitly without a group
    ]
    async with FakeGateway(batch_op=batch_op) as gateway:
        async with Producer(gateway.ws, token=TOKEN) as producer:
            await producer.enqueue_many("bulk", messages, group="g", priority=-1, ttl=60)
            await producer.enqueue_many("bulk", [{"body": 3}])  # no defaults: v1 messages
        stored = [(m.body, m.group, m.priority, m.ttl) for m in gateway.queues["bulk"]]
        last = gateway.received[-1]
        sent = last["messages"][0] if batch_op else last
    assert stored == [
        (0, "g", -1, 60),
        (1, "own", 9, 5),
        (2, None, -1, 60),
        (3, None, 0, None),
    ]
    assert messages[0] == {"body": 0}  # the caller's dicts are left as they were
    assert sent["body"] == 3 and not {"group", "priority", "ttl"} & set(sent)


async def test_bad_values_are_the_gateways_to_refuse(gateway: FakeGateway) -> None:
    async with Producer(gateway.ws, token=TOKEN) as producer:
        with pytest.raises(Invalid, match="priority"):
            await producer.enqueue("q", 1, priority=500)
        with pytest.raises(BadFrame, match="group"):
            await producer.enqueue("q", 1, group=7)  # type: ignore[arg-type]
        with pytest.raises(Invalid, match=r"messages\[1\]: ttl"):
            await producer.enqueue_many("q", [{"body": 1}, {"body": 2, "ttl": -1}])
    assert len(gateway.received) == 3 and not gateway.queues["q"]


async def test_refusals_raise_and_the_socket_stays_usable(gateway: FakeGateway) -> None:
    async with Producer(gateway.ws, token=TOKEN) as producer:
        with pytest.raises(Forbidden, match="enqueue:secret"):
            await producer.enqueue("secret", 1)
        with pytest.raises(Invalid):
            await producer.enqueue("q", 1, delay=-1)
        assert (await producer.enqueue("q", 1)).duplicate is False
        assert producer.connected
    assert gateway.handshakes == 1


async def test_a_refused_token_raises_unauthorized(gateway: FakeGateway) -> None:
    with pytest.raises(Unauthorized, match="HTTP 403"):
        async with Producer(gateway.ws, token="lc_wrong"):
            pass


async def test_a_call_in_flight_during_a_drop_raises_and_the_next_reconnects(
    gateway: FakeGateway,
) -> None:
    gateway.drop_on = lambda frame: frame.get("body") == "boom"
    async with Producer(gateway.ws, token=TOKEN) as producer:
        with pytest.raises(ConnectionClosed):
            await producer.enqueue("q", "boom", key="once")
        assert not producer.connected
        gateway.drop_on = lambda frame: False
        # Retrying with the same key is safe: at most one copy is stored.
        assert (await producer.enqueue("q", "boom", key="once")).duplicate is False
        assert producer.connected
    assert gateway.handshakes == 2


async def test_a_closed_producer_refuses_new_calls(gateway: FakeGateway) -> None:
    producer = Producer(gateway.ws, token=TOKEN)
    async with producer:
        await producer.enqueue("q", 1)
    with pytest.raises(ConnectionClosed, match="closed"):
        await producer.enqueue("q", 2)
    assert gateway.handshakes == 1
