"""The JavaScript client in Debian's Chromium against a live gateway.

The page is exactly the example of docs/clients.md, section "JavaScript",
written into a document of the gateway's origin (Playwright answers the
token view; the module itself comes from the gateway's /static/). It subscribes,
works a queue and enqueues; it survives a socket closed by the gateway and a
gateway restart with no gap, or is told of the gap.

Parts that need server features still being built (topic history and resume,
signed tokens) check for them at run time and skip, saying which.
"""

from __future__ import annotations

import asyncio
import json
import re
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browsers import browser_missing
from tests.support.clients import Socket, ahttp
from tests.support.databases import REDIS_URL, ROOT, redis_unavailable, sqlite_database
from tests.support.gateways import GatewayProcess
from tests.support.tokens import TEST_SIGNING_KEY, mint
from tests.support.waiting import wait_until

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))

DOC = ROOT / "docs" / "clients.md"
SIGNING_KEY = TEST_SIGNING_KEY
PAGE_SCOPES = ("subscribe:prices", "consume:thumbnails", "enqueue:orders")


def example_page() -> str:
    """The HTML block of docs/clients.md's JavaScript section, as written."""
    text = DOC.read_text()
    start = text.index("\n## JavaScript\n")
    end = text.index("\n## ", start + 1)
    match = re.search(r"```html\n(.*?)\n```", text[start:end], re.DOTALL)
    assert match is not None, "no html block in docs/clients.md, section JavaScript"
    return match.group(1)


@pytest.fixture(scope="module")
def site() -> Iterator[GatewayProcess]:
    var = Path(tempfile.mkdtemp(prefix="leasecast-jsclient-"))
    with sqlite_database(var) as env:
        env["GATEWAY_SIGNING_KEY"] = SIGNING_KEY
        gateway = GatewayProcess(env, var, name="jsclient")
        gateway.manage(
            "shell",
            "-c",
            "from django.contrib.auth.models import User;"
            "User.objects.create_user('visitor', 'v@example.com', 'pw')",
        )
        gateway.start()
        yield gateway
        gateway.stop()


@pytest.fixture(scope="module")
def admin(site: GatewayProcess) -> str:
    return site.issue_token("admin", name="test-admin")


@pytest.fixture(scope="module")
def page_token(site: GatewayProcess) -> str:
    """A stored token with only the page's scopes (no admin, no staff)."""
    return site.issue_token(*PAGE_SCOPES, name="page")


class TokenView:
    """Stands in for the application's `/leasecast/token/` view; counts its calls."""

    def __init__(self, mint: Callable[[], str]) -> None:
        self.mint = mint
        self.calls = 0

    async def handle(self, route: Any) -> None:
        self.calls += 1
        await route.fulfill(
            status=200,
            content_type="application/json",
            body=json.dumps({"token": self.mint()}),
        )


async def open_example(chromium: Any, site: GatewayProcess, view: TokenView) -> Any:
    """A page at the gateway's origin showing the docs example; fails the test on page errors."""
    page = await chromium.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.errors = errors
    await page.route(f"{site.http}/leasecast/token/", view.handle)
    # A document of the gateway's origin, really loaded from it (Chromium's
    # local network access checks refuse loopback sockets to a page that
    # Playwright answered itself), then the example written into it.
    await page.goto(f"{site.http}/healthz")
    await page.set_content(example_page())
    await page.wait_for_function(
        "document.getElementById('status').textContent === 'open'", timeout=15_000
    )
    return page


async def subscriber_sockets(site: GatewayProcess, admin: str, topic: str) -> list[dict[str, Any]]:
    """The sockets subscribed to ``topic``: subscriber sockets, and multiplexed
    sockets carrying it (their state of that topic merged in)."""
    status, stats = await ahttp("GET", f"{site.http}/api/stats", admin)
    assert status == 200, stats
    found = [s for s in stats["sockets"] if s["kind"] == "subscriber" and s.get("topic") == topic]
    for s in stats["sockets"]:
        if s["kind"] == "multiplex":
            found += [{**s, **t} for t in s["topics"] if t["topic"] == topic]
    return found


async def publish(site: GatewayProcess, admin: str, topic: str, bodies: list[Any]) -> None:
    async with await Socket.open(f"{site.ws}/ws/produce/", admin) as producer:
        for body in bodies:
            reply = await producer.request({"op": "publish", "topic": topic, "body": body})
            assert reply["op"] == "published", reply


