"""Signed connection tokens and token lifetime against live gateways (issue 11, item 1).

docs/protocol.md, "Signed tokens and token lifetime (1.1)":

- a JWT (HS256, ``GATEWAY_SIGNING_KEY``) of a non-staff ``sub`` is accepted
  wherever a stored token is (header or ``?token=``, sockets and HTTP), within
  its scopes; a URL outside them is 4403;
- a bad one (expired, malformed, wrong key, ``alg: none``, no ``exp``, bad
  scopes) is refused as a bad stored token is: 403 on the handshake, 401 over
  HTTP; a gateway without a key refuses every signed token;
- a socket of a signed token closes with 4401 at ``exp`` unless refreshed; a
  refresh with another ``sub`` or an invalid token is ``forbidden`` and
  changes nothing; ``refresh`` is taken by every socket kind;
- revoking a stored token (``manage.py revoke_token``, or deleting it) closes
  its sockets with 4401 on every process and its HTTP requests get 401,
  within 5 s: two gateway processes sharing one PostgreSQL database.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.access.tokens import signed_token
from tests.support.clients import Socket, ahttp, http, unique
from tests.support.databases import ROOT, sqlite_database
from tests.support.gateways import GatewayProcess
from tests.support.tokens import TEST_SIGNING_KEY, encode, mint

#: Alone, after the parallel run: the revocation bound is checked on a quiet machine.
pytestmark = pytest.mark.serial

KEY = TEST_SIGNING_KEY
#: The protocol's bound on closing a revoked token's sockets and refusing its requests.
REVOCATION_BOUND = 5.0
#: Slack for the scheduling of this test's own processes (a busy 2-core machine).
SLACK = 1.0


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def gw() -> Iterator[GatewayProcess]:
    """A gateway with a signing key (SQLite)."""
    var = Path(tempfile.mkdtemp(prefix="leasecast-signed-"))
    with sqlite_database(var) as env:
        process = GatewayProcess({**env, "GATEWAY_SIGNING_KEY": KEY}, var, name="signed")
        process.start()
        yield process
        process.stop()


@pytest.fixture(scope="module")
def admin(gw: GatewayProcess) -> str:
    return gw.issue_token("admin", name="admin")


async def close_code(sock: Socket, timeout: float = 10) -> int | None:
    """Wait until the server closes ``sock``; its close code (frames before it are dropped)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await sock.next(max(0.01, deadline - time.monotonic()))
        except ConnectionError:
            return sock.conn.close_code


async def refused_status(url: str, token: str, *, query: bool = False) -> int | None:
    """The HTTP status of a refused handshake (None if the socket was accepted)."""
    headers = {} if query else {"Authorization": f"Bearer {token}"}
    if query:
        url += ("&" if "?" in url else "?") + "token=" + token
    try:
        conn = await connect(url, additional_headers=headers)
    except InvalidStatus as exc:
        return exc.response.status_code
    await conn.close()
    return None


async def publish(gw: GatewayProcess, token: str, topic: str, body: Any) -> None:
    status, reply = await ahttp(
        "POST", f"{gw.http}/api/topics/{topic}/messages", token, {"messages": [{"body": body}]}
    )
    assert status == 200, reply


async def bodies(sock: Socket, n: int) -> list[Any]:
    got: list[Any] = []
    while len(got) < n:
        frame = await sock.next()
        assert frame["op"] == "messages", frame
        got += [item["body"] for item in frame["items"]]
    return got


# -- accepted within its scopes


@pytest.mark.parametrize("query", [False, True], ids=["header", "query"])
async def test_signed_token_of_a_user_subscribes_within_its_scopes_only(
    gw: GatewayProcess, admin: str, query: bool
) -> None:
    mine, other = unique("user.7.t"), unique("user.8.t")
    token = mint("7", ["subscribe:user.7.*"])
    url = f"{gw.ws}/ws/topics/{mine}/"
    if query:
        sub = Socket(await connect(f"{url}?token={token}"))
    else:
        sub = await Socket.open(url, token)
    async with sub:
        await asyncio.sleep(0.2)  # the subscription is in place before the publish
        await publish(gw, admin, mine, {"n": 1})
        assert await bodies(sub, 1) == [{"n": 1}]
    # Another user's topic: accepted, told forbidden, closed 4403 (as for stored tokens).
    async with await Socket.open(f"{gw.ws}/ws/topics/{other}/", token) as sock:
        frame = await sock.next()
        assert frame["op"] == "error" and frame["code"] == "forbidden", frame
        assert await close_code(sock) == 4403


