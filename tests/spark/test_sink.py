"""The PySpark sink with a real local Spark session streaming into a live gateway."""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spark.conftest import drain_ids, visible, write_files
from tests.support.clients import http, unique
from tests.support.gateways import GatewayProcess


def run_stream(
    spark: Any,
    site: GatewayProcess,
    token: str,
    source: Path,
    checkpoint: Path,
    queue: str | None = None,
    topic: str | None = None,
    schema: str = "id LONG, name STRING",
    **options: str,
) -> None:
    """Stream the JSON files under ``source`` into the gateway; ``options`` go to the sink."""
    frame = spark.readStream.schema(schema).option("maxFilesPerTrigger", 2).json(str(source))
    query = (
        frame.writeStream.format("leasecast")
        .option("url", site.http)
        .option("token", token)
        .option(*(("queue", queue) if queue else ("topic", topic)))
        .options(**options)
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


def _row(i: int) -> dict[str, Any]:
    """Row ``i`` of the protocol 1.1 test: every other row grouped, some with a ttl."""
    return {
        "id": i,
        "grp": f"g{i % 3}" if i % 2 == 0 else None,
        "prio": {1: 100, 3: -100}.get(i, i % 7 - 3),
        "life": 1.5 if i % 10 == 5 else (3600.0 if i % 4 == 0 else None),
    }


def _browse(site: GatewayProcess, token: str, queue: str, state: str) -> dict[int, Any]:
    status, page = http(
        "GET", f"{site.http}/api/queues/{queue}/messages?state={state}&limit=1000", token
    )
    assert status == 200, page
    assert page["next"] is None
    return {m["body"]["id"]: m for m in page["messages"]}


def test_group_priority_and_ttl_columns_reach_the_queue(spark: Any, site: GatewayProcess) -> None:
    token = site.issue_token("admin", name="spark-fields")
    queue = unique("spark-fields")
    work = Path(tempfile.mkdtemp(prefix="leasecast-fields-"))
    rows = {i: _row(i) for i in range(60)}
    (work / "in").mkdir()
    (work / "in" / "rows.json").write_text("".join(json.dumps(r) + "\n" for r in rows.values()))
    run_stream(
        spark,
        site,
        token,
        work / "in",
        work / "checkpoint",
        queue,
        schema="id LONG, grp STRING, prio INT, life DOUBLE",
        keyColumn="id",
        groupColumn="grp",
        priorityColumn="prio",
        ttlColumn="life",
        batchSize="7",
    )
    committed = time.monotonic()
    short = {i for i, r in rows.items() if r["life"] == 1.5}
    # Straight after the commit (a short ttl may just have run out: those are checked below).
    first = _browse(site, token, queue, "visible")
    assert set(rows) - short <= set(first) <= set(rows)
    for i, message in first.items():
        assert (message["group"], message["priority"]) == (rows[i]["grp"], rows[i]["prio"]), i
        assert message["key"] == str(i)  # keyColumn, spelled in camel case, is honoured

    time.sleep(max(0.0, committed + 2.0 - time.monotonic()))
    dead = _browse(site, token, queue, "dead")
    assert set(dead) == short
    assert {m["dead_reason"] for m in dead.values()} == {"expired"}
    left = _browse(site, token, queue, "visible")
    assert set(left) == set(rows) - short
    for i, message in left.items():
        if rows[i]["life"] is None:
            assert message["expires_in"] is None, i
        else:
            assert 3500 < message["expires_in"] <= 3600, (i, message)

    # Leased through the client: each delivery carries its row's group and priority.
    async def lease() -> dict[int, tuple[str | None, int]]:
        from gateway.client import Worker

        got: dict[int, tuple[str | None, int]] = {}
        async with Worker(site.ws, queue, token=token, prefetch=100) as worker:
            async for delivery in worker:
                got[delivery.body["id"]] = (delivery.group, delivery.priority)
                await delivery.ack()  # lets the next message of its group go
                if len(got) == len(left):
                    break
        return got

    leased = asyncio.run(asyncio.wait_for(lease(), 60))
    assert leased == {i: (rows[i]["grp"], rows[i]["prio"]) for i in left}


def test_group_priority_and_ttl_columns_of_a_wrong_type_fail_clearly(
    spark: Any, site: GatewayProcess
) -> None:
    token = site.issue_token("admin", name="spark-types")
    work = Path(tempfile.mkdtemp(prefix="leasecast-types-"))
    (work / "in").mkdir()
    (work / "in" / "rows.json").write_text('{"id": 1, "n": 2, "x": 2.5, "s": "soon"}\n')
    schema = "id LONG, n INT, x DOUBLE, s STRING"
    queue = unique("spark-types")
    cases: list[tuple[dict[str, str], str]] = [
        ({"queue": queue, "groupColumn": "n"}, "column 'n' is INT; it must be a STRING column"),
        ({"queue": queue, "priorityColumn": "x"}, "column 'x' is DOUBLE; it must be an integer"),
        ({"queue": queue, "ttlColumn": "s"}, "column 's' is STRING; it must be a numeric column"),
        ({"topic": queue, "priorityColumn": "n"}, "priorityColumn applies to a queue, not to a"),
    ]
    for number, (options, message) in enumerate(cases):
        with pytest.raises(Exception, match=message):
            run_stream(
                spark,
                site,
                token,
                work / "in",
                work / f"checkpoint-{number}",
                schema=schema,
                **options,
            )
    assert visible(site, token, queue) == 0


def test_a_batch_refused_at_commit_is_replayed_whole_after_a_restart(
    spark: Any, site: GatewayProcess
) -> None:
    # A full bounded queue refuses the batch's commit (429), Spark fails the
    # batch and calls the writer's abort(); once there is room, the query
    # restarted from its checkpoint replays the same batch id, which must
    # then commit: an abort that ended the gateway transaction made every
    # replay fail ("was aborted") for good.
    token = site.issue_token("admin", name="spark-refused")
    queue = unique("spark-refused")
    status, _ = http("PATCH", f"{site.http}/api/queues/{queue}", token, {"max_length": 1000})
    assert status == 200
    work = Path(tempfile.mkdtemp(prefix="leasecast-refused-"))
    source, checkpoint = work / "in", work / "checkpoint"
    write_files(source, 0, 3000, per_file=1500)
    with pytest.raises(Exception, match=r"HTTP 429"):
        run_stream(spark, site, token, source, checkpoint, queue, batchSize="500")
    assert visible(site, token, queue) == 0  # the commit was all or nothing
    status, _ = http("PATCH", f"{site.http}/api/queues/{queue}", token, {"max_length": 0})
    assert status == 200
    run_stream(spark, site, token, source, checkpoint, queue, batchSize="500")
    assert visible(site, token, queue) == 3000
    assert sorted(drain_ids(site, token, queue)) == list(range(3000))
