"""The old path of the tests' databases, kept for bench/ and older imports.

They live in :mod:`tests.support.databases` now; tests import them from there.
"""

from __future__ import annotations

from tests.support.databases import (
    PG_ADMIN_URL,
    REDIS_URL,
    ROOT,
    base_env,
    manage,
    postgres_database,
    postgres_unavailable,
    redis_unavailable,
    sqlite_database,
)

__all__ = [
    "PG_ADMIN_URL",
    "REDIS_URL",
    "ROOT",
    "base_env",
    "manage",
    "postgres_database",
    "postgres_unavailable",
    "redis_unavailable",
    "sqlite_database",
]
