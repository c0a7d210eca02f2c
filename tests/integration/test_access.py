"""Access control against live gateways (issue 6, item 5; docs/operations.md, Security).

- Every HTTP route (walked from ``gateway.site.urls`` at test time, admin and
  dashboard included) and every socket route (``consumers.routing``) refuses a
  caller without a token or a staff session; only ``/healthz`` and the login
  page answer.
- Scopes are enforced per name, for each operation, and each refusal changes
  nothing, while the same operation with the right scope goes through.
- The database holds no token in plain text.
- Browser sockets (session cookie) must come from an allowed Origin; token
  sockets need none.
- The dashboard's actions need the CSRF token and a staff user.
- ``GATEWAY_ENV=production`` refuses ``GATEWAY_DEBUG`` and a weak ``SECRET_KEY``.
- Per-token socket and message-rate limits answer ``backpressure`` (HTTP 429).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.support.clients import Socket, ahttp, http, unique
from tests.support.databases import ROOT, base_env, sqlite_database
from tests.support.gateways import GatewayProcess, both_servers
from tests.support.sessions import (
    LOGIN_PATH,
    PASSWORD,
    Client,
    open_socket,
    own_origin,
    socket_outcome,
)

STAFF, DEMOTED = "ops", "demoted"
#: The only routes that answer a caller nobody knows: health, and the way in.
PUBLIC = {"healthz": "the load balancer's health check", "admin/login/": "the login form"}
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
REDIRECTS = (301, 302, 303, 307, 308)
EVIL = "http://evil.example"
GOOD_KEY = "k3Y-" + "x7Qp9LmZ2vRt8WbN4sJd6HfYc1GkPa5EoUiTnSrQwXyVbMlKjHg"  # 55 characters


# -- helpers: a cookie-keeping HTTP client that does not follow redirects


def create_users(gw: GatewayProcess) -> None:
    """A superuser, and a staff user who is demoted once logged in (its session stays)."""
    from django.contrib.auth.models import User

    def create(db: str) -> None:
        User.objects.db_manager(db).create_superuser(STAFF, "ops@example.com", PASSWORD)
        User.objects.db_manager(db).create_user(DEMOTED, "d@example.com", PASSWORD, is_staff=True)

    gw.on_database(create)


def demote(gw: GatewayProcess) -> None:
    from django.contrib.auth.models import User

    gw.on_database(
        lambda db: User.objects.using(db).filter(username=DEMOTED).update(is_staff=False)
    )


def issue_tokens(gw: GatewayProcess, wanted: dict[str, list[str]]) -> dict[str, str]:
    """Tokens named and scoped as ``wanted``: name -> secret."""
    return {name: gw.issue_token(*scopes, name=name) for name, scopes in wanted.items()}


async def handshake_status(url: str, **caller: Any) -> int:
    """101 if the socket was accepted, else the HTTP status of the refused handshake.

    A browser's refused socket (with an Origin, protocol 1.2) is accepted, told
    ``unauthorized`` and closed with 4401: that is 4401 here.
    """
    try:
        s = await open_socket(url, **caller)
    except InvalidStatus as exc:
        return exc.response.status_code
    try:
        await s.request({"op": "probe-unknown"})
    except (ConnectionError, ConnectionClosed):
        await s.reader
        frames = []
        while not s.frames.empty():
            frames.append(s.frames.get_nowait())
        codes = [f.get("code") for f in frames if f.get("op") == "error"]
        assert codes == ["unauthorized"] and s.conn.close_code == 4401, (codes, s.conn.close_code)
        return 4401
    await s.close()
    return 101


def status_outcome(status: int, body: Any) -> str:
    if status == 200:
        return "ok"
    code = body.get("error") if isinstance(body, dict) else body
    return f"{code} {status}"


# -- the sites


@pytest.fixture(scope="module")
def site(gateway_server: str) -> Iterator[GatewayProcess]:
    """A gateway on SQLite with the development defaults, a superuser and a demoted user."""
    var = Path(tempfile.mkdtemp(prefix="leasecast-access-"))
    with sqlite_database(var) as env:
        gw = GatewayProcess(env, var, name="access", server=gateway_server)
        create_users(gw)
        gw.start()
        yield gw
        gw.stop()


@pytest.fixture(scope="module")
def admin(site: GatewayProcess) -> str:
    return site.issue_token("admin", name="access-admin")


@pytest.fixture(scope="module")
def staff(site: GatewayProcess) -> Client:
    client = Client(site.http)
    client.login(STAFF)
    return client


@pytest.fixture(scope="module")
def demoted(site: GatewayProcess) -> Client:
    """A session whose user was staff when it logged in and is not any more."""
    client = Client(site.http)
    client.login(DEMOTED)
    demote(site)
    return client


# -- 1. every route refuses strangers


@dataclass(frozen=True)
class HttpRoute:
    route: str  # as Django reports it (ResolverMatch.route)
    path: str  # a concrete path that resolves to it
    is_api: bool


_CONVERTER_SAMPLES = {
    "int": "7",
    "str": "probe",
    # Two segments: only a <path:> route takes them (a catch-all after <str:> routes).
    "path": "probe/more",
    "slug": "probe",
    "uuid": "00000000-0000-0000-0000-000000000007",
}


def _sample_route(route: str) -> str:
    """A concrete path for a ``path()`` route: each converter replaced by a sample value."""

    def sample(match: re.Match[str]) -> str:
        converter = match.group(1) or "str"
        if converter not in _CONVERTER_SAMPLES:
            raise AssertionError(f"no sample for converter {converter!r} in {route!r}")
        return _CONVERTER_SAMPLES[converter]

    return re.sub(r"<(?:(\w+):)?\w+>", sample, route)


def _sample_regex(regex: str) -> str:
    """A concrete path for a ``re_path()`` regex: named groups replaced by matching samples."""

    def sample(match: re.Match[str]) -> str:
        body = match.group(2)
        first = body.split("|")[0]
        for candidate in (first, "probe", "7"):
            if re.fullmatch(body, candidate):
                return candidate
        raise AssertionError(f"no sample for group {match.group(0)!r}")

    path = re.sub(r"\(\?P<(\w+)>((?:[^()]|\([^()]*\))*)\)", sample, regex)
    return path.removeprefix("^").removesuffix("$").replace("\\", "")


def http_routes() -> list[HttpRoute]:
    """Every route of ``gateway.site.urls``, recursively, each with a path that reaches it."""
    from django.urls import URLPattern, URLResolver, get_resolver, resolve
    from django.urls.resolvers import RegexPattern

    def sample(pattern: Any) -> str:
        text = str(pattern)
        return _sample_regex(text) if isinstance(pattern, RegexPattern) else _sample_route(text)

    routes: list[HttpRoute] = []

    def walk(patterns: list[Any], route: str, path: str) -> None:
        for entry in patterns:
            here_route = route + str(entry.pattern).removeprefix("^")
            here_path = path + sample(entry.pattern)
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, here_route, here_path)
            else:
                assert isinstance(entry, URLPattern)
                match = resolve("/" + here_path)
                # The sample reaches this very route, so no route goes unvisited.
                assert match.route == here_route, (here_path, match.route, here_route)
                # Token-authenticated endpoints (the API, /metrics); the rest are pages.
                is_api = entry.callback.__module__.startswith("consumers.")
                routes.append(HttpRoute(here_route, "/" + here_path, is_api))

    walk(get_resolver().url_patterns, "", "")
    return routes


def refused(client: Client, method: str, path: str, headers: dict[str, str]) -> str | None:
    """None if the request is refused (401/403, or sent to log in), else what it got."""
    reply = client.request(method, path, headers=headers)
    hops = 0
    while reply.status in REDIRECTS and hops < 4:
        target = urllib.parse.urljoin(path, reply.headers["Location"])
        if urllib.parse.urlsplit(target).path == LOGIN_PATH:
            return None
        reply = client.request("GET", target, headers=headers)
        hops += 1
    if reply.status in (401, 403):
        return None
    return f"{method} {path} -> {reply.status} {reply.text[:200]!r}"


def test_the_walk_finds_every_kind_of_route() -> None:
    routes = {r.route: r for r in http_routes()}
    for must in ("healthz", "api/stats", "dashboard/", "admin/", "admin/gateway/token/"):
        assert must in routes, sorted(routes)
    assert any(r.is_api for r in routes.values())
    assert sum(r.route.startswith("admin/") for r in routes.values()) > 20


@both_servers
def test_every_url_refuses_callers_without_a_token_or_staff_session(
    site: GatewayProcess, admin: str, demoted: Client
) -> None:
    from django.utils import timezone

    from gateway.models import Token

    revoked = site.issue_token("admin", name="revoked")
    site.on_database(
        lambda db: Token.objects.using(db).filter(name="revoked").update(revoked_at=timezone.now())
    )
    callers: list[tuple[str, Client, dict[str, str]]] = [
        ("anonymous", Client(site.http), {}),
        ("unknown token", Client(site.http), {"Authorization": "Bearer lc_not-a-token"}),
        ("revoked token", Client(site.http), {"Authorization": f"Bearer {revoked}"}),
        ("malformed header", Client(site.http), {"Authorization": "Basic b3BzOm9wcw=="}),
        ("non-staff session", demoted, {}),
    ]
    routes = http_routes()
    answered: list[str] = []
    for route in routes:
        if route.route in PUBLIC:
            continue
        for who, client, headers in callers:
            for method in METHODS:
                got = refused(client, method, route.path, headers)
                if got is not None:
                    answered.append(f"{who}: {got}")
        if not route.is_api:
            # Pages are for staff sessions: even an admin token does not open them.
            got = refused(
                Client(site.http), "GET", route.path, {"Authorization": f"Bearer {admin}"}
            )
            if got is not None:
                answered.append(f"admin token: {got}")
    assert answered == [], "\n".join(answered)
    # The public routes are public, and there are exactly those.
    assert {r.route for r in routes} >= set(PUBLIC)
    assert http("GET", site.http + "/healthz") == (200, {"status": "ok"})
    assert Client(site.http).request("GET", LOGIN_PATH).status == 200


def test_the_walk_can_fail(site: GatewayProcess, admin: str, staff: Client) -> None:
    """The same check passes every route for the right caller: it tells the two apart."""
    for path, client, headers in [
        ("/api/stats", Client(site.http), {"Authorization": f"Bearer {admin}"}),
        ("/api/stats", staff, {}),
        ("/dashboard/", staff, {}),
        ("/admin/gateway/token/", staff, {}),
    ]:
        assert refused(client, "GET", path, headers) is not None, path


@dataclass(frozen=True)
class SocketRoute:
    regex: str
    path: str
    catch_all: bool


def socket_routes() -> list[SocketRoute]:
    """Every route of ``consumers.routing``, each with a path that the router sends to it."""
    from consumers.routing import websocket_urlpatterns

    found = []
    for index, entry in enumerate(websocket_urlpatterns):
        regex = entry.pattern.regex.pattern
        catch_all = regex in ("", "^")
        path = "ws/probe-unknown/" if catch_all else _sample_regex(regex)
        path = path.replace("probe", unique("probe"))
        # Routed as Channels' URLRouter does: the first pattern that matches.
        first = next(i for i, e in enumerate(websocket_urlpatterns) if e.pattern.match(path))
        assert first == index, (regex, path, first)
        found.append(SocketRoute(regex, "/" + path, catch_all))
    return found


@both_servers
async def test_every_socket_route_refuses_a_handshake_without_credentials(
    site: GatewayProcess, admin: str, staff: Client, demoted: Client
) -> None:
    routes = socket_routes()
    assert len(routes) >= 5 and sum(r.catch_all for r in routes) == 1
    me = own_origin(site)
    strangers: list[tuple[str, dict[str, Any]]] = [
        ("nothing", {}),
        ("unknown token", {"token": "lc_not-a-token"}),
        ("an origin but no credentials", {"origin": me}),
        ("non-staff session", {"cookie": demoted.cookie_header(), "origin": me}),
        ("staff session, foreign origin", {"cookie": staff.cookie_header(), "origin": EVIL}),
        ("staff session, no origin", {"cookie": staff.cookie_header()}),
        (
            "staff session, origin 'null'",
            {"cookie": staff.cookie_header(), "origin": "null"},
        ),
    ]
    answered = []
    for route in routes:
        url = site.ws + route.path
        for who, caller in strangers:
            status = await handshake_status(url, **caller)
            # A browser (an Origin) is told why, as it cannot see a 403 (protocol 1.2).
            if status != (4401 if "origin" in caller else 403):
                answered.append(f"{who}: {route.path} -> {status}")
        status = await handshake_status(f"{url}?token=lc_not-a-token")
        if status != 403:
            answered.append(f"unknown token in the query: {route.path} -> {status}")
        # A spoofed Host that matches the page's Origin is still not an allowed host.
        spoofed = f"ws://evil.example:{site.port}{route.path}"
        status = await handshake_status(
            spoofed,
            cookie=staff.cookie_header(),
            origin=f"http://evil.example:{site.port}",
            host="127.0.0.1",
            port=site.port,
        )
        if status != 4401:
            answered.append(f"spoofed host: {route.path} -> {status}")
        # And the right callers get in (except on the catch-all): the test can fail.
        for who, caller in [
            ("admin token", {"token": admin}),
            ("staff session", {"cookie": staff.cookie_header(), "origin": me}),
        ]:
            status = await handshake_status(url, **caller)
            if status != (403 if route.catch_all else 101):
                answered.append(f"{who}: {route.path} -> {status}")
    assert answered == [], "\n".join(answered)


# -- 2. scopes per name, per operation


ENQUEUE, CONSUME, PUBLISH, SUBSCRIBE = "enqueue", "consume", "publish", "subscribe"
NAME_ACTIONS = (ENQUEUE, CONSUME, PUBLISH, SUBSCRIBE)


@dataclass
class Operation:
    """One operation, run by a token; ``ok`` if it went through, else what refused it.

    The allowed token holds the scope the operation needs as a glob that
    matches the name; the denied token holds every other action on the name
    and the needed action on a pattern beside it (``NAME.*``), so only the
    per-name, per-action rule can tell them apart.
    """

    name: str
    needs: str  # the action whose scope it needs, or "admin"
    run: Callable[[GatewayProcess, str, str, str], Awaitable[str]]  # (gw, admin, token, name)
    refusal: str = "forbidden"  # what the denied token is told
    base: Callable[[str], list[str]] = field(default=lambda name: [])  # both tokens get these
    denied: Callable[[str], list[str]] | None = None  # instead of the rule above

    def allowed_scopes(self, name: str) -> list[str]:
        own = ["admin"] if self.needs == "admin" else [f"{self.needs}:{name[:-1]}*"]
        return [*self.base(name), *own]

    def denied_scopes(self, name: str) -> list[str]:
        if self.denied is not None:
            return self.denied(name)
        if self.needs == "admin":
            return [f"{action}:*" for action in NAME_ACTIONS]
        others = [f"{action}:{name}" for action in NAME_ACTIONS if action != self.needs]
        return [*self.base(name), *others, f"{self.needs}:{name}.*"]


async def queue_counts(gw: GatewayProcess, admin: str, queue: str) -> tuple[int, ...]:
    status, body = await ahttp("GET", f"{gw.http}/api/queues/{queue}", admin)
    if status == 404:
        return (0, 0, 0, 0)
    assert status == 200, body
    return tuple(body[k] for k in ("visible", "delayed", "in_flight", "dead"))


def enqueue_outcome(reply_outcome: str, counts: tuple[int, ...]) -> str:
    """``ok`` only if the message is there; ``forbidden`` only if nothing is."""
    there = sum(counts)
    if reply_outcome == "ok":
        return "ok" if there == 1 else f"ok but {counts}"
    return reply_outcome if there == 0 else f"{reply_outcome} but {counts}"


def frame_outcome(reply: dict[str, Any], success: str) -> str:
    return "ok" if reply["op"] == success else f"{reply.get('code')}"


async def run_enqueue_on_producer(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    async with await Socket.open(f"{gw.ws}/ws/produce/", token) as s:
        reply = await s.request({"op": "enqueue", "queue": name, "body": 1})
    return enqueue_outcome(frame_outcome(reply, "enqueued"), await queue_counts(gw, admin, name))


async def run_enqueue_many(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    async with await Socket.open(f"{gw.ws}/ws/produce/", token) as s:
        reply = await s.request({"op": "enqueue_many", "queue": name, "messages": [{"body": 1}]})
    outcome = frame_outcome(reply, "enqueued_many")
    return enqueue_outcome(outcome, await queue_counts(gw, admin, name))


async def run_enqueue_on_worker(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    async with await Socket.open(f"{gw.ws}/ws/queues/{name}-w/", token) as s:
        reply = await s.request({"op": "enqueue", "queue": name, "body": 1})
    return enqueue_outcome(frame_outcome(reply, "enqueued"), await queue_counts(gw, admin, name))


async def run_ack_follow_up(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    source = f"{name}-w"
    await ahttp(
        "POST", f"{gw.http}/api/queues/{source}/messages", admin, {"messages": [{"body": 0}]}
    )
    async with await Socket.open(f"{gw.ws}/ws/queues/{source}/", token) as s:
        (delivery,) = await s.deliveries(1)
        ack = {"op": "ack", "receipt": delivery["receipt"]}
        reply = await s.request({**ack, "enqueue": [{"queue": name, "body": 1}]})
        outcome = frame_outcome(reply, "acked")
        if outcome != "ok":
            # Refused as a whole: the ack did not happen either, the lease is still held.
            again = await s.request(ack)
            if again["op"] != "acked":
                return f"{outcome}, then the lease was gone: {again}"
    return enqueue_outcome(outcome, await queue_counts(gw, admin, name))


async def run_http_enqueue(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    status, body = await ahttp(
        "POST", f"{gw.http}/api/queues/{name}/messages", token, {"messages": [{"body": 1}]}
    )
    return enqueue_outcome(status_outcome(status, body), await queue_counts(gw, admin, name))


async def run_stage(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    txn = unique("txn")
    base = f"{gw.http}/api/transactions/{txn}"
    status, body = await ahttp(
        "PUT", f"{base}/partitions/0", token, {"queue": name, "messages": [{"body": 1}]}
    )
    outcome = status_outcome(status, body)
    # A transaction is its first stager's (protocol 1.2): the token commits what
    # it staged; a refused stage claimed nothing, so the admin may commit the name.
    _, committed = await ahttp("POST", f"{base}/commit", token if outcome == "ok" else admin)
    return enqueue_outcome(outcome, await queue_counts(gw, admin, name)) + (
        "" if committed["committed"] == (1 if outcome == "ok" else 0) else f" {committed}"
    )


async def run_consume(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    return await socket_outcome(await Socket.open(f"{gw.ws}/ws/queues/{name}/", token))


async def run_queue_stats(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    await ahttp("POST", f"{gw.http}/api/queues/{name}/messages", admin, {"messages": [{"body": 1}]})
    status, body = await ahttp("GET", f"{gw.http}/api/queues/{name}", token)
    return status_outcome(status, body)


async def publish_checked(
    gw: GatewayProcess, admin: str, name: str, publish: Callable[[], Awaitable[str]]
) -> str:
    """Run ``publish`` with an admin subscriber on the topic; check what it received."""
    async with await Socket.open(f"{gw.ws}/ws/topics/{name}/", admin) as sub:
        await sub.request({"op": "probe-unknown"})  # subscribed by now
        outcome = await publish()
        async with await Socket.open(f"{gw.ws}/ws/produce/", admin) as p:
            await p.request({"op": "publish", "topic": name, "body": "marker"})
        bodies: list[Any] = []
        while "marker" not in bodies:
            frame = await sub.next()
            bodies += [item["body"] for item in frame["items"]]
    expected = ["published", "marker"] if outcome == "ok" else ["marker"]
    return outcome if bodies == expected else f"{outcome} but the subscriber got {bodies}"


async def run_publish_on_producer(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    async def publish() -> str:
        async with await Socket.open(f"{gw.ws}/ws/produce/", token) as s:
            reply = await s.request({"op": "publish", "topic": name, "body": "published"})
        return frame_outcome(reply, "published")

    return await publish_checked(gw, admin, name, publish)


async def run_publish_on_worker(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    async def publish() -> str:
        async with await Socket.open(f"{gw.ws}/ws/queues/{name}-w/", token) as s:
            reply = await s.request({"op": "publish", "topic": name, "body": "published"})
        return frame_outcome(reply, "published")

    return await publish_checked(gw, admin, name, publish)


async def run_publish_on_subscriber(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    async def publish() -> str:
        async with await Socket.open(f"{gw.ws}/ws/topics/{name}-s/", token) as s:
            reply = await s.request({"op": "publish", "topic": name, "body": "published"})
        return frame_outcome(reply, "published")

    return await publish_checked(gw, admin, name, publish)


async def run_http_publish(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    async def publish() -> str:
        status, body = await ahttp(
            "POST",
            f"{gw.http}/api/topics/{name}/messages",
            token,
            {"messages": [{"body": "published"}]},
        )
        return status_outcome(status, body)

    return await publish_checked(gw, admin, name, publish)


async def run_subscribe(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    return await socket_outcome(await Socket.open(f"{gw.ws}/ws/topics/{name}/", token))


async def run_purge(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    messages = {"messages": [{"body": 1}, {"body": 2}]}
    await ahttp("POST", f"{gw.http}/api/queues/{name}/messages", admin, messages)
    status, body = await ahttp("POST", f"{gw.http}/api/queues/{name}/purge", token)
    outcome = status_outcome(status, body)
    left = sum(await queue_counts(gw, admin, name))
    return outcome if left == (0 if outcome == "ok" else 2) else f"{outcome} but {left} left"


async def run_redrive(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    await ahttp("POST", f"{gw.http}/api/queues/{name}/messages", admin, {"messages": [{"body": 1}]})
    async with await Socket.open(f"{gw.ws}/ws/queues/{name}/", admin) as w:
        (delivery,) = await w.deliveries(1)
        assert (await w.request({"op": "reject", "receipt": delivery["receipt"]}))["op"] == (
            "rejected"
        )
    status, body = await ahttp("POST", f"{gw.http}/api/queues/{name}/redrive", token)
    outcome = status_outcome(status, body)
    dead = (await queue_counts(gw, admin, name))[3]
    return outcome if dead == (0 if outcome == "ok" else 1) else f"{outcome} but {dead} dead"


async def run_stats(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    status, body = await ahttp("GET", f"{gw.http}/api/stats", token)
    return status_outcome(status, body)


async def run_dashboard_socket(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    return await socket_outcome(await Socket.open(f"{gw.ws}/ws/dashboard/", token))


async def _staged(gw: GatewayProcess, admin: str, token: str, name: str) -> tuple[str, str]:
    """A transaction staged by ``token`` if it may, else by ``admin``; and its owner
    (a transaction is its first stager's, protocol 1.2)."""
    base = f"{gw.http}/api/transactions/{unique('txn')}"
    staged = {"queue": name, "messages": [{"body": 1}]}
    for owner in (token, admin):
        if (await ahttp("PUT", f"{base}/partitions/0", owner, staged))[0] == 200:
            return base, owner
    raise AssertionError("even the admin token could not stage")


async def run_commit(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    base, _ = await _staged(gw, admin, token, name)
    status, body = await ahttp("POST", f"{base}/commit", token)
    return enqueue_outcome(status_outcome(status, body), await queue_counts(gw, admin, name))


async def run_abort(gw: GatewayProcess, admin: str, token: str, name: str) -> str:
    base, owner = await _staged(gw, admin, token, name)
    status, body = await ahttp("POST", f"{base}/abort", token)
    outcome = status_outcome(status, body)
    # After an abort the owner's commit is invalid; after a refused abort it commits the message.
    status, _ = await ahttp("POST", f"{base}/commit", owner)
    left = sum(await queue_counts(gw, admin, name))
    if outcome == "ok":
        return "ok" if (status, left) == (400, 0) else f"ok but {status} {left}"
    return outcome if (status, left) == (200, 1) else f"{outcome} but {status} {left}"


def _worker_base(name: str) -> list[str]:
    return [f"consume:{name}-w"]


def _no_enqueue_scope(name: str) -> list[str]:
    return [f"{action}:*" for action in (CONSUME, PUBLISH, SUBSCRIBE)]


HTTP_REFUSAL, URL_REFUSAL = "forbidden 403", "forbidden 4403"

OPERATIONS = [
    Operation("enqueue on the producer socket", ENQUEUE, run_enqueue_on_producer),
    Operation("enqueue_many on the producer socket", ENQUEUE, run_enqueue_many),
    Operation("enqueue on a worker socket", ENQUEUE, run_enqueue_on_worker, base=_worker_base),
    Operation("an ack's follow-up enqueue", ENQUEUE, run_ack_follow_up, base=_worker_base),
    Operation("HTTP enqueue", ENQUEUE, run_http_enqueue, HTTP_REFUSAL),
    Operation("stage a transaction partition", ENQUEUE, run_stage, HTTP_REFUSAL),
    Operation("consume: the worker socket", CONSUME, run_consume, URL_REFUSAL),
    # Queue stats take consume or enqueue: the denied token holds neither on the name.
    Operation(
        "queue stats",
        CONSUME,
        run_queue_stats,
        HTTP_REFUSAL,
        denied=lambda name: [f"publish:{name}", f"subscribe:{name}", f"consume:{name}.*"],
    ),
    Operation("publish on the producer socket", PUBLISH, run_publish_on_producer),
    Operation("publish on a worker socket", PUBLISH, run_publish_on_worker, base=_worker_base),
    Operation(
        "publish on a subscriber socket",
        PUBLISH,
        run_publish_on_subscriber,
        base=lambda name: [f"subscribe:{name}-s"],
    ),
    Operation("HTTP publish", PUBLISH, run_http_publish, HTTP_REFUSAL),
    Operation("subscribe: the subscriber socket", SUBSCRIBE, run_subscribe, URL_REFUSAL),
    Operation("purge", "admin", run_purge, HTTP_REFUSAL),
    Operation("redrive", "admin", run_redrive, HTTP_REFUSAL),
    Operation("stats", "admin", run_stats, HTTP_REFUSAL),
    Operation("the dashboard socket", "admin", run_dashboard_socket, URL_REFUSAL),
    # Commit and abort need an enqueue scope somewhere (docs/protocol.md, transactions).
    Operation("commit a transaction", ENQUEUE, run_commit, HTTP_REFUSAL, denied=_no_enqueue_scope),
    Operation("abort a transaction", ENQUEUE, run_abort, HTTP_REFUSAL, denied=_no_enqueue_scope),
]


async def test_scopes_are_enforced_per_name_for_every_operation(
    site: GatewayProcess, admin: str
) -> None:
    stems = {op.name: unique("scoped") for op in OPERATIONS}
    wanted: dict[str, list[str]] = {}
    for op in OPERATIONS:
        wanted[f"denied {op.name}"] = op.denied_scopes(stems[op.name] + "-n")
        wanted[f"allowed {op.name}"] = op.allowed_scopes(stems[op.name] + "-m")
    tokens = issue_tokens(site, wanted)
    results = {}
    for op in OPERATIONS:
        stem = stems[op.name]
        denied = await op.run(site, admin, tokens[f"denied {op.name}"], stem + "-n")
        allowed = await op.run(site, admin, tokens[f"allowed {op.name}"], stem + "-m")
        results[op.name] = (denied, allowed)
    assert results == {op.name: (op.refusal, "ok") for op in OPERATIONS}


# -- 3. tokens are stored hashed


def _session_payloads(values: list[str]) -> list[str]:
    """What Django's signed session strings hold (base64, maybe zlib), decoded without the key."""
    decoded = []
    for value in values:
        payload = value.split(":")[0]
        compressed = payload.startswith(".")
        payload = payload.removeprefix(".")
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        decoded.append((zlib.decompress(raw) if compressed else raw).decode(errors="replace"))
    return decoded


def database_text(env: dict[str, str]) -> str:
    """Every row of every table as text (and, for SQLite, the raw bytes of its files)."""
    parts: list[str] = []
    sessions: list[str] = []
    if "DATABASE_URL" in env:
        import psycopg

        with psycopg.connect(env["DATABASE_URL"]) as conn:
            tables = [
                r[0]
                for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            ]
            for table in tables:
                rows = conn.execute(f'SELECT t::text FROM "{table}" t').fetchall()
                parts += [r[0] for r in rows]
            sessions = [r[0] for r in conn.execute("SELECT session_data FROM django_session")]
    else:
        path = Path(env["GATEWAY_SQLITE_PATH"])
        conn = sqlite3.connect(path)
        try:
            tables = [
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            ]
            for table in tables:
                parts += [repr(row) for row in conn.execute(f'SELECT * FROM "{table}"')]
            sessions = [r[0] for r in conn.execute("SELECT session_data FROM django_session")]
        finally:
            conn.close()
        for suffix in ("", "-wal", "-shm"):
            file = Path(str(path) + suffix)
            if file.exists():
                parts.append(file.read_bytes().decode("latin-1"))
    return "\n".join(parts + _session_payloads(sessions))


async def test_the_database_holds_no_plaintext_token(
    gateway: GatewayProcess, database_env: tuple[dict[str, str], Path]
) -> None:
    import hashlib

    env, _ = database_env
    # Issued three ways: the command, bootstrap_dev, and the admin's form.
    issued = gateway.manage("issue_token", "plain-check", "--scope", "admin")
    secrets = {"issue_token": issued.strip().splitlines()[-1]}
    boot = gateway.manage("bootstrap_dev")
    found = re.search(r"admin token:\s+(\S+)", boot)
    assert found, boot
    secrets["bootstrap_dev"] = found.group(1)
    from django.contrib.auth.models import User

    gateway.on_database(
        lambda db: User.objects.db_manager(db).create_superuser(
            "hashcheck", "h@example.com", PASSWORD
        )
    )
    staff = Client(gateway.http)
    staff.login("hashcheck")
    staff.request("GET", "/admin/gateway/token/add/")
    form = urllib.parse.urlencode(
        {
            "csrfmiddlewaretoken": staff.cookie("csrftoken") or "",
            "name": "from-the-admin",
            "scopes_text": "admin",
            "revoked_at_0": "",
            "revoked_at_1": "",
        }
    ).encode()
    reply = staff.request(
        "POST",
        "/admin/gateway/token/add/",
        form,
        {"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert reply.status == 200, reply.text[:2000]
    page = reply.text  # the answer shows it once (no message: it would sit in a cookie)
    found = re.search(r"Token for from-the-admin: (lc_[\w-]+)", page)
    assert found, page[:3000]
    secrets["admin form"] = found.group(1)
    # Each one works (so it is a real token), by header and in a socket URL.
    for secret in secrets.values():
        status, _ = await ahttp("GET", f"{gateway.http}/api/stats", secret)
        assert status == 200
        async with await Socket.open(f"{gateway.ws}/ws/produce/?token={secret}") as s:
            assert (await s.request({"op": "publish", "topic": "t", "body": 1}))["op"] == (
                "published"
            )
    text = database_text(env)
    for how, secret in secrets.items():
        assert secret not in text, f"the token from {how} is stored in plain text"
        # The scan sees the token table: the hash is there (so the check can fail).
        assert hashlib.sha256(secret.encode()).hexdigest() in text, how
        assert secret not in gateway.log_text(), f"the token from {how} is in the gateway's log"


# -- 4. Origin of browser sockets


@both_servers
async def test_session_sockets_need_an_allowed_origin_and_token_sockets_none(
    site: GatewayProcess, admin: str, staff: Client
) -> None:
    url = f"{site.ws}/ws/dashboard/"
    me = own_origin(site)
    cookie = staff.cookie_header()
    # The dashboard's own page: accepted, and it gets its snapshots.
    s = await open_socket(url, cookie=cookie, origin=me)
    assert (await s.next())["op"] == "snapshot"
    await s.close()
    # The same cookie from any other origin, or none: refused (a browser is told why).
    for origin in (EVIL, f"http://127.0.0.1:{site.port + 1}", "http://127.0.0.1"):
        assert await handshake_status(url, cookie=cookie, origin=origin) == 4401, origin
    assert await handshake_status(url, cookie=cookie) == 403
    # localhost is an allowed host too, when the page was served as localhost.
    status = await handshake_status(
        f"ws://localhost:{site.port}/ws/dashboard/",
        cookie=cookie,
        origin=f"http://localhost:{site.port}",
    )
    assert status in (101, 403)  # localhost may resolve to ::1, where nothing listens
    # Tokens need no Origin (a worker process sends none), nor a particular one.
    for caller in ({"token": admin}, {"token": admin, "origin": EVIL}):
        s = await open_socket(f"{site.ws}/ws/produce/", **caller)
        assert (await s.request({"op": "enqueue", "queue": unique(), "body": 1}))["op"] == (
            "enqueued"
        )
        await s.close()
    s = await open_socket(f"{site.ws}/ws/produce/?token={admin}", origin=EVIL)
    assert (await s.request({"op": "enqueue", "queue": unique(), "body": 1}))["op"] == "enqueued"
    await s.close()


# -- 5. dashboard actions: CSRF and staff


def _count(gw: GatewayProcess, admin: str, queue: str) -> int:
    status, body = http("GET", f"{gw.http}/api/queues/{queue}", admin)
    assert status == 200, body
    return int(body["visible"])


def test_dashboard_actions_need_the_csrf_token_and_a_staff_user(
    site: GatewayProcess, admin: str, staff: Client, demoted: Client
) -> None:
    queue = unique("csrf")
    http("POST", f"{site.http}/api/queues/{queue}/messages", admin, {"messages": [{"body": 1}] * 3})
    purge = f"/api/queues/{queue}/purge"
    csrf = staff.cookie("csrftoken") or ""
    assert csrf
    refusals = [
        ("no CSRF token", staff, {}),
        ("a wrong CSRF token", staff, {"X-CSRFToken": "x" * 32}),
        ("another origin", staff, {"X-CSRFToken": csrf, "Origin": EVIL}),
        ("a non-staff session", demoted, {"X-CSRFToken": demoted.cookie("csrftoken") or ""}),
        ("no session", Client(site.http), {"X-CSRFToken": csrf, "Cookie": f"csrftoken={csrf}"}),
    ]
    for action in ("purge", "redrive"):
        for why, client, headers in refusals:
            reply = client.request("POST", f"/api/queues/{queue}/{action}", headers=headers)
            assert reply.status in (401, 403), (action, why, reply.status, reply.text)
            assert reply.json()["error"] in ("forbidden", "unauthorized"), (action, why)
            assert _count(site, admin, queue) == 3, (action, why)
    reply = staff.request("POST", purge, headers={"X-CSRFToken": "wrong"})
    assert (reply.status, reply.json()["error"]) == (403, "forbidden")
    assert "CSRF" in reply.json()["detail"]
    # The dashboard's own request (cookie and header, same origin) goes through.
    reply = staff.request("POST", purge, headers={"X-CSRFToken": csrf, "Origin": own_origin(site)})
    assert (reply.status, reply.json()) == (200, {"purged": 3})
    # Reading needs no CSRF token, but still a staff user.
    assert staff.request("GET", "/api/stats").status == 200
    assert demoted.request("GET", "/api/stats").status == 403


# -- 6. production settings


def _settings_env(var: Path, **extra: str) -> dict[str, str]:
    env = base_env(var)
    for name in ("SECRET_KEY", "DJANGO_SECRET_KEY", "GATEWAY_DEBUG", "GATEWAY_ENV"):
        env.pop(name, None)
    for name in [k for k in env if k.startswith("GATEWAY_TOKEN_")]:
        env.pop(name)
    env["GATEWAY_SQLITE_PATH"] = str(var / "leasecast.sqlite3")
    env.update(extra)
    return env


def _check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"GATEWAY_DEBUG": "1", "SECRET_KEY": GOOD_KEY}, "refuses to start with GATEWAY_DEBUG on"),
        ({}, "SECRET_KEY is not set"),
        ({"SECRET_KEY": "changeme"}, "at least 50 random characters"),
        ({"SECRET_KEY": "a" * 80}, "at least 50 random characters"),
        ({"SECRET_KEY": "django-insecure-" + GOOD_KEY}, "not a placeholder"),
        ({"DJANGO_SECRET_KEY": "short"}, "at least 50 random characters"),
        ({"SECRET_KEY": GOOD_KEY, "GATEWAY_TOKEN_RATE": "fast"}, "GATEWAY_TOKEN_RATE"),
    ],
)
def test_production_refuses_to_start_misconfigured(extra: dict[str, str], message: str) -> None:
    var = Path(tempfile.mkdtemp(prefix="leasecast-prod-"))
    done = _check(_settings_env(var, GATEWAY_ENV="production", **extra))
    assert done.returncode != 0
    assert "ImproperlyConfigured" in done.stderr and message in done.stderr, done.stderr[-2000:]
    assert not (var / "secret_key").exists()  # production never makes one up


