"""A PySpark streaming sink into Leasecast, with exactly-once effect into queues.

.. code-block:: python

    from spark_feed.sink import LeasecastDataSource

    spark.dataSource.register(LeasecastDataSource)
    (df.writeStream.format("leasecast")
        .option("url", "http://127.0.0.1:8000").option("token", TOKEN)
        .option("queue", "events")            # or .option("topic", "prices")
        .option("checkpointLocation", "/tmp/ckpt")
        .start())

Each micro-batch is a gateway transaction named from the streaming query id
(stable across restarts from the same checkpoint) and the batch id. ``write()``
runs on the executors and stages its partition (replacing what a failed
attempt of the same task staged); ``commit()`` makes the whole batch visible
at once, and committing a batch again after a restart changes nothing
(docs/protocol.md, Staged enqueue). A refusal or an unreachable gateway
raises, the batch fails, and Spark retries it; a failed batch leaves its
transaction open (``abort()`` does not abort it), so the replay can commit.

Each write task keeps one HTTP connection to the gateway for all its requests.

Options: ``url``, ``token``, ``queue`` or ``topic``; ``bodyColumn`` (default:
the whole row as a JSON object), ``keyColumn`` (idempotency key),
``delayColumn`` (seconds), ``groupColumn`` (a string column),
``priorityColumn`` (an integer column, -100..100), ``ttlColumn`` (a numeric
column, seconds), ``batchSize`` (messages per request, default 1000),
``timeout`` (seconds per request, default 30). A null in a column leaves that
field out of the row's message. ``group``, ``priority`` and ``ttl`` are
protocol 1.1 fields of queues; a topic has none of them.

Topics are not transactional: with ``topic`` each row is published from the
executor as it is written, so a replayed batch publishes again (at least once).
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import (
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegralType,
    StringType,
    StructType,
)

__all__ = ["LeasecastDataSource", "LeasecastStreamWriter", "SinkError"]

#: Partition numbers are spaced so one Spark partition can span many requests.
CHUNKS_PER_PARTITION = 1_000_000


class SinkError(RuntimeError):
    """The gateway refused a request, or could not be reached: the batch fails."""


#: The protocol 1.1 columns: option, message field, the column types it takes
#: (checked on the driver when the query starts) and what to call them.
_TYPED_COLUMNS: tuple[tuple[str, str, tuple[type[DataType], ...], str], ...] = (
    ("groupColumn", "group", (StringType,), "a STRING column"),
    ("priorityColumn", "priority", (IntegralType,), "an integer column (TINYINT..BIGINT)"),
    (
        "ttlColumn",
        "ttl",
        (IntegralType, FloatType, DoubleType, DecimalType),
        "a numeric column (seconds)",
    ),
)


@dataclass
class StagedPartition(WriterCommitMessage):
    """What one write task staged."""

    txn: str
    partition: int
    rows: int
    #: The gateway partition numbers this task staged (one per request).
    chunks: tuple[int, ...] = ()


class _Gateway:
    """HTTP to the gateway over one kept-alive connection (reopened after a failure)."""

    def __init__(self, base: str, token: str, timeout: float) -> None:
        parts = urllib.parse.urlsplit(base)
        self.https = parts.scheme == "https"
        self.netloc = parts.netloc
        self.prefix = parts.path.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: Any) -> Any:
        """Send one JSON request; the decoded reply, or :class:`SinkError`."""
        if self._conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self._conn = cls(self.netloc, timeout=self.timeout)
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        try:
            self._conn.request(method, self.prefix + path, json.dumps(body), headers)
            response = self._conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as err:
            self.close()
            raise SinkError(f"{method} {path}: {err}") from err
        if response.status == 403 and path.startswith("/api/transactions/"):
            # A transaction belongs to the principal that first staged into
            # it (docs/protocol.md, Staged enqueue): retrying cannot help.
            txn = path.split("/")[3]
            raise SinkError(
                f"{method} {path}: HTTP 403: transaction {txn!r} belongs to another token "
                "(a restarted query must use the token, or signed-token subject, that staged "
                f"it; an admin token may abort it: POST /api/transactions/{txn}/abort) "
                f"{data[:300]!r}"
            )
        if response.status != 200:
            raise SinkError(f"{method} {path}: HTTP {response.status} {data[:300]!r}")
        return json.loads(data)

    def close(self) -> None:
        """Drop the connection."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class LeasecastStreamWriter(DataSourceStreamWriter):
    """Stages each partition under the batch's transaction; commits the batch."""

    def __init__(self, schema: StructType, options: Mapping[str, str]) -> None:
        # Spark hands the options over case-insensitively, their names in lower
        # case: ``keyColumn`` arrives as ``keycolumn``. Look them up the same way.
        lowered = {name.lower(): value for name, value in options.items()}

        def get(name: str) -> str | None:
            return lowered.get(name.lower())

        self.url = (get("url") or "http://127.0.0.1:8000").rstrip("/")
        token = get("token")
        if not token:
            raise SinkError("option 'token' is required")
        self.token = token
        self.queue = get("queue")
        self.topic = get("topic")
        if (self.queue is None) == (self.topic is None):
            raise SinkError("give exactly one of the options 'queue' and 'topic'")
        self.body_column = get("bodyColumn")
        self.key_column = get("keyColumn")
        self.delay_column = get("delayColumn")
        self.batch_size = int(get("batchSize") or "1000")
        self.timeout = float(get("timeout") or "30")
        names = set(schema.fieldNames())
        for option, column in (
            ("bodyColumn", self.body_column),
            ("keyColumn", self.key_column),
            ("delayColumn", self.delay_column),
        ):
            if column is not None and column not in names:
                raise SinkError(f"option {option}: no column {column!r} in {sorted(names)}")
        #: (column, message field) of the protocol 1.1 columns asked for
        self.typed_columns: list[tuple[str, str]] = []
        for name, field, types, what in _TYPED_COLUMNS:
            column = get(name)
            if column is None:
                continue
            if self.topic is not None:
                raise SinkError(f"option {name} applies to a queue, not to a topic")
            if column not in names:
                raise SinkError(f"option {name}: no column {column!r} in {sorted(names)}")
            found = schema[column].dataType
            if not isinstance(found, types):
                raise SinkError(
                    f"option {name}: column {column!r} is {found.simpleString().upper()}; "
                    f"it must be {what} (cast it)"
                )
            self.typed_columns.append((column, field))

    def _message(self, row: Any) -> dict[str, Any]:
        record = row.asDict(recursive=True)
        body = record[self.body_column] if self.body_column else record
        message: dict[str, Any] = {"body": _jsonable(body)}
        if self.key_column and record.get(self.key_column) is not None:
            message["key"] = str(record[self.key_column])
        if self.delay_column and record.get(self.delay_column) is not None:
            message["delay"] = float(record[self.delay_column])
        for column, field in self.typed_columns:
            value = record.get(column)
            if value is not None:
                # The column types were checked: str, int, or a number (a
                # Decimal too, which JSON has no place for).
                message[field] = value if field != "ttl" else float(value)
        return message

    def write(self, iterator: Iterator[Any]) -> StagedPartition:
        from pyspark import TaskContext

        context = TaskContext.get()
        assert context is not None
        query = context.getLocalProperty("sql.streaming.queryId") or "query"
        batch = context.getLocalProperty("streaming.sql.batchId") or "0"
        txn = f"{query}-{batch}"
        partition = context.partitionId()
        rows = 0
        chunk: list[dict[str, Any]] = []
        chunk_no = 0
        staged: list[int] = []
        gateway = _Gateway(self.url, self.token, self.timeout)  # one connection per task

        def flush() -> None:
            nonlocal chunk, chunk_no
            if self.topic is not None:
                gateway.request("POST", f"/api/topics/{self.topic}/messages", {"messages": chunk})
            else:
                # A retried task restages the same chunks, replacing them.
                number = partition * CHUNKS_PER_PARTITION + chunk_no
                gateway.request(
                    "PUT",
                    f"/api/transactions/{txn}/partitions/{number}",
                    {"queue": self.queue, "messages": chunk},
                )
                staged.append(number)
            chunk, chunk_no = [], chunk_no + 1

        try:
            for row in iterator:
                chunk.append(self._message(row))
                rows += 1
                if len(chunk) >= self.batch_size:
                    flush()
            if chunk:
                flush()
        finally:
            gateway.close()
        return StagedPartition(txn, partition, rows, tuple(staged))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        if self.topic is not None:
            return
        # Commit exactly what this attempt's tasks staged: staging left by an
        # earlier attempt of the same batch that was split differently (a
        # restart with other settings) is discarded, not committed with it.
        chunks: dict[str, set[int]] = {}
        for message in messages:
            if isinstance(message, StagedPartition):
                chunks.setdefault(message.txn, set()).update(message.chunks)
        gateway = _Gateway(self.url, self.token, self.timeout)
        try:
            for txn, numbers in chunks.items():
                gateway.request(
                    "POST", f"/api/transactions/{txn}/commit", {"partitions": sorted(numbers)}
                )
        finally:
            gateway.close()

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Spark calls this when a batch fails (a refused request, a stopped
        # query) and replays the same batch id when the query restarts from
        # its checkpoint. Aborting the gateway transaction would be final: the
        # replay's commit would be refused ("was aborted") on every restart.
        # So the transaction stays open; the replay's commit names the chunks
        # it staged and discards the rest, and staging never replayed expires
        # after 24 hours (docs/spark.md).
        return


def _jsonable(value: Any) -> Any:
    """Spark values (dates, decimals, rows) as JSON values."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


class LeasecastDataSource(DataSource):
    """``format("leasecast")``: a streaming sink into a Leasecast queue or topic."""

    @classmethod
    def name(cls) -> str:
        return "leasecast"

    def schema(self) -> str:
        return "value string"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return LeasecastStreamWriter(schema, self.options)
