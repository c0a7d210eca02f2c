"""docs/spark.md "The example job": its commands run as written, twice in a row.

The ``sh`` block is typed into one bash, from a directory of its own that
has the checkout's ``.venv`` and ``manage.py`` (the commands' ``var/orders-in`` and
``var/checkpoints`` land there, not in the checkout), against a real gateway,
with the ``export`` line ``make run`` prints. The second run uses the same
directory and database: the file job finds nothing new, the rate job goes on
(with the token the first run kept: a batch staged under one token cannot be
replayed under another).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.integration.doc_shell import Shell, sh_commands
from tests.support.clients import http
from tests.support.databases import ROOT, manage, sqlite_database
from tests.support.docs import bootstrap_export
from tests.support.gateways import GatewayProcess

DOC = ROOT / "docs" / "spark.md"


@pytest.mark.timeout(1200)  # four Spark sessions start, about 40 s each on a busy machine
def test_the_example_job_commands_run_as_written_twice(tmp_path: Path) -> None:
    commands = sh_commands(DOC, "## The example job: `python -m spark_feed`")
    assert any("--files var/orders-in" in c for c in commands), commands
    work = tmp_path / "checkout"
    work.mkdir()
    (work / ".venv").symlink_to(ROOT / ".venv")
    (work / "manage.py").symlink_to(ROOT / "manage.py")
    var = Path(tempfile.mkdtemp(prefix="leasecast-spark-doc-"))
    with sqlite_database(var) as env:
        gateway = GatewayProcess(env, var, name="spark-doc")
        export = bootstrap_export(manage(env, "bootstrap_dev", "--url", gateway.http))
        admin = export.rsplit("ADMIN_TOKEN=", 1)[1]
        gateway.start()
        try:
            ticks = []
            for round_ in (1, 2):
                shell = Shell(env, tmp_path / f"shell{round_}.log", cwd=work)
                try:
                    shell.run(export)
                    outputs = [shell.run(command, timeout=300) for command in commands]
                finally:
                    shell.close()
                files_job = next(
                    o for c, o in zip(commands, outputs, strict=True) if "--files" in c
                )
                assert "running; checkpoint var/checkpoints/events" in files_job, files_job
                status, events = http("GET", f"{gateway.http}/api/queues/events", admin)
                # Exactly the file's two rows, however often the job runs.
                assert status == 200 and events["visible"] == 2, events
                status, queue = http("GET", f"{gateway.http}/api/queues/ticks", admin)
                assert status == 200, queue
                ticks.append(queue["visible"])
            assert ticks[0] >= 1000 and ticks[1] >= ticks[0] + 1000, ticks
            assert (work / "var" / "checkpoints" / "events").is_dir()
        finally:
            gateway.stop()
