"""The PySpark sink with a real local Spark session streaming into a live gateway."""

from __future__ import annotations

import asyncio
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.integration.harness import GatewayProcess, http, unique
from tests.spark.conftest import drain_ids, visible, write_files


def run_stream(
    spark: Any,
    site: GatewayProcess,
    token: str,
    source: Path,
    checkpoint: Path,
    queue: str | None = None,
    topic: str | None = None,
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
        .option(*(("queue", queue) if queue else ("topic", topic)))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)


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


def test_topic_mode_reaches_a_subscriber(spark: Any, site: GatewayProcess) -> None:
    token = site.issue_token("admin", name="spark-topic")
    topic = unique("spark-topic")
    work = Path(tempfile.mkdtemp(prefix="leasecast-topic-"))
    write_files(work / "in", 0, 1000, per_file=500)
    received: list[int] = []
    ready = threading.Event()

    async def subscribe() -> None:
        from gateway.client import Subscriber

        # block: a subscriber that misses nothing, or is disconnected (never here).
        async with Subscriber(
            site.ws, topic, token=token, capacity=10_000, on_full="block"
        ) as subscriber:
            ready.set()
            async for message in subscriber:
                received.append(message.body["id"])
                if len(received) >= 1000:
                    return

    thread = threading.Thread(target=lambda: asyncio.run(asyncio.wait_for(subscribe(), 180)))
    thread.start()
    assert ready.wait(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the subscription is registered on accept
        _, stats = http("GET", f"{site.http}/api/stats", token)
        if any(t["name"] == topic and t["subscribers"] == 1 for t in stats["topics"]):
            break
        time.sleep(0.1)
    run_stream(spark, site, token, work / "in", work / "checkpoint", topic=topic)
    thread.join(180)
    # Two Spark partitions publish side by side: each row once, in no set order.
    assert sorted(received) == list(range(1000))
    assert visible(site, token, topic) == 0  # a topic is not a queue: nothing was enqueued
