"""Real databases for the tests: a migrated SQLite file, a fresh PostgreSQL database, Redis.

PostgreSQL tests run when the server at 127.0.0.1:5432 answers (or
``$LEASECAST_TEST_PG``), Redis tests when 127.0.0.1:6379 does (or
``$LEASECAST_TEST_REDIS``); each is skipped with the reason shown otherwise
(a laptop without it). CI has both, so there they run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager, suppress
from pathlib import Path
from typing import Any

__all__ = [
    "PG_ADMIN_URL",
    "REDIS_URL",
    "ROOT",
    "base_env",
    "database",
    "manage",
    "postgres_database",
    "postgres_unavailable",
    "redis_unavailable",
    "sqlite_database",
]

ROOT = Path(__file__).resolve().parents[2]
PG_ADMIN_URL = os.environ.get("LEASECAST_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("LEASECAST_TEST_REDIS", "redis://127.0.0.1:6379/0")


def postgres_unavailable() -> str | None:
    """Why PostgreSQL cannot be used, or None if it can."""
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, connect_timeout=3):
            return None
    except Exception as exc:
        return f"PostgreSQL at {PG_ADMIN_URL} is not reachable: {type(exc).__name__}: {exc}"


def manage(env: dict[str, str], *args: str) -> str:
    """Run ``manage.py`` with ``env`` in a subprocess; returns stdout."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def base_env(var_dir: Path) -> dict[str, str]:
    """The environment of a gateway process with its own var/ directory."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["GATEWAY_VAR_DIR"] = str(var_dir)
    env["DJANGO_SETTINGS_MODULE"] = "gateway.settings"
    env["PYTHONPATH"] = str(ROOT)
    return env


def schema_key() -> str:
    """What a migrated database's schema depends on, as ``d52_`` and 12 hex
    digits for Django 5.2.x: the installed Django (whose own apps bring
    their migrations), the settings (``INSTALLED_APPS``) and the project's
    migrations."""
    import django

    digest = hashlib.sha256(django.__version__.encode())
    files = [ROOT / "gateway" / "site" / "settings.py"]
    files += sorted((ROOT / "gateway" / "migrations").glob("*.py"))
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return f"d{django.VERSION[0]}{django.VERSION[1]}_{digest.hexdigest()[:12]}"


def _sqlite_template() -> Path:
    """A SQLite file that ``manage.py migrate`` made, shared by every test process.

    Migrating costs a Django process (about 2 s of CPU); copying the file
    costs nothing. The file is named for :func:`schema_key`, so a changed
    migration makes a new one; parallel workers that miss it at once each
    migrate a file of their own and move it into place (the same content).
    The files of other schemas on the same Django release are deleted then,
    as the PostgreSQL templates are (:func:`_postgres_template`).
    """
    folder = Path(tempfile.gettempdir()) / f"leasecast-test-schema-{os.getuid()}"
    folder.mkdir(exist_ok=True)
    key = schema_key()
    template = folder / f"{key}.sqlite3"
    if not template.exists():
        work = Path(tempfile.mkdtemp(prefix="migrate-", dir=folder))
        env = base_env(work)
        env["GATEWAY_SQLITE_PATH"] = str(work / "leasecast.sqlite3")
        manage(env, "migrate", "--noinput", "-v0")
        # One self-contained file (the write-ahead log folded in), moved into
        # place whole by a rename: a reader never sees half of it.
        with closing(sqlite3.connect(work / "leasecast.sqlite3")) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        os.replace(work / "leasecast.sqlite3", template)
        shutil.rmtree(work, ignore_errors=True)
        release = key.split("_", 1)[0]
        for older in folder.glob(f"{release}_*.sqlite3"):
            if older != template:
                older.unlink(missing_ok=True)
    return template


@contextmanager
def sqlite_database(var_dir: Path) -> Iterator[dict[str, str]]:
    """A migrated SQLite database (a copy of :func:`_sqlite_template`); yields
    the environment that selects it."""
    env = base_env(var_dir)
    env["GATEWAY_SQLITE_PATH"] = str(var_dir / "leasecast.sqlite3")
    try:
        shutil.copyfile(_sqlite_template(), env["GATEWAY_SQLITE_PATH"])
    except FileNotFoundError:
        # A run of another tree replaced the template just then: make it again.
        shutil.copyfile(_sqlite_template(), env["GATEWAY_SQLITE_PATH"])
    yield env


def _postgres_template(admin: Any) -> str:
    """The name of a migrated PostgreSQL database to copy (``CREATE DATABASE ...
    TEMPLATE``), made once per :func:`schema_key` and kept on the server.

    Made under another name and renamed when done, so no copy is taken of a
    half-migrated one; a worker that loses the race drops its own. The
    templates of other schemas on the same Django release are dropped then (a
    run of an older tree that still needs one makes it again); the Django 6
    tests keep theirs beside.
    """
    name = f"leasecast_schema_{schema_key()}"
    if _exists(admin, name):
        return name
    work = f"leasecast_migrating_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE DATABASE "{work}"')
    try:
        env = base_env(Path(tempfile.mkdtemp(prefix="leasecast-migrate-")))
        env["DATABASE_URL"] = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + work
        manage(env, "migrate", "--noinput", "-v0")
        _while_in_use(lambda: admin.execute(f'ALTER DATABASE "{work}" RENAME TO "{name}"'))
    except Exception:
        admin.execute(f'DROP DATABASE IF EXISTS "{work}" WITH (FORCE)')
        if not _exists(admin, name):
            raise
        return name
    release = name.rsplit("_", 1)[0].replace("_", "\\_")  # leasecast_schema_d52
    old = admin.execute(
        "SELECT datname FROM pg_database WHERE datname LIKE %s AND datname <> %s",
        (release + "\\_%", name),
    ).fetchall()
    for (other,) in old:
        with suppress(Exception):  # in use by a run of another tree: it stays
            admin.execute(f'DROP DATABASE IF EXISTS "{other}"')
    return name


def _exists(admin: Any, name: str) -> bool:
    return bool(admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone())


def _while_in_use(step: Callable[[], Any], tries: int = 100) -> None:
    """``step``, again while PostgreSQL says another session uses its database:
    a backend whose client just left takes a moment to exit, and one copy of
    a template is made at a time."""
    import psycopg

    for attempt in range(tries):
        try:
            step()
            return
        except psycopg.errors.ObjectInUse:
            if attempt == tries - 1:
                raise
            time.sleep(0.1)


@contextmanager
def postgres_database(var_dir: Path) -> Iterator[dict[str, str]]:
    """A fresh, migrated PostgreSQL database (a copy of :func:`_postgres_template`),
    dropped afterwards."""
    import psycopg

    name = f"leasecast_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        template = _postgres_template(conn)
        _while_in_use(lambda: conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    env = base_env(var_dir)
    env["DATABASE_URL"] = PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    try:
        yield env
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def database(kind: str, prefix: str = "leasecast-") -> Iterator[tuple[dict[str, str], Path]]:
    """A migrated database of ``kind`` ("sqlite" or "postgres") and a fresh var/
    directory for its gateway; skips the test, saying why, if PostgreSQL is away."""
    import pytest

    var = Path(tempfile.mkdtemp(prefix=f"{prefix}{kind}-"))
    if kind == "sqlite":
        with sqlite_database(var) as env:
            yield env, var
        return
    reason = postgres_unavailable()
    if reason:
        pytest.skip(reason)
    with postgres_database(var) as env:
        yield env, var


def redis_unavailable(url: str = REDIS_URL) -> str | None:
    """Why the Redis server at ``url`` cannot be used (it does not answer PING), or None."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=3)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return f"Redis at {url} does not answer: {type(exc).__name__}: {exc}"
    return None


