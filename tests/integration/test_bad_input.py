"""Bad input gets the protocol's error, changes nothing, and leaves the socket usable."""

from __future__ import annotations

import contextlib
import json

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.clients import Socket, ahttp, http, unique
from tests.support.gateways import GatewayProcess, both_servers

BAD_FRAMES = [
    ("not json at all", "bad_frame"),
    ("[1, 2, 3]", "bad_frame"),
    ('{"no_op": 1}', "bad_frame"),
    ('{"op": "fly"}', "unknown_op"),
    ('{"op": "enqueue", "queue": "q"}', "bad_frame"),
    ('{"op": "enqueue", "queue": "q", "body": 1, "delay": -1}', "invalid"),
    ('{"op": "enqueue", "queue": "no spaces", "body": 1}', "invalid"),
    ('{"op": "enqueue", "queue": "q", "body": 1, "delay": "1"}', "bad_frame"),
    ('{"op": "enqueue", "queue": "q", "body": 1, "key": 9}', "bad_frame"),
    ('{"op": "enqueue", "queue": "q", "body": 123456789012345678901234567890}', "invalid"),
]

WORKER_ONLY = [
    ('{"op": "ack"}', "bad_frame"),
    ('{"op": "ack", "receipt": "1.ff"}', "stale_receipt"),
    ('{"op": "nack", "receipt": "garbage"}', "stale_receipt"),
    ('{"op": "nack", "receipt": "1.ff", "delay": -5}', "invalid"),
    ('{"op": "extend", "receipt": "1.ff", "timeout": -1}', "invalid"),
    ('{"op": "reject", "receipt": ["x"]}', "bad_frame"),
]


@both_servers
@pytest.mark.parametrize("path", ["/ws/produce/", "/ws/queues/QUEUE/"])
async def test_every_bad_frame_gets_its_error_and_the_socket_stays_usable(
    gateway: GatewayProcess, admin_token: str, path: str
) -> None:
    q = unique()
    frames = BAD_FRAMES + (WORKER_ONLY if "queues" in path else [])
    async with await Socket.open(gateway.ws + path.replace("QUEUE", q), admin_token) as s:
        for text, code in frames:
            await s.send(text.replace('"q"', f'"{q}"'))
            reply = await s.next()
            assert reply["op"] == "error" and reply["code"] == code, (text, reply)
            assert reply["detail"]
        # A ref is echoed on errors too.
        reply = await s.request({"op": "enqueue", "queue": q, "body": 1, "delay": -1})
        assert reply["code"] == "invalid"
        await s.conn.send(b"\x00\x01binary")
        assert (await s.next())["code"] == "bad_frame"
        # Nothing was enqueued by any of it (every enqueue above named q).
        status, body = await ahttp("GET", f"{gateway.http}/api/queues/{q}", admin_token)
        if "queues" in path:
            # The worker socket itself may have made the (empty) queue by now.
            assert status in (200, 404), (status, body)
        else:
            assert status == 404, body  # not even the queue was made
        if status == 200:
            counts = [body[k] for k in ("visible", "in_flight", "delayed", "dead")]
            assert counts == [0, 0, 0, 0], body
        # And the socket still works.
        ok = await s.request({"op": "enqueue", "queue": q, "body": "fine"})
        assert ok["op"] == "enqueued"
    status, body = await ahttp("GET", f"{gateway.http}/api/queues/{q}", admin_token)
    # Exactly the one good message exists. On a worker socket it was delivered to
    # the socket itself, and its release on close may still be on its way.
    assert body["visible"] + body["in_flight"] == 1, body
    assert body["delayed"] == body["dead"] == 0, body


async def test_body_over_the_limit_is_too_large(gateway: GatewayProcess, admin_token: str) -> None:
    q = unique()
    async with await Socket.open(f"{gateway.ws}/ws/produce/", admin_token) as s:
        reply = await s.request({"op": "enqueue", "queue": q, "body": "x" * (256 * 1024 + 1)})
        assert reply["code"] == "too_large"
        assert (await s.request({"op": "enqueue", "queue": q, "body": "x" * 1000}))["op"] == (
            "enqueued"
        )


