"""The example shop's packing page in Chromium: a task's live progress bar
(``gateway.tasks.progress`` in the task, ``watchTask`` on the page) that keeps
going across a page reload and a restart of the gateway.

One daphne process serves the shop (its views and Leasecast); a real
``manage.py leasecast_worker`` runs the task with a token that may consume
the task queue and publish the tasks' topics; the page follows the task with
a signed token scoped to ``subscribe:task.RESULT_ID``. SQLite and PostgreSQL.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.support.browsers import browser_missing
from tests.support.databases import postgres_database, postgres_unavailable, sqlite_database
from tests.support.shop import SHOP, ShopProcess, shop_env

pytestmark = [
    pytest.mark.skipif(browser_missing() is not None, reason=str(browser_missing())),
    # Alone: it restarts its gateway, and Playwright's waits need a page that gets CPU.
    pytest.mark.serial,
]


@pytest.fixture(params=["sqlite", "postgres"])
def shop(request: pytest.FixtureRequest) -> Iterator[ShopProcess]:
    """The running shop and its task worker (killed after the test)."""
    if request.param == "postgres" and (reason := postgres_unavailable()):
        pytest.skip(reason)
    var = Path(tempfile.mkdtemp(prefix=f"leasecast-shop-progress-{request.param}-"))
    with ExitStack() as stack:
        database = sqlite_database if request.param == "sqlite" else postgres_database
        env = shop_env(stack.enter_context(database(var)))
        process = ShopProcess(env, var, name="shop")
        process.manage("migrate", "--noinput", "-v0")
        token = process.issue_token("consume:default", "publish:task.*", name="packers")
        process.start()
        stack.callback(process.stop)
        with open(var / "worker.log", "ab") as log:
            worker = subprocess.Popen(
                [sys.executable, str(SHOP / "manage.py"), "leasecast_worker", "--queue", "default"],
                cwd=SHOP,
                env={**env, "LEASECAST_URL": process.http, "LEASECAST_TOKEN": token},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        stack.callback(lambda: (worker.kill(), worker.wait(10)))
        process.worker_log = var / "worker.log"  # type: ignore[attr-defined]
        yield process


async def wait_for(page: Any, shop: ShopProcess, condition: str, timeout: float) -> None:
    """Wait for ``condition`` (JavaScript) on the page; on timeout say what the page showed."""
    try:
        await page.wait_for_function(condition, timeout=timeout * 1000)
    except Exception as exc:
        status = await page.text_content("#status")
        worker = shop.worker_log.read_text(errors="replace")[-3000:]  # type: ignore[attr-defined]
        logs = "\n".join(page.console_lines)
        raise AssertionError(
            f"{condition} never held: status {status!r}; console:\n{logs}\nworker:\n{worker}\n"
            f"gateway:\n{shop.log_text()[-3000:]}"
        ) from exc


async def bar(page: Any) -> int:
    value: int = await page.evaluate("document.getElementById('bar').value")
    return value


async def test_the_packing_page_survives_a_reload_and_a_gateway_restart(
    shop: ShopProcess, browser: Any
) -> None:
    page = await browser.new_page()
    page.console_lines = []
    page.on("console", lambda message: page.console_lines.append(message.text))
    page.on("pageerror", lambda error: page.console_lines.append(f"page error: {error}"))
    await page.goto(f"{shop.http}/orders/pack/")
    await page.fill("input[name=steps]", "40")
    await page.fill("input[name=step_seconds]", "0.25")
    await page.click("button[type=submit]")
    await wait_for(page, shop, "document.getElementById('bar').value >= 2", 30)
    assert "task=" in page.url  # the task is in the URL: a reload watches it again

    await page.reload()
    # From the topic's latest update (no waiting for the next one to show where it is).
    await wait_for(page, shop, "document.getElementById('bar').value >= 2", 30)
    assert (await page.text_content("#status") or "").startswith(("packing:", "done:"))

    before = await bar(page)
    shop.stop()
    shop.start()  # same port: the page's socket reconnects by itself
    await wait_for(page, shop, f"document.getElementById('bar').value > {before}", 60)
    done = "document.getElementById('status').textContent.startsWith('done:')"
    await wait_for(page, shop, done, 60)
    assert await bar(page) == 40
    assert "packed" in (await page.text_content("#status") or "")
    # Reloaded after the end, the page can learn it only from the topic's history.
    await page.reload()
    await wait_for(page, shop, done, 30)
    assert await page.evaluate("(b => b.value === b.max)(document.getElementById('bar'))")
    await page.close()
