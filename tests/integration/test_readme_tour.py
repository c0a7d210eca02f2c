"""README "A five-minute tour": every command runs as written, twice in a row.

Each run is what a user does: ``make run`` (its migrate, ``bootstrap_dev`` and
server, on a free port), paste the ``export`` line it printed into a fresh
shell, then type the tour's ``sh`` blocks into that shell in order. The
second run uses the same database, as a second ``make run`` does. A few
commands need the user to wait for something they would see (a worker
holding a message); the test waits for it through the gateway's API.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

from tests.integration.doc_shell import Shell, sh_commands
from tests.support.clients import http
from tests.support.databases import ROOT, manage, sqlite_database
from tests.support.docs import bootstrap_export
from tests.support.gateways import GatewayProcess
from tests.support.waiting import wait_until_blocking

README = ROOT / "README.md"


def tour_commands() -> list[str]:
    """The commands of the README tour's ``sh`` blocks, in order."""
    return sh_commands(README, "## A five-minute tour")


def queue(gateway: GatewayProcess, token: str) -> dict[str, Any]:
    status, body = http("GET", f"{gateway.http}/api/queues/emails.welcome", token)
    return body if status == 200 else {}


def sockets(gateway: GatewayProcess, token: str, kind: str) -> list[dict[str, Any]]:
    status, body = http("GET", f"{gateway.http}/api/stats", token)
    return [s for s in body.get("sockets", []) if s["kind"] == kind] if status == 200 else []


def run_tour(gateway: GatewayProcess, shell: Shell, admin: str, round_: int) -> None:
    """Type every tour command in order, waiting where a reader would."""
    commands = tour_commands()
    kills = 0
    for command in commands:
        if command.startswith(".venv/bin/leasecast stats"):
            # The worker acked the message: what step 5 says the stats show.
            wait_until_blocking(
                lambda: (
                    queue(gateway, admin).get("visible") == 0
                    and queue(gateway, admin).get("in_flight") == 0
                ),
                "the worker's ack",
            )
        if command == "kill $!":
            kills += 1
            if kills == 2:  # the holding worker has printed its delivery
                wait_until_blocking(
                    lambda: queue(gateway, admin).get("in_flight") == 1, "a held lease"
                )
            if kills == 3:
                wait_until_blocking(
                    lambda: '"EURUSD": 1.09' in shell.text(), "the subscriber's message"
                )
        if "publish prices '{\"EURUSD\": 1.09}'" in command:
            wait_until_blocking(lambda: sockets(gateway, admin, "subscriber"), "the subscriber")
        output = shell.run(command)
        assert '"error"' not in output, f"{command!r} was refused:\n{output}"
        check(command, output, shell, gateway, admin, round_)
    assert kills == 3, commands


def objects(output: str, key: str) -> list[dict[str, Any]]:
    """The JSON objects with ``key`` in ``output`` (background jobs print too, and
    curl's answer ends without a newline, so another line may follow on its line)."""
    decoder = json.JSONDecoder()
    found = []
    for line in output.splitlines():
        index = 0
        while line.startswith("{", index):
            value, index = decoder.raw_decode(line, index)
            if key in value:
                found.append(value)
    return found


def check(
    command: str, output: str, shell: Shell, gateway: GatewayProcess, admin: str, round_: int
) -> None:
    """What the README says each command shows."""
    if command.startswith("export LEASECAST_TOKEN"):
        assert shell.run('test -n "$LEASECAST_TOKEN" && echo set').strip() == "set"
    elif command.endswith(".venv/bin/leasecast consume emails.welcome &"):
        wait_until_blocking(lambda: sockets(gateway, admin, "worker"), "the worker")
    elif command.startswith("curl -s -X POST") and command.count("/messages") == 1:
        [result] = objects(output, "results")[0]["results"]
        # The first run enqueues; the second, within the dedup window, is a duplicate.
        assert result["duplicate"] is (round_ == 2), output
    elif command == ".venv/bin/leasecast stats emails.welcome":
        # Indented, so the one object of several lines (the worker's line may come first).
        stats, _ = json.JSONDecoder().raw_decode(output, output.index("{\n"))
        assert (stats["visible"], stats["in_flight"], stats["dead"]) == (0, 0, 0), output
    elif command == ".venv/bin/leasecast consume emails.welcome --count 1":
        [line] = objects(output, "deliveries")
        # After the kill, the held message again; after the redrive, the dead one.
        assert line["body"]["to"] in {"bob@example.com", "nobody@invalid"}, output
        if line["body"]["to"] == "bob@example.com":
            assert line["deliveries"] == 2, output
    elif command.endswith("--count 1 --reject"):
        assert [line["body"] for line in objects(output, "deliveries")] == [
            {"to": "nobody@invalid"}
        ]
        assert queue(gateway, admin)["dead"] == 1
    elif "/messages?state=dead" in command:
        [page] = objects(output, "messages")
        items = page["messages"]
        assert [item["body"] for item in items] == [{"to": "nobody@invalid"}], output
    elif command.endswith('/redrive" -H "Authorization: Bearer $ADMIN_TOKEN"'):
        assert objects(output, "redriven") == [{"redriven": 1}], output
    elif "subscribe prices --after" in command:
        lines = objects(output, "seq")
        assert [line["body"] for line in lines] == [{"EURUSD": 1.11}, {"EURUSD": 1.12}], output


def test_the_readme_tour_runs_as_written_twice(tmp_path: Path) -> None:
    var = Path(tempfile.mkdtemp(prefix="leasecast-tour-"))
    with sqlite_database(var) as env:
        env = {k: v for k, v in env.items() if k not in ("LEASECAST_URL", "LEASECAST_TOKEN")}
        for round_ in (1, 2):
            gateway = GatewayProcess(env, var, name=f"tour{round_}")
            # What `make run` does: migrate, bootstrap_dev with its URL, serve.
            manage(env, "migrate", "--noinput", "-v0")
            printed = manage(env, "bootstrap_dev", "--url", gateway.http)
            export = bootstrap_export(printed)
            assert export.startswith(f"export LEASECAST_URL={gateway.http} ADMIN_TOKEN=lc_")
            admin = export.rsplit("ADMIN_TOKEN=", 1)[1]
            gateway.start()
            shell = Shell(env, tmp_path / f"shell{round_}.log")
            try:
                shell.run(export)
                run_tour(gateway, shell, admin, round_)
                # Everything the tour enqueued was worked: nothing left behind.
                stats = queue(gateway, admin)
                assert (stats["visible"], stats["in_flight"], stats["dead"]) == (0, 0, 0)
            finally:
                shell.close()
                gateway.stop()


def test_bootstrap_dev_names_its_file_and_prints_the_export_line(tmp_path: Path) -> None:
    with sqlite_database(tmp_path) as env:
        first = manage(env, "bootstrap_dev", "--url", "http://127.0.0.1:9000/")
        again = manage(env, "bootstrap_dev", "--url", "http://127.0.0.1:9001")
    path = tmp_path / "dev-credentials.txt"
    assert f"kept in {path}" in first  # named, not "this file"
    assert path.stat().st_mode & 0o777 == 0o600
    token = re.search(r"admin token:\s+(lc_\S+)", first)
    assert token is not None, first
    assert bootstrap_export(first) == (
        f"export LEASECAST_URL=http://127.0.0.1:9000 ADMIN_TOKEN={token.group(1)}"
    )
    # Later runs print the same credentials with this run's address.
    assert bootstrap_export(again) == (
        f"export LEASECAST_URL=http://127.0.0.1:9001 ADMIN_TOKEN={token.group(1)}"
    )
    assert "admin login:   admin / " in again
