"""The dashboard's operator controls in Chromium: tasks, workers, forms, pause, permissions.

On SQLite and PostgreSQL: the task results and their retry are the store's.
Tasks are enqueued as a Django project does (``tests.tasksite``: TASKS on
``gateway.tasks.LeasecastBackend``), and a test's own worker socket takes
them and acks them with their outcome, as ``leasecast_worker`` would.
"""

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
from tests.support.databases import ROOT, postgres_database, postgres_unavailable, sqlite_database
from tests.support.gateways import GatewayProcess
from tests.support.task_results import WORKER_ID, enqueue_tasks, settle

pytestmark = [
    pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing())),
    # Alone, as test_dashboard: Playwright's waits on a page starved of CPU.
    pytest.mark.serial,
]

VIEWER = "viewer"
USERS = (
    "from django.contrib.auth.models import Permission, User;"
    f"User.objects.create_superuser({STAFF!r}, 'ops@example.com', {PASSWORD!r});"
    f"v = User.objects.create_user({VIEWER!r}, 'v@example.com', {PASSWORD!r}, is_staff=True);"
    "v.user_permissions.add(Permission.objects.get(codename='view_queue'))"
)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def site(request: pytest.FixtureRequest) -> Iterator[GatewayProcess]:
    var = Path(tempfile.mkdtemp(prefix=f"leasecast-tasks-{request.param}-"))
    if request.param == "postgres" and (reason := postgres_unavailable()):
        pytest.skip(reason)
    database = sqlite_database if request.param == "sqlite" else postgres_database
    with database(var) as env:
        gateway = GatewayProcess(env, var, name="tasks")
        gateway.manage("shell", "-c", USERS)
        gateway.start()
        yield gateway
        gateway.stop()


@pytest.fixture(scope="module")
def token(site: GatewayProcess) -> str:
    return site.issue_token("admin", name="tasks-test")


def audit_log(site: GatewayProcess) -> str:
    return site.manage(
        "shell",
        "-c",
        "from django.contrib.admin.models import LogEntry;"
        "print('\\n'.join(f'{e.user.username} {e.object_repr}: {e.change_message}' "
        "for e in LogEntry.objects.all()))",
    )


async def login(
    browser: Any,
    site: GatewayProcess,
    username: str = STAFF,
    confirm: dict[str, bool] | None = None,
) -> Any:
    """A logged-in page on the dashboard, live; its confirmations are answered
    ``confirm["accept"]`` (yes unless a test says otherwise)."""
    answer = confirm if confirm is not None else {"accept": True}
    page = await browser.new_page(viewport={"width": 1280, "height": 1000})
    page.on(
        "dialog",
        lambda d: asyncio.ensure_future(d.accept() if answer["accept"] else d.dismiss()),
    )
    await page.goto(f"{site.http}/admin/login/?next=/dashboard/")
    await page.fill("#id_username", username)
    await page.fill("#id_password", PASSWORD)
    await page.click("input[type=submit]")
    await page.wait_for_url(re.compile(r".*/dashboard/$"))
    await page.wait_for_selector("#status.live", timeout=10_000)
    return page


def row(result_id: str) -> str:
    return f"#task-table tr[data-id='{result_id}']"


async def status_of(page: Any, result_id: str, status: str) -> None:
    await page.wait_for_selector(f"{row(result_id)}[data-status={status}]", timeout=10_000)


async def shown_ids(page: Any) -> set[str]:
    ids = await page.eval_on_selector_all(
        "#task-table tbody tr[data-id]", "rs => rs.map(r => r.dataset.id)"
    )
    return set(ids)


