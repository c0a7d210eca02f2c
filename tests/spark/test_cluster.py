"""The sink on a Spark standalone cluster: an executor and the driver killed mid-batch.

A master and two workers (separate JVMs, from pyspark's ``bin/spark-class``),
the feed job submitted with ``spark-submit --master spark://...`` as
docs/spark.md says, its executors running the Python of this virtualenv
(``spark.pyspark.python``: the sink is installed there, as it must be in a
real cluster's executor environment), writing to a real gateway process
through :class:`~tests.spark.standalone.HoldingProxy`, which holds:

1. the first staging request of batch 1, from a write task on an executor:
   that executor's JVM is killed with ``kill -9`` while the request is in
   flight, and the request dropped like a dead process's. Spark retries the
   task on another executor; the query goes on (no restart);
2. the gateway's answer to batch 2's commit: the gateway has committed, the
   driver never hears of it; the driver (spark-submit, its JVM and Python) is
   killed with ``kill -9``. A new driver on the same checkpoint replays batch
   2 (the gateway answers ``already``) and goes on with batch 3.

The ledger: every commit the gateway confirmed (``committed``, ``already``)
against every message delivered to a worker, counted per row id: nothing
lost, nothing twice; the one replayed commit is counted and is ``already``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.spark.conftest import drain_ids, visible, write_files
from tests.spark.standalone import (
    FAST_JVM,
    HoldingProxy,
    StandaloneCluster,
    owner_of_connection,
    process_chain,
    spark_bin,
)
from tests.support.clients import unique
from tests.support.databases import sqlite_database
from tests.support.gateways import GatewayProcess
from tests.support.processes import LoggedProcess

FILES, PER_FILE, PER_BATCH = 8, 100, 2  # 4 micro-batches of 2 files (2 partitions)
ROWS = FILES * PER_FILE

#: The driver script docs/spark.md has users submit.
DRIVER_SCRIPT = "from spark_feed.job import main\n\nraise SystemExit(main())\n"


class Driver(LoggedProcess):
    """``spark-submit`` of the feed job in its own process group, output to a file."""

    def __init__(self, cluster: StandaloneCluster, work: Path, *job_args: str) -> None:
        command = [
            str(spark_bin("spark-submit")),
            *("--master", cluster.url),
            # The executors' Python: the sink (and pyarrow) are installed in it.
            *("--conf", f"spark.pyspark.python={sys.executable}"),
            *("--driver-java-options", FAST_JVM),
            *("--conf", f"spark.executor.extraJavaOptions={FAST_JVM}"),
            str(work / "feed.py"),
            *job_args,
        ]
        log = work / f"driver-{time.monotonic_ns()}.log"
        # kill -9 of its group reaches spark-submit's JVM and the Python.
        super().__init__(command, log, what="the driver", cwd=work, env=cluster.env)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_executor_and_driver_killed_mid_batch_on_a_cluster_every_row_once(tmp_path: Path) -> None:
    work = tmp_path
    (work / "spark").mkdir()
    cluster = StandaloneCluster(work / "spark")
    cluster.start()  # first: its JVMs take longest; the gateway's database is made meanwhile
    drivers: list[Driver] = []
    proxy = HoldingProxy()
    try:
        with sqlite_database(work) as env:
            site = GatewayProcess(env, work, name="spark-cluster")
            token = site.issue_token("enqueue:*", "consume:*", name="cluster")
            queue = unique("cluster")
            write_files(work / "in", 0, ROWS, per_file=PER_FILE)
            (work / "feed.py").write_text(DRIVER_SCRIPT)
            job = [
                *("--url", proxy.http, "--token", token, "--queue", queue),
                *("--files", str(work / "in"), "--schema", "id LONG, name STRING"),
                *("--max-files-per-trigger", str(PER_BATCH), "--batch-size", "25"),
                *("--available-now", "--checkpoint", str(work / "checkpoint")),
            ]
            proxy.hold_stage(1)
            proxy.hold_commit_answer(2)
            cluster.wait_master()
            drivers.append(Driver(cluster, work, *job))  # executors come as workers do
            try:
                site.start()  # while the driver starts (the proxy holds requests till then)
                proxy.connect(site.http)
                cluster.wait_ready()
                run_the_faults(cluster, site, proxy, drivers, work, job, token, queue)
                check_the_ledger(site, proxy, drivers[1], token, queue)
            finally:
                proxy.close()
                site.stop()
        # One worker saw its executor die of the kill (exit status 137 is SIGKILL).
        logs = [cluster.log(f"worker{n}") for n in (1, 2)]
        assert sum("exitStatus 137" in log for log in logs) == 1, logs
    finally:
        for driver in drivers:
            if driver.proc.poll() is None:
                driver.kill()
        cluster.stop()


def run_the_faults(
    cluster: StandaloneCluster,
    site: GatewayProcess,
    proxy: HoldingProxy,
    drivers: list[Driver],
    work: Path,
    job: list[str],
    token: str,
    queue: str,
) -> None:
    """Kill the executor mid-stage, then the driver after the gateway's commit; run a new one."""
    # 1. An executor dies with a write task's request in flight.
    stage = proxy.caught(1)
    writer = owner_of_connection(stage.client_port, proxy.port)
    assert writer is not None, "no process holds the held connection"
    chain = list(process_chain(writer))
    executor = next((pid for pid, cmd in chain if "CoarseGrainedExecutorBackend" in cmd), None)
    assert executor is not None and executor in cluster.executors(), chain
    os.kill(executor, signal.SIGKILL)
    proxy.release(stage, drop=True)

    # 2. The gateway commits batch 2; the driver dies before it hears so.
    commit = proxy.caught(2)
    assert commit.answer == {"committed": PER_BATCH * PER_FILE, "already": False}
    assert visible(site, token, queue) == 3 * PER_BATCH * PER_FILE  # batches 0-2
    first = drivers[0]
    first.kill()
    proxy.release(commit, drop=True)
    # Spark retried the lost executor's task: the query never failed.
    assert "query failed" not in first.output(), first.output()[-3000:]

    drivers.append(Driver(cluster, work, *job))
    again = drivers[1]
    assert again.wait() == 0, again.output()[-3000:]