@both_servers
async def test_frame_over_the_transport_limit_closes_1009(
    gateway: GatewayProcess, admin_token: str
) -> None:
    s = await Socket.open(f"{gateway.ws}/ws/produce/", admin_token)
    frame = json.dumps({"op": "enqueue", "queue": "q", "body": "y" * (9 * 1024 * 1024)})
    # The gateway may close while the client is still writing the frame.
    with contextlib.suppress(ConnectionClosed):
        await s.send(frame)
    await s.reader
    assert s.conn.close_code == 1009


@both_servers
async def test_handshake_refused_without_a_valid_token(gateway: GatewayProcess) -> None:
    for token in (None, "lc_not-a-real-token"):
        for path in ("/ws/produce/", "/ws/queues/q/"):
            with pytest.raises(InvalidStatus) as info:
                await Socket.open(gateway.ws + path, token)
            assert info.value.response.status_code == 403


@both_servers
async def test_token_in_query_string_works_for_browsers(
    gateway: GatewayProcess, admin_token: str
) -> None:
    async with await Socket.open(f"{gateway.ws}/ws/produce/?token={admin_token}") as s:
        reply = await s.request({"op": "enqueue", "queue": unique(), "body": 1})
        assert reply["op"] == "enqueued"


async def test_revoked_scope_and_patterns_are_enforced(gateway: GatewayProcess) -> None:
    token = gateway.issue_token("consume:emails.*", "enqueue:emails.*", name="emails")
    async with await Socket.open(f"{gateway.ws}/ws/queues/emails.welcome/", token) as w:
        denied = await w.request({"op": "enqueue", "queue": "billing", "body": 1})
        assert denied["code"] == "forbidden"
        allowed = await w.request({"op": "enqueue", "body": 1})
        assert allowed["op"] == "enqueued"
    # A socket URL outside the scopes: accepted, one error frame, close 4403.
    s = await Socket.open(f"{gateway.ws}/ws/queues/billing/", token)
    frame = await s.next()
    assert frame["code"] == "forbidden"
    await s.reader
    assert s.conn.close_code == 4403


@pytest.mark.parametrize(
    "query", ["prefetch=0", "prefetch=1001", "prefetch=ten", "visibility_timeout=-1"]
)
@both_servers
async def test_invalid_socket_parameters_close_4400(
    gateway: GatewayProcess, admin_token: str, query: str
) -> None:
    s = await Socket.open(f"{gateway.ws}/ws/queues/{unique()}/?{query}", admin_token)
    frame = await s.next()
    assert frame["code"] == "invalid", frame
    await s.reader
    assert s.conn.close_code == 4400


async def test_invalid_queue_name_in_url_closes_4400(
    gateway: GatewayProcess, admin_token: str
) -> None:
    s = await Socket.open(f"{gateway.ws}/ws/queues/bad%20name/", admin_token)
    assert (await s.next())["code"] == "invalid"
    await s.reader
    assert s.conn.close_code == 4400


@both_servers
def test_http_errors_have_the_protocol_codes(gateway: GatewayProcess, admin_token: str) -> None:
    base = gateway.http
    limited = gateway.issue_token("enqueue:jobs", name="jobs-only")
    cases = [
        ("GET", "/api/queues/x", None, None, 401, "unauthorized"),
        ("GET", "/api/queues/x", "lc_wrong", None, 401, "unauthorized"),
        (
            "POST",
            "/api/queues/other/messages",
            limited,
            {"messages": [{"body": 1}]},
            403,
            "forbidden",
        ),
        ("POST", "/api/queues/jobs/purge", limited, None, 403, "forbidden"),
        ("GET", "/api/stats", limited, None, 403, "forbidden"),
        ("GET", f"/api/queues/{unique()}", admin_token, None, 404, "not_found"),
        ("POST", "/api/queues/jobs/messages", limited, {"messages": "no"}, 400, "bad_frame"),
        ("POST", "/api/queues/jobs/messages", limited, {"messages": []}, 400, "invalid"),
        (
            "POST",
            "/api/queues/bad name!/messages",
            admin_token,
            {"messages": [{"body": 1}]},
            400,
            "invalid",
        ),
        (
            "POST",
            "/api/queues/jobs/messages",
            limited,
            {"messages": [{"body": "z" * (300 * 1024)}]},
            413,
            "too_large",
        ),
    ]
    for method, path, token, body, status, code in cases:
        got_status, got = http(method, base + path.replace(" ", "%20"), token, body)
        assert (got_status, got.get("error") if isinstance(got, dict) else got) == (status, code), (
            method,
            path,
            got,
        )
    status, got = http("POST", base + "/api/queues/jobs/messages", limited, raw=b"{not json")
    assert status == 400 and got["error"] == "bad_frame"
    status, got = http("GET", base + "/healthz")
    assert (status, got) == (200, {"status": "ok"})