async def queue_drained(site: GatewayProcess, admin: str, queue: str) -> bool:
    """Nothing visible or in flight in ``queue``: every message was acked."""
    status, counts = await ahttp("GET", f"{site.http}/api/queues/{queue}", admin)
    return bool(status == 200 and counts["visible"] == 0 and counts["in_flight"] == 0)


async def shown_prices(page: Any) -> list[tuple[str, Any]]:
    """(data-offset, body) of every price the page shows, in order."""
    rows = await page.eval_on_selector_all(
        "#prices li", "items => items.map(li => [li.dataset.offset, li.textContent])"
    )
    return [(offset, json.loads(text)) for offset, text in rows]


async def topic_history_supported(site: GatewayProcess, admin: str, topic: str) -> str | None:
    """Why topic history and resume cannot be tested here, or None (and history is on)."""
    url = f"{site.http}/api/topics/{topic}"
    status, _ = await ahttp("PATCH", url, admin, {"history_size": 1000})
    if status != 200:
        return f"topic history is not served yet (PATCH /api/topics/{topic} answered {status})"
    async with await Socket.open(f"{site.ws}/ws/topics/{topic}/?recover=latest", admin) as probe:
        try:
            first = await probe.next(timeout=5)
        except TimeoutError:
            return "the gateway sends no `subscribed` frame for recover=latest yet"
    if first.get("op") != "subscribed":
        return (
            f"the gateway's first frame for recover=latest is {first.get('op')!r}, not subscribed"
        )
    return None


async def test_example_page_subscribes_works_a_queue_and_enqueues(
    browser: Any,
    site: GatewayProcess,
    admin: str,
    page_token: str,
) -> None:
    view = TokenView(lambda: page_token)
    page = await open_example(browser, site, view)
    await wait_until(lambda: subscriber_sockets(site, admin, "prices"), "the page's subscription")

    # Live prices, in order, each once; credit is granted back as they are shown
    # (a window of 64: 200 messages need three grants or more).
    bodies = [{"price": 100 + i} for i in range(200)]
    await publish(site, admin, "prices", bodies)

    async def all_shown() -> bool:
        return len(await shown_prices(page)) >= len(bodies)

    await wait_until(all_shown, "200 prices shown")
    assert [body for _, body in await shown_prices(page)] == bodies

    # The page's worker acks what is enqueued to its queue.
    async with await Socket.open(f"{site.ws}/ws/produce/", admin) as producer:
        for i in range(3):
            await producer.request(
                {"op": "enqueue", "queue": "thumbnails", "body": {"image": f"img{i}.png"}}
            )
    await wait_until(
        lambda: page.evaluate("document.querySelectorAll('#jobs li').length === 3"),
        "three jobs shown",
    )

    await wait_until(
        lambda: queue_drained(site, admin, "thumbnails"), "the thumbnails queue acked empty"
    )
    jobs = await page.eval_on_selector_all("#jobs li", "items => items.map(li => li.textContent)")
    assert [job.split(": ")[1] for job in jobs] == ["img0.png", "img1.png", "img2.png"]

    # The producer: a click enqueues, the promise resolves with the stored id.
    await page.click("#order")
    await page.wait_for_function(
        "document.getElementById('ordered').textContent.startsWith('order ')", timeout=10_000
    )
    status, orders = await ahttp("GET", f"{site.http}/api/queues/orders", admin)
    assert status == 200 and orders["visible"] == 1, orders
    assert await page.inner_text("#gap") == ""
    assert page.errors == []
    await page.close()