def test_an_unknown_environment_is_refused() -> None:
    var = Path(tempfile.mkdtemp(prefix="leasecast-prod-"))
    done = _check(_settings_env(var, GATEWAY_ENV="prod", SECRET_KEY=GOOD_KEY))
    assert done.returncode != 0 and "GATEWAY_ENV must be one of" in done.stderr


def test_production_with_a_real_key_starts_and_development_is_unchanged() -> None:
    var = Path(tempfile.mkdtemp(prefix="leasecast-prod-"))
    done = _check(_settings_env(var, GATEWAY_ENV="production", SECRET_KEY=GOOD_KEY))
    assert done.returncode == 0, done.stderr
    # make run's embedded default: no key, debug allowed, a key made once in var/.
    done = _check(_settings_env(var, GATEWAY_DEBUG="1"))
    assert done.returncode == 0, done.stderr
    assert len((var / "secret_key").read_text().strip()) >= 50


def test_the_server_refuses_to_start_in_production_with_debug_on() -> None:
    var = Path(tempfile.mkdtemp(prefix="leasecast-prod-"))
    with sqlite_database(var) as dev_env:
        env = {**dev_env, **_settings_env(var, GATEWAY_ENV="production", SECRET_KEY=GOOD_KEY)}
        gw = GatewayProcess({**env, "GATEWAY_DEBUG": "1"}, var, name="prod-debug")
        with pytest.raises(RuntimeError, match="gateway exited") as info:
            gw.start()
        assert "refuses to start with GATEWAY_DEBUG on" in str(info.value)
        gw = GatewayProcess(env, var, name="prod")
        gw.start()  # /healthz answers
        try:
            assert http("GET", gw.http + "/healthz") == (200, {"status": "ok"})
            token = gw.issue_token("admin", name="prod")
            status, _ = http("GET", gw.http + "/api/stats", token)
            assert status == 200
        finally:
            gw.stop()


