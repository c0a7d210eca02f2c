"""docs/operations.md: every ``sh`` command runs as written, twice in a row.

"Choosing the server: daphne or uvicorn" gives two commands that serve the
gateway on 127.0.0.1:8000. Each is typed into a shell as written, in the
background (a server runs until stopped), the only substitution being the
port: ``-p 8000`` becomes a free port (8000 may be someone's ``make run``).
Each serves /healthz and the API under the server it names, is stopped with
SIGTERM, and is started again on the same var/ directory (a temporary
``GATEWAY_VAR_DIR``, never the developer's var/).

The efficiency benchmark's command of the same section runs with its flags
and smaller numbers (as written it took 82 s here: see its test) and must
print its table, a row per server and app.

Where every ``sh``/``bash``/``console`` block of README.md, docs/ and
examples/ is run as written: :data:`COVERED` (checked by the last test, so a
new block without a test fails it).
docs/tasks.md names its commands in its prose, not in blocks:
tests/integration/test_tasks_doc_commands.py runs those.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.integration.doc_shell import Shell, in_background, sh_commands
from tests.support.clients import http
from tests.support.databases import ROOT, sqlite_database
from tests.support.gateways import free_port
from tests.support.waiting import wait_until_blocking

DOC = ROOT / "docs" / "operations.md"
SERVERS_SECTION = "## Choosing the server: daphne or uvicorn"

#: What the shell's ``wait`` says once each server stopped on SIGTERM (the table
#: of the section says so too).
EXIT_ON_SIGTERM = {"daphne": 0, "uvicorn": 143}


def answer(url: str) -> tuple[int, dict[str, str]] | None:
    """``GET url``: its status and headers (lower-case names), or None if nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}
    except OSError:
        return None


def serve_commands() -> list[str]:
    """The section's two server commands (the benchmark's has no ``-p``)."""
    return [c for c in sh_commands(DOC, SERVERS_SECTION) if "gateway.serve" in c]


def test_the_section_has_the_commands_this_test_runs() -> None:
    commands = sh_commands(DOC, SERVERS_SECTION)
    assert commands == [
        ".venv/bin/python -m gateway.serve -b 127.0.0.1 -p 8000                    # daphne",
        ".venv/bin/python -m gateway.serve --server uvicorn -b 127.0.0.1 -p 8000   # uvicorn",
        ".venv/bin/python -m bench.efficiency --cycles 5000 --rounds 2",
    ], commands


@pytest.mark.parametrize("server", ["daphne", "uvicorn"])
def test_each_server_command_serves_the_gateway_twice(server: str, tmp_path: Path) -> None:
    if server == "uvicorn":
        pytest.importorskip("uvicorn", reason="uvicorn is not installed (the dev extra has it)")
    [command] = [c for c in serve_commands() if c.endswith(f"# {server}")]
    port = free_port()
    # The one substitution: a free port for the doc's 8000.
    typed = command.replace("-p 8000", f"-p {port}")
    assert typed != command
    var = Path(tempfile.mkdtemp(prefix=f"leasecast-ops-{server}-"))
    try:
        with sqlite_database(var) as env:
            admin = _admin_token(env)
            for round_ in (1, 2):
                shell = Shell(env, tmp_path / f"{server}{round_}.log")
                try:
                    shell.run(in_background(typed))
                    answered = wait_until_blocking(
                        lambda: answer(f"http://127.0.0.1:{port}/healthz"),
                        f"{server} serving /healthz (round {round_})",
                    )
                    assert answered is not None
                    status, headers = answered
                    assert status == 200, (status, shell.text())
                    # The server the comment names is the one that answers.
                    assert server in headers.get("server", ""), headers
                    code, body = http("GET", f"http://127.0.0.1:{port}/api/stats", admin)
                    assert code == 200 and "sockets" in body, (code, body)
                    # Stopped as an operator would (SIGTERM); it exits by itself.
                    stopped = shell.run('kill $! && wait $!; echo "exited $?"')
                    # daphne exits 0; uvicorn ends its graceful shutdown by raising
                    # the signal again, so the shell sees 128 + SIGTERM.
                    assert f"exited {EXIT_ON_SIGTERM[server]}" in stopped, stopped
                    assert answer(f"http://127.0.0.1:{port}/healthz") is None
                finally:
                    shell.close()
    finally:
        shutil.rmtree(var, ignore_errors=True)


def _admin_token(env: dict[str, str]) -> str:
    from tests.support.databases import manage

    return manage(env, "issue_token", "ops-doc", "--scope", "admin").strip().splitlines()[-1]


