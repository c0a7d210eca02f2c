"""Hostile message bodies, keys and token names stay inert in the admin and the dashboard.

Debian's Chromium, driven by Playwright, opens every page that shows them.
The test fails if any dialog opens (every payload calls ``alert``) or if any
payload's markup turns into an element. It first proves, on a page that does
inject the payloads, that this detection sees both.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browsers import PASSWORD, STAFF, browser_missing
from tests.support.clients import Socket, ahttp, unique
from tests.support.databases import sqlite_database
from tests.support.gateways import GatewayProcess

pytestmark = pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing()))

PAYLOADS = [
    "<img src=x onerror=alert(1)>",
    "<script>alert(2)</script>",
    '"><svg onload=alert(3)>',
    "</pre><script>alert(4)</script>",
    '\'><iframe srcdoc="<script>parent.alert(5)</script>"></iframe>',
]
#: What a payload that became markup leaves in the page.
INJECTED = """() => [
    ...document.querySelectorAll('img[src="x"], svg[onload], iframe[srcdoc]'),
    ...[...document.scripts].filter((s) => /alert\\(/.test(s.textContent)),
    ...[...document.querySelectorAll('*')].filter((e) => e.hasAttribute('onerror')),
].map((e) => e.outerHTML.slice(0, 120))"""


@pytest.fixture(scope="module")
def site() -> Iterator[GatewayProcess]:
    var = Path(tempfile.mkdtemp(prefix="leasecast-xss-"))
    with sqlite_database(var) as env:
        gateway = GatewayProcess(env, var, name="xss")
        gateway.manage(
            "shell",
            "-c",
            "from django.contrib.auth.models import User;"
            f"User.objects.create_superuser({STAFF!r}, 'ops@example.com', {PASSWORD!r})",
        )
        gateway.start()
        yield gateway
        gateway.stop()


class Watch:
    """Dialogs a page opened, and what each page had injected."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self.dialogs: list[str] = []
        self.injected: dict[str, list[str]] = {}
        page.on("dialog", self._dialog)

    async def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(dialog.message)
        await dialog.dismiss()

    async def check(self, label: str) -> None:
        """Record this page's injected elements, after its scripts had a moment to run."""
        await self.page.wait_for_load_state("load")
        await self.page.evaluate("() => new Promise((r) => setTimeout(r, 300))")
        found = await self.page.evaluate(INJECTED)
        if found:
            self.injected[label] = found


async def test_the_detection_sees_an_injected_payload(browser: Any) -> None:
    page = await browser.new_page()
    watch = Watch(page)
    await page.set_content("<div>" + "".join(PAYLOADS) + "</div>")
    await watch.check("injected on purpose")
    for _ in range(50):
        if len(watch.dialogs) >= 3:
            break
        await asyncio.sleep(0.1)
    assert {"1", "2", "3"} <= set(watch.dialogs), watch.dialogs
    assert len(watch.injected["injected on purpose"]) >= 3, watch.injected


async def test_hostile_bodies_keys_and_names_stay_text(browser: Any, site: GatewayProcess) -> None:
    admin = site.issue_token("admin", name="xss-admin")
    hostile = site.issue_token("consume:*", "enqueue:*", "subscribe:*", name=PAYLOADS[0])
    doomed_name = PAYLOADS[1]
    site.issue_token("consume:x", name=doomed_name)
    queue, dead_queue = unique("xss"), unique("xssdead")
    ids: list[str] = []
    async with await Socket.open(f"{site.ws}/ws/produce/", admin) as producer:
        for i, payload in enumerate(PAYLOADS):
            for body in (payload, {"html": payload, "list": [payload]}):
                reply = await producer.request(
                    {
                        "op": "enqueue",
                        "queue": queue,
                        "body": body,
                        "key": f"{payload}{i}{body!r}",
                        "group": f"{payload}{i}",
                    }
                )
                ids.append(reply["id"])
        await producer.request({"op": "enqueue", "queue": dead_queue, "body": PAYLOADS[3]})
    async with await Socket.open(f"{site.ws}/ws/queues/{dead_queue}/", admin) as worker:
        (delivery,) = await worker.deliveries(1)
        await worker.request({"op": "reject", "receipt": delivery["receipt"]})

    page = await browser.new_page(viewport={"width": 1440, "height": 1000})
    watch = Watch(page)  # from the first page on: no dialog is accepted
    await page.goto(f"{site.http}/admin/login/?next=/dashboard/")
    await page.fill("#id_username", STAFF)
    await page.fill("#id_password", PASSWORD)
    await page.click("input[type=submit]")
    await page.wait_for_url(re.compile(r".*/dashboard/$"))

    # The admin: message list, the dead ones, each message, searches by key.
    await page.goto(f"{site.http}/admin/gateway/message/")
    await watch.check("message list")
    listed = await page.locator("#result_list").inner_text()
    assert PAYLOADS[0][:20] in listed  # the bodies are shown, as text
    await page.goto(f"{site.http}/admin/gateway/message/?state=dead")
    await watch.check("dead messages")
    assert PAYLOADS[3][:20] in await page.locator("#result_list").inner_text()
    for msg_id in ids:
        await page.goto(f"{site.http}/admin/gateway/message/{msg_id}/change/")
        await watch.check(f"message {msg_id}")
    # The last change page shows its body (a JSON object holding the payload) as text.
    shown = await page.locator("pre").first.inner_text()
    await page.goto(f"{site.http}/admin/gateway/message/?q=onerror")
    await watch.check("search by key")

    # Tokens named with a payload: the list, a change page, and the admin log after
    # a revoke (the index's recent actions show the name).
    await page.goto(f"{site.http}/admin/gateway/token/")
    await watch.check("token list")
    assert PAYLOADS[0] in await page.locator("#result_list").inner_text()
    row = page.locator("#result_list tr", has_text=doomed_name)
    await row.locator("input.action-select").check()
    await page.select_option("select[name=action]", "revoke_tokens")
    await page.click("button[name=index]")
    await page.wait_for_selector("text=Revoked.")
    await watch.check("after revoke")
    await row.locator("th a").click()
    await watch.check("token change page")
    assert await page.input_value("#id_name") == doomed_name
    await page.goto(f"{site.http}/admin/")
    await watch.check("admin index, recent actions")
    assert doomed_name in await page.locator("#recent-actions-module").inner_text()

    # The dashboard's sockets table: the socket of the token named with a payload
    # shows that name, as text.
    async with await Socket.open(f"{site.ws}/ws/queues/{queue}/?prefetch=1", hostile) as w:
        await w.deliveries(1)
        await page.goto(f"{site.http}/dashboard/")
        cell = f"#sockets tr[data-kind=worker][data-name='{queue}'] td.principal"
        await page.wait_for_selector(cell, timeout=10_000)
        assert await page.locator(cell).inner_text() == PAYLOADS[0]
        await watch.check("dashboard")

    # Dashboard v2: the message browser shows bodies and groups (visible, then the
    # dead queue), and the alerts panel and heatmap a dropping subscriber whose
    # token is named with a payload: all as text.
    await page.goto(f"{site.http}/dashboard/")
    await page.wait_for_selector("#status.live", timeout=10_000)
    await page.fill("#queue-filter", queue)
    await page.click(f"#queues tr[data-queue='{queue}'] button.browse", timeout=10_000)
    await page.wait_for_selector("#messages tr[data-id]", timeout=5000)
    shown_bodies = await page.locator("#messages").inner_text()
    assert PAYLOADS[1] in shown_bodies and f"{PAYLOADS[2]}2" in shown_bodies
    await watch.check("dashboard message browser")
    await page.fill("#queue-filter", dead_queue)
    await page.click(f"#queues tr[data-queue='{dead_queue}'] button.browse", timeout=10_000)
    await page.click("#browser-states button[data-state=dead]")
    await page.wait_for_selector("#messages tr[data-state=dead]", timeout=5000)
    assert PAYLOADS[3] in await page.locator("#messages").inner_text()
    await watch.check("dashboard dead messages")
    topic = unique("xsstopic")
    async with (
        await Socket.open(
            f"{site.ws}/ws/topics/{topic}/?on_full=drop_newest&capacity=1&credit=0", hostile
        ),
        await Socket.open(f"{site.ws}/ws/produce/", admin) as publisher,
    ):
        for payload in PAYLOADS * 4:
            await publisher.request({"op": "publish", "topic": topic, "body": payload})
        await page.wait_for_selector(f"#alerts li[data-topic='{topic}']", timeout=10_000)
        await page.wait_for_selector("#heatmap tbody tr", timeout=10_000)
        await page.wait_for_selector(f"#sockets tr[data-name='{topic}'] td.principal", timeout=5000)
        assert (
            await page.inner_text(f"#sockets tr[data-name='{topic}'] td.principal") == PAYLOADS[0]
        )
        await watch.check("dashboard alerts and heatmap")

    status, _ = await ahttp("GET", f"{site.http}/api/stats", admin)
    assert status == 200
    assert watch.dialogs == [], watch.dialogs
    assert watch.injected == {}, watch.injected
    assert PAYLOADS[-1].replace('"', '\\"') in shown, shown  # shown whole, as text