def check_the_ledger(
    site: GatewayProcess, proxy: HoldingProxy, again: Driver, token: str, queue: str
) -> None:
    """What the gateway confirmed against what a worker received, per row id."""
    output = again.output()
    assert "batch 2: 200 rows replayed from the checkpoint" in output, output[-3000:]
    assert "done: 200 rows in 1 batches" in output, output[-3000:]

    commits = Counter((txn.rsplit("-", 1)[1], already) for txn, _, already in proxy.commits)
    assert commits == {
        ("0", False): 1,
        ("1", False): 1,
        ("2", False): 1,  # its answer was held; the driver died
        ("2", True): 1,  # the new driver's replay: the gateway took nothing
        ("3", False): 1,
    }, proxy.commits
    confirmed = sum(n for _, n, already in proxy.commits if not already)
    assert confirmed == ROWS
    assert visible(site, token, queue) == ROWS
    delivered = Counter(drain_ids(site, token, queue))
    lost = set(range(ROWS)) - set(delivered)
    duplicates = {i: n for i, n in delivered.items() if n > 1}
    print(
        f"ledger: {confirmed} rows confirmed in {len(proxy.commits)} commit answers "
        f"({sum(a for *_, a in proxy.commits)} already: the replay), "
        f"{sum(delivered.values())} delivered, {len(lost)} lost, "
        f"{sum(n - 1 for n in duplicates.values())} duplicates"
    )
    assert (len(lost), duplicates) == (0, {}), (sorted(lost)[:20], duplicates)
    assert sum(delivered.values()) == ROWS
