"""The SQL that differs between SQLite and PostgreSQL, one class per dialect.

Statements the two share are written once, with ``%s`` placeholders, in the
modules that use them; :meth:`Dialect.sql` adapts the placeholders. What
differs lives here: how a transaction begins, the lease statement (design
decision 2), bulk inserts and acks (a JSON array of rows and array literals
of ids on PostgreSQL, a JSON array on SQLite), and the per-group and
per-queue locks that only PostgreSQL needs.

The hot statements (:meth:`Dialect.lease`, :meth:`Dialect.insert`,
:meth:`Dialect.ack_many`) are run by the dialect itself, through the ``run``
it is given, because on SQLite their shape costs more than their work. A
statement with a list of N placeholders is a new statement for every N,
parsed and planned again, with N parameters bound one by one, and one that
returns N rows (``RETURNING``) makes N steps, each of which releases the GIL
and must win it back from the event loop. So on SQLite the insert and the
ack take their list as one JSON parameter (their text never changes, and
Python's statement cache keeps them planned) and return at most one row. The
lease stays one atomic ``UPDATE ... RETURNING`` (design decision 2): split
into pick, update and read back it measured no faster. PostgreSQL's driver
fetches a whole result at once, so ``RETURNING`` stays there; its lists go
as one parameter each, made in C (``orjson``) or by ``str.join``, because
psycopg dumps a Python list element by element in Python, and the store's
connection prepares the statements (``gateway.engine``).
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "POSTGRESQL",
    "SQLITE",
    "SQLITE_THROUGH_DJANGO",
    "Dialect",
    "Leased",
    "Run",
    "Statement",
    "check_sqlite",
    "take_write_lock",
]

Statement = tuple[str, Sequence[Any]]
#: Runs one statement (``%s`` placeholders) in the current transaction and
#: returns the cursor (``Txn.exec``).
Run = Callable[[str, Sequence[Any]], Any]

#: The columns an enqueue writes, in the order of :meth:`Dialect.insert`'s rows.
INSERT_COLUMNS = (
    'queue_id, body, "key", state, visible_at, deliveries, enqueued_at, "group", priority, '
    "expires_at"
)
#: What a lease returns per message.
LEASED_COLUMNS = 'id, body, deliveries, "group", priority, visible_at'
#: A guarded lease's condition (``Dialect.lease``): the queue (the parameter)
#: is neither paused nor limited. Uncorrelated, so evaluated once per statement.
LEASE_GUARD = (
    "AND NOT EXISTS (SELECT 1 FROM leasecast_queue AS qc WHERE qc.id = %s "
    "AND (qc.paused OR qc.max_in_flight > 0 OR qc.rate_limit > 0))"
)


#: A lease's condition on the message's ttl: a message past it is never
#: leased, whether or not a sweep (``gateway.store.expiry``) has
#: dead-lettered it yet. The parameter is the transaction's clock.
LEASE_TTL = "AND (expires_at IS NULL OR expires_at > %s)"


@dataclass(slots=True)
class Leased:
    """What one lease statement returned (:meth:`Dialect.lease`)."""

    #: a row of :data:`LEASED_COLUMNS` per message, in no promised order
    rows: list[Sequence[Any]]
    #: where the dialect reads them in the same statement (PostgreSQL), and
    #: only when ``rows`` are fewer than asked: the queue's earliest
    #: ``visible_at`` of a leased or delayed message other than ``rows``, and
    #: its earliest ``expires_at``, as the statement found them; None
    #: otherwise, and the caller reads them if it needs them
    after: tuple[float | None, float | None] | None = None


class Dialect:
    """SQL for one database. Subclasses fill in what differs."""

    name = "abstract"
    begin = "BEGIN"
    placeholder = "%s"
    #: a JSON value passed as text, for a JSON column (``TaskRecord``)
    json_param = "%s"

    def start(self, cursor: Any, *, relaxed: bool = False) -> None:
        """Begin a transaction on ``cursor``'s connection (:attr:`begin`).

        ``relaxed``: its commit need not wait for the log's flush, where the
        database can say so (PostgreSQL; see ``gateway.store.runner``).
        """
        cursor.execute(self.begin)

    def sql(self, text: str) -> str:
        """Adapt ``%s`` placeholders to the driver's style."""
        return text if self.placeholder == "%s" else text.replace("%s", self.placeholder)

    #: A limited or paused queue's control row, read by its lease round
    #: (``gateway.store.leasing``); PostgreSQL locks it (:meth:`control`).
    _CONTROL = (
        "SELECT paused, max_in_flight, rate_limit, rate_burst, rate_tokens, rate_refilled_at "
        "FROM leasecast_queue WHERE id = %s"
    )
    #: A queue's leases in flight now (leased, neither timed out nor past their ttl).
    _IN_FLIGHT = (
        "SELECT COUNT(*) FROM leasecast_message WHERE queue_id = %s AND state = 1 "
        "AND visible_at > %s AND (expires_at IS NULL OR expires_at > %s)"
    )

    def control(self, run: Run, queue_id: int, *, wait: bool = True) -> Sequence[Any] | None:
        """A queue's ``paused, max_in_flight, rate_limit, rate_burst, rate_tokens,
        rate_refilled_at``, held for the rest of the transaction: no other
        transaction leases from the queue until this one ends, so the count of
        leases in flight and the bucket it reads next stay true until its commit.

        ``wait``: False to get None at once instead of waiting for another
        transaction that holds the row (``gateway.store.leasing`` then tries
        again shortly; it never waits for queues out of their id order, which
        is what keeps two processes from deadlocking).
        """
        row: Sequence[Any] | None = run(self._CONTROL, (queue_id,)).fetchone()
        return row

    def in_flight(self, run: Run, queue_id: int, now: float) -> int:
        """How many messages of the queue are leased at ``now``."""
        return int(run(self._IN_FLIGHT, (queue_id, now, now)).fetchone()[0])

    def lease(
        self,
        run: Run,
        queue_id: int,
        n: int,
        now: float,
        lease_end: float,
        token: int,
        *,
        guarded: bool = False,
    ) -> Leased:
        """Lease up to ``n`` heads of the queue in delivery order (priority, then id),
        none past its ttl (:data:`LEASE_TTL`), noting ``now`` as each lease's
        start (``leased_at``).

        ``guarded``: lease nothing if the queue's row is paused or limited (a
        round run without the control rules, on settings cached before another
        process changed them). One primary-key lookup, evaluated once.
        """
        raise NotImplementedError

    def insert(self, run: Run, rows: Sequence[tuple[Any, ...]]) -> list[int]:
        """Insert message rows (values in :data:`INSERT_COLUMNS` order but ``deliveries``);
        returns their ids in the order given."""
        raise NotImplementedError

    def ack_many(
        self, run: Run, pairs: Sequence[tuple[int, int]], now: float
    ) -> list[Sequence[Any]]:
        """Delete the current leases named by ``(id, lease_token)`` pairs; returns
        ``(id, lease_token, queue_id, group, leased_at)`` for each one deleted."""
        raise NotImplementedError

    def lock_groups(self, keys: Sequence[tuple[int, str]]) -> Statement | None:
        """A statement that serialises the settling of these groups across
        connections until commit, or None where transactions are serial anyway."""
        return None