async def test_tasks_listed_filtered_retried_and_cancelled_with_worker_rows(
    browser: Any, site: GatewayProcess, token: str
) -> None:
    queue, idle = unique("reports"), unique("later")
    ok_id, fail_id, held_id, waiting_id = enqueue_tasks(
        site,
        ("add", queue, [1, 2]),
        ("fail", queue, []),
        ("add", queue, [40, 2]),
        ("async_add", idle, [5, 5]),  # no worker takes this queue: READY
    )
    async with await Socket.open(f"{site.ws}/ws/queues/{queue}/?prefetch=3", token) as worker:
        first = {d["body"]["id"]: d for d in await worker.deliveries(3)}
        await settle(worker, first[ok_id], "SUCCESSFUL")
        await settle(worker, first[fail_id], "FAILED")
        # held_id stays leased by this worker: RUNNING.
        confirm = {"accept": True}
        page = await login(browser, site, confirm=confirm)

        # Every status, with its arguments, attempts, worker, result or error.
        await status_of(page, ok_id, "SUCCESSFUL")
        await status_of(page, fail_id, "FAILED")
        await status_of(page, held_id, "RUNNING")
        await status_of(page, waiting_id, "READY")
        text = await page.inner_text(row(ok_id))
        assert "add" in text and "1, 2" in text and WORKER_ID in text
        assert '{"sum":3}' in text
        failed = await page.inner_text(row(fail_id))
        assert "ValueError: <b>boom</b>" in failed  # text, not markup
        running = await page.inner_text(row(held_id))
        assert "40, 2" in running and "socket" in running  # held by the test's socket

        # The table fits its section at 1,280 px, and a phone's page is no wider
        # than the phone (the table scrolls in its own box).
        fits = (
            "() => { const t = document.querySelector('#task-table');"
            " return t.getBoundingClientRect().right <= t.closest('section')"
            ".getBoundingClientRect().right; }"
        )
        assert await page.evaluate(fits)
        await page.locator(f"{row(fail_id)} details").click()  # the whole traceback
        # docs/dashboard-tasks*.png are refreshed on request only (so a run leaves
        # the work tree clean): LEASECAST_SCREENSHOT_TASKS=docs/dashboard-tasks.png.
        shot = os.environ.get("LEASECAST_SCREENSHOT_TASKS") or str(site.var_dir / "tasks.png")
        await page.locator("#tasks").screenshot(path=str(ROOT / shot))
        await page.set_viewport_size({"width": 390, "height": 844})
        await page.wait_for_timeout(300)
        assert await page.evaluate("document.documentElement.scrollWidth") <= 390
        await page.locator("#tasks").screenshot(path=str(ROOT / shot.replace(".png", "-390.png")))
        await page.set_viewport_size({"width": 1280, "height": 1000})

        # The worker's row says what it runs now: the held task, by name.
        worker_row = page.locator(f"#worker-table tr[data-queue='{queue}']")
        await page.wait_for_function(
            "([sel, id]) => document.querySelector(sel)?.textContent.includes(id.slice(0, 8))",
            arg=[f"#worker-table tr[data-queue='{queue}']", held_id],
            timeout=10_000,
        )
        assert "tests.tasksite.tasks.add" in await worker_row.inner_text()

        # Filters: by status, then by name.
        await page.click("#task-states button[data-status=FAILED]")
        await page.wait_for_function(
            "() => [...document.querySelectorAll('#task-table tbody tr[data-id]')]"
            ".every(r => r.dataset.status === 'FAILED')",
            timeout=10_000,
        )
        assert fail_id in await shown_ids(page)
        assert ok_id not in await shown_ids(page)
        await page.click("#task-states button[data-status='']")
        await page.fill("#task-filter", "async_add")
        await page.wait_for_function(
            "(id) => { const rows = [...document.querySelectorAll("
            "'#task-table tbody tr[data-id]')];"
            " return rows.length > 0 && rows.every(r => r.dataset.id === id); }",
            arg=waiting_id,
            timeout=10_000,
        )
        await page.fill("#task-filter", "")
        await status_of(page, fail_id, "FAILED")

        # Retry, refused at the confirmation first: nothing happens.
        confirm["accept"] = False
        await page.click(f"{row(fail_id)} button.retry")
        await asyncio.sleep(1)
        assert "Retried task" not in audit_log(site)
        await status_of(page, fail_id, "FAILED")
        # Confirmed: the task runs again and its message reaches a worker,
        # under the same result id, as the backend enqueued it.
        confirm["accept"] = True
        await page.click(f"{row(fail_id)} button.retry")
        # READY, or RUNNING already: the worker has room for it.
        await page.wait_for_selector(
            f"{row(fail_id)}:is([data-status=READY], [data-status=RUNNING])", timeout=10_000
        )
        assert "Retried task" in await page.inner_text("#task-notice")
        (again,) = await worker.deliveries(1)  # the worker has room again
        assert again["body"]["id"] == fail_id
        assert again["body"]["task"] == "tests.tasksite.tasks.fail"
        assert f"{STAFF} " in audit_log(site)
        assert f"Retried task {fail_id} (enqueued message" in audit_log(site)
        # Retrying a task that is not FAILED is refused by the server too.
        status, reply = await ahttp("POST", f"{site.http}/api/tasks/{ok_id}/retry", token=token)
        assert status == 400 and reply["error"] == "invalid" and "SUCCESSFUL" in reply["detail"]

        # Cancel a running task (confirmed): its message is dead-lettered, the
        # worker holding it is told, the task is FAILED, and the log says who.
        if not await page.evaluate("document.body.hasAttribute('data-cancel-available')"):
            assert "unavailable" in await page.inner_text(f"{row(held_id)} button.cancel")
            pytest.skip("this gateway has no cancel endpoint yet: the button says so")
        await page.click(f"{row(held_id)} button.cancel")
        await status_of(page, held_id, "FAILED")
        told = await worker.next(timeout=10)
        assert told["op"] == "cancel" and told["id"] == str(first[held_id]["id"])
        assert "cancelled" in await page.inner_text(row(held_id))
        assert f"Cancelled message {first[held_id]['id']}" in audit_log(site)


