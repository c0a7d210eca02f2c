"""docs/clients.md "Python": its example runs as written, against a live gateway.

The code block is run as a program of its own with only the environment the
section names (``LEASECAST_URL``, ``LEASECAST_TOKEN``) and a token with exactly
the scopes it lists.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.databases import ROOT
from tests.integration.harness import GatewayProcess
from tests.integration.test_clients_doc_raw import doc_block


def test_python_example_runs_against_a_live_gateway(gateway: GatewayProcess) -> None:
    code = doc_block("Python", "python")
    token = gateway.issue_token(
        "enqueue:emails",
        "consume:emails",
        "publish:prices",
        "subscribe:prices",
        name="python-example",
    )
    env = {**os.environ, "LEASECAST_URL": gateway.http, "LEASECAST_TOKEN": token}
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "enqueued 3 duplicates 0",
        "sending to user0@example.com delivery 1",
        "sending to user1@example.com delivery 1",
        "sending to user2@example.com delivery 1",
        "prices [101, 102, 103]",
    ]