# -- SQLite ----------------------------------------------------------------------


class _Sqlite(Dialect):
    """SQLite: ``BEGIN IMMEDIATE`` makes every write transaction serial, so a
    queue's control row needs no lock of its own."""

    name = "sqlite"
    begin = "BEGIN IMMEDIATE"
    placeholder = "?"

    def start(self, cursor: Any, *, relaxed: bool = False) -> None:
        """``BEGIN IMMEDIATE``, the write lock taken in short steps (:func:`take_write_lock`)."""
        take_write_lock(cursor, lambda: cursor.execute(self.begin))

    # These take their lists as one JSON array parameter (see the module's doc).
    # Rows in the array's order (``key`` is the index), so ids follow it.
    _INSERT = f"""
        INSERT INTO leasecast_message ({INSERT_COLUMNS})
        SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'),
            json_extract(value, '$[2]'), json_extract(value, '$[3]'),
            json_extract(value, '$[4]'), 0, json_extract(value, '$[5]'),
            json_extract(value, '$[6]'), json_extract(value, '$[7]'),
            json_extract(value, '$[8]')
        FROM json_each(%s) ORDER BY key
    """
    _CURRENT_OF = """
        SELECT json_group_array(json_array(id, lease_token, queue_id, "group", leased_at))
        FROM leasecast_message WHERE id IN (SELECT value FROM json_each(%s))
        AND state = 1 AND visible_at > %s AND (expires_at IS NULL OR expires_at > %s)
    """
    _DELETE_IDS = "DELETE FROM leasecast_message WHERE id IN (SELECT value FROM json_each(%s))"

    _LEASE_TEMPLATE = f"""
        UPDATE leasecast_message
        SET state = 1, deliveries = deliveries + 1, lease_token = %s, leased_at = %s,
            visible_at = CASE WHEN expires_at < %s THEN expires_at ELSE %s END
        WHERE id IN (
            SELECT id FROM (
                SELECT id, priority FROM (
                    SELECT id, priority FROM leasecast_message
                    WHERE queue_id = %s AND state = 0 {LEASE_TTL} {{guard}}
                    ORDER BY priority DESC, id LIMIT %s
                )
                UNION ALL
                SELECT id, priority FROM (
                    SELECT id, priority FROM leasecast_message
                    WHERE queue_id = %s AND state IN (1, 3) AND visible_at <= %s {LEASE_TTL}
                        {{guard}}
                    ORDER BY priority DESC, id LIMIT %s
                )
                ORDER BY priority DESC, id LIMIT %s
            )
        )
        RETURNING {LEASED_COLUMNS}
    """
    _LEASE = _LEASE_TEMPLATE.replace("{guard}", "")
    _LEASE_GUARDED = _LEASE_TEMPLATE.replace("{guard}", LEASE_GUARD)

    def lease(
        self,
        run: Run,
        queue_id: int,
        n: int,
        now: float,
        lease_end: float,
        token: int,
        *,
        guarded: bool = False,
    ) -> Leased:
        if guarded:
            params: tuple[Any, ...] = (
                *(token, now, lease_end, lease_end),
                *(queue_id, now, queue_id, n),
                *(queue_id, now, now, queue_id, n),
                n,
            )
            sql = self._LEASE_GUARDED
        else:
            params = (
                *(token, now, lease_end, lease_end),
                *(queue_id, now, n),
                *(queue_id, now, now, n),
                n,
            )
            sql = self._LEASE
        return Leased(run(sql, params).fetchall())

    def insert(self, run: Run, rows: Sequence[tuple[Any, ...]]) -> list[int]:
        cursor = run(self._INSERT, (orjson.dumps(rows).decode(),))
        # The id column is AUTOINCREMENT: ids are never reused, and the rows of
        # one statement take consecutive ids, in order, under the write lock.
        # Counting them costs one row where RETURNING cost one per message.
        last: int = cursor.lastrowid
        first = last - len(rows) + 1
        (found,) = run(
            "SELECT COUNT(*) FROM leasecast_message WHERE id BETWEEN %s AND %s", (first, last)
        ).fetchone()
        if found != len(rows):
            raise RuntimeError(f"inserted {len(rows)} rows, found {found} in ids {first}..{last}")
        return list(range(first, last + 1))

    def ack_many(
        self, run: Run, pairs: Sequence[tuple[int, int]], now: float
    ) -> list[Sequence[Any]]:
        # The current leases among these ids, as one row; the lease tokens are
        # compared here, then the acked ones deleted by id.
        ids = orjson.dumps([msg_id for msg_id, _ in pairs]).decode()
        (found,) = run(self._CURRENT_OF, (ids, now, now)).fetchone()
        wanted = set(pairs)
        current = [row for row in orjson.loads(found) if (row[0], row[1]) in wanted]
        if current:
            run(self._DELETE_IDS, (orjson.dumps([row[0] for row in current]).decode(),))
        return current


