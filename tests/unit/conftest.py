"""Fixtures shared by the unit tests of the store."""

from __future__ import annotations

import itertools
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.core.leases import QueueSettings
from gateway.store import POSTGRESQL, SQLITE, Store
from tests.support.databases import postgres_database, postgres_unavailable, sqlite_database
from tests.support.fakes import FakeClock

_names = itertools.count()


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest) -> Iterator[tuple[str, Callable[[], Any]]]:
    """A migrated database of each kind (PostgreSQL when it answers) and how to connect."""
    var = Path(tempfile.mkdtemp(prefix="leasecast-unit-"))
    if request.param == "sqlite":
        with sqlite_database(var) as env:
            path = env["GATEWAY_SQLITE_PATH"]
            yield "sqlite", lambda: sqlite3.connect(path, isolation_level=None)
    else:
        reason = postgres_unavailable()
        if reason:
            pytest.skip(reason)
        import psycopg

        with postgres_database(var) as env:
            url = env["DATABASE_URL"]
            yield "postgres", lambda: psycopg.connect(url, autocommit=True)


@pytest.fixture
def clock() -> FakeClock:
    """The store's clock, moved by hand."""
    return FakeClock(1_000_000.0)


@pytest.fixture
def store(database: tuple[str, Any], clock: FakeClock) -> Iterator[Store]:
    """A store on ``database`` with the fake clock: timeout 30 s, max_deliveries 3,
    dedup window 60 s, and settings re-read on every batch."""
    kind, connect = database
    s = Store(
        connect,
        SQLITE if kind == "sqlite" else POSTGRESQL,
        clock=clock,
        defaults=QueueSettings(visibility_timeout=30, max_deliveries=3, dedup_window=60),
        settings_ttl=0,
    )
    yield s
    s.close()


@pytest.fixture
def queue() -> str:
    """A queue name no other test of the session uses."""
    return f"q{next(_names)}"
