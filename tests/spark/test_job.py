"""The example job (``python -m spark_feed``) as a real driver process, killed for real.

Each test runs the job as its own process group (Python driver, Spark's JVM
and its Python workers) and checks exactly-once effect by draining the queue
through a real worker socket.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.spark.conftest import drain_ids, visible, write_files
from tests.support.clients import unique
from tests.support.databases import ROOT
from tests.support.gateways import GatewayProcess, sqlite_gateway
from tests.support.processes import LoggedProcess
from tests.support.waiting import wait_until_blocking

ROWS = 10_000


class Job(LoggedProcess):
    """One run of ``python -m spark_feed`` in its own process group, output in a file."""

    def __init__(self, site: GatewayProcess, token: str, queue: str, work: Path, *extra: str):
        command = [
            sys.executable,
            "-m",
            "spark_feed",
            "--url",
            site.http,
            "--token",
            token,
            "--queue",
            queue,
            "--files",
            str(work / "in"),
            "--schema",
            "id LONG, name STRING",
            "--max-files-per-trigger",
            "1",
            "--batch-size",
            "100",
            "--available-now",
            "--checkpoint",
            str(work / "checkpoint"),
            *extra,
        ]
        log = work / f"job-{time.monotonic_ns()}.log"
        super().__init__(command, log, what="the job", cwd=ROOT)


@pytest.fixture
def own_site() -> Iterator[GatewayProcess]:
    """A gateway of the test's own (it gets killed)."""
    with sqlite_gateway("spark-own") as gateway:
        yield gateway


def test_driver_killed_mid_stream_and_restarted_gives_exactly_every_row(
    site: GatewayProcess,
) -> None:
    token = site.issue_token("enqueue:*", "consume:*", name="job-kill")
    queue = unique("job")
    work = Path(tempfile.mkdtemp(prefix="leasecast-job-"))
    write_files(work / "in", 0, ROWS, per_file=250)  # 40 files: 40 batches
    job = Job(site, token, queue, work)
    wait_until_blocking(
        lambda: visible(site, token, queue) >= 1000, "the first batches", timeout=180
    )
    job.kill()
    at_kill = visible(site, token, queue)
    assert at_kill < ROWS, "the job finished before it could be killed mid-stream"
    again = Job(site, token, queue, work)
    assert again.wait() == 0, again.output()[-3000:]
    assert "done:" in again.output()
    assert visible(site, token, queue) == ROWS
    assert sorted(drain_ids(site, token, queue)) == list(range(ROWS))  # each row once


def test_gateway_killed_mid_stream_the_job_recovers_with_exactly_every_row(
    own_site: GatewayProcess,
) -> None:
    token = own_site.issue_token("enqueue:*", "consume:*", name="job-outage")
    queue = unique("job")
    work = Path(tempfile.mkdtemp(prefix="leasecast-job-"))
    write_files(work / "in", 0, ROWS, per_file=250)
    job = Job(own_site, token, queue, work, "--restarts", "30")
    wait_until_blocking(
        lambda: visible(own_site, token, queue) >= 1000, "the first batches", timeout=180
    )
    own_site.kill()  # kill -9 while batches are staged and committed
    time.sleep(3)  # the job's batches fail meanwhile
    own_site.start()
    assert job.wait() == 0, job.output()[-3000:]
    output = job.output()
    assert "query failed" in output and "restarting from the checkpoint" in output, output
    assert visible(own_site, token, queue) == ROWS
    assert sorted(drain_ids(own_site, token, queue)) == list(range(ROWS))


def test_job_refuses_bad_options_with_a_clear_error(site: GatewayProcess) -> None:
    work = Path(tempfile.mkdtemp(prefix="leasecast-job-"))
    (work / "empty").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "LEASECAST_TOKEN"}
    base = [sys.executable, "-m", "spark_feed", "--url", site.http, "--queue", "q"]
    cases = [
        ([*base, "--files", str(work / "empty")], "no token"),
        ([*base, "--token", "lc_wrong", "--files", str(work / "empty")], "refused the token"),
        ([*base, "--rate", "0"], "must be at least 1"),
        ([*base, "--files", str(work), "--rate", "5"], "not allowed with"),
        (
            [
                *base,
                *("--token", site.issue_token("enqueue:*", name="job-columns")),
                *("--files", str(work / "empty"), "--schema", "id LONG, name STRING"),
                *("--priority-column", "name"),
            ],
            "error: option priorityColumn: column 'name' is STRING; it must be an integer column",
        ),
    ]
    for command, message in cases:
        done = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert message in done.stderr, (command, done.stderr)