# -- 7. per-token limits

LIMITS = {
    "GATEWAY_TOKEN_MAX_SOCKETS": "2",
    # Half a message a second after a burst of 5: a refill takes 2 s, so what the
    # test sends straight after a burst finds the bucket empty however slow the
    # machine is, and it waits (retry_after) to see it admitted again.
    "GATEWAY_TOKEN_RATE": "0.5",
    "GATEWAY_TOKEN_BURST": "5",
    "GATEWAY_ALLOWED_ORIGINS": "http://ops.example.com, https://ops2.example.com/",
}


@pytest.fixture(scope="module")
def limited(gateway_server: str) -> Iterator[GatewayProcess]:
    var = Path(tempfile.mkdtemp(prefix="leasecast-limited-"))
    with sqlite_database(var) as env:
        gw = GatewayProcess({**env, **LIMITS}, var, name="limited", server=gateway_server)
        create_users(gw)
        gw.start()
        yield gw
        gw.stop()


def stored(gw: GatewayProcess, queue: str) -> int:
    """Messages of ``queue`` in the gateway's SQLite file (not through the limited API)."""
    conn = sqlite3.connect(gw.env["GATEWAY_SQLITE_PATH"])
    try:
        (n,) = conn.execute(
            "SELECT count(*) FROM leasecast_message m JOIN leasecast_queue q "
            "ON m.queue_id = q.id WHERE q.name = ?",
            (queue,),
        ).fetchone()
        return int(n)
    finally:
        conn.close()


