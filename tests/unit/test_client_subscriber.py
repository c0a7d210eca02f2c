"""The Subscriber's reconnecting, against a real WebSocket server with topic sockets.

:class:`tests.support.fake_gateway.TopicGateway` extends its :class:`FakeGateway`
(a real ``websockets`` server on 127.0.0.1) with ``/ws/topics/TOPIC/``: a credit
window per socket and ``messages`` frames, as docs/protocol.md describes them, plus
switches to close sockets with a given code, and (``history=N``) protocol
1.1 topic history: offsets, an epoch, ``recover=latest`` and
``since``/``epoch`` resume with their ``subscribed`` frames. The integration tests
(tests/integration/test_client.py) do the same against a real gateway.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from leasecast import Message, Subscribed, Subscriber

from gateway.core.errors import ConnectionClosed, Forbidden, Unauthorized
from tests.support.fake_gateway import TOKEN, TopicGateway


@pytest.fixture
async def gateway() -> AsyncIterator[TopicGateway]:
    gw = TopicGateway()
    async with gw:
        yield gw


async def take(messages: AsyncIterator[Message], n: int) -> list[Message]:
    """The next ``n`` messages (with a deadline, so a bug fails instead of hanging)."""
    return [await asyncio.wait_for(anext(messages), 10) for _ in range(n)]


async def test_a_dropped_socket_is_reopened_and_a_fresh_stream_follows(
    gateway: TopicGateway,
) -> None:
    subscriber = Subscriber(gateway.ws, "prices", token=TOKEN, credit=8, backoff_initial=0.01)
    async with subscriber:
        messages = aiter(subscriber)
        await gateway.subscribed("prices", 1)
        await gateway.publish("prices", "a", "b")
        assert [m.body for m in await take(messages, 2)] == ["a", "b"]
        gateway.drop()  # no close frame: a crash or a network cut
        waiting = asyncio.create_task(take(messages, 2))
        await gateway.subscribed("prices", 2)
        await gateway.publish("prices", "c", "d")
        got = await waiting
        # Topics are not durable: the new socket's stream starts at seq 1.
        assert [(m.topic, m.seq, m.body) for m in got] == [("prices", 1, "c"), ("prices", 2, "d")]
        assert subscriber.reconnects == 1 and gateway.handshakes == 2
        # The same socket URL (topic and parameters) as the first time.
        first, again = (s.conn.request for s in gateway.history)
        assert first is not None and again is not None and again.path == first.path


@pytest.mark.parametrize("code", [1001, 1011, 4000, 4008])
async def test_a_server_close_that_is_not_a_refusal_is_reconnected(
    gateway: TopicGateway, code: int
) -> None:
    async with Subscriber(gateway.ws, "prices", token=TOKEN, backoff_initial=0.01) as subscriber:
        messages = aiter(subscriber)
        await gateway.subscribed("prices", 1)
        await gateway.close_topic_sockets(code)
        waiting = asyncio.create_task(take(messages, 1))
        await gateway.subscribed("prices", 2)
        await gateway.publish("prices", "after")
        assert [(m.seq, m.body) for m in await waiting] == [(1, "after")]
        assert subscriber.reconnects == 1


async def test_transient_refusals_are_retried_until_the_gateway_takes_it(
    gateway: TopicGateway,
) -> None:
    async with Subscriber(gateway.ws, "prices", token=TOKEN, backoff_initial=0.01) as subscriber:
        messages = aiter(subscriber)
        await gateway.subscribed("prices", 1)
        gateway.refuse_handshakes = 3  # HTTP 503 three times, then accepted
        gateway.drop()
        waiting = asyncio.create_task(take(messages, 1))
        await gateway.subscribed("prices", 2)
        await gateway.publish("prices", "x")
        assert [m.body for m in await waiting] == ["x"]
        assert gateway.handshakes == 5 and subscriber.reconnects == 1


async def test_a_token_revoked_while_disconnected_stops_reconnecting(
    gateway: TopicGateway,
) -> None:
    async with Subscriber(gateway.ws, "prices", token=TOKEN, backoff_initial=0.01) as subscriber:
        messages = aiter(subscriber)
        await gateway.subscribed("prices", 1)
        gateway.token = "lc_rotated"
        gateway.drop()
        with pytest.raises(Unauthorized):
            await take(messages, 1)
    assert gateway.handshakes == 2 and subscriber.reconnects == 0


async def test_a_refusal_on_an_open_socket_is_final(gateway: TopicGateway) -> None:
    async with Subscriber(gateway.ws, "prices", token=TOKEN, backoff_initial=0.01) as subscriber:
        messages = aiter(subscriber)
        await gateway.subscribed("prices", 1)
        await gateway.close_topic_sockets(4403, error="forbidden")
        with pytest.raises(Forbidden, match="no more"):
            await take(messages, 1)
    assert gateway.handshakes == 1 and subscriber.reconnects == 0


async def test_close_interrupts_a_reconnect_in_its_backoff(gateway: TopicGateway) -> None:
    # The first delay is at least 2 s: a reconnect before close() ends it would
    # show as a second handshake.
    subscriber = Subscriber(gateway.ws, "prices", token=TOKEN, backoff_initial=4.0, backoff_max=4.0)
    async with subscriber:
        messages = aiter(subscriber)
        await gateway.subscribed("prices", 1)
        gateway.drop()
        waiting = asyncio.create_task(take(messages, 1))
        await gateway.until(lambda: not gateway.topics["prices"], "the drop seen by the gateway")
        await asyncio.sleep(0.05)  # let the subscriber notice and start its backoff
        await subscriber.close()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(waiting, 10)
    assert gateway.handshakes == 1 and subscriber.reconnects == 0


async def test_dropped_counts_add_up_across_frames_and_reconnects(gateway: TopicGateway) -> None:
    async with Subscriber(gateway.ws, "prices", token=TOKEN, backoff_initial=0.01) as subscriber:
        messages = aiter(subscriber)
        await gateway.subscribed("prices", 1)
        await gateway.publish("prices", "a", dropped=3)
        assert [(m.seq, m.body) for m in await take(messages, 1)] == [(4, "a")]
        assert subscriber.dropped == 3
        gateway.drop()
        waiting = asyncio.create_task(take(messages, 1))
        await gateway.subscribed("prices", 2)
        await gateway.publish("prices", "b", dropped=2)
        assert [(m.seq, m.body) for m in await waiting] == [(3, "b")]
        assert subscriber.dropped == 5


async def test_credit_is_granted_in_halves_as_messages_are_consumed(
    gateway: TopicGateway,
) -> None:
    async with Subscriber(gateway.ws, "prices", token=TOKEN, credit=4) as subscriber:
        messages = aiter(subscriber)
        await gateway.subscribed("prices", 1)
        sub = gateway.history[0]
        await gateway.publish("prices", *range(10))
        assert len(sub.pending) == 6  # only the window (4) is sent before any grant
        assert [m.body for m in await take(messages, 10)] == list(range(10))
        # A grant of 2 after every 2 consumed (a message counts as consumed
        # when the next is asked for): 8 granted for the first 9.
        await gateway.until(lambda: len(sub.granted) == 4, "four grants")
        assert sub.granted == [2, 2, 2, 2] and sub.credit == 4 + 8 - 10


async def test_iterating_without_async_with_connects_on_first_use(gateway: TopicGateway) -> None:
    subscriber = Subscriber(gateway.ws, "prices", token=TOKEN, backoff_initial=0.01)
    try:
        waiting = asyncio.create_task(take(aiter(subscriber), 1))
        await gateway.subscribed("prices", 1)
        await gateway.publish("prices", "x")
        assert [m.body for m in await waiting] == ["x"]
    finally:
        await subscriber.close()
    # A first connection is not a reconnect.
    assert gateway.handshakes == 1 and subscriber.reconnects == 0


async def test_an_unreachable_gateway_fails_fast_on_first_use() -> None:
    gw = TopicGateway()
    async with gw:
        url = gw.ws
    subscriber = Subscriber(url, "prices", token=TOKEN, backoff_initial=0.01)
    # Like ``async with``: the first connection is not retried forever.
    with pytest.raises(ConnectionClosed, match="cannot connect"):
        await take(aiter(subscriber), 1)
    await subscriber.close()


# -- resume (protocol 1.1: topic history) --------------------------------------------


async def test_a_reconnect_resumes_from_the_last_offset_with_no_gap() -> None:
    async with TopicGateway(history=100) as gateway:
        await gateway.publish("prices", "old")  # before subscribing: not wanted
        gaps: list[Subscribed] = []
        subscriber = Subscriber(
            gateway.ws, "prices", token=TOKEN, backoff_initial=0.01, on_gap=gaps.append
        )
        async with subscriber:
            messages = aiter(subscriber)
            await gateway.subscribed("prices", 1)
            # The first socket learnt the epoch (recover=latest) and skipped "old".
            assert gateway.paths[0].endswith("&recover=latest")
            await gateway.publish("prices", "a", "b")
            got = await take(messages, 2)
            assert [(m.body, m.offset) for m in got] == [("a", 2), ("b", 3)]
            gateway.drop()
            await gateway.publish("prices", "missed-1", "missed-2")  # while disconnected
            waiting = asyncio.create_task(take(messages, 3))
            await gateway.subscribed("prices", 2)
            await gateway.publish("prices", "live")
            after = await waiting
            assert [(m.body, m.offset) for m in after] == [
                ("missed-1", 4),
                ("missed-2", 5),
                ("live", 6),
            ]
            assert "since=3&epoch=e1" in gateway.paths[1]
            assert subscriber.subscribed == Subscribed("prices", "e1", 5, recovered=True)
            assert subscriber.gaps == 0 and gaps == []
            assert (subscriber.position.offset, subscriber.position.epoch) == (6, "e1")


async def test_an_unrecoverable_resume_is_told(caplog: pytest.LogCaptureFixture) -> None:
    async with TopicGateway(history=100) as gateway:
        gaps: list[Subscribed] = []

        async def on_gap(frame: Subscribed) -> None:  # an async callback works too
            gaps.append(frame)

        subscriber = Subscriber(
            gateway.ws, "prices", token=TOKEN, backoff_initial=0.01, on_gap=on_gap
        )
        async with subscriber:
            messages = aiter(subscriber)
            await gateway.subscribed("prices", 1)
            await gateway.publish("prices", "a")
            assert [m.offset for m in await take(messages, 1)] == [1]
            gateway.drop()
            gateway.reset_history("e2")  # the history was lost: offsets restart
            await gateway.publish("prices", "lost")
            waiting = asyncio.create_task(take(messages, 1))
            await gateway.subscribed("prices", 2)
            await gateway.publish("prices", "live")
            assert [(m.body, m.offset) for m in await waiting] == [("live", 2)]
        assert gaps == [Subscribed("prices", "e2", 1, recovered=False)]
        assert subscriber.gaps == 1 and subscriber.subscribed == gaps[0]
        assert "could not resume" in caplog.text
        # Resuming from then on uses the new epoch.
        assert subscriber.position.params() == {"since": 2, "epoch": "e2"}


async def test_a_saved_position_is_resumed_by_a_new_subscriber() -> None:
    async with TopicGateway(history=100) as gateway:
        await gateway.publish("prices", *range(5))
        subscriber = Subscriber(gateway.ws, "prices", token=TOKEN, since=2, epoch="e1")
        async with subscriber:
            got = await take(aiter(subscriber), 2)
        assert [(m.body, m.offset) for m in got] == [(2, 3), (3, 4)]
        assert "since=2&epoch=e1" in gateway.paths[0]


async def test_without_topic_history_a_subscriber_behaves_as_in_v1(
    gateway: TopicGateway,
) -> None:
    subscriber = Subscriber(gateway.ws, "prices", token=TOKEN, backoff_initial=0.01)
    async with subscriber:
        messages = aiter(subscriber)
        await gateway.subscribed("prices", 1)
        await gateway.publish("prices", "a")
        assert [(m.body, m.offset) for m in await take(messages, 1)] == [("a", None)]
        gateway.drop()
        waiting = asyncio.create_task(take(messages, 1))
        await gateway.subscribed("prices", 2)
        await gateway.publish("prices", "b")
        assert [m.body for m in await waiting] == ["b"]
    assert all("since" not in path for path in gateway.paths)
    assert subscriber.subscribed is None and subscriber.gaps == 0


async def test_resume_false_never_asks_for_a_position() -> None:
    async with TopicGateway(history=100) as gateway:
        subscriber = Subscriber(gateway.ws, "prices", token=TOKEN, resume=False)
        async with subscriber:
            await gateway.subscribed("prices", 1)
            await gateway.publish("prices", "a")
            assert [m.offset for m in await take(aiter(subscriber), 1)] == [1]
        assert "since" not in gateway.paths[0]


def test_message_fields_are_the_ones_the_iteration_fills() -> None:
    import dataclasses

    # Subscriber._messages fills these fields itself (no __init__): a field
    # added to Message must be added there.
    assert [f.name for f in dataclasses.fields(Message)] == ["topic", "seq", "body", "offset"]


@pytest.mark.parametrize("history", [0, 100])
async def test_iterated_messages_are_plain_frozen_messages(history: int) -> None:
    """The iteration makes each Message without its ``__init__`` (and, for an
    item of exactly seq, offset and body, from the parsed item itself): what
    the caller gets must be the same frozen Message either way."""
    import dataclasses

    async with (
        TopicGateway(history=history) as gateway,
        Subscriber(gateway.ws, "prices", token=TOKEN) as subscriber,
    ):
        messages = aiter(subscriber)
        await gateway.subscribed("prices", 1)
        await gateway.publish("prices", {"p": 1}, [2], None)
        got = await take(messages, 3)
    offsets = [1, 2, 3] if history else [None, None, None]
    # With history, recover=latest asked for the latest message: there was none.
    expected = [
        Message("prices", seq, body, offset)
        for seq, body, offset in zip([1, 2, 3], [{"p": 1}, [2], None], offsets, strict=True)
    ]
    assert got == expected
    for message, plain in zip(got, expected, strict=True):
        assert type(message) is Message
        assert repr(message) == repr(plain) and vars(message) == vars(plain)
        with pytest.raises(dataclasses.FrozenInstanceError):
            message.seq = 9  # type: ignore[misc]
