"""pgqueuer on the same PostgreSQL server as the gateway, in a database of its own.

- **producers**: one psycopg connection each (autocommit, as pgqueuer
  requires), ``Queries.enqueue`` per message: one INSERT, its own
  transaction, confirmed after the commit. ``batch=True`` coalesces the
  enqueues waiting on one producer into one ``enqueue`` of lists (one
  INSERT of many rows), as Leasecast's client coalesces into
  ``enqueue_many``: pgqueuer's own API offers the lists, not the coalescing.
- **workers**: a ``QueueManager`` each, on its own connection, with
  ``run(batch_size=prefetch)``; the handler records the latency and
  returns, and pgqueuer moves the job to its log in batches
  (``JobStatusLogBuffer``): so the clock stops when the queue table has
  none of the measurement's jobs left.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import timedelta
from typing import Any

import orjson

from bench.peers.base import OnMessage, PeerProducer, PeerWorker, QueuePeer
from bench.procstat import children_of, parent_of, tree_cpu_seconds
from tests.support.databases import PG_ADMIN_URL, postgres_unavailable

__all__ = ["PgQueuerQueue", "postgres_unavailable"]

DURABILITY = (
    "each enqueue (or each list, batched) one autocommit transaction; "
    "synchronous_commit on: the commit waits for the WAL fsync; completions are "
    "written in batches after the handler returns"
)


async def _connection(url: str) -> Any:
    import psycopg

    return await psycopg.AsyncConnection.connect(url, autocommit=True)


class _Producer(PeerProducer):
    def __init__(self, conn: Any, queue: str, batch: bool) -> None:
        from pgqueuer import Queries

        self.conn = conn
        self.queries = Queries.from_psycopg_connection(conn)
        self.queue = queue
        self.batch = batch
        self.waiting: list[tuple[bytes, asyncio.Future[None]]] = []
        self.flushing: asyncio.Task[None] | None = None

    async def enqueue(self, body: dict[str, float]) -> None:
        payload = orjson.dumps(body)
        if not self.batch:
            await self.queries.enqueue(self.queue, payload)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append((payload, future))
        if self.flushing is None or self.flushing.done():
            self.flushing = asyncio.create_task(self._flush())
        await future

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # the enqueues made in this loop iteration join
        while self.waiting:
            taken, self.waiting = self.waiting, []
            try:
                await self.queries.enqueue(
                    [self.queue] * len(taken), [p for p, _ in taken], [0] * len(taken)
                )
            except Exception as exc:
                for _, future in taken:
                    future.set_exception(exc)
            else:
                for _, future in taken:
                    future.set_result(None)

    async def close(self) -> None:
        if self.flushing is not None:
            await self.flushing
        await self.conn.close()


class _Worker(PeerWorker):
    def __init__(self, conn: Any, queue: str, prefetch: int, on_message: OnMessage) -> None:
        from pgqueuer import QueueManager
        from pgqueuer.db import PsycopgDriver
        from pgqueuer.models import Job
        from pgqueuer.queries import Queries

        self.conn = conn
        self.qm = QueueManager(Queries(PsycopgDriver(conn)))

        @self.qm.entrypoint(queue)
        async def handle(job: Job) -> None:
            assert job.payload is not None
            on_message(orjson.loads(job.payload)["t"], None)

        self.task = asyncio.create_task(
            self.qm.run(batch_size=prefetch, dequeue_timeout=timedelta(seconds=5))
        )

    async def close(self) -> None:
        self.qm.shutdown.set()
        # psycopg's notification listener holds the connection until a NOTIFY
        # comes, so run() may not return by itself for a while: the queue is
        # drained (every completion committed) by now, so cancelling loses nothing.
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self.task, 1)
        await self.conn.close()


class PgQueuerQueue(QueuePeer):
    """pgqueuer in a fresh database on 127.0.0.1:5432, dropped afterwards."""

    durability = DURABILITY

    def __init__(self, *, batch: bool = False) -> None:
        self.batch = batch
        self.name = "pgqueuer" + ("-batched" if batch else "")
        self.database = f"leasecast_bench_pgq_{uuid.uuid4().hex[:10]}"
        self.url = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + self.database
        self.admin: Any = None
        self.postmaster = 0
        self.runs = 0

    async def start(self) -> None:
        from pgqueuer import Queries

        admin = await _connection(PG_ADMIN_URL)
        await admin.execute(f'CREATE DATABASE "{self.database}"')
        await admin.close()
        self.admin = await _connection(self.url)
        await Queries.from_psycopg_connection(self.admin).install()
        # The server's CPU: the postmaster of this connection's backend, and its children.
        backend = (await (await self.admin.execute("SELECT pg_backend_pid()")).fetchone())[0]
        self.postmaster = parent_of(backend)

    async def close(self) -> None:
        if self.admin is not None:
            await self.admin.close()
        admin = await _connection(PG_ADMIN_URL)
        await admin.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        await admin.close()

    async def new_queue(self) -> str:
        self.runs += 1
        return f"headline{self.runs}"

    async def producer(self, queue: str) -> PeerProducer:
        return _Producer(await _connection(self.url), queue, self.batch)

    async def worker(self, queue: str, prefetch: int, on_message: OnMessage) -> PeerWorker:
        return _Worker(await _connection(self.url), queue, prefetch, on_message)

    async def drained(self, queue: str) -> None:
        query = "SELECT count(*) FROM pgqueuer WHERE entrypoint = %s"
        while (await (await self.admin.execute(query, (queue,))).fetchone())[0]:
            await asyncio.sleep(0.005)

    def server_pids(self) -> list[int]:
        return [self.postmaster, *children_of(self.postmaster)] if self.postmaster else []

    def server_cpu(self) -> float | None:
        """PostgreSQL's CPU: the postmaster and every backend, ended ones included."""
        return tree_cpu_seconds(self.postmaster) if self.postmaster else None
