"""The store's SQLite transactions take the write lock in short steps (``_Sqlite.start``).

Real SQLite files and connections: while another connection holds the write
lock, ``start`` tries again and again (SQLite's own busy handler would try
once, then sleep 1 ms, 2 ms, 5 ms...), takes the lock when it is free, gives
up with "database is locked" after the connection's own timeout, and leaves
that timeout as it found it.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.store.dialects import SQLITE


class _CountingCursor(sqlite3.Cursor):
    """A real cursor that counts its ``BEGIN IMMEDIATE`` attempts."""

    begins = 0

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "BEGIN IMMEDIATE":
            self.begins += 1
        return super().execute(sql, *args)


@pytest.fixture
def path(tmp_path: Path) -> Iterator[Path]:
    """A WAL-mode SQLite file with one table."""
    file = tmp_path / "lock.sqlite3"
    conn = sqlite3.connect(file, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (v INTEGER)")
    conn.close()
    yield file


def _holder(path: Path) -> sqlite3.Connection:
    """Another connection, holding the write lock."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO t VALUES (1)")
    return conn


def _busy_timeout(cursor: sqlite3.Cursor) -> int:
    value: int = cursor.execute("PRAGMA busy_timeout").fetchone()[0]
    return value


def test_the_lock_is_taken_when_it_is_freed_after_many_tries(path: Path) -> None:
    holder = _holder(path)
    conn = sqlite3.connect(path, isolation_level=None, timeout=10)
    cursor = conn.cursor(_CountingCursor)
    release = threading.Timer(0.3, holder.execute, ["COMMIT"])
    release.start()
    try:
        SQLITE.start(cursor)
        # The holder's row is visible: the lock came after its commit.
        assert cursor.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 1
        cursor.execute("COMMIT")
    finally:
        release.join()
        holder.close()
    # SQLite's handler would have made one attempt and slept inside it.
    assert cursor.begins > 3
    assert _busy_timeout(cursor) == 10_000
    conn.close()


def test_a_lock_held_past_the_timeout_fails_as_sqlite_would(path: Path) -> None:
    holder = _holder(path)
    conn = sqlite3.connect(path, isolation_level=None, timeout=0.2)
    cursor = conn.cursor()
    with pytest.raises(sqlite3.OperationalError, match="database is locked"):
        SQLITE.start(cursor)
    assert not conn.in_transaction
    assert _busy_timeout(cursor) == 200
    holder.execute("ROLLBACK")
    holder.close()
    SQLITE.start(cursor)  # and it works again once the lock is free
    assert conn.in_transaction
    cursor.execute("ROLLBACK")
    conn.close()


def test_a_free_lock_is_taken_at_the_first_try(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None, timeout=5)
    cursor = conn.cursor(_CountingCursor)
    SQLITE.start(cursor)
    assert (cursor.begins, conn.in_transaction, _busy_timeout(cursor)) == (1, True, 5000)
    cursor.execute("ROLLBACK")
    conn.close()