async def test_forms_create_a_queue_and_publish_and_say_what_is_wrong(
    browser: Any, site: GatewayProcess, token: str
) -> None:
    page = await login(browser, site)
    queue, topic = unique("made"), unique("news")
    form = "#create-queue"

    # Bad input is refused with a reason, and nothing is created.
    await page.fill(f"{form} [name=name]", "no spaces allowed")
    await page.click(f"{form} button[type=submit]")
    await page.wait_for_selector(f"{form} .notice.bad", timeout=5000)
    assert "is no queue name" in await page.inner_text(f"{form} .notice")
    await page.fill(f"{form} [name=name]", queue)
    await page.fill(f"{form} [name=settings]", "{max_deliveries: 5}")
    await page.click(f"{form} button[type=submit]")
    await page.wait_for_function(
        "() => document.querySelector('#create-queue .notice').textContent.includes('not JSON')",
        timeout=5000,
    )
    await page.fill(f"{form} [name=settings]", '{"max_deliveries": -1}')
    await page.click(f"{form} button[type=submit]")
    await page.wait_for_function(
        "() => document.querySelector('#create-queue .notice')"
        ".textContent.includes('Not created: invalid')",
        timeout=5000,
    )
    assert "max_deliveries" in await page.inner_text(f"{form} .notice")
    status, _ = await ahttp("GET", f"{site.http}/api/queues/{queue}", token=token)
    assert status == 404

    # Good input creates the queue; it appears in the queues table.
    await page.fill(f"{form} [name=settings]", '{"max_deliveries": 5}')
    await page.click(f"{form} button[type=submit]")
    await page.wait_for_function(
        "(q) => document.querySelector('#create-queue .notice')"
        ".textContent === `Created queue ${q}.`",
        arg=queue,
        timeout=5000,
    )
    status, doc = await ahttp("GET", f"{site.http}/api/queues/{queue}", token=token)
    assert status == 200 and doc["max_deliveries"] == 5
    await page.wait_for_selector(f"#queues tr[data-queue='{queue}']", timeout=5000)

    # Publish: a bare word is not JSON, and says so; a JSON body reaches a subscriber.
    async with await Socket.open(f"{site.ws}/ws/topics/{topic}/", token) as subscriber:
        await page.fill("#publish [name=topic]", topic)
        await page.fill("#publish [name=body]", "hello")
        await page.click("#publish button[type=submit]")
        await page.wait_for_function(
            "() => document.querySelector('#publish .notice').textContent.includes('not JSON')",
            timeout=5000,
        )
        assert 'A string needs its quotes: "hello"' in await page.inner_text("#publish .notice")
        await page.fill("#publish [name=body]", '{"price": 12.5, "note": "<i>x</i>"}')
        await page.click("#publish button[type=submit]")
        await page.wait_for_function(
            "() => document.querySelector('#publish .notice')"
            ".textContent.startsWith('Published 1')",
            timeout=5000,
        )
        frame = await subscriber.next(timeout=10)
        assert frame["op"] == "messages"
        assert [m["body"] for m in frame["items"]] == [{"price": 12.5, "note": "<i>x</i>"}]