#: The write lock's retry steps, in seconds (:func:`take_write_lock`).
_FIRST_STEP = 0.00005
_LAST_STEP = 0.001


def take_write_lock(cursor: Any, begin: Callable[[], object]) -> None:
    """Call ``begin``, which takes SQLite's write lock (``BEGIN IMMEDIATE``),
    trying again in short steps while another connection holds the lock.

    SQLite's own busy handler (the connection's timeout) sleeps 1, 2, 5, 10,
    15... ms between tries, so a transaction that finds the lock held, even
    for 50 us, waits at least 1 ms. The gateway's store and a Django project
    enqueuing each commit thousands of times a second on one file, so that
    was the p99 of taking the lock: measured against a writer of 4-row
    transactions, 1.10 ms with SQLite's handler, 0.16 ms with these steps
    (50 us, doubling up to 1 ms). The connection's timeout (``cursor``'s
    ``busy_timeout``) still bounds the wait and is put back afterwards for
    every other statement.

    Raises:
        Exception: what ``begin`` raised: not busy, or busy past the timeout.
    """
    timeout_ms = cursor.execute("PRAGMA busy_timeout").fetchone()[0]
    cursor.execute("PRAGMA busy_timeout = 0")
    try:
        deadline = time.monotonic() + timeout_ms / 1000
        step = _FIRST_STEP
        while True:
            try:
                begin()
                return
            except Exception as exc:
                if not _is_busy(exc) or time.monotonic() + step > deadline:
                    raise
            time.sleep(step)
            step = min(step * 2, _LAST_STEP)
    finally:
        cursor.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")


