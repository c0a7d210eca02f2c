"""The docs' examples: a docs/clients.md section's code block run as a program, and
the ``export`` line ``bootstrap_dev`` prints for the reader to paste."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.support.databases import ROOT
from tests.support.gateways import GatewayProcess

DOC = ROOT / "docs" / "clients.md"


def doc_block(section: str, language: str) -> str:
    """The first ``language`` code block of the docs/clients.md section titled ``section``."""
    text = DOC.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    body = text[start : end if end != -1 else len(text)]
    match = re.search(rf"```{language}\n(.*?)\n```", body, re.DOTALL)
    assert match is not None, f"no {language} block in section {section!r}"
    return match.group(1) + "\n"


def run_example(gateway: GatewayProcess, section: str, name: str) -> str:
    """Run the section's Python block as a program of its own, with only the
    environment the docs name and a token with exactly the scopes they list
    (the examples need no more); its output."""
    token = gateway.issue_token(
        "enqueue:emails",
        "consume:emails",
        "publish:prices",
        "subscribe:prices",
        name=name,
    )
    env = {**os.environ, "LEASECAST_URL": gateway.http, "LEASECAST_TOKEN": token}
    done = subprocess.run(
        [sys.executable, "-c", doc_block(section, "python")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,  # a program that waits forever fails here
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def bootstrap_export(output: str) -> str:
    """The ``export`` line ``bootstrap_dev`` (so ``make run``) says to paste."""
    lines = [line.strip() for line in output.splitlines() if line.strip().startswith("export ")]
    assert len(lines) == 1, output
    return lines[0]
