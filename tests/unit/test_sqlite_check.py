"""The store refuses an SQLite library its statements cannot run on (gateway.store.dialects)."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from gateway.store.dialects import check_sqlite


class _Old(sqlite3.Connection):
    """A real connection that reports an SQLite before RETURNING."""

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "SELECT sqlite_version()":
            return super().execute("SELECT '3.34.1'")
        return super().execute(sql, *args)


class _NoJson(sqlite3.Connection):
    """A real connection built as if without the JSON functions."""

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if "json_" in sql:
            raise sqlite3.OperationalError("no such table: json_each")
        return super().execute(sql, *args)


def test_this_pythons_sqlite_passes() -> None:
    check_sqlite(sqlite3.connect(":memory:"))


def test_an_sqlite_before_3_35_is_refused_with_its_version() -> None:
    with pytest.raises(RuntimeError, match=r"3\.35 or later; this Python has 3\.34\.1"):
        check_sqlite(sqlite3.connect(":memory:", factory=_Old))


def test_an_sqlite_without_json_is_refused() -> None:
    with pytest.raises(RuntimeError, match="JSON functions"):
        check_sqlite(sqlite3.connect(":memory:", factory=_NoJson))