async def test_signed_token_over_http_within_and_outside_its_scopes(gw: GatewayProcess) -> None:
    topic = unique("chat.t")
    token = mint("9", [f"publish:{topic}"])
    status, reply = http(
        "POST", f"{gw.http}/api/topics/{topic}/messages", token, {"messages": [{"body": 1}]}
    )
    assert (status, reply) == (200, {"published": 1})
    status, reply = http("POST", f"{gw.http}/api/topics/x{topic}/messages", token, {"messages": []})
    assert status == 403 and reply["error"] == "forbidden", reply
    status, reply = http("GET", f"{gw.http}/api/stats", token)
    assert status == 403 and reply["error"] == "forbidden", reply


# -- refused as a bad stored token is


def _bad_tokens() -> dict[str, str]:
    now = int(time.time())
    good_claims = {"sub": "7", "exp": now + 600, "scopes": ["admin"]}
    head = _b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    return {
        "expired": encode({**good_claims, "exp": now - 1}),
        "malformed": "eyJhbGciOiJIUzI1NiJ9.bm90IGpzb24.c2ln",
        "wrong-key": mint("7", ["admin"], key="some-other-key-" + "0" * 40),
        "alg-none": f"{head}.{_b64(json.dumps(good_claims).encode())}.",
        "missing-exp": encode({"sub": "7", "scopes": ["admin"]}),
        "missing-sub": encode({"exp": now + 600, "scopes": ["admin"]}),
        "bad-scopes": encode({**good_claims, "scopes": "admin"}),
        # exp that never comes (issue 22.12): NaN compared false with every time.
        "exp-nan": encode({**good_claims, "exp": float("nan")}),
        "exp-infinity": encode({**good_claims, "exp": float("inf")}),
        "exp-1e308": encode({**good_claims, "exp": 1e308}),
        "over-max-ttl": encode({**good_claims, "exp": now + 2 * 86400}),
    }


@pytest.mark.parametrize("case", list(_bad_tokens()))
async def test_bad_signed_tokens_are_refused_403_on_sockets_and_401_over_http(
    gw: GatewayProcess, case: str
) -> None:
    token = _bad_tokens()[case]
    topic = unique("t")
    assert await refused_status(f"{gw.ws}/ws/topics/{topic}/", token) == 403
    assert await refused_status(f"{gw.ws}/ws/topics/{topic}/", token, query=True) == 403
    assert await refused_status(f"{gw.ws}/ws/produce/", token) == 403
    status, reply = http("GET", f"{gw.http}/api/stats", token)
    assert status == 401 and reply["error"] == "unauthorized", reply
    # Nothing about the refusal gives the key away.
    assert KEY not in json.dumps(reply)


async def test_a_gateway_without_a_signing_key_refuses_signed_tokens_and_says_why(
    tmp_path: Path,
) -> None:
    with sqlite_database(tmp_path) as env:
        env.pop("GATEWAY_SIGNING_KEY", None)
        process = GatewayProcess(env, tmp_path, name="nokey")
        process.start()
        try:
            # Even a token signed with the empty key: never accepted.
            for token in (
                mint("7", ["admin"]),
                jwt.encode({"sub": "7", "exp": int(time.time()) + 60, "scopes": ["admin"]}, "x"),
            ):
                assert await refused_status(f"{process.ws}/ws/produce/", token) == 403
                status, _ = http("GET", f"{process.http}/api/stats", token)
                assert status == 401
        finally:
            process.stop()
        assert "GATEWAY_SIGNING_KEY is not set" in process.log_text()


