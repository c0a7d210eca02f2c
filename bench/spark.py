"""Spark feed benchmark: the Leasecast sink against two foreachBatch baselines, in one run.

    python -m bench.spark                       # 200,000 rows a run, ~2-3 minutes
    python -m bench.spark --rows 50000 --baseline-rows 5000 --rounds 1 --json out.json

One local Spark session (``local[2]``) streams JSON-lines files into one
gateway process on SQLite, end to end: the clock starts when the query starts
and stops when the gateway's queue shows every row committed and visible.

- **leasecast-sink**: ``format("leasecast")``, staged per partition and
  committed per micro-batch (exactly-once in effect), ``batchSize`` rows per
  HTTP request.
- **foreachbatch-partition-post**: what a user would write instead:
  ``foreachBatch`` running ``foreachPartition`` on the executors, each
  partition POSTed as one batch request (``POST /api/queues/Q/messages``,
  all-or-nothing per request; split only at the API's limit of
  ``MAX_BATCH`` = 10,000 messages a request). Fast, but not exactly-once: a
  replayed batch or a retried task enqueues its rows again.
- **foreachbatch-post**: the naive way, ``foreachBatch`` on the driver POSTing
  every row as its own request (one message a request) over one kept-alive
  connection. Not exactly-once either.

All read the same kind of files (about 120 bytes a row) with the same
``maxFilesPerTrigger``. The sink and the per-partition POST run ``--rounds``
times in rotation (sink, partition, sink, partition...); the price of
exactly-once is the sink's rows/s over the per-partition POST's, per round,
reported as the median with its spread. Results are ratios within one run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.parse
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.integration import harness
from tests.support.databases import sqlite_database
from tests.support.gateways import GatewayProcess


@dataclass
class Result:
    """One way of feeding the gateway."""

    name: str
    rows: int
    seconds: float
    batches: int

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def write_files(folder: Path, rows: int, per_file: int) -> None:
    """JSON-lines files of ``rows`` rows, ``per_file`` a file."""
    folder.mkdir(parents=True, exist_ok=True)
    pad = "x" * 64
    for start in range(0, rows, per_file):
        lines = (
            json.dumps({"id": i, "name": f"row {i}", "pad": pad})
            for i in range(start, min(rows, start + per_file))
        )
        (folder / f"part-{start:09d}.json").write_text("\n".join(lines) + "\n")


def visible(gateway: GatewayProcess, token: str, queue: str) -> int:
    status, stats = harness.http("GET", f"{gateway.http}/api/queues/{queue}", token)
    return int(stats["visible"]) if status == 200 else 0


def wait_visible(gateway: GatewayProcess, token: str, queue: str, rows: int, limit: float) -> None:
    """Block until ``rows`` rows are visible in ``queue`` (polling every 20 ms)."""
    deadline = time.monotonic() + limit
    while visible(gateway, token, queue) < rows:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{queue}: {visible(gateway, token, queue)} of {rows} after {limit}s"
            )
        time.sleep(0.02)


def post_every_row(url: str, token: str, queue: str) -> Any:
    """The baseline's ``foreachBatch`` function: one POST a row, on the driver."""
    parts = urllib.parse.urlsplit(url)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def each_batch(frame: Any, batch_id: int) -> None:
        conn = http.client.HTTPConnection(parts.netloc, timeout=30)
        try:
            for row in frame.toLocalIterator():
                body = json.dumps({"messages": [{"body": row.asDict()}]})
                conn.request("POST", f"/api/queues/{queue}/messages", body, headers)
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}")
        finally:
            conn.close()

    return each_batch


def partition_poster(url: str, token: str, queue: str, limit: int = 10_000) -> Any:
    """A ``foreachPartition`` function POSTing its rows as one request (``limit`` a request).

    Every message of a request is enqueued in one transaction, so each
    partition lands whole or not at all (up to ``limit`` rows, the API's
    ``MAX_BATCH``); nothing ties the partitions of a micro-batch together,
    and a replay enqueues again (no exactly-once).
    """
    parts = urllib.parse.urlsplit(url)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    path = f"/api/queues/{queue}/messages"

    # Nested, so cloudpickle ships it by value to Spark's Python workers.
    def post_partition(rows: Any) -> None:
        import http.client
        import json

        conn = http.client.HTTPConnection(parts.netloc, timeout=60)
        try:
            messages: list[dict[str, Any]] = []

            def flush() -> None:
                conn.request("POST", path, json.dumps({"messages": messages}), headers)
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    raise RuntimeError(f"HTTP {response.status}")
                messages.clear()

            for row in rows:
                messages.append({"body": row.asDict()})
                if len(messages) >= limit:
                    flush()
            if messages:
                flush()
        finally:
            conn.close()

    return post_partition


def post_each_partition(url: str, token: str, queue: str) -> Any:
    """The fair baseline's ``foreachBatch`` function: one POST a partition, on the executors."""
    post_partition = partition_poster(url, token, queue)

    def each_batch(frame: Any, batch_id: int) -> None:
        frame.foreachPartition(post_partition)

    return each_batch


WAYS = ("leasecast-sink", "foreachbatch-partition-post", "foreachbatch-post")