async def test_socket_closed_by_the_gateway_resumes_without_gap_or_is_told(
    browser: Any,
    site: GatewayProcess,
    admin: str,
    page_token: str,
) -> None:
    missing = await topic_history_supported(site, admin, "prices")
    page = await open_example(browser, site, TokenView(lambda: page_token))
    (before,) = await wait_until(
        lambda: subscriber_sockets(site, admin, "prices"), "the page's subscription"
    )
    await publish(site, admin, "prices", [f"a{i}" for i in range(5)])

    async def shown_at_least(n: int) -> bool:
        return len(await shown_prices(page)) >= n

    await wait_until(lambda: shown_at_least(5), "five prices before the disconnect")

    # The gateway closes the page's socket (the dashboard's disconnect, code
    # 4000); five prices are published while the page reconnects.
    async with await Socket.open(f"{site.ws}/ws/dashboard/", admin) as dashboard:
        reply = await dashboard.request(
            {"op": "disconnect", "process": before["process"], "socket": before["id"]}
        )
        assert reply["op"] == "disconnected", reply
        await publish(site, admin, "prices", [f"b{i}" for i in range(5)])

    async def reconnected() -> bool:
        now = await subscriber_sockets(site, admin, "prices")
        return len(now) == 1 and now[0]["id"] != before["id"]

    await wait_until(reconnected, "the page's new socket")
    if missing is not None:
        # Without history the gateway cannot replay: the page must say so.
        await page.wait_for_function(
            "document.getElementById('gap').textContent !== ''", timeout=10_000
        )
        assert page.errors == []
        pytest.skip(f"told of the gap; no-gap resume not testable: {missing}")

    await wait_until(lambda: shown_at_least(10), "ten prices after the disconnect")
    shown_now = await shown_prices(page)
    assert [body for _, body in shown_now] == [f"a{i}" for i in range(5)] + [
        f"b{i}" for i in range(5)
    ]
    offsets = [int(offset) for offset, _ in shown_now]
    assert offsets == list(range(offsets[0], offsets[0] + 10)), offsets
    assert await page.inner_text("#gap") == ""
    assert page.errors == []
    await page.close()


async def restart_under_the_page(
    chromium: Any, gateway: GatewayProcess, admin: str, page_token: str
) -> tuple[Any, list[Any], bool]:
    """Three prices, a gateway restart (same port and database), three more.

    Returns the page, the prices it shows and whether it was told of a gap,
    once it shows all six or was told.
    """
    missing = await topic_history_supported(gateway, admin, "prices")
    if missing is not None:
        pytest.skip(missing)
    page = await open_example(chromium, gateway, TokenView(lambda: page_token))
    await wait_until(
        lambda: subscriber_sockets(gateway, admin, "prices"), "the page's subscription"
    )
    await publish(gateway, admin, "prices", [f"c{i}" for i in range(3)])

    async def shown_at_least(n: int) -> bool:
        return len(await shown_prices(page)) >= n

    await wait_until(lambda: shown_at_least(3), "three prices before the restart")
    # The page reconnects by itself (backoff); what is published before it is
    # back is missed unless it resumes.
    await asyncio.to_thread(gateway.stop)
    await asyncio.to_thread(gateway.start)
    await publish(gateway, admin, "prices", [f"d{i}" for i in range(3)])
    told = "document.getElementById('gap').textContent !== ''"

    async def complete_or_told() -> bool:
        return await shown_at_least(6) or await page.evaluate(told)

    await wait_until(complete_or_told, "all six prices, or the gap told")
    bodies = [body for _, body in await shown_prices(page)]
    return page, bodies, await page.evaluate(told)


async def test_gateway_restart_loses_in_process_history_and_the_page_is_told(
    browser: Any,
    site: GatewayProcess,
    admin: str,
    page_token: str,
) -> None:
    page, bodies, told = await restart_under_the_page(browser, site, admin, page_token)
    # A single process keeps the history in memory: the restart starts a new
    # epoch, the resume cannot recover, and the page says so.
    assert told, bodies
    assert bodies[:3] == ["c0", "c1", "c2"]
    assert len(set(bodies)) == len(bodies)
    # And it goes on with the new epoch.
    await publish(site, admin, "prices", ["e0"])
    await wait_until(
        lambda: page.evaluate(
            "[...document.querySelectorAll('#prices li')].some(li => li.textContent === '\"e0\"')"
        ),
        "a price after the gap",
    )
    assert page.errors == []
    await page.close()


@pytest.fixture
def redis_site() -> Iterator[GatewayProcess]:
    """A gateway whose topic history lives in Redis (it survives a restart)."""
    reason = redis_unavailable()
    if reason:
        pytest.skip(reason)
    var = Path(tempfile.mkdtemp(prefix="leasecast-jsclient-redis-"))
    with sqlite_database(var) as env:
        env.update(REDIS_URL=REDIS_URL, GATEWAY_REDIS_PREFIX=f"lcjs{uuid.uuid4().hex[:8]}")
        gateway = GatewayProcess(env, var, name="jsredis")
        gateway.start()
        yield gateway
        gateway.stop()


