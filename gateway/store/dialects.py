"""The SQL that differs between SQLite and PostgreSQL, one class per dialect.

Statements the two share are written once, with ``%s`` placeholders, in the
modules that use them; :meth:`Dialect.sql` adapts the placeholders. What
differs lives here: how a transaction begins, the lease statement (DESIGN
decision 2), bulk inserts and acks (arrays on PostgreSQL, VALUES lists on
SQLite), and the per-group lock that only PostgreSQL needs.

The stored states are the integers of :class:`gateway.leases.StoredState`:
0 READY, 1 LEASED, 2 DEAD, 3 DELAYED, 4 WAITING.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

__all__ = ["POSTGRESQL", "SQLITE", "Dialect", "Statement"]

Statement = tuple[str, Sequence[Any]]

#: The columns an enqueue writes, in the order of :meth:`Dialect.insert`'s rows.
INSERT_COLUMNS = (
    'queue_id, body, "key", state, visible_at, deliveries, enqueued_at, "group", priority, '
    "expires_at"
)
#: What a lease returns per message.
LEASED_COLUMNS = 'id, body, deliveries, "group", priority, visible_at'


class Dialect:
    """SQL for one database. Subclasses fill in what differs."""

    name = "abstract"
    begin = "BEGIN"
    placeholder = "%s"
    #: a JSON value passed as text, for a JSON column (``TaskRecord``)
    json_param = "%s"

    def sql(self, text: str) -> str:
        """Adapt ``%s`` placeholders to the driver's style."""
        return text if self.placeholder == "%s" else text.replace("%s", self.placeholder)

    def lease(self, queue_id: int, n: int, now: float, lease_end: float, token: int) -> Statement:
        """Lease up to ``n`` heads of the queue in delivery order (priority, then id)."""
        raise NotImplementedError

    def insert(self, rows: Sequence[tuple[Any, ...]]) -> Statement:
        """Insert message rows (values in :data:`INSERT_COLUMNS` order but ``deliveries``),
        returning their ids."""
        raise NotImplementedError

    def ack_many(self, pairs: Sequence[tuple[int, int]], now: float) -> Statement:
        """Delete the current leases named by ``(id, lease_token)`` pairs, returning
        the pairs deleted and the group of each."""
        raise NotImplementedError

    def lock_groups(self, keys: Sequence[tuple[int, str]]) -> Statement | None:
        """A statement that serialises the settling of these groups across
        connections until commit, or None where transactions are serial anyway."""
        return None


# -- SQLite ----------------------------------------------------------------------


class _Sqlite(Dialect):
    """SQLite: ``BEGIN IMMEDIATE`` makes every write transaction serial."""

    name = "sqlite"
    begin = "BEGIN IMMEDIATE"
    placeholder = "?"

    _LEASE = f"""
        UPDATE leasecast_message
        SET state = 1, deliveries = deliveries + 1, lease_token = ?,
            visible_at = CASE WHEN expires_at < ? THEN expires_at ELSE ? END
        WHERE id IN (
            SELECT id FROM (
                SELECT id, priority FROM (
                    SELECT id, priority FROM leasecast_message
                    WHERE queue_id = ? AND state = 0 ORDER BY priority DESC, id LIMIT ?
                )
                UNION ALL
                SELECT id, priority FROM (
                    SELECT id, priority FROM leasecast_message
                    WHERE queue_id = ? AND state IN (1, 3) AND visible_at <= ?
                    ORDER BY priority DESC, id LIMIT ?
                )
                ORDER BY priority DESC, id LIMIT ?
            )
        )
        RETURNING {LEASED_COLUMNS}
    """

    def lease(self, queue_id: int, n: int, now: float, lease_end: float, token: int) -> Statement:
        return self._LEASE, (token, lease_end, lease_end, queue_id, n, queue_id, now, n, n)

    def insert(self, rows: Sequence[tuple[Any, ...]]) -> Statement:
        values = ",".join(["(?, ?, ?, ?, ?, 0, ?, ?, ?, ?)"] * len(rows))
        sql = f"INSERT INTO leasecast_message ({INSERT_COLUMNS}) VALUES {values} RETURNING id"
        return sql, [value for row in rows for value in row]

    def ack_many(self, pairs: Sequence[tuple[int, int]], now: float) -> Statement:
        # The plain "id IN" lets SQLite use the primary key; the row values
        # then check each lease token (it would scan otherwise).
        sql = (
            "DELETE FROM leasecast_message WHERE id IN ("
            + ",".join(["?"] * len(pairs))
            + ") AND state = 1 AND visible_at > ? AND (expires_at IS NULL OR expires_at > ?)"
            " AND (id, lease_token) IN (VALUES "
            + ",".join(["(?, ?)"] * len(pairs))
            + ') RETURNING id, lease_token, queue_id, "group"'
        )
        params: list[Any] = [msg_id for msg_id, _ in pairs] + [now, now]
        for pair in pairs:
            params += pair
        return sql, params


