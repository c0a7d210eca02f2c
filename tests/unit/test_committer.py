"""Group commit: batching, order, and bounded memory when the store falls behind."""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.core.errors import Backpressure, StaleReceipt
from gateway.core.protocol import EnqueueSpec
from gateway.engine.committer import Committer
from gateway.store import SQLITE, Ack, Enqueue, Op, Result, Store
from tests.support.databases import sqlite_database


class GatedStore(Store):
    """A real store whose batches wait until the test opens the gate."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.batch_sizes: list[int] = []

    def run(self, ops: Sequence[Op]) -> list[Result]:
        self.gate.wait(10)
        self.batch_sizes.append(len(ops))
        return super().run(ops)


@pytest.fixture(scope="module")
def sqlite_path() -> Iterator[str]:
    var = Path(tempfile.mkdtemp(prefix="leasecast-committer-"))
    with sqlite_database(var) as env:
        yield env["GATEWAY_SQLITE_PATH"]


def make(path: str) -> GatedStore:
    return GatedStore(lambda: sqlite3.connect(path, isolation_level=None), SQLITE, clock=time.time)


def spec(body: str) -> EnqueueSpec:
    return EnqueueSpec(f'"{body}"'.encode())


async def test_ops_arriving_during_a_batch_share_the_next_commit(sqlite_path: str) -> None:
    store = make(sqlite_path)
    committer = Committer(lambda: store)
    results: list[Result] = []
    committer.submit(Enqueue("cq1", [spec("first")]), results.append)
    for i in range(50):
        committer.submit(Enqueue("cq1", [spec(str(i))]), results.append)
    store.gate.set()
    while len(results) < 51:
        await asyncio.sleep(0.01)
    assert store.batch_sizes == [1, 50]  # one commit for the fifty that waited
    ids = [int(r[0].id) for r in results]
    assert ids == sorted(ids)  # applied in submission order


async def test_enqueues_get_backpressure_past_the_backlog_but_acks_do_not(
    sqlite_path: str,
) -> None:
    store = make(sqlite_path)
    committer = Committer(lambda: store, max_backlog=10)
    results: list[Result] = []
    committer.submit(Enqueue("cq2", [spec("running")]), results.append)  # the blocked batch
    for i in range(12):
        committer.submit(Enqueue("cq2", [spec(str(i))]), results.append)
    committer.submit(Ack("1.ff"), results.append)
    await asyncio.sleep(0.05)
    refused = [r for r in results if isinstance(r, Backpressure)]
    assert len(refused) == 2 and committer.refused == 2  # the 11th and 12th waiting enqueues
    store.gate.set()
    while len(results) < 14:
        await asyncio.sleep(0.01)
    assert isinstance(results[-1], StaleReceipt)  # the ack was taken, not refused
    assert sum(1 for r in results if isinstance(r, list)) == 11
