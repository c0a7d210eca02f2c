"""A real local Spark session (one per test run) and a live gateway for the Spark tests."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.clients import http
from tests.support.gateways import GatewayProcess, sqlite_gateway


def spark_missing() -> str | None:
    """Why Spark cannot run here, or None."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed"
    if shutil.which("java") is None:
        return "no Java on PATH (Spark needs Java 17)"
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    reason = spark_missing()
    if reason is not None:
        for item in items:
            if "tests/spark" in str(item.path):
                item.add_marker(pytest.mark.skip(reason=reason))


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
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("FATAL")
    session.dataSource.register(LeasecastDataSource)
    yield session
    session.stop()


@pytest.fixture(scope="module")
def site() -> Iterator[GatewayProcess]:
    """A gateway on SQLite shared by a test module (tests use their own queue names)."""
    with sqlite_gateway("spark") as gateway:
        yield gateway


def write_files(folder: Path, start: int, count: int, per_file: int = 2000) -> None:
    """JSON-lines files of rows ``{"id": i, "name": ...}`` for ids start..start+count-1."""
    folder.mkdir(parents=True, exist_ok=True)
    for offset in range(start, start + count, per_file):
        lines = [
            json.dumps({"id": i, "name": f"row {i}"}) for i in range(offset, offset + per_file)
        ]
        (folder / f"part-{offset:06d}.json").write_text("\n".join(lines) + "\n")


def visible(site: GatewayProcess, token: str, queue: str) -> int:
    """The queue's visible count (0 for a queue never used)."""
    status, stats = http("GET", f"{site.http}/api/queues/{queue}", token)
    return int(stats["visible"]) if status == 200 else 0


def drain_ids(site: GatewayProcess, token: str, queue: str) -> list[int]:
    """Every body's id, consumed (and acked) through a real worker socket."""
    from gateway.client import Worker

    total = visible(site, token, queue)  # before the worker leases any

    async def run() -> list[int]:
        ids: list[int] = []
        if total == 0:
            return ids
        async with Worker(site.ws, queue, token=token, prefetch=1000) as worker:
            async for delivery in worker:
                ids.append(delivery.body["id"])
                await delivery.ack()
                if len(ids) >= total:
                    break
        return ids

    return asyncio.run(run())