@both_servers
async def test_closed_socket_gets_no_more_work(gateway: GatewayProcess, admin_token: str) -> None:
    q = unique()
    async with await Socket.open(f"{gateway.ws}/ws/produce/", admin_token) as p:
        for i in range(3):
            assert (await p.request({"op": "enqueue", "queue": q, "body": i}))["op"] == "enqueued"
        w1 = await Socket.open(
            f"{gateway.ws}/ws/queues/{q}/?prefetch=2&visibility_timeout=300", admin_token
        )
        held = await w1.deliveries(2)
        assert [d["body"] for d in held] == [0, 1]
        w1_client = "{}:{}".format(*w1.conn.local_address[:2])
        async with await Socket.open(f"{gateway.ws}/ws/queues/{q}/?prefetch=10", admin_token) as w2:
            (third,) = await w2.deliveries(1)
            assert third["body"] == 2  # 0 and 1 are leased to w1
            w2_client = "{}:{}".format(*w2.conn.local_address[:2])
            assert await worker_leases(gateway, admin_token, q) == {w1_client: 2, w2_client: 1}
            await w1.close()
            # The close released w1's leases at once (its 300 s timeout is far
            # off), in their original place: they go to w2.
            again = await w2.deliveries(2)
            assert [(d["id"], d["deliveries"]) for d in again] == [(d["id"], 2) for d in held]
            # The gateway forgot w1 before releasing its leases, and new work
            # goes to the live socket only: nothing is leased to the closed one.
            assert await worker_leases(gateway, admin_token, q) == {w2_client: 3}
            for i in range(3, 6):
                await p.request({"op": "enqueue", "queue": q, "body": i})
            more = await w2.deliveries(3)
            assert [(d["body"], d["deliveries"]) for d in more] == [(3, 1), (4, 1), (5, 1)]
            for d in [third, *again, *more]:
                assert (await w2.request({"op": "ack", "receipt": d["receipt"]}))["op"] == "acked"
            assert await worker_leases(gateway, admin_token, q) == {w2_client: 0}
    status, body = await ahttp("GET", f"{gateway.http}/api/queues/{q}", admin_token)
    assert status == 200
    assert [body[k] for k in ("visible", "in_flight", "delayed", "dead")] == [0, 0, 0, 0], body


async def worker_leases(gw: GatewayProcess, token: str, queue: str) -> dict[str, int]:
    """Leases held per worker socket of ``queue`` (by client address), as the gateway reports."""
    status, stats = await ahttp("GET", f"{gw.http}/api/stats", token)
    assert status == 200, stats
    return {
        s["client"]: s["leases"]
        for s in stats["sockets"]
        if s["kind"] == "worker" and s.get("queue") == queue
    }


@both_servers
async def test_unknown_socket_paths_are_refused(gateway: GatewayProcess, admin_token: str) -> None:
    """The server's side of a refused path: HTTP 403 (which paths: test_refusals_in_process)."""
    with pytest.raises(InvalidStatus) as info:
        await Socket.open(gateway.ws + "/ws/queues/a/b/", admin_token)
    assert info.value.response.status_code == 403


# -- protocol 1.2: unknown fields, JSON everywhere under /api/, numbers in URLs


