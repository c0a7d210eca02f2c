"""examples/htmx and examples/shop: their READMEs' commands run as written, twice in a row.

Each README's ``sh`` blocks are typed into one bash, in order, as a user
would type them into their terminals (a server or a worker in the
background, since it runs until stopped; everything stops at the end of a
run). Then the same commands again on the same state (var/, the shop's
database), as a user coming back the next day: migrate again, a second
token, serve again.

Substitutions, and only these:

- ports: the docs' 8000 and 8001 become free ports (someone's ``make run``
  may hold 8000). ``make run`` is given its port by ``PORT`` in the
  environment (the Makefile's ``PORT ?= 8000``), its command text unchanged;
- a value the README says the user pastes: ``TOKEN`` (what ``issue_token``
  printed), ``ADMIN_TOKEN`` (the admin token ``make run`` printed),
  ``lc_...`` (the shop's printed token).

The gateway's state is a temporary ``GATEWAY_VAR_DIR``; the shop runs in a
copy of examples/shop (beside a link to this checkout's .venv, so its
``../../.venv`` paths hold), never in the developer's var/ or the shop's own
database.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.integration.doc_shell import Shell, in_background, sh_commands
from tests.support.clients import http
from tests.support.databases import ROOT
from tests.support.gateways import free_port
from tests.support.waiting import wait_until_blocking

HTMX = ROOT / "examples" / "htmx" / "README.md"
SHOP = ROOT / "examples" / "shop"


def answer(url: str) -> tuple[int, str] | None:
    """``GET url``: status and body, or None while nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None


def json_objects(text: str) -> list[dict[str, Any]]:
    """Every JSON object starting a line of ``text`` (or following curl's unterminated answer)."""
    decoder = json.JSONDecoder()
    found = []
    for line in text.splitlines():
        index = line.find("{")
        while index != -1:
            try:
                value, end = decoder.raw_decode(line, index)
            except ValueError:
                index = line.find("{", index + 1)
                continue
            if isinstance(value, dict):
                found.append(value)
            index = line.find("{", end)
    return found


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the settings a developer's shell may carry."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GATEWAY_", "LEASECAST_"))
        and k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "PYTHONPATH", "PORT")
    }
    env.update(extra)
    return env


# -- examples/htmx ------------------------------------------------------------------