@contextmanager
def django_alias(
    env: dict[str, str], prefix: str, close: Callable[[str], None] | None = None
) -> Iterator[str]:
    """A Django connection alias of this test process on the database ``env``
    selects: its ``DATABASE_URL``, or else its SQLite file with the project's
    SQLite options (WAL, ``BEGIN IMMEDIATE``).

    The name is ``PREFIX-`` and a random part, never reused for another
    database: threads keep their connection objects of an alias.

    Args:
        close: also run at the end with the name, before this thread's
            connection is closed and the alias removed (a test that used the
            alias on threads of its own closes theirs there).
    """
    import dj_database_url
    from django.db import DEFAULT_DB_ALIAS, connections

    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    if "DATABASE_URL" in env:
        config = dict(dj_database_url.parse(env["DATABASE_URL"], conn_max_age=0))
    else:
        config = {**connections.settings[DEFAULT_DB_ALIAS], "NAME": env["GATEWAY_SQLITE_PATH"]}
    configured = connections.configure_settings(
        {DEFAULT_DB_ALIAS: connections.settings[DEFAULT_DB_ALIAS], name: config}
    )
    connections.settings[name] = configured[name]
    try:
        yield name
    finally:
        if close is not None:
            close(name)
        connections[name].close()
        del connections.settings[name]