async def test_gateway_restart_with_history_in_redis_resumes_without_gap(
    browser: Any,
    redis_site: GatewayProcess,
) -> None:
    admin = redis_site.issue_token("admin", name="admin")
    page_token = redis_site.issue_token(*PAGE_SCOPES, name="page")
    page, bodies, told = await restart_under_the_page(browser, redis_site, admin, page_token)
    assert not told
    assert bodies == ["c0", "c1", "c2", "d0", "d1", "d2"]
    offsets = [int(offset) for offset, _ in await shown_prices(page)]
    assert offsets == list(range(offsets[0], offsets[0] + 6)), offsets
    assert page.errors == []
    await page.close()


async def test_signed_token_of_a_non_staff_user_is_refreshed_and_works_a_queue(
    browser: Any,
    site: GatewayProcess,
    admin: str,
) -> None:
    try:
        probe = await Socket.open(f"{site.ws}/ws/produce/", mint("visitor", PAGE_SCOPES, 60))
    except Exception as exc:
        pytest.skip(f"the gateway refuses signed tokens ({type(exc).__name__}: {exc})")
    await probe.close()

    # Tokens of 8 seconds: the page must refresh them to keep its sockets.
    view = TokenView(lambda: mint("visitor", PAGE_SCOPES, 8))
    page = await open_example(browser, site, view)
    (first,) = await wait_until(
        lambda: subscriber_sockets(site, admin, "prices"), "the page's subscription"
    )
    start = len(await shown_prices(page))
    sent: list[str] = []
    # Fourteen seconds of prices, one a second: past the first tokens' expiry
    # (a socket whose token expired without refresh is closed within 5 s).
    for i in range(14):
        sent.append(f"s{i}")
        await publish(site, admin, "prices", [sent[-1]])
        await asyncio.sleep(1)

    async def all_shown() -> bool:
        return len(await shown_prices(page)) >= start + len(sent)

    await wait_until(all_shown, "every price while tokens expire and are refreshed")
    assert [body for _, body in await shown_prices(page)][start:] == sent
    (now,) = await subscriber_sockets(site, admin, "prices")
    assert now["id"] == first["id"], "the socket was replaced: its token was not refreshed"
    assert view.calls >= 3, view.calls  # the first token and at least two refreshes

    # The page's worker, on the same signed token, acks a queue.
    async with await Socket.open(f"{site.ws}/ws/produce/", admin) as producer:
        for i in range(2):
            await producer.request(
                {"op": "enqueue", "queue": "thumbnails", "body": {"image": f"signed{i}.png"}}
            )

    await wait_until(
        lambda: queue_drained(site, admin, "thumbnails"), "the thumbnails queue acked empty"
    )
    assert page.errors == []
    await page.close()


WORKER_SCRIPT = """
async ({ token }) => {
  const lc = await import("/static/leasecast/leasecast.js");
  const reported = [];
  const client = new lc.Leasecast(location.origin, {
    token,
    onError: (error) => reported.push(error.name),
  });
  const out = { reported };

  // Outside the token's scopes: the subscription stops with Forbidden (no retries).
  const forbidden = client.subscribe("secret", { onMessage: () => {} });
  const final = await forbidden.done;
  out.forbidden = [final.name, final.code, final instanceof lc.ProtocolError];

  // A body over the gateway's limit: the promise rejects with TooLarge.
  try {
    await client.enqueue("work.a", "x".repeat(300 * 1024));
    out.tooLarge = "accepted";
  } catch (error) {
    out.tooLarge = [error.name, error.code, error instanceof lc.TooLarge];
  }

  // A job that fails once: the throw nacks it, its redelivery is acked.
  const seen = [];
  let done;
  const finished = new Promise((resolve) => (done = resolve));
  const worker = client.consume("work.a", async (job) => {
    seen.push([job.body, job.deliveries]);
    if (job.deliveries === 1) throw new Error("try again");
    done();
  }, { prefetch: 1 });
  const published = await client.publish("work.news", { hello: 1 });
  out.published = [published.seq, typeof published.offset, typeof published.epoch];
  const { id, duplicate } = await client.enqueue("work.a", "flaky", { key: "flaky-1" });
  const again = await client.enqueue("work.a", "flaky", { key: "flaky-1" });
  out.enqueued = [typeof id, duplicate, again.id === id, again.duplicate];
  await finished;
  out.flaky = seen;

  // Explicit controls: extend the lease, then reject (dead-letter) by hand;
  // settling twice is refused by the client.
  let handled;
  const controlled = new Promise((resolve) => (handled = resolve));
  const manual = client.consume("work.b", async (job) => {
    const expiresIn = await job.extend(120);
    await job.reject();
    let second;
    try {
      await job.ack();
      second = "acked twice";
    } catch (error) {
      second = error.name;
    }
    handled([expiresIn > 60, second]);
  });
  await client.enqueue("work.b", "poison");
  out.controlled = await controlled;
  await new Promise((resolve) => setTimeout(resolve, 300)); // the automatic ack would follow
  out.counts = [worker.acked, worker.nacked, manual.acked, manual.nacked];
  await client.close();
  out.states = [worker.state, manual.state, forbidden.state];
  return out;
}
"""