def run_query(
    spark: Any,
    gateway: GatewayProcess,
    token: str,
    source: Path,
    rows: int,
    *,
    queue: str,
    files_per_trigger: int,
    way: str,
    batch_size: int,
) -> Result:
    """Stream ``source`` into ``queue`` one way; timed until every row is visible."""
    frame = (
        spark.readStream.schema("id LONG, name STRING, pad STRING")
        .option("maxFilesPerTrigger", files_per_trigger)
        .json(str(source))
    )
    checkpoint = tempfile.mkdtemp(prefix="leasecast-bench-ckpt-")
    writer = frame.writeStream.option("checkpointLocation", checkpoint).trigger(availableNow=True)
    if way == "foreachbatch-post":
        writer = writer.foreachBatch(post_every_row(gateway.http, token, queue))
    elif way == "foreachbatch-partition-post":
        writer = writer.foreachBatch(post_each_partition(gateway.http, token, queue))
    else:
        writer = (
            writer.format("leasecast")
            .option("url", gateway.http)
            .option("token", token)
            .option("queue", queue)
            .option("batchSize", str(batch_size))
        )
    started = time.perf_counter()
    query = writer.start()
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    wait_visible(gateway, token, queue, rows, 600)
    seconds = time.perf_counter() - started
    batches = sum(1 for p in query.recentProgress if p["numInputRows"])
    return Result(way, rows, seconds, batches)


def price_of_exactly_once(results: list[Result]) -> list[float]:
    """Per round: the sink's rows/s over the per-partition POST's (results in rotation)."""
    sinks = [r for r in results if r.name == "leasecast-sink"]
    partitions = [r for r in results if r.name == "foreachbatch-partition-post"]
    return [s.rows_per_s / p.rows_per_s for s, p in zip(sinks, partitions, strict=False)]


def table(results: list[Result]) -> str:
    """The Markdown table of ``docs/benchmarks.md``: every run, then the price of exactly-once."""
    base = next((r for r in results if r.name == "foreachbatch-post"), None)
    lines = [
        "| feed | rows | batches | seconds | rows/s | vs foreachBatch POST per row |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        ratio = f"{r.rows_per_s / base.rows_per_s:.1f}x" if base and base.rows_per_s else "-"
        lines.append(
            f"| {r.name} | {r.rows:,} | {r.batches} | {r.seconds:.1f} | "
            f"{r.rows_per_s:,.0f} | {ratio} |"
        )
    prices = price_of_exactly_once(results)
    if prices:
        each = ", ".join(f"{p:.2f}" for p in prices)
        lines.append(
            f"\nPrice of exactly-once (leasecast-sink rows/s / foreachbatch-partition-post "
            f"rows/s): median {statistics.median(prices):.2f} (per round: {each}; "
            "below 1 means the sink is slower)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print its table."""
    parser = argparse.ArgumentParser(prog="python -m bench.spark", description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000, help="rows through the sink")
    parser.add_argument("--baseline-rows", type=int, default=5_000, help="rows POSTed one by one")
    parser.add_argument("--rows-per-file", type=int, default=10_000)
    parser.add_argument("--files-per-trigger", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=5000, help="sink rows per request")
    parser.add_argument(
        "--rounds", type=int, default=2, help="sink and per-partition POST runs, in rotation"
    )
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

    from spark_feed.job import spark_session

    with ExitStack() as stack:
        var = Path(tempfile.mkdtemp(prefix="leasecast-bench-spark-"))
        env = stack.enter_context(sqlite_database(var))
        gateway = GatewayProcess(env, var, name="bench-spark")
        gateway.start()
        stack.callback(gateway.stop)
        token = gateway.issue_token("admin", name="bench")
        print("starting Spark (local[2])", file=sys.stderr)
        spark = spark_session("local[2]")
        stack.callback(spark.stop)
        data = Path(tempfile.mkdtemp(prefix="leasecast-bench-data-"))
        write_files(data / "warmup", 2000, 1000)
        write_files(data / "sink", args.rows, args.rows_per_file)
        write_files(data / "baseline", args.baseline_rows, min(args.rows_per_file, 2500))
        common = {"files_per_trigger": args.files_per_trigger, "batch_size": args.batch_size}
        # Warm every path (Python workers, JIT) before anything is timed.
        for way in WAYS:
            run_query(
                spark, gateway, token, data / "warmup", 2000, queue=f"warm-{way}", way=way, **common
            )
        runs: list[tuple[str, Path, int]] = []
        for _ in range(args.rounds):
            runs += [
                ("leasecast-sink", data / "sink", args.rows),
                ("foreachbatch-partition-post", data / "sink", args.rows),
            ]
        runs.append(("foreachbatch-post", data / "baseline", args.baseline_rows))
        results = []
        for number, (way, source, rows) in enumerate(runs):
            print(f"{way}: {rows:,} rows", file=sys.stderr)
            results.append(
                run_query(
                    spark,
                    gateway,
                    token,
                    source,
                    rows,
                    queue=f"bench-{number}-{way}",
                    way=way,
                    **common,
                )
            )
            print(f"   {results[-1].rows_per_s:,.0f} rows/s", file=sys.stderr)
        print(table(results))
        print(f"\nload average {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            rows_out = [asdict(r) | {"rows_per_s": r.rows_per_s} for r in results]
            args.json.write_text(json.dumps(rows_out, indent=2))


if __name__ == "__main__":
    main()
