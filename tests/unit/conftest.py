"""Fixtures shared by the unit tests of the store."""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.databases import postgres_database, postgres_unavailable, sqlite_database


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