async def test_page_worker_controls_and_typed_errors(
    browser: Any,
    site: GatewayProcess,
    admin: str,
) -> None:
    token = site.issue_token(
        "consume:work.*", "enqueue:work.*", "publish:work.*", name="worker-page"
    )
    page = await browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(f"{site.http}/healthz")
    out = await page.evaluate(WORKER_SCRIPT, {"token": token})

    assert out["forbidden"] == ["Forbidden", "forbidden", True]
    assert out["tooLarge"] == ["TooLarge", "too_large", True]
    assert out["enqueued"] == ["string", False, True, True]
    assert out["published"] == [1, "number", "string"]
    assert out["flaky"] == [["flaky", 1], ["flaky", 2]]
    assert out["controlled"] == [True, "StaleReceipt"]
    # The flaky job: one automatic nack, one automatic ack; the manual one: neither.
    assert out["counts"] == [1, 1, 0, 0]
    assert out["states"] == ["closed", "closed", "closed"]
    # Reported to onError: the refusal and the handler's throw.
    assert "Forbidden" in out["reported"] and "Error" in out["reported"]

    async def settled() -> bool:
        _, a = await ahttp("GET", f"{site.http}/api/queues/work.a", admin)
        _, b = await ahttp("GET", f"{site.http}/api/queues/work.b", admin)
        counts = [(q["visible"], q["in_flight"], q["dead"]) for q in (a, b)]
        return counts == [(0, 0, 0), (0, 0, 1)]

    await wait_until(settled, "work.a acked, work.b dead-lettered")
    assert errors == []
    await page.close()


async def test_revoked_token_closes_with_4401_and_the_page_reconnects_with_a_new_one(
    browser: Any,
    site: GatewayProcess,
    admin: str,
) -> None:
    first = site.issue_token(*PAGE_SCOPES, name="revoked-page")
    second = site.issue_token(*PAGE_SCOPES, name="next-page")
    current = [first]
    view = TokenView(lambda: current[0])
    page = await open_example(browser, site, view)
    (before,) = await wait_until(
        lambda: subscriber_sockets(site, admin, "prices"), "the page's subscription"
    )
    try:
        site.manage("revoke_token", "revoked-page")
    except RuntimeError as exc:
        pytest.skip(f"manage.py revoke_token is not there yet: {str(exc)[:200]}")
    current[0] = second

    async def closed_by_gateway() -> bool:
        now = await subscriber_sockets(site, admin, "prices")
        return all(socket["id"] != before["id"] for socket in now)

    try:
        await wait_until(closed_by_gateway, "the revoked token's socket closed", timeout=10)
    except AssertionError:
        pytest.skip("the gateway does not close the sockets of a revoked token (4401) yet")

    async def replaced() -> bool:
        return len(await subscriber_sockets(site, admin, "prices")) == 1

    await wait_until(replaced, "the page's new socket, with the new token")
    await publish(site, admin, "prices", ["after-revoke"])

    async def shown() -> bool:
        return "after-revoke" in [body for _, body in await shown_prices(page)]

    await wait_until(shown, "a price after the reconnect with the new token")
    assert view.calls >= 2
    assert page.errors == []
    await page.close()


SLOW_PAGE_SCRIPT = """
async ({ token }) => {
  const { Leasecast } = await import("/static/leasecast/leasecast.js");
  const client = new Leasecast(location.origin, { token });
  let release;
  const gate = new Promise((resolve) => (release = resolve));
  window.slow = { bodies: [], drops: [], release, client };
  window.slow.sub = client.subscribe("slow", {
    credit: 2,
    capacity: 3,
    onFull: "drop_oldest",
    // The first message holds the page up: no credit goes back meanwhile.
    onMessage: async ({ body }) => {
      window.slow.bodies.push(body);
      if (body === 0) await gate;
    },
    onDrop: (n, { total }) => window.slow.drops.push([n, total]),
  });
  await window.slow.sub.whenOpen();
}
"""


