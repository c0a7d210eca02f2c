"""The Subscriber's reconnecting, against a real WebSocket server with topic sockets.

:class:`TopicGateway` extends the worker tests' :class:`FakeGateway` (a real
``websockets`` server on 127.0.0.1) with ``/ws/topics/TOPIC/``: a credit
window per socket and ``messages`` frames, as docs/protocol.md describes them, plus
switches to close sockets with a given code, and (``history=N``) protocol
1.1 topic history: offsets, an epoch, ``recover=latest`` and
``since``/``epoch`` resume with their ``subscribed`` frames. The integration tests
(tests/integration/test_client.py) do the same against a real gateway.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pytest
from leasecast import Message, Subscribed, Subscriber
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed as WsConnectionClosed

from gateway.core.errors import ConnectionClosed, Forbidden, Unauthorized
from tests.unit.test_client_worker import TOKEN, FakeGateway


@dataclass
class TopicSocket:
    """One subscriber socket of the fake gateway."""

    conn: ServerConnection
    topic: str
    credit: int
    seq: int = 0
    pending: list[tuple[int, Any, int | None]] = field(default_factory=list)
    granted: list[int] = field(default_factory=list)  # the n of each credit frame


class TopicGateway(FakeGateway):
    """:class:`FakeGateway` with broadcast topics."""

    def __init__(self, history: int = 0) -> None:
        super().__init__()
        self.topics: dict[str, list[TopicSocket]] = defaultdict(list)
        #: every topic socket ever accepted, in order
        self.history: list[TopicSocket] = []
        #: messages kept per topic (0: a gateway without topic history)
        self.keep = history
        self.epoch = "e1"
        self.offsets: dict[str, int] = defaultdict(int)
        self.logs: dict[str, list[tuple[int, Any]]] = defaultdict(list)

    def reset_history(self, epoch: str) -> None:
        """Lose every topic's history: offsets restart under a new epoch."""
        self.epoch = epoch
        self.offsets.clear()
        self.logs.clear()

    async def _handle(self, conn: ServerConnection) -> None:
        assert conn.request is not None
        parts = urlsplit(conn.request.path)
        segments = [unquote(s) for s in parts.path.strip("/").split("/")]
        if segments[:2] != ["ws", "topics"] or len(segments) != 3:
            await super()._handle(conn)
            return
        self.paths.append(conn.request.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        topic = segments[2]
        if topic in self.forbidden:
            await self._send(conn, {"op": "error", "code": "forbidden", "detail": f"no {topic}"})
            await conn.close(4403)
            return
        sub = TopicSocket(conn, topic, credit=int(query.get("credit", "256")))
        self.sockets.add(conn)
        self.topics[topic].append(sub)
        self.history.append(sub)
        if self.keep and "since" in query:
            await self._resume(sub, int(query["since"]), query.get("epoch", ""))
        elif self.keep and query.get("recover") == "latest":
            await self._latest(sub)
        try:
            async for text in conn:
                frame = json.loads(text)
                self.received.append(frame)
                if frame.get("op") == "credit":
                    sub.granted.append(frame["n"])
                    sub.credit += frame["n"]
                    await self._flush(sub, 0)
        except WsConnectionClosed:
            pass
        finally:
            self.sockets.discard(conn)
            self.topics[topic].remove(sub)

    async def _latest(self, sub: TopicSocket) -> None:
        log = self.logs[sub.topic]
        frame = {"op": "subscribed", "topic": sub.topic, "epoch": self.epoch}
        frame |= {"offset": self.offsets[sub.topic], "recovered": bool(log)}
        await self._send(sub.conn, frame)
        if log:
            sub.seq += 1
            sub.pending.append((sub.seq, log[-1][1], log[-1][0]))
            await self._flush(sub, 0)

    async def _resume(self, sub: TopicSocket, since: int, epoch: str) -> None:
        log = self.logs[sub.topic]
        oldest = log[0][0] if log else self.offsets[sub.topic] + 1
        recovered = epoch == self.epoch and oldest - 1 <= since <= self.offsets[sub.topic]
        frame = {"op": "subscribed", "topic": sub.topic, "epoch": self.epoch}
        frame |= {"offset": self.offsets[sub.topic], "recovered": recovered}
        await self._send(sub.conn, frame)
        if recovered:
            for offset, body in log:
                if offset > since:
                    sub.seq += 1
                    sub.pending.append((sub.seq, body, offset))
            await self._flush(sub, 0)

    async def publish(self, topic: str, *bodies: Any, dropped: int = 0) -> None:
        """Offer ``bodies`` to every socket of ``topic``, reporting ``dropped`` losses first."""
        offsets: list[int | None] = []
        for body in bodies:
            if self.keep:
                self.offsets[topic] += 1
                self.logs[topic] = [*self.logs[topic], (self.offsets[topic], body)][-self.keep :]
                offsets.append(self.offsets[topic])
            else:
                offsets.append(None)
        for sub in list(self.topics[topic]):
            sub.seq += dropped
            for body, offset in zip(bodies, offsets, strict=True):
                sub.seq += 1
                sub.pending.append((sub.seq, body, offset))
            await self._flush(sub, dropped)

    async def _flush(self, sub: TopicSocket, dropped: int) -> None:
        n = min(sub.credit, len(sub.pending))
        items, sub.pending = sub.pending[:n], sub.pending[n:]
        sub.credit -= n
        if items or dropped:
            frame = {
                "op": "messages",
                "topic": sub.topic,
                "items": [
                    {"seq": seq, "body": body} | ({} if offset is None else {"offset": offset})
                    for seq, body, offset in items
                ],
                "dropped": dropped,
            }
            await self._send(sub.conn, frame)

    async def close_topic_sockets(self, code: int, error: str | None = None) -> None:
        """Close every topic socket with ``code``, stating ``error`` first if given."""
        for sub in [s for subs in self.topics.values() for s in subs]:
            if error is not None:
                await self._send(sub.conn, {"op": "error", "code": error, "detail": "no more"})
            await sub.conn.close(code)

    async def until(self, condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
        """Wait until ``condition()`` holds (the gateway's own view), or fail."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not condition():
            assert asyncio.get_running_loop().time() < deadline, f"never: {what}"
            await asyncio.sleep(0.005)

    async def subscribed(self, topic: str, handshakes: int) -> None:
        """Wait until ``topic`` has one socket, accepted as handshake number ``handshakes``."""
        await self.until(
            lambda: len(self.topics[topic]) == 1 and len(self.history) == handshakes,
            f"socket {handshakes} on {topic}",
        )


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
