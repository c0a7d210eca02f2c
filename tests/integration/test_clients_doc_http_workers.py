"""docs/clients.md "HTTP workers": its curl commands and its Python example run as written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.doc_shell import Shell, sh_commands
from tests.support.clients import ahttp
from tests.support.databases import ROOT
from tests.support.docs import doc_block
from tests.support.gateways import GatewayProcess

DOC = ROOT / "docs" / "clients.md"
SECTION = "HTTP workers"


def _env(gateway: GatewayProcess, name: str) -> dict[str, str]:
    token = gateway.issue_token("enqueue:emails", "consume:emails", name=name)
    return {**os.environ, "LEASECAST_URL": gateway.http, "LEASECAST_TOKEN": token}


async def test_curl_commands_lease_and_ack(
    gateway: GatewayProcess, admin_token: str, tmp_path: Path
) -> None:
    commands = sh_commands(DOC, f"## {SECTION}")
    assert len(commands) == 4, commands
    shell = Shell(_env(gateway, "curl-doc"), tmp_path / "shell.log", cwd=tmp_path)
    try:
        outputs = [shell.run(command, timeout=60) for command in commands]
    finally:
        shell.close()
    assert json.loads(outputs[0])["results"][0]["duplicate"] is False
    leased = json.loads(outputs[2])
    assert leased["body"] == {"to": "ada@example.com"} and leased["deliveries"] == 1
    assert json.loads(outputs[3]) == {"acked": 1, "stale": []}
    _, stats = await ahttp("GET", f"{gateway.http}/api/queues/emails", admin_token)
    assert (stats["visible"], stats["in_flight"]) == (0, 0), stats


async def test_python_example_drains_the_queue(gateway: GatewayProcess, admin_token: str) -> None:
    env = _env(gateway, "python-http-doc")
    bodies = [{"to": f"user{i}@example.com"} for i in range(3)]
    status, _ = await ahttp(
        "POST",
        f"{gateway.http}/api/queues/emails/messages",
        admin_token,
        {"messages": [{"body": body} for body in bodies]},
    )
    assert status == 200
    done = subprocess.run(
        [sys.executable, "-c", doc_block(SECTION, "python")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines == [*(f"sending to {b['to']}" for b in bodies), "handled 3"], lines
    status, stats = await ahttp("GET", f"{gateway.http}/api/queues/emails", admin_token)
    assert (stats["visible"], stats["in_flight"]) == (0, 0), stats