async def test_an_async_on_message_holds_credit_and_drops_are_reported(
    browser: Any,
    site: GatewayProcess,
    admin: str,
) -> None:
    token = site.issue_token("subscribe:slow", name="slow-page")
    page = await browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(f"{site.http}/healthz")
    await page.evaluate(SLOW_PAGE_SCRIPT, {"token": token})
    await wait_until(lambda: subscriber_sockets(site, admin, "slow"), "the page's subscription")

    # Twenty prices while the page is stuck on the first: the gateway sends two
    # (the credit), keeps the newest three (capacity, drop_oldest), drops 15.
    await publish(site, admin, "slow", list(range(20)))
    (socket,) = await subscriber_sockets(site, admin, "slow")
    assert (socket["credit"], socket["buffered"], socket["dropped"]) == (0, 3, 15), socket
    # Sent by the gateway is not yet handled by the page: wait for the first,
    # then it must be the only one (the page holds the second back).
    await wait_until(lambda: page.evaluate("window.slow.bodies.length > 0"), "the first price")
    await asyncio.sleep(0.3)
    assert await page.evaluate("window.slow.bodies") == [0]

    await page.evaluate("window.slow.release()")
    await wait_until(
        lambda: page.evaluate("window.slow.bodies.length === 5"), "the buffered prices"
    )
    assert await page.evaluate("window.slow.bodies") == [0, 1, 17, 18, 19]
    assert await page.evaluate("window.slow.drops") == [[15, 15]]
    assert await page.evaluate("window.slow.sub.dropped") == 15
    await page.evaluate("window.slow.client.close()")
    assert errors == []
    await page.close()


REFUSED_TOKEN_SCRIPT = """
async ({ good }) => {
  const lc = await import("/static/leasecast/leasecast.js");
  const out = {};
  let sockets = 0;
  class Counted extends WebSocket {
    constructor(url) {
      super(url);
      sockets += 1;
    }
  }
  const bounded = (promise) =>
    Promise.race([promise, new Promise((r) => setTimeout(() => r("still retrying"), 10000))]);

  // A fixed token the gateway refuses: the subscription stops with Unauthorized,
  // told to onError, after one socket (no reconnect can help).
  const reported = [];
  const refused = new lc.Leasecast(location.origin, {
    token: "lc_not-a-token",
    WebSocket: Counted,
    onError: (error) => reported.push([error.name, error.code]),
  });
  const sub = refused.subscribe("prices", { onMessage: () => {} });
  const final = await bounded(sub.done);
  out.final = final && final.name
    ? [final.name, final.code, final instanceof lc.Unauthorized]
    : final;
  out.sockets = sockets;
  out.state = sub.state;
  try {
    await bounded(refused.enqueue("orders", 1));
    out.enqueue = "accepted";
  } catch (error) {
    out.enqueue = [error.name, error.code];
  }
  out.reported = reported;
  await refused.close();

  // With getToken: a refused token makes the client ask it again, and the next
  // token gets in (the refused socket counts as no reconnect, no gap).
  let calls = 0;
  const recovers = [];
  window.renewed = new lc.Leasecast(location.origin, {
    getToken: async () => (++calls === 1 ? "lc_not-a-token" : good),
    onError: () => {},
  });
  window.renewedSub = window.renewed.subscribe("prices", {
    onMessage: () => {},
    onRecover: (info) => recovers.push(info),
  });
  window.renewedOut = () => ({
    calls,
    recovers,
    reconnects: window.renewedSub.reconnects,
    state: window.renewedSub.state,
  });
  return out;
}
"""