async def until_admitted(s: Socket, frame: dict[str, Any], success: str) -> dict[str, Any]:
    """Send ``frame`` until it is admitted, waiting as each refusal says."""
    deadline = time.monotonic() + 60
    while True:
        reply = await s.request(frame)
        if reply["op"] == success:
            return reply
        assert reply["code"] == "backpressure", reply
        assert time.monotonic() < deadline, "never admitted again"
        await asyncio.sleep(reply["retry_after"])


async def test_a_token_over_its_message_rate_gets_backpressure_and_keeps_its_socket(
    limited: GatewayProcess,
) -> None:
    tokens = issue_tokens(limited, {"greedy": ["enqueue:*"], "other": ["enqueue:*"]})
    queue, theirs = unique("rate"), unique("rate")
    async with await Socket.open(f"{limited.ws}/ws/produce/", tokens["greedy"]) as s:
        # 40 frames at once: the burst of 5 goes through, then backpressure.
        refs = [f"g{i}" for i in range(40)]
        for ref in refs:
            await s.send({"op": "enqueue", "queue": queue, "body": ref, "ref": ref})
        replies = [await s.next() for _ in refs]
        # One reply per frame (refusals may overtake the enqueues being committed).
        assert sorted(r["ref"] for r in replies) == sorted(refs)
        accepted = [r for r in replies if r["op"] == "enqueued"]
        refused = [r for r in replies if r["op"] == "error"]
        assert len(accepted) + len(refused) == 40
        assert 5 <= len(accepted) < 40
        assert {r["code"] for r in refused} == {"backpressure"}
        assert all(r["retry_after"] > 0 and "GATEWAY_TOKEN_RATE" in r["detail"] for r in refused)
        # A refused frame changed nothing: exactly the accepted ones are stored.
        assert stored(limited, queue) == len(accepted)
        # Bad frames cost too, so a flood of them is bounded like any other.
        await s.send("not json")
        assert (await s.next())["code"] == "backpressure"
        # Another token is unaffected: its own burst goes through right now.
        async with await Socket.open(f"{limited.ws}/ws/produce/", tokens["other"]) as o:
            for i in range(5):
                reply = await o.request({"op": "enqueue", "queue": theirs, "body": i})
                assert reply["op"] == "enqueued", reply
        # The socket stays open and usable: after the wait it says, it is admitted.
        await until_admitted(s, {"op": "enqueue", "queue": queue, "body": "later"}, "enqueued")
    assert stored(limited, queue) == len(accepted) + 1
    assert stored(limited, theirs) == 5