@both_servers
async def test_a_message_with_an_unknown_field_is_invalid_and_enqueues_nothing(
    gateway: GatewayProcess, admin_token: str
) -> None:
    """``{"body": 1, "dealy": 5}`` was enqueued at once, without its delay."""
    q = unique()
    async with await Socket.open(f"{gateway.ws}/ws/produce/", admin_token) as s:
        for frame in (
            {"op": "enqueue", "queue": q, "body": 1, "dealy": 5},
            {"op": "enqueue", "queue": q, "body": 1, "delay": 5, "prio": 1},
            {"op": "enqueue_many", "queue": q, "messages": [{"body": 1}, {"body": 2, "dealy": 5}]},
        ):
            if "prio" in frame:
                reply = await s.request(frame)  # with a ref beside the unknown field
            else:
                await s.send(frame)
                reply = await s.next()
            assert reply["op"] == "error" and reply["code"] == "invalid", (frame, reply)
            unknown = "prio" if "prio" in frame else "dealy"
            assert repr(unknown) in reply["detail"] and "delay" in reply["detail"], reply
        # Other frames still ignore fields they do not use.
        reply = await s.request({"op": "publish", "topic": unique(), "body": 1, "color": "red"})
        assert reply["op"] == "published", reply
    base = f"{gateway.http}/api/queues/{q}"
    status, body = await ahttp(
        "POST",
        f"{base}/messages",
        admin_token,
        {"messages": [{"body": 1}, {"body": 2, "dealy": 5}]},
    )
    assert (status, body["error"]) == (400, "invalid"), body
    assert "messages[1]" in body["detail"] and "'dealy'" in body["detail"], body
    status, body = await ahttp(
        "PUT",
        f"{gateway.http}/api/transactions/{unique('t')}/partitions/0",
        admin_token,
        {"queue": q, "messages": [{"body": 1, "ttll": 5}]},
    )
    assert (status, body["error"]) == (400, "invalid") and "'ttll'" in body["detail"], body
    status, body = await ahttp("GET", base, admin_token)
    assert status == 404, body  # nothing was applied, not even the queue made