async def test_pause_toggle_pauses_and_resumes_a_queue(
    browser: Any, site: GatewayProcess, token: str
) -> None:
    queue = unique("pausable")
    status, doc = await ahttp("PATCH", f"{site.http}/api/queues/{queue}", token=token, body={})
    assert status == 200
    if "paused" not in doc:
        pytest.skip("this gateway's queue document has no 'paused' yet")
    page = await login(browser, site)
    button = f"#queues tr[data-queue='{queue}'] button.pause"
    await page.wait_for_selector(f"{button}:not([disabled])", timeout=10_000)
    await page.click(button)
    await page.wait_for_function(
        "(sel) => document.querySelector(sel)?.textContent === 'resume'", arg=button, timeout=10_000
    )
    _, doc = await ahttp("GET", f"{site.http}/api/queues/{queue}", token=token)
    assert doc["paused"] is True
    assert "paused" in await page.inner_text(f"#queues tr[data-queue='{queue}'] td.name")
    await page.click(button)
    await page.wait_for_function(
        "(sel) => document.querySelector(sel)?.textContent === 'pause'", arg=button, timeout=10_000
    )
    _, doc = await ahttp("GET", f"{site.http}/api/queues/{queue}", token=token)
    assert doc["paused"] is False
    assert '{"paused": true}' in audit_log(site) or '{"paused":true}' in audit_log(site)


async def test_a_view_only_operator_sees_no_control_and_the_server_refuses_them(
    browser: Any, site: GatewayProcess, token: str
) -> None:
    queue = unique("watched")
    (failed,) = enqueue_tasks(site, ("fail", queue, []))
    async with await Socket.open(f"{site.ws}/ws/queues/{queue}/?prefetch=1", token) as worker:
        (delivery,) = await worker.deliveries(1)
        await settle(worker, delivery, "FAILED")
    page = await login(browser, site, VIEWER)
    await status_of(page, failed, "FAILED")
    await page.wait_for_selector(f"#queues tr[data-queue='{queue}']", timeout=10_000)
    # Reading, yes; acting, no: no button but browse, no create-queue form.
    buttons = await page.eval_on_selector_all(
        "main button", "bs => bs.filter(b => b.offsetParent !== null).map(b => b.className)"
    )
    assert not [b for b in buttons if re.search(r"retry|cancel|purge|redrive|pause|danger", b)]
    assert await page.locator("#create-queue").count() == 0
    # Publishing is a client's work, which every staff session may do: its form stays.
    assert await page.locator("#publish").count() == 1
    # The server refuses them anyway, with the session and its CSRF token.
    refused = await page.evaluate(
        """async (id) => {
            const csrf = document.cookie.match(/csrftoken=([^;]+)/)[1];
            const r = await fetch(`/api/tasks/${id}/retry`,
                {method: 'POST', headers: {'X-CSRFToken': csrf}});
            return [r.status, (await r.json()).error];
        }""",
        failed,
    )
    assert refused == [403, "forbidden"]


async def test_the_schedules_panel_lists_schedules_when_the_gateway_has_them(
    browser: Any, site: GatewayProcess, token: str
) -> None:
    name, queue = unique("nightly"), unique("reports")
    status, doc = await ahttp(
        "PUT",
        f"{site.http}/api/schedules/{name}",
        token=token,
        body={"queue": queue, "body": {"report": "daily"}, "cron": "0 3 * * *"},
    )
    if status == 404 and doc.get("error") == "not_found" and "endpoint" in doc.get("detail", ""):
        pytest.skip("this gateway has no /api/schedules yet: the panel stays hidden")
    assert status == 200, doc
    page = await login(browser, site)
    schedule = f"#schedule-table tr[data-schedule='{name}']"
    await page.wait_for_selector(schedule, timeout=15_000)
    assert await page.is_visible("#schedules")
    text = await page.inner_text(schedule)
    assert queue in text and "cron 0 3 * * *" in text and "enabled" in text
    assert "in " in text  # the next tick, in hours
