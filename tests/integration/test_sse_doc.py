"""docs/clients.md "Server-sent events": its curl commands run as written and show what it says."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.integration.doc_shell import Shell, sh_commands
from tests.support.databases import ROOT
from tests.support.gateways import GatewayProcess

DOC = ROOT / "docs" / "clients.md"
SECTION = "## Server-sent events: EventSource, curl, htmx"


async def test_the_curl_commands_read_a_published_message(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    commands = sh_commands(DOC, SECTION)
    assert len(commands) == 5, commands
    token = gateway.issue_token("publish:prices", "subscribe:prices", name="sse-doc")
    env = {**os.environ, "LEASECAST_URL": gateway.http, "LEASECAST_TOKEN": token}
    shell = Shell(env, tmp_path / "shell.log", cwd=tmp_path)
    try:
        outputs = [shell.run(command, timeout=60) for command in commands]
    finally:
        shell.close()
    assert json.loads(outputs[2]) == {"published": 1}
    shown = outputs[4]
    assert shown.startswith(": leasecast event stream\n\n"), shown
    block = shown.split("\n\n")[1].splitlines()
    assert block[0].startswith("id: ") and block[0].endswith(":1"), shown
    assert block[1:] == ["event: message", 'data: {"sku":"A1","price":10}'], shown