# -- PostgreSQL --------------------------------------------------------------------


class _Postgres(Dialect):
    """PostgreSQL: several gateway processes lease from one database at once."""

    name = "postgresql"
    json_param = "CAST(%s AS jsonb)"

    _LEASE = """
        WITH ready AS (
            SELECT id, priority FROM leasecast_message
            WHERE queue_id = %s AND state = 0 ORDER BY priority DESC, id LIMIT %s
            FOR UPDATE SKIP LOCKED
        ), due AS (
            SELECT id, priority FROM leasecast_message
            WHERE queue_id = %s AND state IN (1, 3) AND visible_at <= %s
            ORDER BY priority DESC, id LIMIT %s
            FOR UPDATE SKIP LOCKED
        ), picked AS (
            SELECT id FROM (SELECT * FROM ready UNION ALL SELECT * FROM due) AS u
            ORDER BY priority DESC, id LIMIT %s
        )
        UPDATE leasecast_message AS m
        SET state = 1, deliveries = m.deliveries + 1, lease_token = %s,
            visible_at = CASE WHEN m.expires_at < %s THEN m.expires_at ELSE %s END
        FROM picked WHERE m.id = picked.id
        RETURNING m.id, m.body, m.deliveries, m."group", m.priority, m.visible_at
    """

    def lease(self, queue_id: int, n: int, now: float, lease_end: float, token: int) -> Statement:
        return self._LEASE, (queue_id, n, queue_id, now, n, n, token, lease_end, lease_end)

    def insert(self, rows: Sequence[tuple[Any, ...]]) -> Statement:
        # One statement of arrays, whatever the row count: PostgreSQL plans it
        # once, where a VALUES list of thousands of parameters costs more to
        # parse than to run.
        columns: list[list[Any]] = [list(column) for column in zip(*rows, strict=True)]
        sql = (
            f"INSERT INTO leasecast_message ({INSERT_COLUMNS}) "
            "SELECT q, b, k, s, v, 0, e, g, p, x FROM unnest("
            "%s::bigint[], %s::text[], %s::text[], %s::smallint[], %s::float8[], "
            "%s::float8[], %s::text[], %s::smallint[], %s::float8[]"
            ") AS t(q, b, k, s, v, e, g, p, x) RETURNING id"
        )
        return sql, columns

    def ack_many(self, pairs: Sequence[tuple[int, int]], now: float) -> Statement:
        ids = [msg_id for msg_id, _ in pairs]
        tokens = [token for _, token in pairs]
        sql = (
            "DELETE FROM leasecast_message WHERE id = ANY(%s::bigint[]) AND state = 1 "
            "AND visible_at > %s AND (expires_at IS NULL OR expires_at > %s) "
            "AND (id, lease_token) IN (SELECT * FROM unnest(%s::bigint[], %s::bigint[])) "
            'RETURNING id, lease_token, queue_id, "group"'
        )
        return sql, (ids, now, now, ids, tokens)

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
POSTGRESQL: Dialect = _Postgres()