async def test_a_gateway_bound_to_an_audience_and_issuer_takes_only_its_tokens(
    tmp_path: Path,
) -> None:
    with sqlite_database(tmp_path) as env:
        env.update(
            GATEWAY_SIGNING_KEY=KEY,
            GATEWAY_SIGNING_AUDIENCE="gw-eu",
            GATEWAY_SIGNING_ISSUER="shop",
            GATEWAY_SIGNING_MAX_TTL="600",
        )
        process = GatewayProcess(env, tmp_path, name="bound")
        process.start()
        try:

            def token(ttl: float = 60, **binding: str) -> str:
                return signed_token("7", ["admin"], ttl, key=KEY, max_ttl=7200, **binding)

            good = token(audience="gw-eu", issuer="shop")
            assert await refused_status(f"{process.ws}/ws/produce/", good) is None
            assert http("GET", f"{process.http}/api/stats", good)[0] == 200
            for bad in (
                token(),  # no aud, no iss
                token(audience="gw-us", issuer="shop"),  # another gateway's
                token(audience="gw-eu", issuer="billing"),  # another application's
                token(3600, audience="gw-eu", issuer="shop"),  # longer than 600 s
            ):
                assert await refused_status(f"{process.ws}/ws/produce/", bad) == 403
                status, reply = http("GET", f"{process.http}/api/stats", bad)
                assert status == 401 and reply["error"] == "unauthorized", reply
        finally:
            process.stop()


# -- lifetime: 4401 at exp, refresh


async def test_socket_of_a_signed_token_closes_4401_at_exp_not_before(gw: GatewayProcess) -> None:
    topic = unique("user.7.exp")
    token = mint("7", ["subscribe:user.7.*"], ttl=2)
    exp = jwt.decode(token, options={"verify_signature": False})["exp"]
    async with await Socket.open(f"{gw.ws}/ws/topics/{topic}/", token) as sock:
        code = await close_code(sock, timeout=exp - time.time() + REVOCATION_BOUND + SLACK)
        closed_at = time.time()
    assert code == 4401
    assert closed_at >= exp  # not before exp (the protocol's rule, not a speed)
    print(f"closed {closed_at - exp:.3f} s after exp")


async def test_refresh_extends_the_socket_and_applies_the_new_scopes(
    gw: GatewayProcess, admin: str
) -> None:
    topic = unique("user.7.r")
    short = mint("7", [f"subscribe:{topic}"], ttl=2)
    exp = jwt.decode(short, options={"verify_signature": False})["exp"]
    async with await Socket.open(f"{gw.ws}/ws/topics/{topic}/", short) as sock:
        # Not allowed to publish yet.
        reply = await sock.request({"op": "publish", "topic": topic, "body": 0})
        assert reply["code"] == "forbidden", reply
        longer = mint("7", [f"subscribe:{topic}", f"publish:{topic}"], ttl=60)
        reply = await sock.request({"op": "refresh", "token": longer})
        assert reply["op"] == "refreshed", reply
        assert isinstance(reply["expires_in"], int) and 50 <= reply["expires_in"] <= 60, reply
        # The new scopes apply from now on.
        reply = await sock.request({"op": "publish", "topic": topic, "body": 1})
        assert reply["op"] == "published", reply
        assert await bodies(sock, 1) == [1]
        # Past the first token's exp (plus the bound), the socket is still open.
        await asyncio.sleep(max(0.0, exp - time.time()) + 1.5)
        await publish(gw, admin, topic, 2)
        assert await bodies(sock, 1) == [2]


