"""The SQLite database holds live session keys and token hashes: only its owner may read it.

The database file is created 0600 whatever the umask, SQLite gives its WAL
and shared-memory files the same mode, and a file an earlier version left
readable by others is tightened when a process starts on it.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.clients import http
from tests.support.databases import base_env, manage
from tests.support.gateways import GatewayProcess


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask, under which files are created readable by everyone (0644)."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_the_database_and_its_wal_are_private(umask_022: None) -> None:
    var = Path(tempfile.mkdtemp(prefix="leasecast-private-"))
    env = base_env(var)
    database = var / "db" / "leasecast.sqlite3"
    env["GATEWAY_SQLITE_PATH"] = str(database)
    manage(env, "migrate", "--noinput", "-v0")
    assert mode(database) == 0o600
    gateway = GatewayProcess(env, var, name="private")
    token = gateway.issue_token("admin")
    gateway.start()
    try:
        status, _ = http(
            "POST",
            f"{gateway.http}/api/queues/private/messages",
            token,
            {"messages": [{"body": "a secret"}]},
        )
        assert status == 200
        # While the gateway runs, the WAL and its index exist beside the file.
        for companion in ("-wal", "-shm"):
            path = database.with_name(database.name + companion)
            assert mode(path) == 0o600, (companion, oct(mode(path)))
    finally:
        gateway.stop()
    assert mode(database) == 0o600


def test_a_readable_database_left_by_an_earlier_version_is_tightened(umask_022: None) -> None:
    var = Path(tempfile.mkdtemp(prefix="leasecast-private-"))
    env = base_env(var)
    database = var / "leasecast.sqlite3"
    env["GATEWAY_SQLITE_PATH"] = str(database)
    manage(env, "migrate", "--noinput", "-v0")
    database.chmod(0o644)
    manage(env, "check")
    assert mode(database) == 0o600