async def test_batches_cost_their_size_and_credit_is_free(limited: GatewayProcess) -> None:
    tokens = issue_tokens(limited, {"batch": ["enqueue:*", "subscribe:*", "publish:*"]})
    queue, topic = unique("batch"), unique("topic")
    async with await Socket.open(f"{limited.ws}/ws/topics/{topic}/", tokens["batch"]) as s:
        for _ in range(50):  # credit has no reply, so it is never refused
            await s.send({"op": "credit", "n": 1})
        reply = await s.request(
            {"op": "enqueue_many", "queue": queue, "messages": [{"body": i} for i in range(5)]}
        )
        assert reply["op"] == "enqueued_many"  # 5 messages: the whole burst
        reply = await s.request({"op": "enqueue", "queue": queue, "body": "one more"})
        assert reply["code"] == "backpressure"
        assert s.frames.empty()  # no error for any of the 50 credit frames
    assert stored(limited, queue) == 5


@both_servers
def test_http_over_the_rate_is_429_with_retry_after(limited: GatewayProcess) -> None:
    tokens = issue_tokens(limited, {"http": ["enqueue:*"], "bystander": ["enqueue:*"]})
    queue = unique("http")
    url = f"{limited.http}/api/queues/{queue}/messages"
    five = {"messages": [{"body": i} for i in range(5)]}
    assert http("POST", url, tokens["http"], five)[0] == 200
    request = urllib.request.Request(
        url, data=json.dumps({"messages": [{"body": 6}]}).encode(), method="POST"
    )
    request.add_header("Authorization", f"Bearer {tokens['http']}")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    assert info.value.code == 429
    assert int(info.value.headers["Retry-After"]) >= 1
    assert json.loads(info.value.read())["error"] == "backpressure"
    assert stored(limited, queue) == 5
    assert http("POST", url, tokens["bystander"], five)[0] == 200
    assert stored(limited, queue) == 10