async def test_refresh_with_another_sub_or_an_invalid_token_is_forbidden_and_changes_nothing(
    gw: GatewayProcess, admin: str
) -> None:
    topic = unique("user.7.f")
    token = mint("7", [f"subscribe:{topic}"], ttl=3)
    exp = jwt.decode(token, options={"verify_signature": False})["exp"]
    async with await Socket.open(f"{gw.ws}/ws/topics/{topic}/", token) as sock:
        refusals = [
            mint("8", [f"subscribe:{topic}", "admin"], ttl=600),  # another user
            mint("7", ["admin"], ttl=600, key="not-the-key-" + "1" * 40),  # forged
            encode({"sub": "7", "scopes": ["admin"]}),  # no exp
            _bad_tokens()["alg-none"],
            "lc_not_a_signed_token",
        ]
        for bad in refusals:
            reply = await sock.request({"op": "refresh", "token": bad})
            assert reply["op"] == "error" and reply["code"] == "forbidden", reply
            assert KEY not in reply["detail"]
        reply = await sock.request({"op": "refresh"})
        assert reply["code"] == "bad_frame", reply
        # Nothing changed: still subscribed, still not admin, still closing at exp.
        await publish(gw, admin, topic, "still")
        assert await bodies(sock, 1) == ["still"]
        reply = await sock.request({"op": "publish", "topic": topic, "body": 0})
        assert reply["code"] == "forbidden", reply
        assert await close_code(sock, exp - time.time() + REVOCATION_BOUND + SLACK) == 4401
        assert time.time() >= exp


async def test_refresh_that_would_lose_the_sockets_own_topic_is_refused(
    gw: GatewayProcess,
) -> None:
    topic = unique("user.7.l")
    async with await Socket.open(
        f"{gw.ws}/ws/topics/{topic}/", mint("7", [f"subscribe:{topic}"])
    ) as sock:
        reply = await sock.request({"op": "refresh", "token": mint("7", ["subscribe:other"])})
        assert reply["code"] == "forbidden" and "subscribe on" in reply["detail"], reply
        reply = await sock.request({"op": "refresh", "token": mint("7", [f"subscribe:{topic}"])})
        assert reply["op"] == "refreshed", reply


async def test_every_socket_kind_takes_refresh(gw: GatewayProcess) -> None:
    queue = unique("jobs")
    scopes = [f"consume:{queue}", f"enqueue:{queue}", "admin"]
    urls = [
        f"{gw.ws}/ws/queues/{queue}/",
        f"{gw.ws}/ws/produce/",
        f"{gw.ws}/ws/topics/{unique('t')}/",
        f"{gw.ws}/ws/dashboard/",
    ]
    for url in urls:
        async with await Socket.open(url, mint("ops-bot", scopes)) as sock:
            reply = await sock.request({"op": "refresh", "token": mint("ops-bot", scopes)})
            assert reply["op"] == "refreshed", (url, reply)
    # The dashboard needs admin after a refresh too.
    async with await Socket.open(f"{gw.ws}/ws/dashboard/", mint("ops-bot", ["admin"])) as sock:
        reply = await sock.request({"op": "refresh", "token": mint("ops-bot", ["subscribe:x"])})
        assert reply["code"] == "forbidden", reply


async def test_a_socket_of_a_stored_token_cannot_be_refreshed(
    gw: GatewayProcess, admin: str
) -> None:
    async with await Socket.open(f"{gw.ws}/ws/produce/", admin) as sock:
        reply = await sock.request({"op": "refresh", "token": mint("7", ["admin"])})
        assert reply["code"] == "forbidden", reply
        reply = await sock.request({"op": "enqueue", "queue": unique(), "body": 1})
        assert reply["op"] == "enqueued", reply


# -- revocation of stored tokens


def run_manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


async def http_refused_within(gw: GatewayProcess, token: str, topic: str, bound: float) -> float:
    """Seconds until a publish with ``token`` is answered 401 (fails past ``bound``)."""
    start = time.monotonic()
    while True:
        status, reply = await ahttp(
            "POST", f"{gw.http}/api/topics/{topic}/messages", token, {"messages": [{"body": 1}]}
        )
        if status == 401:
            return time.monotonic() - start
        assert status == 200, reply
        assert time.monotonic() - start < bound, "HTTP still accepted the revoked token"
        await asyncio.sleep(0.1)


