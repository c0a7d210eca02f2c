"""The dashboard and the admin in a real browser: Debian's Chromium driven by Playwright."""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.browsers import PASSWORD, STAFF, browser_missing
from tests.support.clients import Socket, ahttp, unique
from tests.support.databases import ROOT, sqlite_database
from tests.support.gateways import GatewayProcess, gateways_on_redis

pytestmark = [
    pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing())),
    # Alone, after the parallel run: a page starved of CPU by the parallel
    # workers missed Playwright's 30 s wait for the admin's queue filter.
    pytest.mark.serial,
]


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
        # All 50 published, 2 buffered: 48 dropped (the row updates in place each second).
        await page.wait_for_function(
            "(sel) => document.querySelector(sel)?.textContent.includes('48 (')",
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


# -- Dashboard v2: history, heatmap and alerts, message browser, layout, scale -----


async def staff_page(browser: Any, site: GatewayProcess, width: int = 1440) -> Any:
    """A logged-in staff page on the dashboard, live."""
    page = await login(browser, site)
    await page.set_viewport_size({"width": width, "height": 1000})
    await page.wait_for_url(re.compile(r".*/dashboard/$"))
    await page.wait_for_selector("#status.live", timeout=10_000)
    return page


#: The largest value a chart's polyline reaches, as a share of its height (0: flat).
CHART_PEAK = """(series) => {
    const svg = document.querySelector(`figure[data-series=${series}] svg`);
    const line = svg.querySelector('polyline');
    if (!line) return 0;
    const h = svg.clientHeight;
    const ys = line.getAttribute('points').split(' ').filter(Boolean).map((p) => +p.split(',')[1]);
    return ys.length ? (h - Math.min(...ys)) / h : 0;
}"""


async def test_charts_draw_history_after_a_reload(
    browser: Any, site: GatewayProcess, token: str
) -> None:
    queue = unique("hist")
    async with (
        await Socket.open(f"{site.ws}/ws/produce/", token) as producer,
        await Socket.open(f"{site.ws}/ws/queues/{queue}/?prefetch=50", token) as worker,
    ):
        page = await staff_page(browser, site)
        await page.select_option("#focus-queue", queue, timeout=10_000)  # once listed
        for i in range(40):
            await producer.request({"op": "enqueue", "queue": queue, "body": i})
        for frame in await worker.deliveries(40):
            await worker.request({"op": "ack", "receipt": frame["receipt"]})
        # The burst shows on the open page, then the rate falls back to 0 ...
        await page.wait_for_function(f"() => ({CHART_PEAK})('acked') > 0.3", timeout=10_000)
        await page.wait_for_function(
            "() => document.querySelector('figure[data-series=acked] .now').textContent === '0'",
            timeout=20_000,
        )
    # ... and a page opened afresh draws it from the gateway's history, before
    # and whatever it measures itself.
    await page.reload()
    await page.wait_for_selector("#status.live", timeout=10_000)
    await page.select_option("#focus-queue", queue, timeout=10_000)
    assert await page.evaluate(CHART_PEAK, "acked") > 0.3
    assert await page.evaluate(CHART_PEAK, "enqueued") > 0.3
    points = await page.get_attribute("figure[data-series=acked] svg", "data-points")
    assert points is not None and int(points) >= 2
    await page.close()


async def test_heatmap_and_alerts_show_a_slow_drop_newest_subscriber(
    browser: Any, site: GatewayProcess, token: str
) -> None:
    topic = unique("ticks")
    page = await staff_page(browser, site)
    alert = f"#alerts li.consumer[data-topic='{topic}']"
    async with await Socket.open(f"{site.ws}/ws/produce/", token) as producer:
        slow = await Socket.open(
            f"{site.ws}/ws/topics/{topic}/?on_full=drop_newest&capacity=2&credit=0", token
        )

        async def publish() -> None:
            while True:
                await producer.request({"op": "publish", "topic": topic, "body": "tick"})
                await asyncio.sleep(0.05)

        publishing = asyncio.create_task(publish())
        try:
            await page.wait_for_selector(alert, timeout=5000)
            text = await page.locator(alert).inner_text()
            assert "dropped" in text and "drop_newest" in text, text
            row = page.locator("#heatmap tbody tr", has_text=topic)
            await row.wait_for(timeout=5000)
            assert await row.locator("rect").count() >= 1
            assert await page.locator("#heatmap-empty").is_hidden()
            # Its sockets row is on the first page, marked.
            await page.wait_for_selector(
                f"#sockets tr.hot[data-kind=subscriber][data-name='{topic}']", timeout=5000
            )
        finally:
            publishing.cancel()
            await slow.close()
        # It leaves: the alert and its heatmap row go.
        await page.wait_for_selector(alert, state="detached", timeout=5000)
        await row.wait_for(state="detached", timeout=5000)
    await page.close()


async def test_message_browser_lists_dead_and_requeue_reaches_a_worker(
    browser: Any, site: GatewayProcess, token: str
) -> None:
    queue = unique("browse")
    async with await Socket.open(f"{site.ws}/ws/produce/", token) as producer:
        await producer.request(
            {"op": "enqueue", "queue": queue, "body": {"order": 1, "note": "doomed"}, "group": "g1"}
        )
        for body in ({"order": 2}, {"order": 3}):
            await producer.request({"op": "enqueue", "queue": queue, "body": body})
    async with await Socket.open(f"{site.ws}/ws/queues/{queue}/?prefetch=1", token) as worker:
        (first,) = await worker.deliveries(1)
        await worker.request({"op": "reject", "receipt": first["receipt"]})
        (second,) = await worker.deliveries(1)
        await worker.request({"op": "reject", "receipt": second["receipt"]})
        (third,) = await worker.deliveries(1)  # held: in flight

        page = await staff_page(browser, site)
        await page.fill("#queue-filter", queue)
        await page.click(f"#queues tr[data-queue='{queue}'] button.browse", timeout=10_000)
        await page.click("#browser-states button[data-state=dead]")
        dead = page.locator(f"#messages tr[data-id='{first['id']}'][data-state=dead]")
        await dead.wait_for(timeout=5000)
        text = await dead.inner_text()
        assert '"note":"doomed"' in text and "g1" in text and "rejected" in text, text

        # Another operator requeues the second one after the page listed it:
        # the page's requeue says so and changes nothing.
        await page.click("#browser-refresh")
        stale = page.locator(f"#messages tr[data-id='{second['id']}'] button.requeue")
        await stale.wait_for(timeout=5000)
        requeue = f"{site.http}/api/queues/{queue}/messages/{second['id']}/requeue"
        status, _ = await ahttp("POST", requeue, token)
        assert status == 200
        await stale.click()
        await page.wait_for_selector("#browser-notice.warn", timeout=5000)
        assert "Nothing was changed" in await page.inner_text("#browser-notice")
        status, listed = await ahttp(
            "GET", f"{site.http}/api/queues/{queue}/messages?state=visible", token
        )
        assert [m["id"] for m in listed["messages"]] == [second["id"]], (first, second, third)

        # A worker acks the in-flight one after the page listed it: delete is refused.
        await page.click("#browser-states button[data-state=in_flight]")
        gone = page.locator(f"#messages tr[data-id='{third['id']}'] button.delete")
        await gone.wait_for(timeout=5000)
        await worker.request({"op": "ack", "receipt": third["receipt"]})
        await gone.click()
        await page.wait_for_function(
            "() => document.querySelector('#browser-notice').textContent.includes('Nothing')",
            timeout=5000,
        )

        # Requeue the dead one from the page (confirmed): the worker gets it.
        await page.click("#browser-states button[data-state=dead]")
        await page.click(f"#messages tr[data-id='{first['id']}'] button.requeue", timeout=5000)
        await page.wait_for_selector("#browser-notice.ok", timeout=5000)
        got = {}
        for _ in range(2):  # the second, requeued before, and the first (prefetch 1)
            (frame,) = await worker.deliveries(1)
            got[frame["id"]] = frame
            await worker.request({"op": "ack", "receipt": frame["receipt"]})
        assert got[first["id"]]["body"] == {"order": 1, "note": "doomed"}
        assert got[first["id"]]["deliveries"] == 1  # requeue resets the count
    for _ in range(30):
        if f"Requeued message {first['id']}" in audit_log(site):
            break
        await asyncio.sleep(0.2)
    assert f"{STAFF} " in audit_log(site) and f"Requeued message {first['id']}" in audit_log(site)
    await page.close()


#: Every header and cell that ends beyond its section's inner box, and tables
#: wider than their section, and whether the page scrolls sideways.
CUT_OFF = """() => {
    const out = [];
    for (const table of document.querySelectorAll('main table')) {
        if (!table.offsetParent) continue;  // hidden (the closed message browser)
        const box = table.closest('section');
        const style = getComputedStyle(box);
        const right = box.getBoundingClientRect().right - parseFloat(style.borderRightWidth);
        if (box.scrollWidth > box.clientWidth) out.push(`${table.id}: section overflows`);
        for (const cell of table.querySelectorAll('th, td')) {
            const r = cell.getBoundingClientRect();
            if (r.width && r.right > right + 0.5)
                out.push(`${table.id}: "${cell.textContent.slice(0, 30)}" ends at ${r.right}`);
        }
    }
    if (document.documentElement.scrollWidth > innerWidth) out.push('the page scrolls sideways');
    return out;
}"""

#: Numeric cells whose right edge is not their column header's right edge.
MISALIGNED = """(id) => {
    const table = document.getElementById(id);
    const heads = [...table.tHead.rows[0].cells];
    const out = [];
    for (const row of table.tBodies[0].rows) {
        if (row.cells.length === 1) continue;
        if (row.cells.length !== heads.length) out.push(`${id}: ${row.cells.length} cells`);
        [...row.cells].forEach((cell, i) => {
            if (!cell.classList.contains('num')) return;
            const a = cell.getBoundingClientRect().right;
            const b = heads[i].getBoundingClientRect().right;
            const num = heads[i].classList.contains('num');
            if (Math.abs(a - b) > 1 || !num) out.push(`${id} column ${i}`);
        });
    }
    return out;
}"""


async def test_no_column_is_cut_off_at_1024_px(
    browser: Any, site: GatewayProcess, token: str
) -> None:
    long_queue, topic = unique("q" + "x" * 150), unique("t" + "y" * 150)
    async with (
        await Socket.open(f"{site.ws}/ws/produce/", token) as producer,
        await Socket.open(f"{site.ws}/ws/queues/{long_queue}/?prefetch=3", token),
        await Socket.open(
            f"{site.ws}/ws/topics/{topic}/?on_full=drop_newest&capacity=1&credit=0", token
        ),
    ):
        for i in range(5):
            body = {"text": "a long body " * 30, "i": i}
            await producer.request(
                {"op": "enqueue", "queue": long_queue, "body": body, "group": "g" * 120}
            )
            await producer.request({"op": "publish", "topic": topic, "body": i})
        page = await staff_page(browser, site, width=1024)
        await page.wait_for_selector(f"#sockets tr[data-name='{topic}']", timeout=10_000)
        await page.wait_for_selector(f"#topics tr[data-topic='{topic}']", timeout=10_000)
        await page.fill("#queue-filter", long_queue)
        await page.click(f"#queues tr[data-queue='{long_queue}'] button.browse", timeout=10_000)
        await page.wait_for_selector("#messages tr[data-id]", timeout=5000)
        await page.wait_for_selector("#heatmap tbody tr", timeout=10_000)
        for width in (1024, 1280):
            await page.set_viewport_size({"width": width, "height": 900})
            await page.evaluate("() => new Promise((r) => setTimeout(r, 1200))")  # a tick
            await page.screenshot(path=str(site.var_dir / f"layout-{width}.png"), full_page=True)
            cut_off = await page.evaluate(CUT_OFF)
            assert cut_off == [], (width, cut_off)
            for table in ("queues", "topics", "sockets", "messages"):
                assert await page.evaluate(MISALIGNED, table) == [], (width, table)
        # Usable with the keyboard: rows and buttons take focus, Enter on a
        # queue row opens its messages, and focus shows.
        await page.click("#browser-close")
        row = page.locator(f"#queues tr[data-queue='{long_queue}']")
        await row.focus()
        outline = await row.evaluate("(r) => getComputedStyle(r).outlineStyle")
        await page.keyboard.press("Enter")
        await page.wait_for_selector("#browser:not([hidden]) #messages tr[data-id]", timeout=5000)
        assert outline != "none"
        await page.keyboard.press("Tab")
        focused = await page.evaluate("() => document.activeElement.tagName")
        assert focused == "BUTTON"
    await page.close()


@pytest.fixture(scope="module")
def big_site() -> Iterator[GatewayProcess]:
    """A gateway whose per-token socket limit allows a thousand subscribers."""
    var = Path(tempfile.mkdtemp(prefix="leasecast-browser-big-"))
    with sqlite_database(var) as env:
        env["GATEWAY_TOKEN_MAX_SOCKETS"] = "5000"
        # Every queue's one message is "old" after 2 s: 200 queue alerts.
        env["GATEWAY_DASHBOARD_OLDEST_ALERT"] = "2"
        gateway = GatewayProcess(env, var, name="big")
        gateway.manage(
            "shell",
            "-c",
            "from django.contrib.auth.models import User;"
            f"User.objects.create_superuser({STAFF!r}, 'ops@example.com', {PASSWORD!r})",
        )
        gateway.start()
        yield gateway
        gateway.stop()


SOCKETS, QUEUES = 1000, 200

#: Mean milliseconds of each part of one render, on the page's last snapshot.
RENDER_PARTS = """() => {
    const s = state.snapshot;
    const parts = {
        charts: () => renderCharts(), alerts: () => renderAlerts(s),
        heatmap: () => renderHeatmap(), queues: () => renderQueues(s),
        topics: () => renderTopics(s), sockets: () => renderSockets(s),
    };
    const out = {};
    for (const [name, f] of Object.entries(parts)) {
        const a = performance.now();
        for (let i = 0; i < 10; i++) f();
        out[name] = Math.round((performance.now() - a) * 10) / 100;
    }
    return out;
}"""


async def test_a_thousand_sockets_and_200_queues_render(
    browser: Any, big_site: GatewayProcess
) -> None:
    from websockets.asyncio.client import connect

    token = big_site.issue_token("admin", name="big")
    headers = {"Authorization": f"Bearer {token}"}
    async with await Socket.open(f"{big_site.ws}/ws/produce/", token) as producer:
        for i in range(QUEUES):
            await producer.request({"op": "enqueue", "queue": f"load-{i:03d}", "body": i})
    sockets = []
    try:
        for i in range(0, SOCKETS, 100):  # a hundred at a time: real handshakes
            sockets += await asyncio.gather(
                *(
                    connect(
                        f"{big_site.ws}/ws/topics/load-{(i + j) % 20}/", additional_headers=headers
                    )
                    for j in range(100)
                )
            )
        page = await staff_page(browser, big_site)
        await page.select_option("#socket-kind", "subscriber")
        try:
            await page.wait_for_function(
                "(n) => document.getElementById('socket-count').textContent === String(n)",
                arg=SOCKETS,
                timeout=20_000,
            )
        finally:
            print(await page.inner_text("#socket-count"), await page.inner_text("#status"))
        await page.wait_for_function(
            "() => document.getElementById('queue-count').textContent === '200'", timeout=20_000
        )
        # The alerts panel lists every queue whose oldest visible message is too old;
        # one purged, its alert goes.
        await page.wait_for_function(
            "() => document.querySelectorAll('#alerts li.queue').length === 200", timeout=20_000
        )
        status, _ = await ahttp("POST", f"{big_site.http}/api/queues/load-007/purge", token)
        assert status == 200
        await page.wait_for_selector(
            "#alerts li.queue[data-queue='load-007']", state="detached", timeout=5000
        )
        assert await page.locator("#alerts li.queue").count() == 199
        assert await page.locator("#sockets tbody tr").count() == 50  # one page
        assert await page.locator("#queues tbody tr").count() == 50
        # The last page of sockets is reachable and holds the rest.
        for _ in range(19):
            await page.click(".pager[data-table=sockets] .next")
        assert await page.locator("#sockets tbody tr").count() == 50
        assert await page.locator(".pager[data-table=sockets] .next").is_disabled()
        # Scripting time per update, over ten updates (reported, not asserted:
        # docs/benchmarks.md has the figures).
        await page.evaluate("() => { window.leasecastRenderTimes.length = 0; }")
        await page.wait_for_function(
            "() => window.leasecastRenderTimes.length >= 10", timeout=30_000
        )
        times = sorted(await page.evaluate("() => window.leasecastRenderTimes"))
        frames = sorted(await page.evaluate("() => window.leasecastFrameTimes.slice(-10)"))
        print(
            f"\ndashboard, {SOCKETS} sockets and {QUEUES} queues, per update: render "
            f"median {times[len(times) // 2]:.1f} ms, max {times[-1]:.1f} ms; parse and render "
            f"median {frames[len(frames) // 2]:.1f} ms, max {frames[-1]:.1f} ms"
        )
        parts = await page.evaluate(RENDER_PARTS)
        print("  per part (ms, mean of 10 calls):", parts)
        print("  snapshot frame:", await page.evaluate("() => window.leasecastFrameBytes"), "chars")
        await page.close()
    finally:
        await asyncio.gather(*(s.close() for s in sockets), return_exceptions=True)


async def test_history_and_alerts_cover_every_process(
    browser: Any, redis_url: str, tmp_path: Path
) -> None:
    """Traffic on gateway B shows on the dashboard served by A (REDIS_URL shared)."""
    with gateways_on_redis(tmp_path, redis_url) as (a, b, token):
        a.manage(
            "shell",
            "-c",
            "from django.contrib.auth.models import User;"
            f"User.objects.create_superuser({STAFF!r}, 'ops@example.com', {PASSWORD!r})",
        )
        queue, topic = unique("far"), unique("fartopic")
        page = await staff_page(browser, a)
        async with (
            await Socket.open(f"{b.ws}/ws/produce/", token) as producer,
            await Socket.open(f"{b.ws}/ws/queues/{queue}/?prefetch=50", token) as worker,
            await Socket.open(
                f"{b.ws}/ws/topics/{topic}/?on_full=drop_newest&capacity=1&credit=0", token
            ),
        ):
            # B joins the exchange with its first socket, then sends a snapshot a second.
            await page.wait_for_function(
                "() => document.getElementById('processes').textContent.startsWith('2 gateway')",
                timeout=10_000,
            )
            for i in range(40):
                await producer.request({"op": "enqueue", "queue": queue, "body": i})
            for frame in await worker.deliveries(40):
                await worker.request({"op": "ack", "receipt": frame["receipt"]})
            for i in range(30):
                await producer.request({"op": "publish", "topic": topic, "body": i})
            # B's acks are in A's history (all queues: A's own database has no such queue).
            await page.wait_for_function(f"() => ({CHART_PEAK})('acked') > 0.3", timeout=10_000)
            alert = page.locator(f"#alerts li.consumer[data-topic='{topic}']")
            await alert.wait_for(timeout=10_000)
            here = (await page.inner_text("#processes")).split(": ", 1)[1].split(", ")[0]
            assert here not in await alert.inner_text()  # B's socket, labelled with B
        await page.reload()
        await page.wait_for_selector("#status.live", timeout=10_000)
        assert await page.evaluate(CHART_PEAK, "acked") > 0.3  # kept by A
        await page.close()


#: What sticks out to the right of a 390-px phone screen: the page's own
#: sideways scroll, and every element (outside a table's scroll box) that ends past it.
PHONE_OVERFLOW = """(width) => {
    const out = [];
    const page = document.scrollingElement.scrollWidth;
    if (page > width) out.push(`the page is ${page} px wide`);
    const nodes = 'header *, main > *, section > *, .section-head *';
    for (const node of document.querySelectorAll(nodes)) {
        if (!node.offsetParent || node.closest('.table-scroll')) continue;
        const r = node.getBoundingClientRect();
        if (r.width && r.right > width + 0.5)
            out.push(`${node.tagName}#${node.id}.${node.className} ends at ${Math.round(r.right)}`);
    }
    return out;
}"""


async def test_the_dashboard_is_usable_on_a_390_px_phone(
    browser: Any, site: GatewayProcess, token: str
) -> None:
    queue, topic = unique("phone" + "q" * 40), unique("phone-prices")
    async with (
        await Socket.open(f"{site.ws}/ws/produce/", token) as producer,
        await Socket.open(f"{site.ws}/ws/queues/{queue}/?prefetch=2", token),
        await Socket.open(f"{site.ws}/ws/topics/{topic}/?capacity=1&credit=0", token),
    ):
        for i in range(3):
            await producer.request({"op": "enqueue", "queue": queue, "body": {"i": i}})
            await producer.request({"op": "publish", "topic": topic, "body": i})
        page = await staff_page(browser, site, width=1280)
        await page.wait_for_selector(f"#queues tr[data-queue='{queue}']", timeout=10_000)
        await page.screenshot(path=str(site.var_dir / "phone-check-1280.png"), full_page=True)
        await page.set_viewport_size({"width": 390, "height": 844})
        await page.evaluate("() => new Promise((r) => setTimeout(r, 1200))")  # a tick
        await page.screenshot(path=str(site.var_dir / "phone-390.png"), full_page=True)
        assert await page.evaluate(PHONE_OVERFLOW, 390) == []
        # The wide tables scroll inside their own box, and their rows still work:
        # the queue's messages open from its row.
        box = page.locator("#queues").locator("xpath=..")
        assert await box.evaluate("(b) => b.classList.contains('table-scroll')")
        await page.fill("#queue-filter", queue)
        await page.locator(f"#queues tr[data-queue='{queue}'] button.browse").click()
        await page.wait_for_selector("#messages tr[data-id]", timeout=5000)
        assert await page.evaluate(PHONE_OVERFLOW, 390) == []
    await page.close()


@pytest.fixture
def empty_site() -> Iterator[GatewayProcess]:
    """A gateway nobody has used yet: no queue, no topic, no socket."""
    var = Path(tempfile.mkdtemp(prefix="leasecast-empty-"))
    with sqlite_database(var) as env:
        gateway = GatewayProcess(env, var, name="empty")
        gateway.manage(
            "shell",
            "-c",
            "from django.contrib.auth.models import User;"
            f"User.objects.create_superuser({STAFF!r}, 'ops@example.com', {PASSWORD!r})",
        )
        gateway.start()
        yield gateway
        gateway.stop()


async def test_an_empty_dashboard_says_what_to_do_next(
    browser: Any, empty_site: GatewayProcess
) -> None:
    page = await staff_page(browser, empty_site)
    hint = page.locator("#empty-hint")
    await hint.wait_for(state="visible", timeout=5000)
    text = await hint.inner_text()
    assert "consume emails.welcome" in text and "enqueue emails.welcome" in text, text
    assert "make demo" in text, text
    await page.screenshot(path=str(empty_site.var_dir / "empty.png"), full_page=True)
    # Once there is something to show, the hint goes away.
    token = empty_site.issue_token("admin", name="empty")
    status, _ = await ahttp(
        "POST",
        f"{empty_site.http}/api/queues/first/messages",
        token,
        {"messages": [{"body": 1}]},
    )
    assert status == 200
    await hint.wait_for(state="hidden", timeout=5000)
    await page.close()


async def test_a_multiplexed_socket_is_listed_by_its_topics(
    browser: Any, site: GatewayProcess, token: str
) -> None:
    """A /ws/ socket shows its topics, its subscription count and their sums
    (before, its row had no name and no figures)."""
    prices, news = unique("prices"), unique("news")
    async with await Socket.open(f"{site.ws}/ws/", token) as mux:
        for i, topic in enumerate((prices, news)):
            reply = await mux.request({"op": "subscribe", "topic": topic, "ref": f"s{i}"})
            assert reply["op"] == "subscribed", reply
        await ahttp(
            "POST",
            f"{site.http}/api/topics/{prices}/messages",
            token,
            {"messages": [{"body": i} for i in range(3)]},
        )
        page = await staff_page(browser, site, width=1280)
        await page.select_option("#socket-kind", "multiplex")
        row = page.locator("#sockets tbody tr[data-kind=multiplex]")
        await row.wait_for(timeout=10_000)
        assert await row.locator("td.name").inner_text() == f"{prices}, {news}"
        await page.wait_for_function(
            "() => /3 delivered/.test(document.querySelector("
            "'#sockets tbody tr[data-kind=multiplex]').cells[7].textContent)",
            timeout=10_000,
        )
        assert "2 subscriptions" in await row.locator("td").nth(6).inner_text()
        if shots := os.environ.get("LEASECAST_SCREENSHOT_MUX"):
            await page.locator("#sockets").screenshot(path=f"{shots}-1280.png")
            await page.set_viewport_size({"width": 390, "height": 900})
            await page.screenshot(path=f"{shots}-390.png", full_page=True)
        await page.close()
