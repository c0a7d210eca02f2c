"""When a schedule ticks (protocol 1.2: Schedules). Pure: times in, times out.

A schedule ticks either ``every`` N seconds, aligned on multiples of N since
the Unix epoch, or at the wall-clock times of a five-field ``cron``
expression in an IANA timezone. Cron expressions are parsed and matched by
cronsim; this module decides what a wall-clock time means in the zone:

- a wall time that a daylight-saving change skips (02:30 on the night the
  clocks go forward) does not tick;
- a wall time that a change repeats (02:30 on the night they go back) ticks
  once, at its first occurrence.

(cronsim alone follows Debian cron: it moves a skipped fixed-time job to the
end of the gap, and repeats wildcard minutes in a repeated hour. So it is fed
naive wall times here, and the zone is applied afterwards.)

Every function takes and returns Unix seconds. :class:`TickRule` is what the
store keeps and the firing loop asks:

- :meth:`TickRule.next_after` ``(t)``: the first tick strictly after ``t``;
- :meth:`TickRule.latest_at` ``(t)``: the most recent tick at or before
  ``t``;
- :func:`due_tick`: the tick a process should fire now, if any (catch-up
  fires only the most recent: ticks missed while no gateway ran are not
  replayed one by one; ticks a running process was late for are).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from gateway.core.errors import Invalid

__all__ = [
    "MAX_EVERY",
    "TickRule",
    "due_tick",
    "parse_tick_rule",
    "tick_label",
]

#: Longest ``every`` accepted: one year, in seconds (as a message's delay).
MAX_EVERY = 365 * 24 * 3600.0
#: Longest cron expression accepted (a generous bound; real ones are short).
_MAX_CRON_LENGTH = 200
#: The characters of a five-field crontab: numbers, names, ``*``, ``,``, ``-``, ``/``.
_CRON_CHARS = re.compile(r"[0-9A-Za-z*,/\- ]+")
#: More than any daylight-saving change repeats (30 min to 2 h in the IANA data).
_PAST_REPETITION = timedelta(hours=3)
#: How far a cron rule looks for its next or previous tick before it says
#: there is none (cronsim gives up after 50 years too).
_HORIZON_YEARS = 50


@dataclass(frozen=True, slots=True)
class TickRule:
    """A validated tick rule: exactly one of ``cron`` and ``every``.

    Build it with :func:`parse_tick_rule`, which checks the values.
    """

    cron: str | None
    every: float | None
    timezone: str = "UTC"

    def next_after(self, t: float) -> float | None:
        """The first tick strictly after ``t``; None if there is none (50 years)."""
        if self.every is not None:
            return (math.floor(t / self.every) + 1) * self.every
        assert self.cron is not None
        zone = _zone(self.timezone)
        # Cron ticks fall on whole seconds: from the whole second at or before
        # ``t`` (a float a hair below a second would round up to it).
        wall = _wall(math.floor(t), zone)
        try:
            for candidate in CronSim(self.cron, wall):
                at = _instant(candidate, zone)
                if at is not None and at > t:
                    return at
                if candidate.year > wall.year + _HORIZON_YEARS:
                    return None
        except (StopIteration, OverflowError, ValueError):
            return None
        return None

    def latest_at(self, t: float) -> float | None:
        """The most recent tick at or before ``t``; None if there is none (50 years)."""
        if self.every is not None:
            return math.floor(t / self.every) * self.every
        assert self.cron is not None
        zone = _zone(self.timezone)
        second = math.floor(t)  # cron ticks fall on whole seconds
        wall = _wall(second, zone)
        # cronsim's reverse iteration starts below the time it is given:
        # from the next whole second, so that ``t`` itself may be the tick.
        start = wall + timedelta(seconds=1)
        if _instant(wall, zone) != second:
            # ``t`` is in the second pass of a repeated hour: the wall times
            # after its own, up to the end of the first pass, ticked before
            # it. Start past the repetition; later candidates are skipped.
            start += _PAST_REPETITION
        try:
            for candidate in CronSim(self.cron, start, reverse=True):
                at = _instant(candidate, zone)
                if at is not None and at <= t:
                    return at
                if candidate.year < wall.year - _HORIZON_YEARS:
                    return None
        except (StopIteration, OverflowError, ValueError):
            return None
        return None


def due_tick(
    rule: TickRule,
    now: float,
    *,
    last_tick: float | None,
    since: float,
    running_since: float | None = None,
) -> float | None:
    """The tick to fire at ``now``, or None.

    Only ticks later than ``last_tick`` and not before ``since`` (when the
    schedule was created, enabled or given a new rule: ticks before that are
    not its own) count.

    Without ``running_since`` this is the most recent such tick. With it (the
    time the asking process's loop started), ticks are told apart by whether
    a process ran when they passed:

    - of the ticks before ``running_since`` (downtime, as far as this process
      knows), only the most recent is fired: the ones before it are skipped
      (protocol 1.2: Schedules);
    - every tick from ``running_since`` on is fired, oldest first, one a call:
      a loop that fell behind (a stalled or starved process) catches up tick
      by tick instead of skipping the ones it was late for.
    """
    latest = rule.latest_at(now)
    if latest is None or latest < since:
        return None
    if last_tick is not None and latest <= last_tick:
        return None
    if running_since is None or running_since >= latest:
        return latest
    before = rule.latest_at(running_since)
    if before is not None and before >= since and (last_tick is None or before > last_tick):
        return before  # the one catch-up tick for the time before this process ran
    floor = since if last_tick is None else max(since, last_tick)
    first = floor if last_tick is None and rule.latest_at(floor) == floor else None
    if first is None:
        first = rule.next_after(floor)
    return first if first is not None and first <= latest else latest


def parse_tick_rule(
    cron: object = None, every: object = None, timezone: object = "UTC", *, now: float
) -> TickRule:
    """Check a schedule's ``cron`` / ``every`` / ``timezone`` and return its rule.

    Args:
        now: the current time: a cron expression must have a tick within 50
            years of it (``0 0 30 2 *`` never ticks).

    Raises:
        Invalid: both or neither of ``cron`` and ``every``; ``every`` not a
            number >= 1; ``cron`` not five valid fields, or never ticking;
            ``timezone`` not an IANA name.
    """
    if timezone is None:
        timezone = "UTC"
    if not isinstance(timezone, str) or not timezone:
        raise Invalid("timezone must be an IANA timezone name such as 'Europe/Berlin'")
    try:
        _zone(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise Invalid(f"unknown timezone {timezone[:60]!r} (an IANA name, e.g. 'UTC')") from exc
    if (cron is None) == (every is None):
        raise Invalid("give exactly one of 'cron' (a crontab expression) and 'every' (seconds)")
    if every is not None:
        if not isinstance(every, int | float) or isinstance(every, bool):
            raise Invalid("every must be a number of seconds")
        if not math.isfinite(every) or not 1 <= every <= MAX_EVERY:
            raise Invalid(f"every must be >= 1 and <= {MAX_EVERY:.0f} seconds")
        return TickRule(None, float(every), timezone)
    if not isinstance(cron, str):
        raise Invalid("cron must be a string: five fields, e.g. '0 3 * * *'")
    expression = " ".join(cron.split())
    if len(cron) > _MAX_CRON_LENGTH or not _CRON_CHARS.fullmatch(expression or "-"):
        raise Invalid(f"cron {cron[:60]!r} is not a crontab expression")
    if len(expression.split()) != 5:
        raise Invalid(
            f"cron {cron[:60]!r} must have five fields: minute, hour, day of month, month, "
            "day of week"
        )
    try:
        CronSim(expression, datetime(2000, 1, 1))
    except (CronSimError, ValueError, IndexError, KeyError) as exc:
        raise Invalid(f"cron {cron[:60]!r} is not a valid crontab expression: {exc}") from exc
    rule = TickRule(expression, None, timezone)
    if rule.next_after(now) is None:
        raise Invalid(f"cron {cron[:60]!r} never ticks")
    return rule


def tick_label(tick: float) -> str:
    """A tick as the protocol writes it: ISO 8601 in UTC with ``Z``
    (``2026-11-26T03:00:00Z``; milliseconds only for a tick between seconds)."""
    moment = datetime.fromtimestamp(tick, UTC)
    if moment.microsecond:
        text = moment.isoformat(timespec="milliseconds")
    else:
        text = moment.isoformat(timespec="seconds")
    return text.removesuffix("+00:00") + "Z"


def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _wall(t: float, zone: ZoneInfo) -> datetime:
    """The naive wall-clock time in ``zone`` at Unix time ``t``."""
    return datetime.fromtimestamp(t, UTC).astimezone(zone).replace(tzinfo=None)


def _instant(wall: datetime, zone: ZoneInfo) -> float | None:
    """The Unix time of naive wall time ``wall`` in ``zone``: its first occurrence
    if the zone repeats it, None if the zone skips it."""
    aware = wall.replace(tzinfo=zone, fold=0)
    if aware.astimezone(UTC).astimezone(zone).replace(tzinfo=None) != wall:
        return None  # in a gap: this wall time does not exist in the zone that day
    return aware.timestamp()
