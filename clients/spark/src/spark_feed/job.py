"""The example streaming job: JSON-lines files or Spark's rate source into Leasecast.

``python -m spark_feed --help`` lists the options. The job prints a line per
micro-batch (rows, time, rows/s) and a summary at the end. A batch that fails
(the gateway refused it or is down) fails the query; the job then restarts the
query from its checkpoint after a backoff, up to ``--restarts`` times, and
the restarted query replays the failed batch: the sink's staged transactions
make that replay exactly-once in effect (docs/spark.md).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from leasecast.cli import positive_int

from spark_feed.progress import ProgressReport

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["JobError", "build_parser", "main", "run"]

#: How often the job looks at the query's progress, in seconds.
POLL_SECONDS = 0.5


class JobError(Exception):
    """A job that cannot start as asked: bad options, no files, a refused token."""


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m spark_feed``."""
    parser = argparse.ArgumentParser(
        prog="python -m spark_feed",
        description="Stream JSON-lines files or Spark's rate source into a Leasecast "
        "queue (exactly-once in effect) or topic.",
    )
    where = parser.add_argument_group("gateway")
    where.add_argument(
        "--url",
        default=os.environ.get("LEASECAST_URL", "http://127.0.0.1:8000"),
        help="the gateway (default $LEASECAST_URL or http://127.0.0.1:8000)",
    )
    where.add_argument("--token", help="an API token (default $LEASECAST_TOKEN)")
    target = where.add_mutually_exclusive_group(required=True)
    target.add_argument("--queue", help="the queue to enqueue to")
    target.add_argument("--topic", help="the topic to publish to (at least once)")

    source = parser.add_argument_group("source (one of)")
    kind = source.add_mutually_exclusive_group(required=True)
    kind.add_argument("--files", type=Path, help="a directory of JSON-lines files to stream")
    kind.add_argument(
        "--rate", type=positive_int, help="Spark's rate source: this many rows per second"
    )
    source.add_argument(
        "--schema",
        help="the files' schema in Spark DDL, e.g. 'id LONG, name STRING' "
        "(default: inferred from the files present at the start)",
    )
    source.add_argument(
        "--max-files-per-trigger", type=positive_int, help="at most this many files a batch"
    )

    sink = parser.add_argument_group("sink")
    sink.add_argument("--body-column", help="the column that is the body (default: the row)")
    sink.add_argument("--key-column", help="a column to use as the idempotency key")
    sink.add_argument("--delay-column", help="a column of delays in seconds")
    sink.add_argument("--group-column", help="a STRING column: the message's group (queues only)")
    sink.add_argument(
        "--priority-column", help="an integer column: the priority, -100..100 (queues only)"
    )
    sink.add_argument("--ttl-column", help="a numeric column: the ttl in seconds (queues only)")
    sink.add_argument(
        "--batch-size", type=positive_int, default=1000, help="messages per HTTP request"
    )

    run_group = parser.add_argument_group("running")
    run_group.add_argument(
        "--checkpoint",
        type=Path,
        help="the query's checkpoint directory (default var/checkpoints/NAME); "
        "a restart from it resumes where the job stopped",
    )
    run_group.add_argument(
        "--available-now",
        action="store_true",
        help="process what is there, then stop (default: run until Ctrl-C)",
    )
    run_group.add_argument(
        "--stop-after-rows",
        type=positive_int,
        help="stop once this run has written this many rows (a replayed batch does not count)",
    )
    run_group.add_argument(
        "--trigger-seconds", type=float, default=0.0, help="start a batch at most this often"
    )
    run_group.add_argument(
        "--restarts",
        type=int,
        default=10,
        help="restart a failed query from its checkpoint this many times (default 10)",
    )
    run_group.add_argument(
        "--master",
        help="Spark master, e.g. spark://HOST:7077 (default: spark-submit's --master when "
        "submitted with it, else local[2])",
    )
    run_group.add_argument(
        "--spark-log-level",
        default="FATAL",
        choices=["ALL", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF"],
        help="Spark's own logging (default FATAL: the job reports failures itself)",
    )
    return parser


def check_gateway(url: str, token: str, path: str) -> str | None:
    """Ask the gateway about the target before Spark starts.

    Returns a warning if the gateway cannot be reached (the job starts anyway:
    its batches fail and are retried until it answers).

    Raises:
        JobError: the gateway refused the token.
    """
    request = urllib.request.Request(
        url.rstrip("/") + path, headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10):
            return None
    except urllib.error.HTTPError as err:
        if err.code in (401, 403):
            raise JobError(f"the gateway refused the token (HTTP {err.code})") from err
        return None  # 404: a queue never used yet; it is created on first enqueue
    except (urllib.error.URLError, OSError) as err:
        return f"the gateway at {url} does not answer yet ({err}); batches will be retried"


def submitted() -> bool:
    """Whether spark-submit started this process (its JVM is already there)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def master_of(option: str | None) -> str | None:
    """The master to ask for: ``--master``; else none under spark-submit (its
    ``--master`` holds), else ``local[2]``."""
    if option:
        return option
    return None if submitted() else "local[2]"


def spark_session(master: str | None, log_level: str = "FATAL") -> SparkSession:
    """A Spark session with the Leasecast sink registered.

    ``master`` None keeps the master spark-submit was given.
    """
    from pyspark.sql import SparkSession

    from spark_feed.sink import LeasecastDataSource

    # Spark's Python workers (on every executor) run this interpreter unless
    # PYSPARK_PYTHON (or spark-submit's spark.pyspark.python) names another:
    # the sink and pyarrow must be installed in it, at that path on every node.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder
    if master is not None:
        builder = builder.master(master)
    session = (
        builder.appName("leasecast-feed")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # our own lines say more
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    # Spark logs every failed task as pages of JVM stack at ERROR; the job
    # prints one line per failure itself (``query failed: ...``).
    session.sparkContext.setLogLevel(log_level)
    session.dataSource.register(LeasecastDataSource)
    return session


def source_frame(spark: SparkSession, ns: argparse.Namespace) -> DataFrame:
    """The streaming DataFrame the options ask for."""
    if ns.rate is not None:
        return spark.readStream.format("rate").option("rowsPerSecond", ns.rate).load()
    folder: Path = ns.files
    if not folder.is_dir():
        raise JobError(f"--files {folder}: not a directory")
    reader = spark.readStream
    if ns.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", ns.max_files_per_trigger)
    if ns.schema:
        reader = reader.schema(ns.schema)
    else:
        if not any(path.is_file() for path in folder.iterdir()):
            raise JobError(
                f"--files {folder} is empty: no file to infer the schema from; give --schema"
            )
        spark.conf.set("spark.sql.streaming.schemaInference", "true")
    return reader.json(str(folder))


def sink_options(ns: argparse.Namespace, token: str) -> dict[str, str]:
    """The sink's options for the command line's."""
    options = {"url": ns.url, "token": token, "batchSize": str(ns.batch_size)}
    options.update({"queue": ns.queue} if ns.queue else {"topic": ns.topic})
    for option, column in (
        ("bodyColumn", ns.body_column),
        ("keyColumn", ns.key_column),
        ("delayColumn", ns.delay_column),
        ("groupColumn", ns.group_column),
        ("priorityColumn", ns.priority_column),
        ("ttlColumn", ns.ttl_column),
    ):
        if column:
            options[option] = column
    return options


def unfinished_batches(checkpoint: Path) -> frozenset[int]:
    """Batches an earlier run planned (``offsets/N``) and did not finish (no ``commits/N``).

    A job stopped mid-batch (Ctrl-C, ``--stop-after-rows``, a crash) leaves
    one; the restarted query replays it first. Empty for a new checkpoint.
    """

    def ids(folder: str) -> set[int]:
        path = checkpoint / folder
        if not path.is_dir():
            return set()
        return {int(p.name) for p in path.iterdir() if p.name.isdigit()}

    return frozenset(ids("offsets") - ids("commits"))


def start_query(frame: DataFrame, ns: argparse.Namespace, token: str) -> StreamingQuery:
    """Start the sink on ``frame``.

    Raises:
        JobError: the columns do not fit the options (a missing column, or one of
            the wrong type): said once here, not by a query failing on every restart.
    """
    from spark_feed.sink import LeasecastStreamWriter, SinkError

    options = sink_options(ns, token)
    try:
        LeasecastStreamWriter(frame.schema, options)  # checks the options on the schema
    except SinkError as err:
        raise JobError(str(err)) from None
    writer = (
        frame.writeStream.format("leasecast")
        .options(**options)
        .option("checkpointLocation", str(ns.checkpoint))
    )
    if ns.available_now:
        writer = writer.trigger(availableNow=True)
    elif ns.trigger_seconds > 0:
        writer = writer.trigger(processingTime=f"{ns.trigger_seconds} seconds")
    return writer.start()


def watch(query: StreamingQuery, report: ProgressReport, limit: int | None, out: TextIO) -> None:
    """Print each batch until the query ends, or ``limit`` rows are written."""
    while True:
        active = query.isActive
        for line in report.update(query.recentProgress, time.monotonic()):
            print(line, file=out, flush=True)
        if not active:
            return
        if limit is not None and report.rows >= limit:
            query.stop()
            return
        time.sleep(POLL_SECONDS)


def run(ns: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Run the job; returns the process exit code.

    Raises:
        JobError: the job cannot start as asked.
    """
    token = ns.token or os.environ.get("LEASECAST_TOKEN")
    if not token:
        raise JobError("no token: give --token or set LEASECAST_TOKEN")
    name = ns.queue or ns.topic
    if ns.checkpoint is None:
        ns.checkpoint = Path("var") / "checkpoints" / name
    if ns.queue and (warning := check_gateway(ns.url, token, f"/api/queues/{ns.queue}")):
        print(f"warning: {warning}", file=out, flush=True)
    target = f"queue {ns.queue}" if ns.queue else f"topic {ns.topic}"
    master = master_of(ns.master)
    print(
        f"starting Spark ({master or 'spark-submit --master'}); writing to {target} at {ns.url}",
        file=out,
        flush=True,
    )
    spark = spark_session(master, ns.spark_log_level)
    # Reset when the query starts; a batch an earlier run left unfinished is
    # replayed first and is not this run's work (it must not end the run
    # early under --stop-after-rows).
    report = ProgressReport(started=time.monotonic(), replayed=unfinished_batches(ns.checkpoint))
    failures = 0
    query: StreamingQuery | None = None
    try:
        while True:
            query = start_query(source_frame(spark, ns), ns, token)
            if report.batches == 0:
                report.started = time.monotonic()  # rates count streaming, not Spark's start
            print(f"query {query.id} running; checkpoint {ns.checkpoint}", file=out, flush=True)
            watch(query, report, ns.stop_after_rows, out)
            error = query.exception()
            if error is None:
                break
            failures += 1
            reason = _first_line(error)
            if failures > ns.restarts:
                print(f"query failed: {reason}; giving up", file=out, flush=True)
                return 1
            pause = min(30.0, 2.0 ** (failures - 1))
            print(
                f"query failed: {reason}; restarting from the checkpoint in {pause:.0f} s "
                f"({failures}/{ns.restarts})",
                file=out,
                flush=True,
            )
            time.sleep(pause)
    except KeyboardInterrupt:
        print("stopping", file=out, flush=True)
        if query is not None and query.isActive:
            query.stop()
    finally:
        print(report.summary(time.monotonic()), file=out, flush=True)
        spark.stop()
    return 0


def _first_line(error: Any) -> str:
    """The useful line of a Spark error (they run to pages of JVM stack)."""
    text = str(getattr(error, "desc", None) or error)
    found = re.search(r"SinkError: (.+)", text)
    if found:
        return found.group(1).strip()[:300]
    return (text.strip().splitlines() or ["unknown error"])[0][:300]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m spark_feed``."""
    ns = build_parser().parse_args(argv)
    try:
        return run(ns)
    except JobError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
