"""``make demo`` (``python -m gateway.demo``): everything starts, moves, and stops on Ctrl-C."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gateway.site.demo import spark_missing
from tests.support.clients import http
from tests.support.databases import ROOT, base_env, manage
from tests.support.gateways import free_port
from tests.support.waiting import wait_until_blocking


def credential(path: Path, label: str) -> str:
    return next(
        line.split(":", 1)[1].strip()
        for line in path.read_text().splitlines()
        if line.strip().startswith(label)
    )


def arguments_holding(secret: str) -> list[str]:
    """The command lines of this machine's processes that contain ``secret`` (``ps`` shows them)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            args = cmdline.read_bytes().split(b"\0")
            if any(secret.encode() in arg for arg in args):
                found.append(b" ".join(args).decode(errors="replace"))
    return found


def test_demo_runs_every_part_and_stops_cleanly_on_ctrl_c() -> None:
    var = Path(tempfile.mkdtemp(prefix="leasecast-demo-"))
    env = base_env(var)
    # What `make run` left behind: its database, with a queue of its own, and
    # its credentials. The demo must touch neither.
    manage(env, "migrate", "--noinput", "-v0")
    manage(env, "bootstrap_dev")
    run_credentials = (var / "dev-credentials.txt").read_text()
    manage(
        env,
        "shell",
        "-c",
        "import gateway; gateway.enqueue('leftover.jobs', {'from': 'make run'})",
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # Spark when it can run here (as `make demo` does), a plain producer otherwise.
    with_spark = spark_missing() is None
    command = [sys.executable, "-m", "gateway.demo", "--port", str(port)]
    if not with_spark:
        command.append("--no-spark")
    log = var / "demo.out"
    with open(log, "wb") as out:
        demo = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        wait_until_blocking(
            lambda: "Ctrl-C stops everything" in log.read_text(), "the banner", timeout=120
        )
        banner = log.read_text()
        assert f"{url}/dashboard/" in banner and "admin / " in banner
        # Its own database and credentials, named in the banner.
        assert (var / "demo.sqlite3").exists(), banner
        assert "demo.sqlite3" in banner and "make reset" in banner
        token = credential(var / "demo-credentials.txt", "admin token")
        assert token != credential(var / "dev-credentials.txt", "admin token")
        assert (var / "dev-credentials.txt").read_text() == run_credentials

        def sockets() -> list[dict[str, Any]]:
            status, stats = http("GET", f"{url}/api/stats", token)
            return stats["sockets"] if status == 200 else []

        def alive() -> bool:
            socks = sockets()
            workers = [s for s in socks if s["kind"] == "worker" and s["queue"] == "demo.orders"]
            subs = {s["policy"]: s for s in socks if s["kind"] == "subscriber"}
            return (
                len(workers) >= 2
                and sum(w["acked"] for w in workers) > 0
                and set(subs) == {"drop_oldest", "drop_newest", "block"}
                and subs["drop_newest"]["dropped"] > 0  # the slow one drops
                and subs["block"]["dropped"] == 0
                and subs["drop_oldest"]["delivered"] > 0
            )

        wait_until_blocking(
            alive, f"workers acking and subscribers receiving:\n{log.read_text()}", timeout=120
        )
        # make run's leftovers are not the demo's: no leftover queue, no alert from it.
        queues = http("GET", f"{url}/api/stats", token)[1]["queues"]
        assert "leftover.jobs" not in {q["name"] for q in queues}, queues
        # Every part is running now (the Spark feed too, when it can): none of
        # them has the admin token on its command line, where ps shows it.
        assert arguments_holding(token) == []
        # The poison message is nacked until it is dead-lettered.
        wait_until_blocking(
            lambda: http("GET", f"{url}/api/queues/demo.orders", token)[1].get("dead", 0) >= 1,
            "a dead-lettered poison message",
            timeout=120,
        )
        if with_spark:
            spark_log = var / "demo-spark.log"
            wait_until_blocking(
                lambda: "rows in" in spark_log.read_text(), "a Spark batch", timeout=120
            )
        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
        assert demo.wait(120) == 0, log.read_text()[-3000:]
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
    output = log.read_text()
    assert "stopped the gateway" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    status, _ = (0, None)
    with contextlib.suppress(OSError):
        status, _ = http("GET", f"{url}/healthz")
    assert status == 0, "the gateway still answers after the demo stopped"
    leftover = subprocess.run(
        ["pgrep", "-f", f"127.0.0.1:{port}|-p {port}"], capture_output=True, text=True
    )
    assert leftover.stdout.strip() == "", f"processes left behind: {leftover.stdout}"
