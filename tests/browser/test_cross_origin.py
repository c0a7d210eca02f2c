"""The JavaScript client from a page of another origin (issue 21, item 3).

A page served by another server (here a plain ``http.server`` on another
port, a second origin) imports ``/static/leasecast/leasecast.js`` from the
gateway and connects with a token. The gateway serves the client with CORS
for the origins of ``GATEWAY_ALLOWED_ORIGINS`` only: for any other origin the
browser blocks the import, as before.
"""

from __future__ import annotations

import functools
import http.server
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browsers import browser_missing
from tests.support.clients import Socket
from tests.support.databases import sqlite_database
from tests.support.gateways import GatewayProcess, free_port

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))

CLIENT = "/static/leasecast/leasecast.js"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log on the test's output."""


def page_server(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A plain static server on a free loopback port: a second origin."""
    (root / "index.html").write_text("<!doctype html><title>app</title><p id=status>page</p>")
    port = free_port()
    handler = functools.partial(_Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def app_pages() -> Iterator[tuple[str, str]]:
    """Two page servers: an allowed origin and one the gateway does not know."""
    root = Path(tempfile.mkdtemp(prefix="leasecast-pages-"))
    allowed, allowed_origin = page_server(root)
    other, other_origin = page_server(root)
    yield allowed_origin, other_origin
    allowed.shutdown()
    other.shutdown()


@pytest.fixture(scope="module")
def site(app_pages: tuple[str, str]) -> Iterator[GatewayProcess]:
    allowed_origin, _ = app_pages
    var = Path(tempfile.mkdtemp(prefix="leasecast-cors-"))
    with sqlite_database(var) as env:
        env["GATEWAY_ALLOWED_ORIGINS"] = f"https://ops.example.com, {allowed_origin}"
        gateway = GatewayProcess(env, var, name="cors")
        gateway.start()
        yield gateway
        gateway.stop()


def fetch(url: str, method: str = "GET", **headers: str) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(url, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        response.read()
        return response.status, {k.lower(): v for k, v in response.headers.items()}


def test_the_client_is_served_with_cors_for_allowed_origins_only(
    site: GatewayProcess, app_pages: tuple[str, str]
) -> None:
    allowed, other = app_pages
    status, headers = fetch(site.http + CLIENT, Origin=allowed)
    assert status == 200 and headers["access-control-allow-origin"] == allowed
    assert "origin" in headers.get("vary", "").lower()
    assert "access-control-allow-credentials" not in headers  # never the session cookie
    for origin in (other, "https://evil.example", "null"):
        status, headers = fetch(site.http + CLIENT, Origin=origin)
        assert status == 200 and "access-control-allow-origin" not in headers, origin
    status, headers = fetch(site.http + CLIENT)
    assert status == 200 and "access-control-allow-origin" not in headers
    # A preflight (a module fetched with credentials or headers asks first).
    status, headers = fetch(
        site.http + CLIENT,
        "OPTIONS",
        Origin=allowed,
        **{"Access-Control-Request-Method": "GET"},
    )
    assert status == 204 and headers["access-control-allow-origin"] == allowed
    assert "GET" in headers["access-control-allow-methods"]
    # CORS is for the client (and event streams), not for the API.
    status, headers = fetch(site.http + "/healthz", Origin=allowed)
    assert status == 200 and "access-control-allow-origin" not in headers


PAGE_SCRIPT = """
async ({ gateway, token }) => {
  const { Leasecast } = await import(`${gateway}/static/leasecast/leasecast.js`);
  window.received = [];
  window.client = new Leasecast(gateway, { token });
  window.sub = window.client.subscribe("news", {
    onMessage: (m) => window.received.push(m.body),
  });
  await window.sub.whenOpen();
  return window.sub.state;
}
"""


async def test_a_page_of_another_origin_imports_the_client_and_connects(
    browser: Any,
    site: GatewayProcess,
    app_pages: tuple[str, str],
) -> None:
    allowed, other = app_pages
    token = site.issue_token("subscribe:news", name="other-origin-page")
    admin = site.issue_token("admin", name="cors-admin")
    page = await browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    await page.goto(f"{allowed}/index.html")
    assert await page.evaluate(PAGE_SCRIPT, {"gateway": site.http, "token": token}) == "open"
    async with await Socket.open(f"{site.ws}/ws/produce/", admin) as producer:
        reply = await producer.request({"op": "publish", "topic": "news", "body": "hello"})
        assert reply["op"] == "published"
    await page.wait_for_function("window.received.includes('hello')", timeout=15_000)
    await page.evaluate("window.client.close()")
    assert errors == []

    # A page of an origin the gateway does not list cannot import it.
    await page.goto(f"{other}/index.html")
    refused = await page.evaluate(
        """async (gateway) => {
          try {
            await import(`${gateway}/static/leasecast/leasecast.js`);
            return "imported";
          } catch (error) {
            return error.name;
          }
        }""",
        site.http,
    )
    assert refused == "TypeError"
    await page.close()
