"""Server-sent events in Chromium: the htmx example page, and a bare ``EventSource``.

The example page (examples/htmx) is served by a plain static server of its
own (another origin, allowed by ``GATEWAY_ALLOWED_ORIGINS``) and reads a
topic's stream from gateway A of two gateways sharing topics through Redis.
Messages are published through B. A is killed (``kill -9``) while the pages
read, messages are published meanwhile, and A is started again on its port:
each page's ``EventSource`` reconnects by itself, sending ``Last-Event-ID``,
and shows every message exactly once, in order. A body made to run script
in the page is shown as text.
"""

from __future__ import annotations

import functools
import http.server
import json
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.support.browsers import browser_missing
from tests.support.clients import ahttp, unique
from tests.support.databases import ROOT
from tests.support.gateways import GatewayProcess, free_port, gateways_on_redis

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))

EXAMPLE = ROOT / "examples" / "htmx"
XSS = '<img src=x onerror="window.__xss = 1">'

#: A page with nothing but an EventSource: what the browser itself does.
BARE_PAGE = """<!doctype html><title>bare</title><script>
const params = new URLSearchParams(location.search);
window.got = [];
window.opens = 0;
const source = new EventSource(params.get("url"));
source.onopen = () => { window.opens += 1; };
source.addEventListener("message", (e) => window.got.push([e.lastEventId, e.data]));
</script>"""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log on the test's output."""


@pytest.fixture(scope="module")
def pages() -> Iterator[str]:
    """The example's directory (and the bare page) on a static server of its own origin."""
    root = Path(tempfile.mkdtemp(prefix="leasecast-htmx-"))
    (root / "htmx").symlink_to(EXAMPLE)
    (root / "bare.html").write_text(BARE_PAGE)
    port = free_port()
    handler = functools.partial(_Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{port}"
    server.shutdown()


async def publish(gateway: GatewayProcess, token: str, topic: str, bodies: list[Any]) -> None:
    status, reply = await ahttp(
        "POST",
        f"{gateway.http}/api/topics/{topic}/messages",
        token,
        {"messages": [{"body": body} for body in bodies]},
    )
    assert status == 200, reply


async def test_the_htmx_example_and_an_event_source_miss_nothing_across_a_gateway_restart(
    browser: Any, pages: str, redis_url: str
) -> None:
    var = Path(tempfile.mkdtemp(prefix="leasecast-sse-browser-"))
    topic = unique("live")
    with gateways_on_redis(var, redis_url, GATEWAY_ALLOWED_ORIGINS=pages) as (a, b, admin):
        for gateway in (a, b):
            status, reply = await ahttp(
                "PATCH", f"{gateway.http}/api/topics/{topic}", admin, {"history_size": 1000}
            )
            assert status == 200, reply
        token = a.issue_token(f"subscribe:{topic}", name="page")
        errors: list[str] = []
        htmx_page = await browser.new_page()
        htmx_page.on("pageerror", lambda exc: errors.append(str(exc)))
        await htmx_page.goto(
            f"{pages}/htmx/index.html?gateway={a.http}&topic={topic}&token={token}"
        )
        await htmx_page.wait_for_function(
            "document.getElementById('status').textContent === 'live'", timeout=15_000
        )
        bare = await browser.new_page()
        bare.on("pageerror", lambda exc: errors.append(str(exc)))
        stream = f"{a.http}/sse/topics/{topic}/?token={token}"
        await bare.goto(f"{pages}/bare.html?url={quote(stream, safe='')}")
        await bare.wait_for_function("window.opens === 1", timeout=15_000)

        bodies: list[Any] = [{"n": i} for i in range(10)] + [XSS]
        await publish(b, admin, topic, bodies)
        await htmx_page.wait_for_function(
            f"document.querySelectorAll('#messages li').length >= {len(bodies)}", timeout=15_000
        )
        await bare.wait_for_function(f"window.got.length >= {len(bodies)}", timeout=15_000)

        a.kill()  # the pages' streams break without an end
        more: list[Any] = [{"n": i} for i in range(10, 20)]
        await publish(b, admin, topic, more)
        bodies += more
        a.start()
        later: list[Any] = [{"n": i} for i in range(20, 30)]
        await publish(b, admin, topic, later)
        bodies += later

        shown = f"document.querySelectorAll('#messages li').length >= {len(bodies)}"
        await htmx_page.wait_for_function(shown, timeout=30_000)
        await bare.wait_for_function(f"window.got.length >= {len(bodies)}", timeout=30_000)
        expected = [json.dumps(body, separators=(",", ":")) for body in bodies]
        texts = await htmx_page.eval_on_selector_all(
            "#messages li", "items => items.map(i => i.textContent)"
        )
        assert texts == expected
        notices = await htmx_page.eval_on_selector_all(
            "#notices li", "items => items.map(i => JSON.parse(i.textContent))"
        )
        assert notices and all(n.get("recovered") is True for n in notices), notices
        assert await htmx_page.evaluate("window.__xss") is None
        got = await bare.evaluate("window.got")
        assert [data for _, data in got] == expected
        epoch = got[0][0].split(":")[0]
        offsets = range(1, len(bodies) + 1)
        assert [event_id for event_id, _ in got] == [f"{epoch}:{i}" for i in offsets]
        assert await bare.evaluate("window.opens") >= 2  # it reconnected by itself
        assert errors == []
        await htmx_page.close()
        await bare.close()
