"""The dashboard and the admin in a real browser: Debian's Chromium driven by Playwright."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.databases import ROOT, sqlite_database
from tests.integration.harness import GatewayProcess, Socket, ahttp, unique

CHROMIUM = os.environ.get("LEASECAST_CHROMIUM", "/usr/bin/chromium")


def _browser_missing() -> str | None:
    if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM} (make test installs Debian's chromium when run as root)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed"
    return None


pytestmark = pytest.mark.skipif(_browser_missing() is not None, reason=str(_browser_missing()))

STAFF, PASSWORD = "ops", "correct horse battery"


@pytest.fixture(scope="module")
def site() -> Iterator[GatewayProcess]:
    var = Path(tempfile.mkdtemp(prefix="leasecast-browser-"))
    with sqlite_database(var) as env:
        gateway = GatewayProcess(env, var, name="browser")
        gateway.manage(
            "shell",
            "-c",
            "from django.contrib.auth.models import User;"
            f"User.objects.create_superuser({STAFF!r}, 'ops@example.com', {PASSWORD!r});"
            f"User.objects.create_user('visitor', 'v@example.com', {PASSWORD!r})",
        )
        gateway.start()
        yield gateway
        gateway.stop()


def audit_log(site: GatewayProcess) -> str:
    """Django's admin log, as the gateway's database holds it."""
    return site.manage(
        "shell",
        "-c",
        "from django.contrib.admin.models import LogEntry;"
        "print('\\n'.join(f'{e.user.username} {e.object_repr}: {e.change_message}' "
        "for e in LogEntry.objects.all()))",
    )


@pytest.fixture(scope="module")
def token(site: GatewayProcess) -> str:
    return site.issue_token("admin", name="browser")


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-quic",
                "--no-first-run",
            ],
        )
        yield browser
        await browser.close()


async def login(browser: Any, site: GatewayProcess, username: str = STAFF) -> Any:
    page = await browser.new_page(viewport={"width": 1440, "height": 1000})
    page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
    await page.goto(f"{site.http}/admin/login/?next=/dashboard/")
    await page.fill("#id_username", username)
    await page.fill("#id_password", PASSWORD)
    await page.click("input[type=submit]")
    return page


async def test_anonymous_and_non_staff_are_refused(browser: Any, site: GatewayProcess) -> None:
    page = await browser.new_page()
    await page.goto(f"{site.http}/dashboard/")
    assert "/admin/login/" in page.url
    page = await login(browser, site, "visitor")
    assert "/admin/login/" in page.url  # still on the login page
    assert "staff account" in (await page.content())  # Django refuses non-staff
    status, _ = await ahttp("GET", f"{site.http}/api/stats")
    assert status == 401


async def test_live_rows_counters_drops_and_purge(
    browser: Any, site: GatewayProcess, token: str
) -> None:
    page = await login(browser, site)
    await page.wait_for_url(re.compile(r".*/dashboard/$"))
    await page.wait_for_selector("#status.live", timeout=10_000)
    queue, topic = unique("orders"), unique("prices")

    async with (
        await Socket.open(f"{site.ws}/ws/queues/{queue}/?prefetch=5", token) as worker,
        await Socket.open(
            f"{site.ws}/ws/topics/{topic}/?capacity=2&credit=0", token
        ),  # stalled: no credit
        await Socket.open(f"{site.ws}/ws/produce/", token) as producer,
    ):
        # A worker and a subscriber appear within seconds of connecting.
        await page.wait_for_selector(
            f"#sockets tr[data-kind=worker][data-name='{queue}']", timeout=5000
        )
        await page.wait_for_selector(
            f"#sockets tr[data-kind=subscriber][data-name='{topic}']", timeout=5000
        )

        # Counters move as messages flow.
        for i in range(5):
            await producer.request({"op": "enqueue", "queue": queue, "body": {"n": i}})
        for frame in await worker.deliveries(5):
            await worker.request({"op": "ack", "receipt": frame["receipt"]})
        await page.wait_for_function(
            """(q) => [...document.querySelectorAll('#sockets tr[data-kind=worker]')]
                .some(r => r.dataset.name === q && r.textContent.includes('5 acked'))""",
            arg=queue,
            timeout=5000,
        )

        # A slow subscriber's drops rise and its row stands out.
        for i in range(50):
            await producer.request({"op": "publish", "topic": topic, "body": i})
        row = page.locator(f"#sockets tr[data-kind=subscriber][data-name='{topic}']")
        await page.wait_for_function(
            "(sel) => document.querySelector(sel)?.classList.contains('hot')",
            arg=f"#sockets tr[data-kind=subscriber][data-name='{topic}']",
            timeout=5000,
        )
        assert "48" in await row.inner_text()

        # A queue no worker drains: its names and bodies are shown as text.
        idle = unique("idle")
        xss = "<img src=x onerror=window.pwned=1>"
        for i in range(3):
            await producer.request({"op": "enqueue", "queue": idle, "body": xss if i == 0 else i})
        queue_row = page.locator(f"#queues tr[data-queue='{idle}'] td.visible")
        visible = f"#queues tr[data-queue='{idle}'] td.visible"
        count_is = "([sel, n]) => document.querySelector(sel)?.textContent === n"
        await page.wait_for_function(count_is, arg=[visible, "3"], timeout=5000)
        # docs/dashboard.png is refreshed on request only, so a test run
        # leaves the work tree clean: LEASECAST_SCREENSHOT=docs/dashboard.png.
        shot = os.environ.get("LEASECAST_SCREENSHOT") or str(site.var_dir / "dashboard.png")
        await page.screenshot(path=str(ROOT / shot), full_page=True)

        # Purge from the dashboard (the confirmation is accepted): the count drops.
        await page.click(f"#queues tr[data-queue='{idle}'] button.purge")
        await page.wait_for_function(count_is, arg=[visible, "0"], timeout=5000)
        assert await queue_row.inner_text() == "0"
        assert await page.evaluate("window.pwned") is None
        assert "Purged 3 messages (dashboard or API)." in audit_log(site)

        # Disconnect the worker from the dashboard (confirmed): the gateway closes
        # its socket with 4000, its row goes, and the admin log records who did it.
        worker_row = f"#sockets tr[data-kind=worker][data-name='{queue}']"
        await page.click(f"{worker_row} button.danger")
        with pytest.raises(ConnectionError, match="4000"):
            await worker.next(timeout=10)
        await page.wait_for_selector(worker_row, state="detached", timeout=5000)
        for _ in range(30):  # the entry is written just after the socket closes
            if f"{STAFF} socket" in audit_log(site):
                break
            await asyncio.sleep(0.2)
        (line,) = [x for x in audit_log(site).splitlines() if x.startswith(f"{STAFF} socket")]
        assert line.endswith(": Disconnected from the dashboard.")


async def test_admin_purge_and_message_bodies_escaped(
    browser: Any, site: GatewayProcess, token: str
) -> None:
    queue = unique("adminq")
    async with await Socket.open(f"{site.ws}/ws/produce/", token) as producer:
        for body in ["<script>window.pwned=1</script>", 2, 3]:
            await producer.request({"op": "enqueue", "queue": queue, "body": body})
    page = await login(browser, site)
    # The queue's messages, through the admin's filter: exactly its three.
    await page.goto(f"{site.http}/admin/gateway/message/")
    await page.click(f"#changelist-filter a:text-is('{queue}')")
    await page.wait_for_url(re.compile(r".*queue__id__exact=\d+"))
    assert await page.locator("#result_list tbody tr").count() == 3
    await page.click("text=window.pwned")
    assert await page.evaluate("window.pwned") is None  # shown as text, never run
    assert "&lt;script&gt;" in await page.content()

    # Purge from the admin: the queue's counts (visible / in flight / dead) drop.
    await page.goto(f"{site.http}/admin/gateway/queue/?q={queue}")
    counts = page.locator("#result_list td.field-counts")
    assert await counts.inner_text() == "3 / 0 / 0"
    await page.check("input.action-select")
    await page.select_option("select[name=action]", "purge_queues")
    await page.click("button[name=index]")
    await page.wait_for_selector("text=purged 3 messages")
    assert await counts.inner_text() == "0 / 0 / 0"  # the list the action returned to
    assert "Purged 3 messages (in-flight ones kept)." in audit_log(site)
    status, stats = await ahttp("GET", f"{site.http}/api/queues/{queue}", token)
    assert status == 200 and stats["visible"] == 0