async def test_a_refused_token_is_an_auth_error_not_an_outage(
    browser: Any,
    site: GatewayProcess,
    admin: str,
    page_token: str,
) -> None:
    """Issue 21, item 4: a refused token is told (4401), not a 1006 retried forever."""
    page = await browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(f"{site.http}/healthz")
    before = len(await subscriber_sockets(site, admin, "prices"))
    out = await page.evaluate(REFUSED_TOKEN_SCRIPT, {"good": page_token})
    assert out["final"] == ["Unauthorized", "unauthorized", True]
    assert out["sockets"] == 1
    assert out["state"] == "closed"
    assert out["enqueue"] == ["Unauthorized", "unauthorized"]
    assert out["reported"][0] == ["Unauthorized", "unauthorized"]
    assert {tuple(r) for r in out["reported"]} == {("Unauthorized", "unauthorized")}

    async def renewed_open() -> bool:
        now = await subscriber_sockets(site, admin, "prices")
        state = await page.evaluate("window.renewedOut()")
        return len(now) == before + 1 and state["state"] == "open"

    await wait_until(renewed_open, "the subscription open with the token getToken gave next")
    renewed = await page.evaluate("window.renewedOut()")
    assert (renewed["calls"], renewed["recovers"], renewed["reconnects"]) == (2, [], 0)
    await page.evaluate("window.renewed.close()")
    assert errors == []
    await page.close()


MULTIPLEX_PAGE_SCRIPT = """
async ({ token, topics, room }) => {
  const { Leasecast } = await import("/static/leasecast/leasecast.js");
  const client = new Leasecast(location.origin, { token });
  const got = Object.fromEntries(topics.map((t) => [t, []]));
  const joins = [];
  const leaves = [];
  const subs = topics.map((topic) =>
    client.subscribe(topic, { credit: 4, onMessage: ({ body }) => got[topic].push(body) }),
  );
  const roomSub = client.subscribe(room, {
    presence: true,
    onMessage: () => {},
    onJoin: (m) => joins.push([m.user, m.info]),
    onLeave: (m) => leaves.push(m.user),
  });
  window.mux = { client, got, subs, roomSub, joins, leaves };
  await Promise.all([...subs, roomSub].map((s) => s.whenOpen()));
}
"""


async def test_several_subscriptions_share_one_socket_and_see_presence(
    browser: Any,
    site: GatewayProcess,
    admin: str,
) -> None:
    topics = [f"mux{uuid.uuid4().hex[:6]}" for _ in range(3)]
    room = f"room{uuid.uuid4().hex[:6]}"
    status, _ = await ahttp("PATCH", f"{site.http}/api/topics/{room}", admin, {"presence": True})
    assert status == 200
    name = f"mux-page-{uuid.uuid4().hex[:6]}"
    token = site.issue_token(*(f"subscribe:{t}" for t in [*topics, room]), name=name)
    page = await browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(f"{site.http}/healthz")
    await page.evaluate(MULTIPLEX_PAGE_SCRIPT, {"token": token, "topics": topics, "room": room})

    async def one_socket_for_all() -> list[dict[str, Any]]:
        _, stats = await ahttp("GET", f"{site.http}/api/stats", admin)
        mine = [s for s in stats["sockets"] if s["principal"] == name]
        carried = {t["topic"] for s in mine for t in s.get("topics", [])}
        return mine if carried == {*topics, room} else []

    sockets = await wait_until(one_socket_for_all, "the page's one socket carrying four topics")
    assert [s["kind"] for s in sockets] == ["multiplex"]

    # Each subscription gets exactly its topic's messages, past its credit window.
    for i, topic in enumerate(topics):
        await publish(site, admin, topic, [f"{topic}-{n}" for n in range(10 + i)])

    async def all_got() -> bool:
        got = await page.evaluate("window.mux.got")
        return all(len(got[t]) == 10 + i for i, t in enumerate(topics))

    await wait_until(all_got, "every topic's messages")
    got = await page.evaluate("window.mux.got")
    assert got == {t: [f"{t}-{n}" for n in range(10 + i)] for i, t in enumerate(topics)}

    # Presence: another subscriber joins and leaves; the page is told of both,
    # and client.presence() lists both while it is there.
    visitor = mint("visitor-7", [f"subscribe:{room}"], info={"name": "Seven"})
    async with await Socket.open(f"{site.ws}/ws/topics/{room}/", visitor):
        await wait_until(
            lambda: page.evaluate("window.mux.joins.length === 1"), "the visitor's join"
        )
        assert await page.evaluate("window.mux.joins") == [["visitor-7", {"name": "Seven"}]]
        doc = await page.evaluate(f"window.mux.client.presence({json.dumps(room)})")
        assert doc["count"] == 2 and "visitor-7" in [c["user"] for c in doc["clients"]]
    await wait_until(lambda: page.evaluate("window.mux.leaves.length === 1"), "the leave")
    assert await page.evaluate("window.mux.leaves") == ["visitor-7"]
    await page.evaluate("window.mux.client.close()")
    assert errors == []
    await page.close()
