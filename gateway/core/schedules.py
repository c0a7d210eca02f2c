"""Schedules as the protocol sees them (protocol 1.2: Schedules). Pure: no I/O.

- :func:`parse_schedule`: a ``PUT /api/schedules/NAME`` document, checked
  (unknown fields, types, ranges, a tick rule that can tick) into a
  :class:`ScheduleSpec`, or ``invalid`` naming the problem;
- :class:`ScheduleRow`: a schedule as stored (``gateway.store.schedules``);
- :func:`schedule_document`: the ``GET`` document of a row at a given time;
- :func:`tick_key`: the idempotency key of one tick, ``schedule:NAME:TICK``.

When a schedule ticks is ``gateway.core.schedule_ticks``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.core.errors import BadFrame, Invalid
from gateway.core.protocol import Limits, check_name, parse_enqueue_spec, unknown_fields
from gateway.core.schedule_ticks import TickRule, parse_tick_rule, tick_label

__all__ = [
    "SCHEDULE_FIELDS",
    "ScheduleRow",
    "ScheduleSpec",
    "parse_schedule",
    "schedule_document",
    "tick_key",
]

#: The fields of a schedule's settings document; any other is ``invalid``.
SCHEDULE_FIELDS = frozenset(
    {"queue", "body", "cron", "every", "timezone", "enabled", "group", "priority", "ttl"}
)


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A schedule's settings, checked: what a ``PUT`` stores."""

    queue: str
    body_json: str
    rule: TickRule
    enabled: bool = True
    group: str | None = None
    priority: int = 0
    ttl: float | None = None


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    """A stored schedule (``leasecast_schedule``)."""

    id: int
    name: str
    spec: ScheduleSpec
    #: the most recent tick fired (Unix seconds), None before the first
    last_tick: float | None
    #: messages enqueued (a tick whose key was a duplicate is not counted)
    fired: int
    #: ticks before this time are not the schedule's (created, enabled or
    #: given another rule then)
    active_since: float
    #: kept by ``LEASECAST_SCHEDULES`` (created, changed and deleted with it)
    managed: bool = False
    #: a ``LEASECAST_SCHEDULES`` task's backend alias: ``body_json`` is then
    #: the task's message without its result id
    task_backend: str | None = None


def tick_key(name: str, tick: float) -> str:
    """The idempotency key of ``name``'s tick at ``tick``: ``schedule:NAME:TICK``."""
    return f"schedule:{name}:{tick_label(tick)}"


def parse_schedule(name: object, document: object, limits: Limits, *, now: float) -> ScheduleSpec:
    """Check a schedule's name and ``PUT`` document.

    ``queue`` is required, ``body`` defaults to null; ``cron`` or ``every``
    (exactly one), ``timezone`` (default ``UTC``), ``enabled`` (default true),
    ``group``, ``priority`` and ``ttl`` as for ENQUEUE.

    Raises:
        Invalid: an unknown field, a missing or mistyped one, a value out of
            range (the detail names it).
        TooLarge: the body is over the message size limit.
    """
    check_name(name, "schedule")
    if not isinstance(document, dict):
        raise Invalid("a schedule is a JSON object")
    if document.keys() - SCHEDULE_FIELDS:
        raise unknown_fields(document, SCHEDULE_FIELDS, "schedule")
    if document.get("queue") is None:
        raise Invalid("missing field 'queue': the queue each tick enqueues to")
    try:
        queue = check_name(document["queue"], "queue")
        message = {
            field: document[field]
            for field in ("group", "priority", "ttl")
            if document.get(field) is not None
        }
        message["body"] = document.get("body")
        spec = parse_enqueue_spec(message, limits)
    except BadFrame as exc:  # a mistyped field: invalid here, as any bad value
        raise Invalid(exc.detail) from exc
    enabled = document.get("enabled", True)
    if enabled is None:
        enabled = True
    if not isinstance(enabled, bool):
        raise Invalid("field 'enabled' must be true or false")
    rule = parse_tick_rule(
        document.get("cron"), document.get("every"), document.get("timezone", "UTC"), now=now
    )
    return ScheduleSpec(
        queue=queue,
        body_json=spec.body_json.decode(),
        rule=rule,
        enabled=enabled,
        group=spec.group,
        priority=spec.priority,
        ttl=spec.ttl,
    )


def schedule_document(row: ScheduleRow, now: float) -> dict[str, Any]:
    """A schedule's ``GET`` document at time ``now``.

    ``next_tick`` is the first tick after ``now`` (null while disabled);
    ``next_tick`` and ``last_tick`` are ISO 8601 UTC with ``Z``, or null.
    """
    spec = row.spec
    every: float | int | None = spec.rule.every
    if spec.rule.every is not None and spec.rule.every.is_integer():
        every = int(spec.rule.every)  # 60, as it was given, not 60.0
    next_tick = spec.rule.next_after(now) if spec.enabled else None
    return {
        "name": row.name,
        "queue": spec.queue,
        "body": orjson.Fragment(spec.body_json),
        "cron": spec.rule.cron,
        "every": every,
        "timezone": spec.rule.timezone,
        "enabled": spec.enabled,
        "group": spec.group,
        "priority": spec.priority,
        "ttl": spec.ttl,
        "next_tick": None if next_tick is None else tick_label(next_tick),
        "last_tick": None if row.last_tick is None else tick_label(row.last_tick),
        "fired": row.fired,
    }