def _is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "database is locked" (SQLITE_BUSY), as
    sqlite3 raises it or as Django wraps it."""
    for found in (exc, exc.__cause__):
        if isinstance(found, sqlite3.OperationalError):
            code = getattr(found, "sqlite_errorcode", None)
            if code is not None:
                return bool(code & 0xFF == sqlite3.SQLITE_BUSY)
            return "database is locked" in str(found)
    return False


class _SqliteThroughDjango(_Sqlite):
    """SQLite through a Django connection's cursor (``gateway.host.on_django``).

    Django's SQLite cursor takes ``%s`` placeholders and turns them into ``?``
    itself; with ``DEBUG`` on, its debug wrapper also renders each statement
    with ``%`` for ``connection.queries``, which fails on ``?``. So the
    statements go to it as written, and Django's logging, its
    ``execute_wrapper`` hooks and its error classes all see them. Used while
    Django logs the queries; otherwise ``gateway.host.on_django`` gives
    :data:`SQLITE` to Django's wrapper of the driver's cursor (no rewrite per
    statement). The gateway's own store keeps :data:`SQLITE` on a plain
    ``sqlite3`` cursor.
    """

    placeholder = "%s"


def check_sqlite(conn: Any) -> None:
    """Refuse an SQLite library the store's statements cannot run on.

    ``RETURNING`` needs 3.35; the hot statements need the JSON functions,
    built in since 3.38 and compiled in by most builds before that.

    Raises:
        RuntimeError: saying what is missing.
    """
    version = conn.execute("SELECT sqlite_version()").fetchone()[0]
    if tuple(int(part) for part in version.split(".")[:2]) < (3, 35):
        raise RuntimeError(f"Leasecast needs SQLite 3.35 or later; this Python has {version}")
    try:
        conn.execute("SELECT json_group_array(value) FROM json_each('[1]')").fetchone()
    except Exception as exc:
        raise RuntimeError(
            f"Leasecast needs SQLite's JSON functions (JSON1); SQLite {version} lacks them"
        ) from exc


# -- PostgreSQL --------------------------------------------------------------------


class _Postgres(Dialect):
    """PostgreSQL: several gateway processes lease from one database at once."""

    name = "postgresql"
    json_param = "CAST(%s AS jsonb)"
    # Read committed: the row lock serialises the lease rounds of one limited
    # queue across processes, and each statement after it sees every lease
    # and ack committed before the lock was granted. Unlimited queues never
    # take it, so they pay nothing. NO KEY UPDATE: enqueues and counters
    # (foreign keys to the row take KEY SHARE) do not wait for it.
    _CONTROL = Dialect._CONTROL + " FOR NO KEY UPDATE"
    _CONTROL_NOWAIT = _CONTROL + " SKIP LOCKED"

    def start(self, cursor: Any, *, relaxed: bool = False) -> None:
        """``BEGIN``; relaxed, with ``SET LOCAL synchronous_commit TO OFF`` in
        the same round trip (two statements in one simple query)."""
        sql = "BEGIN; SET LOCAL synchronous_commit TO OFF" if relaxed else "BEGIN"
        cursor.execute(sql, prepare=False)

    def control(self, run: Run, queue_id: int, *, wait: bool = True) -> Sequence[Any] | None:
        sql = self._CONTROL if wait else self._CONTROL_NOWAIT
        row: Sequence[Any] | None = run(sql, (queue_id,)).fetchone()
        return row

    # When the queue runs short (fewer rows than asked), the statement also
    # reads what the round's caller needs next (``gateway.store.leasing``):
    # the earliest lease to time out or delayed message to come due, other
    # than the rows it leases (their new ends are in the rows), and the
    # earliest ttl. Read in the same snapshot, that costs two index lookups
    # instead of a round trip of its own; a full round skips them (CASE runs
    # a subquery only when it is needed). ``after`` LEFT JOIN ``leased``
    # gives one row even when nothing is leased.
    _LEASE_TEMPLATE = f"""
        WITH ready AS (
            SELECT id, priority FROM leasecast_message
            WHERE queue_id = %s AND state = 0 {LEASE_TTL} {{guard}}
            ORDER BY priority DESC, id LIMIT %s
            FOR UPDATE SKIP LOCKED
        ), due AS (
            SELECT id, priority FROM leasecast_message
            WHERE queue_id = %s AND state IN (1, 3) AND visible_at <= %s {LEASE_TTL} {{guard}}
            ORDER BY priority DESC, id LIMIT %s
            FOR UPDATE SKIP LOCKED
        ), picked AS (
            SELECT id FROM (SELECT * FROM ready UNION ALL SELECT * FROM due) AS u
            ORDER BY priority DESC, id LIMIT %s
        ), leased AS (
            UPDATE leasecast_message AS m
            SET state = 1, deliveries = m.deliveries + 1, lease_token = %s, leased_at = %s,
                visible_at = CASE WHEN m.expires_at < %s THEN m.expires_at ELSE %s END
            FROM picked WHERE m.id = picked.id
            RETURNING m.id, m.body, m.deliveries, m."group", m.priority, m.visible_at
        ), short AS (
            SELECT (SELECT COUNT(*) FROM picked) < %s AS short
        ), after AS (
            SELECT CASE WHEN short THEN (SELECT MIN(visible_at) FROM leasecast_message
                    WHERE queue_id = %s AND state IN (1, 3)
                    AND id NOT IN (SELECT id FROM picked)) END AS due_at,
                CASE WHEN short THEN (SELECT MIN(expires_at) FROM leasecast_message
                    WHERE queue_id = %s AND expires_at IS NOT NULL) END AS expires_at
            FROM short
        )
        SELECT leased.*, after.due_at, after.expires_at FROM after LEFT JOIN leased ON true
    """
    _LEASE = _LEASE_TEMPLATE.replace("{guard}", "")
    _LEASE_GUARDED = _LEASE_TEMPLATE.replace("{guard}", LEASE_GUARD)

    def lease(
        self,
        run: Run,
        queue_id: int,
        n: int,
        now: float,
        lease_end: float,
        token: int,
        *,
        guarded: bool = False,
    ) -> Leased:
        guard: tuple[Any, ...] = (queue_id,) if guarded else ()
        params = (
            *(queue_id, now, *guard, n),
            *(queue_id, now, now, *guard, n),
            n,
            *(token, now, lease_end, lease_end),
            *(n, queue_id, queue_id),
        )
        sql = self._LEASE_GUARDED if guarded else self._LEASE
        found = run(sql, params).fetchall()
        # One row at least: the last two columns are ``after``; a row with no
        # id stands for "nothing leased".
        rows = [row[:6] for row in found if row[0] is not None]
        return Leased(rows, (found[0][6], found[0][7]) if len(rows) < n else None)

    # The rows of a batch go as one JSON parameter, serialised in C by orjson:
    # psycopg dumps a Python list into an array parameter element by element
    # in Python (with a regular expression per string, to quote it), which
    # cost the store thread more than the rest of the statement. The text
    # never changes, so the connection keeps it prepared (gateway.engine).
    # Numbers keep their value exactly: a float's shortest repr reads back as
    # the same float8.
    _INSERT = (
        f"INSERT INTO leasecast_message ({INSERT_COLUMNS}) "
        "SELECT (r->>0)::bigint, r->>1, r->>2, (r->>3)::smallint, (r->>4)::float8, 0, "
        "(r->>5)::float8, r->>6, (r->>7)::smallint, (r->>8)::float8 "
        "FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS t(r, i) ORDER BY i "
        "RETURNING id"
    )
    # Ids and tokens as array literals, made by str.join: integers need no
    # quoting. Each row found by id in the primary key compares its token
    # with the one at its id's place: no join, so no plan (generic or not)
    # scans every lease in flight, and no row of the list is built per row
    # found (``(id, lease_token) IN (SELECT * FROM unnest(...))`` made a
    # nested loop over the list for each message). A list that names one id
    # twice (a stale receipt beside the current one) takes the pairwise form.
    _ACK_MANY = (
        "DELETE FROM leasecast_message WHERE id = ANY(%s::bigint[]) "
        "AND lease_token = (%s::bigint[])[array_position(%s::bigint[], id)] AND state = 1 "
        "AND visible_at > %s AND (expires_at IS NULL OR expires_at > %s) "
        'RETURNING id, lease_token, queue_id, "group", leased_at'
    )
    _ACK_PAIRS = (
        "DELETE FROM leasecast_message WHERE id = ANY(%s::bigint[]) AND state = 1 "
        "AND visible_at > %s AND (expires_at IS NULL OR expires_at > %s) "
        "AND (id, lease_token) IN (SELECT * FROM unnest(%s::bigint[], %s::bigint[])) "
        'RETURNING id, lease_token, queue_id, "group", leased_at'
    )

    def insert(self, run: Run, rows: Sequence[tuple[Any, ...]]) -> list[int]:
        # Ids grow in insertion order (the SELECT's ORDER BY), and RETURNING's
        # row order is not promised: sorting restores the given order.
        found = run(self._INSERT, (orjson.dumps(rows).decode(),)).fetchall()
        return sorted(row[0] for row in found)

    def ack_many(
        self, run: Run, pairs: Sequence[tuple[int, int]], now: float
    ) -> list[Sequence[Any]]:
        ids = "{" + ",".join([str(msg_id) for msg_id, _ in pairs]) + "}"
        tokens = "{" + ",".join([str(token) for _, token in pairs]) + "}"
        if len({msg_id for msg_id, _ in pairs}) == len(pairs):
            found = run(self._ACK_MANY, (ids, tokens, ids, now, now))
        else:
            found = run(self._ACK_PAIRS, (ids, now, now, ids, tokens))
        rows: list[Sequence[Any]] = found.fetchall()
        return rows

    def lock_groups(self, keys: Sequence[tuple[int, str]]) -> Statement | None:
        # Transaction-scoped advisory locks, taken in one global order (sorted
        # lock keys) so that two settlers never wait for each other in a
        # cycle. Read committed: the settling statement that follows sees
        # every settlement committed before the lock was granted.
        lock_keys = sorted({group_lock_key(queue_id, group) for queue_id, group in keys})
        return "SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) AS t(k)", (lock_keys,)


def group_lock_key(queue_id: int, group: str) -> int:
    """A stable signed 64-bit advisory lock key for one group of one queue."""
    digest = hashlib.blake2b(f"{queue_id}:{group}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


SQLITE: Dialect = _Sqlite()
#: :data:`SQLITE` for a Django connection's cursor (``%s`` placeholders).
SQLITE_THROUGH_DJANGO: Dialect = _SqliteThroughDjango()
POSTGRESQL: Dialect = _Postgres()
