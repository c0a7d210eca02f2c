"""``make screenshots``: the dashboard under ``make demo``, photographed for docs/.

Starts ``python -m gateway.demo`` on a free port (in its own session), lets it
run 150 seconds (the Spark feed settles, the charts get history, the slow
subscriber drops), logs in with the demo's admin (``var/demo-credentials.txt``, which
the demo writes on its first run) in Debian's Chromium through Playwright, and
writes:

- ``docs/dashboard.png``: the whole page at 1,280 px;
- ``docs/dashboard-messages.png``: the message browser on ``demo.orders``,
  dead messages (the demo's poison messages);
- ``docs/dashboard-1024.png``: the top of the page at 1,024 px;
- ``docs/dashboard-390.png``: the whole page on a 390-px phone.

Then it stops the demo (SIGINT, as Ctrl-C) and exits 0. Never ``playwright
install``: the browser is ``/usr/bin/chromium`` (``LEASECAST_CHROMIUM``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from gateway.conf import var_dir

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("LEASECAST_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def admin_login(var: Path) -> tuple[str, str]:
    """The demo admin's user name and password.

    Raises:
        SystemExit: no credentials file (the demo writes it before it serves).
    """
    path = var / "demo-credentials.txt"
    if not path.exists():
        raise SystemExit(f"{path} not found: the demo did not write it")
    for line in path.read_text().splitlines():
        label, _, value = line.strip().partition(":")
        if label == "admin login":
            user, _, password = value.strip().partition(" / ")
            return user, password
    raise SystemExit(f"no admin login in {path}")


def wait_healthy(url: str, demo: subprocess.Popen[bytes], timeout: float = 90) -> None:
    """Block until the demo's gateway answers ``/healthz``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if demo.poll() is not None:
            raise SystemExit(f"the demo exited with {demo.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=1):
                return
        except (urllib.error.URLError, OSError):
            time.sleep(0.5)
    raise SystemExit("the demo's gateway did not answer /healthz")


def shoot(url: str, user: str, password: str, out: Path) -> list[Path]:
    """Log in and take the screenshots; returns their paths."""
    from playwright.sync_api import sync_playwright

    written = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto(f"{url}/admin/login/?next=/dashboard/")
        page.fill("#id_username", user)
        page.fill("#id_password", password)
        page.click("input[type=submit]")
        page.wait_for_selector("#status.live", timeout=20_000)
        # The slow drop_newest subscriber shows in the alerts and the heatmap.
        page.wait_for_selector("#alerts li.consumer", timeout=60_000)
        page.wait_for_selector("#heatmap tbody tr", timeout=30_000)
        page.wait_for_timeout(1500)  # a tick after the last row appeared
        path = out / "dashboard.png"
        page.screenshot(path=str(path), full_page=True)
        written.append(path)

        page.click("#queues tr[data-queue='demo.orders'] button.browse")
        page.click("#browser-states button[data-state=dead]")
        page.wait_for_selector("#messages tr[data-state=dead]", timeout=30_000)
        page.locator("#browser").scroll_into_view_if_needed()
        path = out / "dashboard-messages.png"
        page.locator("#browser").screenshot(path=str(path))
        written.append(path)

        page.click("#browser-close")
        page.set_viewport_size({"width": 1024, "height": 900})
        page.evaluate("() => window.scrollTo(0, 0)")
        page.wait_for_timeout(1500)
        path = out / "dashboard-1024.png"
        page.screenshot(path=str(path))
        written.append(path)

        # A phone: the tables scroll in their own boxes, the page never sideways.
        page.set_viewport_size({"width": 390, "height": 844})
        page.evaluate("() => window.scrollTo(0, 0)")
        page.wait_for_timeout(1500)
        path = out / "dashboard-390.png"
        page.screenshot(path=str(path), full_page=True)
        written.append(path)
        browser.close()
    return written


def main(argv: list[str] | None = None) -> int:
    """Run the demo, take the screenshots, stop the demo."""
    parser = argparse.ArgumentParser(prog="python -m dashboard.screenshots", description=__doc__)
    parser.add_argument("--port", type=int, default=0, help="the demo's port (default: a free one)")
    parser.add_argument(
        "--warm-up",
        type=float,
        default=150.0,
        help="seconds of demo traffic before the shots (Spark's JVM alone takes ~40 s)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args(argv)
    var = var_dir()
    port = args.port or free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(var / "screenshots-demo.log", "ab")  # noqa: SIM115 - the child writes it
    demo = subprocess.Popen(
        [sys.executable, "-m", "gateway.demo", "--port", str(port)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # so stopping it stops its children too
    )
    try:
        wait_healthy(url, demo)
        user, password = admin_login(var)  # written by the demo before it serves
        print(f"demo on {url}; {args.warm_up:g} s of traffic before the screenshots", flush=True)
        time.sleep(args.warm_up)
        for path in shoot(url, user, password, args.out):
            print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(demo.pid, signal.SIGINT)
        try:
            demo.wait(60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(10)
        log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