@both_servers
async def test_a_token_over_its_socket_limit_is_refused_with_backpressure(
    limited: GatewayProcess,
) -> None:
    tokens = issue_tokens(limited, {"many": ["enqueue:*", "consume:*"], "few": ["enqueue:*"]})
    url = f"{limited.ws}/ws/produce/"
    first = await Socket.open(url, tokens["many"])
    # A socket refused for its scopes does not take a place.
    refused = await Socket.open(f"{limited.ws}/ws/topics/nope/", tokens["many"])
    assert await socket_outcome(refused) == "forbidden 4403"
    second = await Socket.open(f"{limited.ws}/ws/queues/{unique()}/", tokens["many"])
    third = await Socket.open(url, tokens["many"])
    assert await socket_outcome(third) == "backpressure 4429"
    # Another token is unaffected; the two open sockets still work.
    other = await Socket.open(url, tokens["few"])
    assert (await other.request({"op": "enqueue", "queue": unique(), "body": 1}))["op"] == (
        "enqueued"
    )
    assert (await first.request({"op": "enqueue", "queue": unique(), "body": 1}))["op"] == (
        "enqueued"
    )
    # A closed socket gives its place back (once the gateway has seen it go).
    await second.close()
    deadline = time.monotonic() + 30
    while True:
        again = await Socket.open(url, tokens["many"])
        outcome = await socket_outcome(again)
        if outcome == "ok":
            break
        assert outcome == "backpressure 4429" and time.monotonic() < deadline, outcome
        await asyncio.sleep(0.2)
    for s in (first, other):
        await s.close()
    assert http("GET", limited.http + "/healthz")[0] == 200
    watcher = issue_tokens(limited, {"watcher": ["admin"]})["watcher"]
    status, stats = http("GET", limited.http + "/api/stats", watcher)
    assert status == 200
    figures = stats["process"]["token_limits"]
    assert (figures["max_sockets"], figures["rate"], figures["burst"]) == (2, 0.5, 5)
    assert figures["refused_sockets"] >= 1
    assert "Traceback" not in limited.log_text()


async def test_allowed_origins_setting_admits_a_listed_page(limited: GatewayProcess) -> None:
    staff = Client(limited.http)
    staff.login(STAFF)
    url = f"{limited.ws}/ws/dashboard/"
    cookie = staff.cookie_header()
    for origin in ("http://ops.example.com", "https://ops2.example.com", own_origin(limited)):
        assert await handshake_status(url, cookie=cookie, origin=origin) == 101, origin
    for origin in (EVIL, "https://ops.example.com", "http://ops.example.com:8080"):
        assert await handshake_status(url, cookie=cookie, origin=origin) == 4401, origin