@pytest.fixture(scope="module")
def pair(postgres_env: tuple[dict[str, str], Path]) -> Iterator[tuple[GatewayProcess, ...]]:
    """Gateways A and B on one PostgreSQL database (the shared truth for revocation)."""
    env, var = postgres_env
    env = {**env, "GATEWAY_SIGNING_KEY": KEY}
    a = GatewayProcess(env, var, name="rev-a")
    b = GatewayProcess(env, var, name="rev-b")
    a.start()
    try:
        b.start()
        yield a, b
    finally:
        a.stop()
        b.stop()


async def test_revoke_token_closes_its_sockets_on_every_process_and_http_answers_401(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    a, b = pair
    topic = unique("rv")
    token = a.issue_token(f"subscribe:{topic}", f"publish:{topic}", name="revoked-one")
    bystander = a.issue_token(f"subscribe:{topic}", name="bystander")
    socks = [await Socket.open(f"{gw.ws}/ws/topics/{topic}/", token) for gw in (a, b)]
    other = await Socket.open(f"{a.ws}/ws/topics/{topic}/", bystander)
    try:
        for gw in (a, b):  # cached as valid on both processes
            status, _ = await ahttp(
                "POST", f"{gw.http}/api/topics/{topic}/messages", token, {"messages": [{"body": 0}]}
            )
            assert status == 200
        done = await asyncio.to_thread(run_manage, a.env, "revoke_token", "revoked-one")
        assert done.returncode == 0, done.stderr
        assert "revoked 1 token" in done.stdout
        revoked_at = time.monotonic()
        codes = await asyncio.gather(
            *(close_code(s, REVOCATION_BOUND + SLACK) for s in socks), return_exceptions=True
        )
        assert codes == [4401, 4401], codes
        waits = await asyncio.gather(
            *(http_refused_within(gw, token, topic, REVOCATION_BOUND + SLACK) for gw in (a, b))
        )
        print(f"sockets closed after {time.monotonic() - revoked_at:.2f} s; HTTP 401 {waits}")
        # Sockets of other tokens stay open.
        await other.conn.ping()
        assert await refused_status(f"{b.ws}/ws/topics/{topic}/", token) == 403
    finally:
        for s in [*socks, other]:
            await s.close()


async def test_a_revoked_token_used_only_over_http_is_refused_within_5_s(
    pair: tuple[GatewayProcess, GatewayProcess],
) -> None:
    # No socket uses it, so no watch evicts it: the lookup cache's time runs out.
    a, b = pair
    topic = unique("rvh")
    token = a.issue_token(f"publish:{topic}", name="http-only")
    for gw in (a, b):
        status, _ = await ahttp(
            "POST", f"{gw.http}/api/topics/{topic}/messages", token, {"messages": [{"body": 0}]}
        )
        assert status == 200
    done = await asyncio.to_thread(run_manage, b.env, "revoke_token", "http-only")
    assert done.returncode == 0, done.stderr
    waits = await asyncio.gather(
        *(http_refused_within(gw, token, topic, REVOCATION_BOUND + SLACK) for gw in (a, b))
    )
    print(f"HTTP-only token: 401 after {waits}")


async def test_revoke_token_of_an_unknown_name_is_an_error(gw: GatewayProcess) -> None:
    done = await asyncio.to_thread(run_manage, gw.env, "revoke_token", "nobody-by-this-name")
    assert done.returncode == 1
    assert "no token named 'nobody-by-this-name'" in done.stderr


async def test_deleting_a_stored_token_closes_its_sockets(gw: GatewayProcess) -> None:
    topic = unique("del")
    token = gw.issue_token(f"subscribe:{topic}", name="to-delete")
    async with await Socket.open(f"{gw.ws}/ws/topics/{topic}/", token) as sock:
        await asyncio.sleep(0.2)
        script = "from gateway.models import Token; Token.objects.filter(name='to-delete').delete()"
        done = await asyncio.to_thread(run_manage, gw.env, "shell", "-c", script)
        assert done.returncode == 0, done.stderr
        assert await close_code(sock, REVOCATION_BOUND + SLACK) == 4401
