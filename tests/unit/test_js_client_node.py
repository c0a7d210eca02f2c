"""The JavaScript client's unit tests (clients/js/test/*.test.js), run by Node's own runner.

They check the client's pure parts (frame parsing, credit, backoff, resume
position, token refresh timing, close codes) without a socket or a browser.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.support.databases import ROOT

JS_TESTS = ROOT / "clients" / "js" / "test"


def _node() -> str | None:
    node = shutil.which("node")
    if node is None:
        return None
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout
    match = re.match(r"v(\d+)", version.strip())
    # `node --test DIRECTORY` runs the directory's *.test.js from Node 20 on.
    return node if match and int(match.group(1)) >= 20 else None


def test_js_client_unit_tests_pass_in_node() -> None:
    node = _node()
    if node is None:
        pytest.skip("Node.js 20 or later is not installed (apt-get install nodejs)")
    done = subprocess.run(
        [node, "--test", str(JS_TESTS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    passed = re.search(r"^# pass (\d+)$", done.stdout, re.MULTILINE)
    assert passed is not None and int(passed.group(1)) >= 10, done.stdout[-2000:]