class EventStream:
    """``GET /sse/topics/TOPIC/`` read in a thread, as the page's EventSource would
    (raw bytes: the test looks for the headers and events in them)."""

    def __init__(self, port: int, topic: str, token: str, origin: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.sendall(
            f"GET /sse/topics/{topic}/?token={token} HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n"
            f"Origin: {origin}\r\n\r\n".encode()
        )
        self.received = b""
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while chunk := self.sock.recv(65536):
                self.received += chunk
        except OSError:
            pass

    def text(self) -> str:
        return self.received.decode(errors="replace")

    def head(self) -> str:
        """The answer's status line and headers, once they are all in ("" until then)."""
        head, blank, _ = self.text().partition("\r\n\r\n")
        return head if blank else ""

    def close(self) -> None:
        self.sock.close()


def sse_sockets(port: int, admin: str, topic: str) -> list[dict[str, Any]]:
    """The gateway's open event streams on ``topic`` (its ``/api/stats``)."""
    status, body = http("GET", f"http://127.0.0.1:{port}/api/stats", admin)
    if status != 200:
        return []
    return [s for s in body.get("sockets", []) if s["kind"] == "sse" and s.get("topic") == topic]


@pytest.mark.slow  # weighs more in the parallel stage's order (tests/conftest.py)
def test_the_htmx_example_runs_as_written_twice(tmp_path: Path) -> None:
    if shutil.which("make") is None or shutil.which("curl") is None:
        pytest.skip("needs make and curl on PATH (the README's commands)")
    # `make run` installs first when pyproject.toml is newer than its stamp: not
    # into the shared .venv from a test, while other tests use it.
    stale = subprocess.run(["make", "-q", "install"], cwd=ROOT, capture_output=True, check=False)
    if stale.returncode != 0:
        pytest.skip("`make install` is not up to date: make run would pip install into .venv")
    if shutil.which("python3") is None:
        pytest.skip(
            "needs python3 on PATH (the README serves the page with python3 -m http.server)"
        )
    commands = sh_commands(HTMX, "## Run it")
    assert len(commands) == 4, commands
    assert commands[0].startswith("GATEWAY_ALLOWED_ORIGINS=http://127.0.0.1:8001 make run")
    assert "python3 -m http.server" in commands[2] and commands[3].startswith("curl "), commands
    var = Path(tempfile.mkdtemp(prefix="leasecast-htmx-"))
    admins = []
    try:
        for round_ in (1, 2):
            gateway = free_port()
            # make run's port: PORT in its environment (the Makefile's PORT ?= 8000).
            env = clean_env(GATEWAY_VAR_DIR=str(var), PORT=str(gateway))
            shell = Shell(env, tmp_path / f"htmx{round_}.log")
            try:
                admins.append(htmx_round(shell, commands, gateway, free_port()))
            finally:
                shell.close()
    finally:
        shutil.rmtree(var, ignore_errors=True)
    # The README: a second make run keeps var/'s database and admin token.
    assert admins[0] == admins[1]


def htmx_round(shell: Shell, commands: list[str], gateway: int, site: int) -> str:
    """The README's commands once, the gateway on port ``gateway``, the page on ``site``;
    the admin token make run printed."""
    serve, issue, page, publish = (
        c.replace(":8000", f":{gateway}").replace("8001", str(site)) for c in commands
    )
    # `make run` serves until stopped: in the background.
    shell.run(in_background(serve))
    wait_until_blocking(lambda: answer(f"http://127.0.0.1:{gateway}/healthz"), "make run serving")
    # What make run printed: the export line with the admin token.
    exports = [
        line
        for line in shell.text().splitlines()
        if line.strip().startswith("export LEASECAST_URL=")
    ]
    assert len(exports) == 1, shell.text()
    admin = exports[0].rsplit("ADMIN_TOKEN=", 1)[1].strip()
    assert admin.startswith("lc_"), exports

    printed = shell.run(issue).strip().splitlines()
    token = printed[-1].strip()  # "prints TOKEN": alone on the last line
    assert token.startswith("lc_"), printed

    shell.run(in_background(page))
    origin = f"http://127.0.0.1:{site}"
    url = f"{origin}/?gateway=http://127.0.0.1:{gateway}&topic=news&token={token}"
    shown_page = wait_until_blocking(lambda: answer(url), "the page's server")
    assert shown_page is not None
    status, html = shown_page
    assert status == 200 and "sse-connect" in html, html
    for script in ("leasecast-sse.js", "htmx.min.js", "sse.js"):
        shown = answer(f"{origin}/static/{script}")
        assert shown is not None and shown[0] == 200, (script, shown)

    # What the page's EventSource does: the stream, from the page's origin.
    stream = EventStream(gateway, "news", token, origin)
    try:
        head = wait_until_blocking(stream.head, "the stream's headers")
        assert head.startswith("HTTP/1.1 200"), head
        assert f"access-control-allow-origin: {origin}" in head.lower(), head
        wait_until_blocking(
            lambda: sse_sockets(gateway, admin, "news"), "the stream's subscription"
        )
        output = shell.run(publish.replace("ADMIN_TOKEN", admin))
        assert json_objects(output) == [{"published": 1}], output
        # "Each message appears as a line of JSON."
        wait_until_blocking(
            lambda: (
                "event: message" in stream.text() and 'data: {"hello":"world"}' in stream.text()
            ),
            "the published message on the page's stream",
        )
    finally:
        stream.close()
    return admin


# -- examples/shop ------------------------------------------------------------------


def shop_copy(where: Path) -> Path:
    """``where`` as the repository's root for the README: examples/shop copied
    (without a database of a developer's own), .venv a link to this checkout's."""
    shutil.copytree(
        SHOP,
        where / "examples" / "shop",
        ignore=shutil.ignore_patterns("*.sqlite3*", "__pycache__", "*.wake"),
    )
    (where / ".venv").symlink_to(ROOT / ".venv")
    return where


@pytest.mark.slow  # weighs more in the parallel stage's order (tests/conftest.py)
def test_the_shop_example_runs_as_written_twice(tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.skip("needs curl on PATH (the README's commands)")
    if not (ROOT / ".venv" / "bin" / "leasecast").exists():
        pytest.skip(".venv/bin/leasecast is missing: `make install` first, as the README says")
    commands = sh_commands(SHOP / "README.md", "# The example shop")
    assert len(commands) == 8, commands
    root = shop_copy(Path(tempfile.mkdtemp(prefix="leasecast-shop-doc-")))
    try:
        for round_ in (1, 2):
            shell = Shell(clean_env(), tmp_path / f"shop{round_}.log", cwd=root)
            try:
                shop_round(shell, commands, free_port())
            finally:
                shell.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def shop_answers(output: str) -> list[dict[str, Any]]:
    """The shop's answers among a command's output: the consumer running in the
    background writes its deliveries (``deliveries`` in each) to the same
    terminal, and one may land between a curl's first and last line."""
    return [o for o in json_objects(output) if "deliveries" not in o]


def shop_round(shell: Shell, commands: list[str], port: int) -> None:
    """The README's commands once, the shop on ``port`` instead of 8001."""
    cd, migrate, issue, serve, consume, worker, placed, declined = (
        c.replace("127.0.0.1:8001", f"127.0.0.1:{port}").replace("-p 8001", f"-p {port}")
        for c in commands
    )
    assert cd == "cd examples/shop" and "migrate" in migrate and "issue_token" in issue
    assert "leasecast_worker" in worker and '"card": "declined"' in declined, commands
    shell.run(cd)
    shell.run(migrate)
    token = shell.run(issue).strip().splitlines()[-1].strip()  # "prints a token"
    assert token.startswith("lc_"), token
    shell.run(in_background(serve))
    base = f"http://127.0.0.1:{port}"
    wait_until_blocking(lambda: answer(f"{base}/healthz"), "the shop serving")

    # "in other terminals": the consumer and the worker run until stopped.
    mark = len(shell.text())
    shell.run(in_background(consume.replace("lc_...", token)))
    shell.run(in_background(worker.replace("lc_...", token)))
    ada = shop_answers(shell.run(placed))
    assert len(ada) == 1 and set(ada[0]) == {"order", "message", "receipt_task"}, ada
    bob = shop_answers(shell.run(declined))
    assert len(bob) == 1 and "rolled_back" in bob[0], bob

    # The consume command prints ada's order, and never bob's.
    def delivered() -> list[dict[str, Any]]:
        return [
            o
            for o in json_objects(shell.text()[mark:])
            if isinstance(o.get("body"), dict) and "customer" in o["body"]
        ]

    lines = wait_until_blocking(delivered, "the consume command's delivery")
    assert [line["body"] for line in lines] == [{"order": ada[0]["order"], "customer": "ada"}], (
        shell.text()[mark:]
    )

    # The worker ran ada's receipt task; bob's never existed.
    def receipt(task: str) -> tuple[int, dict[str, Any]] | None:
        found = answer(f"{base}/tasks/{task}")
        return None if found is None else (found[0], json.loads(found[1]))

    def succeeded() -> tuple[int, dict[str, Any]] | None:
        found = receipt(ada[0]["receipt_task"])
        return found if found and "SUCC" in str(found[1].get("status")) else None

    done = wait_until_blocking(succeeded, "the worker's receipt task")
    assert done is not None and done[0] == 200, done
    gone = receipt(bob[0]["rolled_back"]["receipt_task"])
    assert gone is not None and gone[0] == 404, gone
    # The order page: ada's order is there, bob's rolled back.
    shown = answer(f"{base}/orders/{ada[0]['order']}")
    assert shown is not None and shown[0] == 200, shown
    missing = answer(f"{base}/orders/{bob[0]['rolled_back']['order']}")
    assert missing is not None and missing[0] == 404, missing
