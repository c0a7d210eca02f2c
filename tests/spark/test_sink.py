"""The PySpark sink with a real local Spark session streaming into a live gateway."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.databases import sqlite_database
from tests.integration.harness import GatewayProcess, http, unique


def _spark_missing() -> str | None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed"
    if shutil.which("java") is None:
        return "no Java on PATH (Spark needs Java 17)"
    return None


pytestmark = pytest.mark.skipif(_spark_missing() is not None, reason=str(_spark_missing()))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session for the whole test run (it takes seconds to start)."""
    from pyspark.sql import SparkSession

    from spark_feed.sink import LeasecastDataSource

    # Spark's Python workers must run this interpreter (it has the sink and pyarrow).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

    session = (
        SparkSession.builder.master("local[2]")
        .appName("leasecast-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.dataSource.register(LeasecastDataSource)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def site() -> Iterator[GatewayProcess]:
    var = Path(tempfile.mkdtemp(prefix="leasecast-spark-"))
    with sqlite_database(var) as env:
        gateway = GatewayProcess(env, var, name="spark")
        gateway.start()
        yield gateway
        gateway.stop()


def write_files(folder: Path, start: int, count: int, per_file: int = 2000) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for offset in range(start, start + count, per_file):
        lines = [
            json.dumps({"id": i, "name": f"row {i}"}) for i in range(offset, offset + per_file)
        ]
        (folder / f"part-{offset:06d}.json").write_text("\n".join(lines) + "\n")


def run_stream(
    spark: Any, site: GatewayProcess, token: str, source: Path, checkpoint: Path, queue: str
) -> None:
    frame = (
        spark.readStream.schema("id LONG, name STRING")
        .option("maxFilesPerTrigger", 2)
        .json(str(source))
    )
    query = (
        frame.writeStream.format("leasecast")
        .option("url", site.http)
        .option("token", token)
        .option("queue", queue)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)


def visible(site: GatewayProcess, token: str, queue: str) -> int:
    status, stats = http("GET", f"{site.http}/api/queues/{queue}", token)
    return int(stats["visible"]) if status == 200 else 0


def drain_ids(site: GatewayProcess, token: str, queue: str) -> list[int]:
    """Every body's id, consumed (and acked) through a real worker socket."""
    import asyncio

    from gateway.client import Worker

    total = visible(site, token, queue)  # before the worker leases any

    async def run() -> list[int]:
        ids: list[int] = []
        async with Worker(site.ws, queue, token=token, prefetch=1000) as worker:
            async for delivery in worker:
                ids.append(delivery.body["id"])
                await delivery.ack()
                if len(ids) >= total:
                    break
        return ids

    return asyncio.run(run())


def test_ten_thousand_rows_arrive_exactly_once_across_a_restart(
    spark: Any, site: GatewayProcess
) -> None:
    token = site.issue_token("admin", name="spark")
    queue = unique("spark")
    work = Path(tempfile.mkdtemp(prefix="leasecast-stream-"))
    source, checkpoint = work / "in", work / "checkpoint"
    write_files(source, 0, 6000)
    run_stream(spark, site, token, source, checkpoint, queue)
    assert visible(site, token, queue) == 6000
    # A restart from the same checkpoint with new files: only the new rows come.
    write_files(source, 6000, 4000)
    run_stream(spark, site, token, source, checkpoint, queue)
    assert visible(site, token, queue) == 10_000
    run_stream(spark, site, token, source, checkpoint, queue)  # nothing new: nothing added
    assert visible(site, token, queue) == 10_000
    ids = drain_ids(site, token, queue)
    assert sorted(ids) == list(range(10_000))  # every row once