@both_servers
async def test_a_settings_document_with_an_unknown_field_is_invalid_and_changes_nothing(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q, topic = unique(), unique("topic")
    base = f"{gateway.http}/api/queues/{q}"
    status, before = await ahttp("PATCH", base, admin_token, {"max_deliveries": 4})
    assert status == 200, before
    change = {"max_deliveries": 9, "visibility_timeot": 5}
    status, body = await ahttp("PATCH", base, admin_token, change)
    assert (status, body["error"]) == (400, "invalid"), body
    assert "'visibility_timeot'" in body["detail"] and "visibility_timeout" in body["detail"]
    assert await ahttp("GET", base, admin_token) == (200, before)
    topic_url = f"{gateway.http}/api/topics/{topic}"
    status, before = await ahttp("GET", topic_url, admin_token)
    status, body = await ahttp("PATCH", topic_url, admin_token, {"history_sise": 5})
    assert (status, body["error"]) == (400, "invalid") and "history_size" in body["detail"], body
    assert await ahttp("GET", topic_url, admin_token) == (200, before)


@both_servers
def test_every_answer_under_api_is_json(gateway: GatewayProcess, admin_token: str) -> None:
    """Unknown URLs and methods answered HTML; a body over Django's upload limit
    answered an HTML "Bad Request (400)" and logged a traceback."""
    base, q = gateway.http, unique()
    for method, path, status, code in (
        ("GET", "/api/nothing", 404, "not_found"),
        ("GET", "/api/queues/", 404, "not_found"),
        ("GET", f"/api/queues/{q}/messages/1/2/3", 404, "not_found"),
        ("POST", f"/api/topics/{q}/unknown", 404, "not_found"),
        ("DELETE", f"/api/queues/{q}/purge", 405, "invalid"),
        ("PUT", f"/api/queues/{q}", 405, "invalid"),
        ("GET", f"/api/transactions/{q}/commit", 405, "invalid"),
    ):
        got_status, got = http(method, base + path, admin_token)
        assert isinstance(got, dict), (method, path, got)
        assert (got_status, got.get("error")) == (status, code), (method, path, got)
        assert got["detail"]
    big = b'{"messages": [{"body": "' + b"x" * (10 * 1024 * 1024) + b'"}]}'
    status, got = http("POST", f"{base}/api/queues/{q}/messages", admin_token, raw=big)
    assert isinstance(got, dict) and (status, got["error"]) == (413, "too_large"), (status, got)
    assert "RequestDataTooBig" not in gateway.log_text()
    assert http("GET", f"{base}/api/queues/{q}", admin_token)[0] == 404  # nothing enqueued


@both_servers
async def test_get_api_queues_lists_the_queues_the_caller_may_read(
    gateway: GatewayProcess, admin_token: str
) -> None:
    prefix = unique("list")
    mine, theirs = f"{prefix}.mine", f"{prefix}.theirs"
    for queue in (mine, theirs):
        status, body = await ahttp(
            "POST",
            f"{gateway.http}/api/queues/{queue}/messages",
            admin_token,
            {"messages": [{"body": 1}, {"body": 2}]},
        )
        assert status == 200, body
    status, body = await ahttp("GET", f"{gateway.http}/api/queues", admin_token)
    assert status == 200, body
    listed = {doc["name"]: doc for doc in body["queues"]}
    assert {mine, theirs} <= listed.keys()
    status, one = await ahttp("GET", f"{gateway.http}/api/queues/{mine}", admin_token)
    # Each as GET /api/queues/NAME gives it (the age moves between the two reads).
    assert listed[mine].keys() == one.keys() and listed[mine]["visible"] == one["visible"] == 2
    narrow = gateway.issue_token(f"consume:{mine}", name="narrow")
    status, body = await ahttp("GET", f"{gateway.http}/api/queues", narrow)
    assert status == 200 and [doc["name"] for doc in body["queues"]] == [mine], body
    status, body = await ahttp("GET", f"{gateway.http}/api/queues")
    assert (status, body["error"]) == (401, "unauthorized"), body


@both_servers
async def test_numbers_in_paths_and_queries_are_checked(
    gateway: GatewayProcess, admin_token: str
) -> None:
    """A partition past 64 bits answered 503 (the store's OverflowError) and rolled
    back everyone's batch; ``"²".isdigit()`` is true, and its requeue answered 500."""
    q, txn = unique(), unique("t")
    assert (
        await ahttp(
            "POST",
            f"{gateway.http}/api/queues/{q}/messages",
            admin_token,
            {"messages": [{"body": 1}]},
        )
    )[0] == 200
    staged = {"queue": q, "messages": [{"body": 1}]}
    base = f"{gateway.http}/api/queues/{q}/messages"
    for method, url, body in (
        ("PUT", f"/api/transactions/{txn}/partitions/99999999999999999999999", staged),
        ("PUT", f"/api/transactions/{txn}/partitions/2147483648", staged),
        ("PUT", f"/api/transactions/{txn}/partitions/-1", staged),
        ("PUT", f"/api/transactions/{txn}/partitions/%C2%B2", staged),
        ("PUT", f"/api/transactions/{txn}/partitions/1e3", staged),
        ("POST", f"/api/transactions/{txn}/commit", {"partitions": [10**22]}),
        ("POST", f"/api/queues/{q}/messages/%C2%B2/requeue", None),
        ("DELETE", f"/api/queues/{q}/messages/%D9%A1", None),  # ARABIC-INDIC DIGIT ONE
        ("DELETE", f"/api/queues/{q}/messages/99999999999999999999999", None),
        ("GET", f"/api/queues/{q}/messages?limit=%C2%B2", None),
        ("GET", f"/api/queues/{q}/messages?limit=%D9%A1%D9%A0", None),
        ("GET", f"/api/queues/{q}/messages?after=99999999999999999999999", None),
        ("GET", f"/api/queues/{q}/messages?after=1_000", None),
        ("DELETE", f"/api/queues/{q}/messages/1?if_deliveries=%20%201", None),
        ("DELETE", f"/api/queues/{q}/messages/1?if_visible_at=1_0", None),
        ("DELETE", f"/api/queues/{q}/messages/1?if_visible_at=%D9%A1", None),
    ):
        status, got = await ahttp(method, gateway.http + url, admin_token, body)
        assert isinstance(got, dict), (method, url, got)
        assert (status, got.get("error")) == (400, "invalid"), (method, url, got)
    status, got = await ahttp("GET", f"{gateway.http}/api/queues/{q}", admin_token)
    assert got["visible"] == 1, got  # nothing was deleted or requeued
    status, got = await ahttp("POST", f"{gateway.http}/api/transactions/{txn}/abort", admin_token)
    assert got == {"aborted": 0, "already": False}, got  # nothing was staged
    assert (await ahttp("DELETE", f"{base}/0", admin_token))[0] == 404  # a number: no such id
