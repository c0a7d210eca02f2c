"""Schedules' rows and ticks (protocol 1.2: Schedules), on both dialects.

A tick is fired by whichever gateway process gets there first, with no
leader (design decision 16). :func:`fire` does it in one transaction:

1. a compare-and-set moves the schedule's ``last_tick`` forward to the tick
   (``WHERE last_tick < TICK``): of the processes trying the same tick, one
   changes the row and the others change nothing (on PostgreSQL they wait
   on the row lock, then find it moved; SQLite runs one writer at a time);
2. the winner enqueues the message with the idempotency key
   ``schedule:NAME:TICK``, and counts it in ``fired`` unless the key was a
   duplicate.

Both in the same transaction, so exactly one message per tick holds even
after the queue's dedup window has forgotten the key: ``last_tick`` never
moves back, and a tick is never fired twice.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from gateway.core.errors import ProtocolError, QueueFull
from gateway.core.protocol import EnqueueSpec
from gateway.core.schedule_ticks import TickRule
from gateway.core.schedules import ScheduleRow, ScheduleSpec, tick_key
from gateway.store.enqueue import enqueue, insert
from gateway.store.txn import SavepointLost, Txn

__all__ = [
    "FireOutcome",
    "ManagedTask",
    "all_schedules",
    "delete_schedule",
    "fire",
    "fire_many",
    "get_schedule",
    "put_schedule",
    "sync_managed",
]

log = logging.getLogger("leasecast.schedules")

#: What :func:`fire` did with a tick: enqueued it; found its key a duplicate
#: (no message, not counted); found it fired already (another process);
#: refused it (a full queue that does not wait, or waited long enough); or
#: left it for a later try (a full ``block`` queue; or, from
#: :func:`fire_many`, ``failed``: an error, logged, its writes undone).
FireOutcome = Literal["fired", "duplicate", "taken", "refused", "waiting", "failed"]

_COLUMNS = (
    'id, name, queue, body, cron, every, timezone, enabled, "group", priority, ttl, '
    "last_tick, fired, active_since, managed, task_backend"
)


def _row(found: Sequence[Any]) -> ScheduleRow:
    (
        row_id,
        name,
        queue,
        body,
        cron,
        every,
        timezone,
        enabled,
        group,
        priority,
        ttl,
        last_tick,
        fired,
        active_since,
        managed,
        task_backend,
    ) = found
    spec = ScheduleSpec(
        queue=queue,
        body_json=body,
        rule=TickRule(cron, every, timezone),
        enabled=bool(enabled),
        group=group,
        priority=priority,
        ttl=ttl,
    )
    return ScheduleRow(
        row_id, name, spec, last_tick, fired, active_since, bool(managed), task_backend
    )


def get_schedule(txn: Txn, name: str) -> ScheduleRow | None:
    """The schedule ``name``, or None."""
    found = txn.exec(
        f"SELECT {_COLUMNS} FROM leasecast_schedule WHERE name = %s", (name,)
    ).fetchone()
    return None if found is None else _row(found)


def all_schedules(txn: Txn, *, enabled_only: bool = False) -> list[ScheduleRow]:
    """Every schedule (or every enabled one), by name."""
    where = "WHERE enabled = %s " if enabled_only else ""
    params = (True,) if enabled_only else ()
    rows = txn.exec(
        f"SELECT {_COLUMNS} FROM leasecast_schedule {where}ORDER BY name", params
    ).fetchall()
    return [_row(found) for found in rows]


def put_schedule(
    txn: Txn,
    name: str,
    spec: ScheduleSpec,
    *,
    managed: bool = False,
    task_backend: str | None = None,
) -> ScheduleRow:
    """Create or replace schedule ``name``; returns the stored row.

    A replaced schedule keeps ``last_tick`` and ``fired``. If its rule
    changed, or it was disabled and is enabled now, it starts afresh: ticks
    before now are not its own (it fires the next one, not a past one).
    """
    now = txn.now
    old = get_schedule(txn, name)
    values = (
        spec.queue,
        spec.body_json,
        spec.rule.cron,
        spec.rule.every,
        spec.rule.timezone,
        spec.enabled,
        spec.group,
        spec.priority,
        spec.ttl,
        managed,
        task_backend,
    )
    if old is None:
        txn.exec(
            'INSERT INTO leasecast_schedule (queue, body, cron, every, timezone, enabled, "group", '
            "priority, ttl, managed, task_backend, name, fired, active_since, created_at, "
            "updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 0, %s, %s, %s)",
            (*values, name, now, now, now),
        )
    else:
        restarted = old.spec.rule != spec.rule or (spec.enabled and not old.spec.enabled)
        txn.exec(
            "UPDATE leasecast_schedule SET queue = %s, body = %s, cron = %s, every = %s, "
            'timezone = %s, enabled = %s, "group" = %s, priority = %s, ttl = %s, managed = %s, '
            "task_backend = %s, active_since = %s, updated_at = %s WHERE id = %s",
            (*values, now if restarted else old.active_since, now, old.id),
        )
    row = get_schedule(txn, name)
    assert row is not None
    return row


def delete_schedule(txn: Txn, name: str) -> bool:
    """Delete schedule ``name``; False if there was none."""
    deleted: int = txn.exec("DELETE FROM leasecast_schedule WHERE name = %s", (name,)).rowcount
    return deleted > 0


def fire(txn: Txn, row: ScheduleRow, tick: float, *, may_wait: bool = False) -> FireOutcome:
    """Fire ``row``'s tick at ``tick`` (see the module docstring), in ``txn``.

    Args:
        may_wait: if the queue is full and its overflow is ``block``, leave the
            tick for a later try (``waiting``) instead of refusing it.
    """
    try:
        with txn.savepoint():
            if not _take(txn, row, tick):
                return "taken"
            spec = row.spec
            body, result_id = _body(row)
            message = EnqueueSpec(
                body.encode(),
                key=tick_key(row.name, tick),
                group=spec.group,
                priority=spec.priority,
                ttl=spec.ttl,
            )
            (result,) = enqueue(txn, spec.queue, [message])
            if result.duplicate:
                return "duplicate"
            txn.exec("UPDATE leasecast_schedule SET fired = fired + 1 WHERE id = %s", (row.id,))
            if result_id is not None:
                _record_task(txn, row, result_id, body, int(result.id))
            return "fired"
    except QueueFull as full:
        if full.may_wait and may_wait:
            return "waiting"
        # The queue's overflow rule refused the message: the tick is over,
        # without a message, and said so (never silently).
        log.warning("schedule %r: tick %s refused: %s", row.name, tick, full.detail)
        return "refused" if _take(txn, row, tick) else "taken"
    except ProtocolError as refused:  # e.g. the queue name: refused, the tick is over
        log.warning("schedule %r: tick %s refused: %s", row.name, tick, refused.detail)
        return "refused" if _take(txn, row, tick) else "taken"


#: Ticks fired by one statement of :func:`fire_many` (bounds its parameters).
_CHUNK = 400


def fire_many(
    txn: Txn, due: Sequence[tuple[ScheduleRow, float]], *, block_wait: float
) -> dict[str, FireOutcome]:
    """Fire many schedules' due ticks in ``txn``; returns each one's outcome by name.

    The same rules as :func:`fire`, in a few statements per queue rather than
    several per tick (a process with a thousand schedules every second would
    otherwise spend its second in round trips): the ticks of plain schedules
    into a queue without ``max_length`` are taken with one compare-and-set,
    their keys claimed with one upsert, their messages inserted with one
    statement. Task schedules and bounded queues (whose overflow rule acts
    per message) fire one by one, and so does a group whose batch failed, so
    that one bad schedule fails alone.

    Args:
        block_wait: a tick into a full ``block`` queue is tried again (left
            ``waiting``) until this many seconds after it.
    """
    outcomes: dict[str, FireOutcome] = {}
    batches: dict[str, list[tuple[ScheduleRow, float]]] = {}
    alone: list[tuple[ScheduleRow, float]] = []
    for row, tick in due:
        q = txn.queue(row.spec.queue, create=True)
        if row.task_backend is None and not q.settings.max_length:
            batches.setdefault(q.name, []).append((row, tick))
        else:
            alone.append((row, tick))
    for queue, items in sorted(batches.items()):
        for start in range(0, len(items), _CHUNK):
            chunk = items[start : start + _CHUNK]
            try:
                with txn.savepoint(catch=Exception):
                    outcomes.update(_fire_batch(txn, queue, chunk))
            except SavepointLost:
                raise
            except Exception as exc:
                log.warning("schedules: a batch into %r failed (%s), one by one", queue, exc)
                alone += chunk
    for row, tick in alone:
        try:
            with txn.savepoint(catch=Exception):
                outcomes[row.name] = fire(txn, row, tick, may_wait=txn.now < tick + block_wait)
        except SavepointLost:
            raise
        except Exception as exc:  # one schedule that cannot fire must not stop the others
            log.warning("schedules: %r could not fire (%s: %s)", row.name, type(exc).__name__, exc)
            outcomes[row.name] = "failed"
    return outcomes


def _fire_batch(
    txn: Txn, queue: str, items: Sequence[tuple[ScheduleRow, float]]
) -> dict[str, FireOutcome]:
    """:func:`fire` for plain schedules into unbounded queue ``queue``, together."""
    outcomes: dict[str, FireOutcome] = {}
    cases = " ".join(["WHEN %s THEN %s"] * len(items))
    ticks: list[Any] = []
    for row, tick in items:
        ticks += [row.id, tick]
    ids = ",".join(["%s"] * len(items))
    taken = {
        found[0]
        for found in txn.exec(
            f"UPDATE leasecast_schedule SET last_tick = CASE id {cases} END "
            f"WHERE id IN ({ids}) AND enabled = %s "
            f"AND (last_tick IS NULL OR last_tick < CASE id {cases} END) RETURNING id",
            (*ticks, *(row.id for row, _ in items), True, *ticks),
        ).fetchall()
    }
    mine = [(row, tick) for row, tick in items if row.id in taken]
    for row, _ in items:
        if row.id not in taken:
            outcomes[row.name] = "taken"
    if not mine:
        return outcomes
    q = txn.queue(queue, create=True)
    now = txn.now
    keys = {tick_key(row.name, tick): (row, tick) for row, tick in mine}
    values: list[Any] = []
    for key in keys:
        values += [q.id, key, now + q.settings.dedup_window]
    # Claim the keys first, as every keyed enqueue does (gateway.store.enqueue):
    # new or expired ones are taken; a live one is a duplicate.
    claimed = {
        found[0]
        for found in txn.exec(
            'INSERT INTO leasecast_dedup (queue_id, "key", msg_id, expires_at) VALUES '
            + ",".join(["(%s, %s, 0, %s)"] * len(keys))
            + ' ON CONFLICT (queue_id, "key") DO UPDATE '
            "SET msg_id = 0, expires_at = excluded.expires_at "
            'WHERE leasecast_dedup.expires_at <= %s RETURNING "key"',
            (*values, now),
        ).fetchall()
    }
    fresh = [key for key in keys if key in claimed]
    for key, (row, _) in keys.items():
        outcomes[row.name] = "fired" if key in claimed else "duplicate"
    if not fresh:
        return outcomes
    specs = []
    for key in fresh:
        spec = keys[key][0].spec
        message = EnqueueSpec(
            spec.body_json.encode(), key=key, group=spec.group, priority=spec.priority, ttl=spec.ttl
        )
        specs.append((q, message))
    msg_ids = insert(txn, specs)
    pairs: list[Any] = []
    for key, msg_id in zip(fresh, msg_ids, strict=True):
        pairs += [key, msg_id]
    marks = ",".join(["%s"] * len(fresh))
    txn.exec(
        'UPDATE leasecast_dedup SET msg_id = CASE "key" '
        + " ".join(["WHEN %s THEN %s"] * len(fresh))
        + f' END WHERE queue_id = %s AND "key" IN ({marks})',
        (*pairs, q.id, *fresh),
    )
    fired_ids = [keys[key][0].id for key in fresh]
    txn.exec(
        "UPDATE leasecast_schedule SET fired = fired + 1 WHERE id IN ("
        + ",".join(["%s"] * len(fired_ids))
        + ")",
        fired_ids,
    )
    return outcomes


def _take(txn: Txn, row: ScheduleRow, tick: float) -> bool:
    """Move ``last_tick`` to ``tick`` if no process has fired it (or a later one)."""
    took: int = txn.exec(
        "UPDATE leasecast_schedule SET last_tick = %s WHERE id = %s AND enabled = %s "
        "AND (last_tick IS NULL OR last_tick < %s)",
        (tick, row.id, True, tick),
    ).rowcount
    return took == 1


def _body(row: ScheduleRow) -> tuple[str, str | None]:
    """The message body of one tick, and the task result id for a task schedule."""
    if row.task_backend is None:
        return row.spec.body_json, None
    template = orjson.loads(row.spec.body_json)
    result_id = uuid.uuid4().hex
    # The backend's message (gateway.host.tasks.task_message), keys in its order.
    body = {
        "task": template["task"],
        "id": result_id,
        "args": template.get("args", []),
        "kwargs": template.get("kwargs", {}),
        "takes_context": template.get("takes_context", False),
    }
    return orjson.dumps(body).decode(), result_id


def _record_task(txn: Txn, row: ScheduleRow, result_id: str, body: str, message_id: int) -> None:
    """The task's result row, as the tasks backend writes it when it enqueues."""
    message = orjson.loads(body)
    json = txn.dialect.json_param
    txn.exec(
        "INSERT INTO leasecast_task (id, backend, task_path, queue, priority, args, kwargs, "
        "status, message_id, enqueued_at, errors, worker_ids) VALUES (%s, %s, %s, %s, %s, "
        f"{json}, {json}, 'READY', %s, %s, {json}, {json})",
        (
            result_id,
            row.task_backend,
            message["task"],
            row.spec.queue,
            row.spec.priority,
            orjson.dumps(message["args"]).decode(),
            orjson.dumps(message["kwargs"]).decode(),
            message_id,
            txn.now,
            "[]",
            "[]",
        ),
    )


@dataclass(frozen=True, slots=True)
class ManagedTask:
    """One ``LEASECAST_SCHEDULES`` entry, resolved: its schedule and backend."""

    spec: ScheduleSpec
    backend: str


def sync_managed(txn: Txn, entries: Mapping[str, ManagedTask]) -> tuple[int, int, int]:
    """Make the schedules kept by ``LEASECAST_SCHEDULES`` match ``entries``.

    Creates the new ones, changes those whose entry changed, deletes those
    whose entry went. Schedules made over HTTP or in the admin are left
    alone, unless an entry takes their name (the setting wins).

    Returns:
        How many were created, changed and deleted.
    """
    existing = {row.name: row for row in all_schedules(txn)}
    created = changed = deleted = 0
    for name, entry in sorted(entries.items()):
        old = existing.get(name)
        if old is None:
            created += 1
        elif old.spec == entry.spec and old.managed and old.task_backend == entry.backend:
            continue
        else:
            changed += 1
        put_schedule(txn, name, entry.spec, managed=True, task_backend=entry.backend)
    for name, row in existing.items():
        if row.managed and name not in entries:
            delete_schedule(txn, name)
            deleted += 1
    return created, changed, deleted