@pytest.mark.slow  # weighs more in the parallel stage's order (tests/conftest.py)
def test_the_benchmark_command_runs_with_its_flags(tmp_path: Path) -> None:
    """The doc's command with its flags, smaller numbers: ``--cycles 5000 --rounds 2``
    as written took 82 s (exit 0, its two tables printed; 2026-11-26, load average
    19 on 2 cores while other suites ran), too long for this stage, so the test
    substitutes ``--cycles 500 --rounds 1``. Nothing else changes: both servers,
    the gateway and the echo app, the same tables. The benchmark keeps no state
    (each run starts its servers on fresh temporary databases), so it is run
    twice only in the sense that the second call starts from scratch too: once here.
    """
    pytest.importorskip("uvicorn", reason="uvicorn is not installed (the benchmark runs both)")
    [command] = [c for c in sh_commands(DOC, SERVERS_SECTION) if "bench.efficiency" in c]
    typed = command.replace("--cycles 5000 --rounds 2", "--cycles 500 --rounds 1")
    assert typed != command, command
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["GATEWAY_VAR_DIR"] = str(tmp_path)
    shell = Shell(env, tmp_path / "bench.log")
    try:
        output = shell.run(typed, timeout=240)
    finally:
        shell.close()
    assert "Efficiency, 500 v1 cycles a measurement" in output, output
    # One row per server and app.
    for server in ("daphne", "uvicorn"):
        for app in ("gateway", "echo"):
            assert re.search(rf"^\| {server} \| {app} \| [0-9,]+ \|", output, re.M), output


# -- which test runs each documented shell block ----------------------------------

#: Every section of README.md, docs/*.md and examples/*/README.md with a
#: ``sh``, ``bash`` or ``console`` block, and what runs its commands as written.
#: A section where nothing does says why, starting with "not run:".
COVERED: dict[tuple[str, str], str] = {
    ("README.md", "# Leasecast"): "not run: `make test` (the whole suite); `make run` is "
    "typed as written by test_examples_commands.py (examples/htmx) and what it runs by "
    "test_readme_tour.py",
    ("README.md", "## A five-minute tour"): "tests/integration/test_readme_tour.py",
    ("docs/clients.md", "## Python"): "not run: `pip install ./clients/python` "
    "(tests/integration/test_client_package.py builds and installs it as a wheel)",
    ("docs/clients.md", "## HTTP workers"): "tests/integration/test_clients_doc_http_workers.py",
    ("docs/clients.md", "## Server-sent events: EventSource, curl, htmx"): (
        "tests/integration/test_sse_doc.py"
    ),
    ("docs/operations.md", "## Choosing the server: daphne or uvicorn"): (
        "tests/integration/test_docs_commands.py"
    ),
    ("docs/spark.md", "## The example job: `python -m spark_feed`"): (
        "tests/spark/test_doc_commands.py"
    ),
    ("docs/spark.md", "### Installing: the same environment on every node"): "not run: "
    "a venv in /opt and a Spark cluster's hosts (tests/spark/test_cluster.py does the same "
    "on its own paths)",
    ("docs/spark.md", "### Submitting"): "not run: a Spark cluster's master and shared paths "
    "(tests/spark/test_cluster.py submits to its own)",
    ("docs/reliability.md", "### Soak (`bench/soak.py`, not in CI)"): "not run: a soak of hours",
    ("examples/htmx/README.md", "## Run it"): "tests/integration/test_examples_commands.py",
    ("examples/shop/README.md", "# The example shop"): (
        "tests/integration/test_examples_commands.py"
    ),
}

#: docs/benchmarks.md's sections: each block is a benchmark of minutes (its
#: figures on the page); tests/integration/test_bench_smoke.py runs the
#: benchmark modules with small sizes, not these commands as written.
BENCHMARKS_NOT_RUN = "not run: benchmarks of minutes (test_bench_smoke.py runs them small)"


def documents() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "examples").glob("*/README.md")),
    ]


def test_every_shell_block_is_run_or_says_why_not() -> None:
    found = {
        (str(path.relative_to(ROOT)), heading)
        for path in documents()
        for heading in shell_sections(path)
    }
    runners = {key: BENCHMARKS_NOT_RUN for key in found if key[0] == "docs/benchmarks.md"}
    runners.update(COVERED)
    listed = set(runners)
    assert found - listed == set(), f"shell blocks that no test runs: {sorted(found - listed)}"
    assert set(COVERED) - found == set(), f"gone from the docs: {sorted(set(COVERED) - found)}"
    for (doc, heading), runner in COVERED.items():
        if not runner.startswith("not run: "):
            test = ROOT / runner
            assert test.is_file(), (doc, heading, runner)
            # The test names the document it runs.
            assert Path(doc).name in test.read_text() or doc in test.read_text(), (doc, runner)


def shell_sections(path: Path) -> list[str]:
    """The headings (``#``..``####`` lines) of ``path`` whose sections hold a shell block."""
    heading, found = "", []
    fenced = False
    for line in path.read_text().splitlines():
        stripped = line.lstrip()
        if stripped.startswith("```"):
            shell = stripped[3:].strip() in ("sh", "bash", "console", "shell")
            if not fenced and shell and heading not in found:
                found.append(heading)
            fenced = not fenced
            continue
        if not fenced and re.match(r"#{1,4} ", line):
            heading = line
    return found
