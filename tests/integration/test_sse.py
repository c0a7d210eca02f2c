"""Server-sent events, ``GET /sse/topics/TOPIC/`` (docs/protocol.md, "Server-sent events").

Real gateway processes under daphne and uvicorn, on SQLite and PostgreSQL
(the topic's history settings are rows), read by a raw HTTP client
(tests.support.events) that can also stop reading: the gateway's
backpressure then fills the stream's buffer and its policy applies.
"""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.clients import Socket, ahttp, unique
from tests.support.events import EventStream, open_stream
from tests.support.gateways import GatewayProcess, both_servers
from tests.support.tokens import TEST_SIGNING_KEY, mint

pytestmark = both_servers

ALLOWED_ORIGIN = "http://app.example.test"
#: Bodies big enough that a few hundred of them overflow every buffer between
#: the gateway and a client that stopped reading (kernel and server).
BIG = "x" * 16_000


def overflowing() -> int:
    """How many ``BIG`` messages surely overflow the kernel's send buffer (its
    largest autotuned size, ``tcp_wmem``) and the server's, with room to spare."""
    try:
        largest = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    except (OSError, ValueError, IndexError):
        largest = 4 << 20
    return max(600, (largest + (4 << 20)) // len(BIG))


@pytest.fixture(scope="module")
def sse_gateway(
    database_env: tuple[dict[str, str], Path], gateway_server: str
) -> Iterator[GatewayProcess]:
    """A gateway with short waits: keep-alive comments every 0.3 s, a 1 s block
    wait, a 1 s request-head deadline (a stream must outlive it)."""
    env, var = database_env
    env = {
        **env,
        "GATEWAY_SSE_KEEPALIVE": "0.3",
        "GATEWAY_BLOCK_WAIT": "1",
        "GATEWAY_REQUEST_HEAD_TIMEOUT": "1",
        "GATEWAY_ALLOWED_ORIGINS": ALLOWED_ORIGIN,
        "GATEWAY_SIGNING_KEY": TEST_SIGNING_KEY,
        # Each token may hold this many sockets and streams at once (a test
        # checks that a stream counts, and that a closed one is given back).
        "GATEWAY_TOKEN_MAX_SOCKETS": "6",
    }
    process = GatewayProcess(env, var, name=f"sse-{gateway_server}", server=gateway_server)
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def token(sse_gateway: GatewayProcess) -> str:
    return sse_gateway.issue_token("admin", name="sse-admin")


def sse_url(gateway: GatewayProcess, topic: str, query: str = "") -> str:
    return f"{gateway.http}/sse/topics/{topic}/" + (f"?{query}" if query else "")


async def publish(
    gateway: GatewayProcess, token: str, topic: str, bodies: list[object], batch_size: int = 50
) -> None:
    for i in range(0, len(bodies), batch_size):
        batch = [{"body": body} for body in bodies[i : i + batch_size]]
        status, reply = await ahttp(
            "POST", f"{gateway.http}/api/topics/{topic}/messages", token, {"messages": batch}
        )
        assert status == 200, reply


def text_of(url: str, token: str) -> str:
    """A GET's body as text (``/metrics``)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text: str = response.read().decode()
        return text


async def keep_history(gateway: GatewayProcess, token: str, topic: str) -> None:
    status, reply = await ahttp(
        "PATCH", f"{gateway.http}/api/topics/{topic}", token, {"history_size": 1000}
    )
    assert status == 200, reply


async def test_a_stream_gets_exactly_the_messages(sse_gateway: GatewayProcess, token: str) -> None:
    topic = unique("sse")
    stream = await open_stream(sse_url(sse_gateway, topic), token)
    try:
        assert stream.status == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        bodies: list[object] = [{"n": i, "text": "line\nbreak é"} for i in range(120)]
        bodies += ["plain", 7, None, [1, 2]]
        await publish(sse_gateway, token, topic, bodies)
        events = await stream.events(len(bodies))
        assert [e.event for e in events] == ["message"] * len(bodies)
        assert [e.json() for e in events] == bodies
        epochs = {e.id.split(":")[0] for e in events if e.id}
        assert len(epochs) == 1
        assert [int(e.id.rsplit(":", 1)[1]) for e in events if e.id] == list(
            range(1, len(bodies) + 1)
        )
        # Nothing more: the next thing on the stream is a keep-alive comment.
        with pytest.raises(TimeoutError):
            await stream.next(timeout=1.0)
        assert "keep-alive" in stream.comments
    finally:
        await stream.close()


async def test_last_event_id_resumes_and_a_malformed_one_starts_fresh(
    sse_gateway: GatewayProcess, token: str
) -> None:
    topic = unique("sse")
    await keep_history(sse_gateway, token, topic)
    first = await open_stream(sse_url(sse_gateway, topic), token)
    await publish(sse_gateway, token, topic, [{"n": i} for i in range(5)])
    seen = await first.events(5)
    await first.close()
    last_id = seen[-1].id
    assert last_id is not None
    epoch = last_id.split(":")[0]
    await publish(sse_gateway, token, topic, [{"n": i} for i in range(5, 10)])

    # As an EventSource reconnects: the URL it had (here recover=latest, which
    # the header overrides) and Last-Event-ID.
    resumed = await open_stream(
        sse_url(sse_gateway, topic, "recover=latest"), token, headers={"Last-Event-ID": last_id}
    )
    try:
        subscribed = await resumed.next()
        assert subscribed is not None and subscribed.event == "subscribed"
        assert subscribed.json() == {"epoch": epoch, "offset": 10, "recovered": True}
        missed = await resumed.events(5)
        assert [e.json() for e in missed] == [{"n": i} for i in range(5, 10)]
        assert [e.id for e in missed] == [f"{epoch}:{i}" for i in range(6, 11)]
        await publish(sse_gateway, token, topic, [{"n": 10}])
        (live,) = await resumed.events(1)
        assert (live.id, live.json()) == (f"{epoch}:11", {"n": 10})
    finally:
        await resumed.close()

    for malformed in ("garbage", f"{epoch}:", f"{epoch}:-1", ":5", f"{epoch}:99999999999999999999"):
        fresh = await open_stream(
            sse_url(sse_gateway, topic), token, headers={"Last-Event-ID": malformed}
        )
        try:
            assert fresh.status == 200, malformed
            subscribed = await fresh.next()
            assert subscribed is not None and subscribed.event == "subscribed"
            assert subscribed.json()["recovered"] is False, malformed
            offset = subscribed.json()["offset"]
            await publish(sse_gateway, token, topic, [{"after": malformed}])
            (live,) = await fresh.events(1)
            assert live.json() == {"after": malformed}
            assert live.id == f"{epoch}:{offset + 1}"
        finally:
            await fresh.close()


async def test_keep_alive_comments_and_no_head_timeout(
    sse_gateway: GatewayProcess, token: str
) -> None:
    topic = unique("sse")
    stream = await open_stream(sse_url(sse_gateway, topic), token)
    try:
        # Idle for 2.5 s: past the 1 s request-head deadline, several keep-alives.
        with pytest.raises(TimeoutError):
            await stream.next(timeout=2.5)
        assert stream.comments.count("keep-alive") >= 3, stream.comments
        await publish(sse_gateway, token, topic, [{"late": True}])
        (event,) = await stream.events(1)
        assert event.json() == {"late": True}
    finally:
        await stream.close()


async def test_a_client_that_stops_reading_fills_its_buffer_and_drop_oldest_applies(
    sse_gateway: GatewayProcess, token: str
) -> None:
    topic = unique("sse")
    stream = await open_stream(
        sse_url(sse_gateway, topic, "capacity=8&on_full=drop_oldest"), token, receive_buffer=4096
    )
    try:
        total = overflowing()  # far more than the kernel and server buffers hold
        # Batches smaller than the buffer: a reader keeping up would drop nothing.
        bodies: list[object] = [{"n": i, "pad": BIG} for i in range(total)]
        await publish(sse_gateway, token, topic, bodies, batch_size=4)
        received: list[int] = []
        dropped = 0
        while not received or received[-1] != total - 1:
            event = await stream.next(timeout=20)
            assert event is not None
            if event.event == "dropped":
                dropped += event.json()["dropped"]
            else:
                assert event.event == "message"
                received.append(event.json()["n"])
        assert dropped > 0
        assert len(received) + dropped == total
        assert received == sorted(received)
        # The newest were kept: the buffer's last capacity messages all arrived.
        assert received[-8:] == list(range(total - 8, total))
    finally:
        await stream.close()


async def test_block_ends_a_stalled_stream_after_the_block_wait(
    sse_gateway: GatewayProcess, token: str
) -> None:
    topic = unique("sse")
    stream = await open_stream(
        sse_url(sse_gateway, topic, "capacity=4&on_full=block"), token, receive_buffer=4096
    )
    try:
        total = overflowing()
        # The publishes wait for the stalled stream up to the block wait (1 s),
        # then it is ended and they go on.
        await asyncio.wait_for(
            publish(sse_gateway, token, topic, [{"n": i, "pad": BIG} for i in range(total)]), 60
        )
        events = await stream.ended(timeout=20)
        ns = [e.json()["n"] for e in events if e.event == "message"]
        assert ns == list(range(len(ns))), "block never skips a message"
        assert len(ns) < total
        assert "end (slow_consumer)" in stream.comments
    finally:
        await stream.close()


async def test_refusals_are_json(sse_gateway: GatewayProcess, token: str) -> None:
    topic = unique("sse")
    other = sse_gateway.issue_token(f"subscribe:{topic}x", name="other-topic")
    await ahttp("PATCH", f"{sse_gateway.http}/api/topics/{topic}", token, {"presence": False})
    cases: list[tuple[str, str | None, dict[str, str], str, int, str]] = [
        ("", None, {}, "GET", 401, "unauthorized"),
        ("", "not-a-token", {}, "GET", 401, "unauthorized"),
        ("token=not-a-token", None, {}, "GET", 401, "unauthorized"),
        ("", other, {}, "GET", 403, "forbidden"),
        (f"token={other}", None, {}, "GET", 403, "forbidden"),
        ("capacity=0", token, {}, "GET", 400, "invalid"),
        ("capacity=lots", token, {}, "GET", 400, "invalid"),
        ("on_full=wait", token, {}, "GET", 400, "invalid"),
        ("since=3", token, {}, "GET", 400, "invalid"),
        ("recover=earliest", token, {}, "GET", 400, "invalid"),
        ("credit=10", token, {}, "GET", 400, "invalid"),
        ("presence=maybe", token, {}, "GET", 400, "invalid"),
        ("presence=true", token, {}, "GET", 400, "invalid"),  # the topic has no presence
        ("", token, {}, "POST", 405, "invalid"),
    ]
    for query, secret, headers, method, status, code in cases:
        stream = await open_stream(
            sse_url(sse_gateway, topic, query), secret, headers=headers, method=method
        )
        try:
            await stream.read_all()
            assert (stream.status, stream.json()["error"]) == (status, code), (query, stream.text)
            assert stream.headers["content-type"] == "application/json"
            assert stream.json()["detail"]
        finally:
            await stream.close()
    # A body over the request limit (GATEWAY_MAX_REQUEST_BYTES) is refused as
    # it is announced, before authentication, as for any request.
    stream = await open_stream(
        sse_url(sse_gateway, topic), token, headers={"Content-Length": str(1 << 30)}
    )
    await stream.read_all()
    assert (stream.status, stream.json()["error"]) == (413, "too_large")
    await stream.close()
    # A topic name the gateway refuses (too long): 400 as well.
    stream = await open_stream(sse_url(sse_gateway, "t" * 300), token)
    await stream.read_all()
    assert (stream.status, stream.json()["error"]) == (400, "invalid")
    await stream.close()


async def test_cors_for_allowed_origins_only_and_token_expiry_or_revocation_ends_the_stream(
    sse_gateway: GatewayProcess, token: str
) -> None:
    topic = unique("sse")
    revocable_name = unique("revocable")
    revocable = sse_gateway.issue_token(f"subscribe:{topic}", name=revocable_name)
    signed = mint("page-user", [f"subscribe:{topic}"], ttl=4)
    streams: list[EventStream] = []
    try:
        allowed = await open_stream(
            sse_url(sse_gateway, topic, f"token={signed}"), headers={"Origin": ALLOWED_ORIGIN}
        )
        streams.append(allowed)
        assert allowed.status == 200
        assert allowed.headers.get("access-control-allow-origin") == ALLOWED_ORIGIN
        assert "access-control-allow-credentials" not in allowed.headers
        other = await open_stream(
            sse_url(sse_gateway, topic, f"token={signed}"),
            headers={"Origin": "http://elsewhere.example.test"},
        )
        streams.append(other)
        assert other.status == 200
        assert "access-control-allow-origin" not in other.headers
        # A page's fetch() with a header asks first.
        preflight = await open_stream(
            sse_url(sse_gateway, topic),
            method="OPTIONS",
            headers={
                "Origin": ALLOWED_ORIGIN,
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "authorization, last-event-id",
            },
        )
        streams.append(preflight)
        assert preflight.status == 204
        assert preflight.headers["access-control-allow-origin"] == ALLOWED_ORIGIN
        assert "last-event-id" in preflight.headers["access-control-allow-headers"].lower()
        # A stored token revoked: its stream ends within the check interval.
        revoked = await open_stream(sse_url(sse_gateway, topic), revocable)
        streams.append(revoked)
        assert revoked.status == 200
        metrics = await asyncio.to_thread(text_of, f"{sse_gateway.http}/metrics", token)
        open_streams = [
            line for line in metrics.splitlines() if line.startswith('leasecast_sockets{kind="sse"')
        ]
        assert open_streams and float(open_streams[0].rsplit(" ", 1)[1]) >= 3, open_streams
        sse_gateway.manage("revoke_token", revocable_name)
        assert await revoked.ended(timeout=10) == []
        assert "end (token revoked)" in revoked.comments
        # The signed token expires within 4 s: both streams end then.
        for stream in (allowed, other):
            assert await stream.ended(timeout=10) == []
            assert "end (token expired)" in stream.comments
    finally:
        for stream in streams:
            await stream.close()


async def test_a_kept_alive_connection_serves_a_stream_after_a_refusal(
    sse_gateway: GatewayProcess, token: str
) -> None:
    topic = unique("sse")
    refused = await open_stream(sse_url(sse_gateway, topic, "capacity=0"), token)
    try:
        await refused.read_all()
        assert refused.status == 400
        # The same connection: under daphne the refused request's transport
        # flow was taken off it, so this one can register its own.
        stream = await open_stream(sse_url(sse_gateway, topic), token, reuse=refused)
        assert stream.status == 200
        await publish(sse_gateway, token, topic, ["again"])
        (event,) = await stream.events(1)
        assert event.json() == "again"
    finally:
        await refused.close()


async def test_presence_events(sse_gateway: GatewayProcess, token: str) -> None:
    topic = unique("sse")
    status, reply = await ahttp(
        "PATCH", f"{sse_gateway.http}/api/topics/{topic}", token, {"presence": True}
    )
    assert status == 200, reply
    watcher = sse_gateway.issue_token(f"subscribe:{topic}", name="watcher")
    stream = await open_stream(sse_url(sse_gateway, topic, "presence=true"), token)
    try:
        assert stream.status == 200
        other = await open_stream(sse_url(sse_gateway, topic), watcher)
        try:
            joined = await _presence_event(stream, "join", "watcher")
            assert joined["topic"] == topic and joined["client"]
        finally:
            await other.close()
        left = await _presence_event(stream, "leave", "watcher")
        assert left["client"] == joined["client"]
        status, listed = await ahttp(
            "GET", f"{sse_gateway.http}/api/topics/{topic}/presence", token
        )
        assert status == 200 and [m["user"] for m in listed["clients"]] == ["sse-admin"]
    finally:
        await stream.close()


async def _presence_event(stream: EventStream, kind: str, user: str) -> dict[str, object]:
    """The next ``kind`` event about ``user`` (others, such as the stream's own join, skipped)."""
    while True:
        event = await stream.next(timeout=10)
        assert event is not None
        if event.event == kind and event.json()["user"] == user:
            data: dict[str, object] = event.json()
            return data


async def test_a_stream_counts_as_one_of_its_token_sockets(
    sse_gateway: GatewayProcess, token: str
) -> None:
    topic = unique("sse")
    limited = sse_gateway.issue_token(f"subscribe:{topic}", name=unique("limited"))
    streams = [await open_stream(sse_url(sse_gateway, topic), limited) for _ in range(6)]
    try:
        assert [s.status for s in streams] == [200] * 6
        refused = await open_stream(sse_url(sse_gateway, topic), limited)
        await refused.read_all()
        await refused.close()
        assert (refused.status, refused.json()["error"]) == (429, "backpressure"), refused.text
        assert "GATEWAY_TOKEN_MAX_SOCKETS" in refused.json()["detail"]
        # A stream that goes gives its place back.
        await streams.pop().close()
        for _ in range(100):
            again = await open_stream(sse_url(sse_gateway, topic), limited)
            if again.status == 200:
                streams.append(again)
                break
            await again.close()
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the closed stream's place was never given back")
    finally:
        for stream in streams:
            await stream.close()


async def test_a_stream_is_listed_with_the_sockets_and_an_operator_may_end_it(
    sse_gateway: GatewayProcess, token: str
) -> None:
    topic = unique("sse")
    stream = await open_stream(sse_url(sse_gateway, topic, "capacity=50"), token)
    try:
        status, stats = await ahttp("GET", f"{sse_gateway.http}/api/stats", token)
        assert status == 200
        (listed,) = [s for s in stats["sockets"] if s.get("topic") == topic]
        assert listed["kind"] == "sse" and listed["capacity"] == 50
        assert listed["principal"] == "sse-admin"
        async with await Socket.open(f"{sse_gateway.ws}/ws/dashboard/", token) as dashboard:
            reply = await dashboard.request(
                {"op": "disconnect", "process": listed["process"], "socket": listed["id"]}
            )
            assert reply["op"] == "disconnected", reply
        assert await stream.ended(timeout=10) == []
        assert "end (disconnected by an operator)" in stream.comments
        status, stats = await ahttp("GET", f"{sse_gateway.http}/api/stats", token)
        assert not [s for s in stats["sockets"] if s.get("topic") == topic]
    finally:
        await stream.close()


async def test_a_stopping_gateway_ends_its_streams_at_once(
    own_gateway: GatewayProcess,
) -> None:
    token = own_gateway.issue_token("admin", name=unique("stopping"))
    stream = await open_stream(sse_url(own_gateway, unique("sse")), token)
    assert stream.status == 200
    assert own_gateway.proc is not None
    own_gateway.proc.terminate()
    # Well before GATEWAY_SHUTDOWN_GRACE (30 s), which an open stream used to
    # hold the process for: the stream ends, and the process exits.
    assert await stream.ended(timeout=15) == []
    await stream.close()
    assert await asyncio.to_thread(own_gateway.proc.wait, 15) is not None
