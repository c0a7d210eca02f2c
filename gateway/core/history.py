"""Topic offsets, history and resume: the rules, without I/O.

Protocol 1.1, "Topics: history, offsets and resume". Every publish to a topic
gets the next **offset** (one sequence per topic across the deployment), and
the topic has an **epoch** that changes whenever the offsets restart. A topic
keeps its last ``history_size`` messages, each for ``history_ttl`` seconds.

This module decides; the history storage (``gateway.topiclog``: in process,
or Redis Streams) and the broadcaster act. Everything here is pure: the
clock is an argument, so the unit tests drive every rule with exact times.

A stored history may hold more than the settings keep (Redis trims
approximately, and a setting may have just been lowered): :func:`kept` is
the one rule for what counts as history, applied on every read.
"""

from __future__ import annotations

import secrets
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from gateway.core.errors import BadFrame, Invalid

__all__ = [
    "DEFAULT_TOPIC_SETTINGS",
    "MAX_HISTORY_SIZE",
    "MAX_HISTORY_TTL",
    "Entry",
    "Head",
    "History",
    "Resume",
    "Sequencer",
    "TopicSettings",
    "kept",
    "new_epoch",
    "plan_latest",
    "plan_resume",
]

#: Most messages a topic may keep (memory: history lives in RAM, here or in Redis).
MAX_HISTORY_SIZE = 1_000_000
#: Longest a message may be kept (seconds): 30 days.
MAX_HISTORY_TTL = 30 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """A topic's stored settings; the defaults are the protocol's (no history)."""

    #: messages kept for resume and ``GET .../history``; 0 keeps none
    history_size: int = 0
    #: seconds a message stays in the history
    history_ttl: float = 300.0
    #: its subscriptions are members of its presence (docs/protocol.md, "Presence")
    presence: bool = False

    def changed(self, changes: dict[str, object]) -> TopicSettings:
        """These settings with ``changes`` applied, every value checked.

        Args:
            changes: setting name to new value, as decoded from a
                ``PATCH /api/topics/TOPIC`` body.

        Raises:
            BadFrame: a value of the wrong JSON type.
            Invalid: an unknown setting (the detail lists the known ones).
            Invalid: a value out of range; nothing is changed.
        """
        values: dict[str, object] = {}
        for name, value in changes.items():
            if name == "history_size":
                values[name] = _check_size(value)
            elif name == "history_ttl":
                values[name] = _check_ttl(value)
            elif name == "presence":
                if not isinstance(value, bool):
                    raise BadFrame("presence must be true or false")
                values[name] = value
            else:
                raise Invalid(
                    f"unknown topic setting {name[:40]!r}; "
                    "known: history_size, history_ttl, presence"
                )
        return replace(self, **values)  # type: ignore[arg-type]

    def as_json(self) -> dict[str, object]:
        """The settings as they appear in a topic's document."""
        return {
            "history_size": self.history_size,
            "history_ttl": self.history_ttl,
            "presence": self.presence,
        }


DEFAULT_TOPIC_SETTINGS = TopicSettings()


def _number(name: str, value: object) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise BadFrame(f"{name} must be a number")
    if value != value or value in (float("inf"), float("-inf")):
        raise Invalid(f"{name} must be finite")
    return float(value)


def _check_size(value: object) -> int:
    number = _number("history_size", value)
    if number != int(number) or not 0 <= number <= MAX_HISTORY_SIZE:
        raise Invalid(f"history_size must be a whole number 0..{MAX_HISTORY_SIZE}")
    return int(number)


def _check_ttl(value: object) -> float:
    number = _number("history_ttl", value)
    if not 0 < number <= MAX_HISTORY_TTL:
        raise Invalid(f"history_ttl must be > 0 and <= {MAX_HISTORY_TTL:.0f} seconds")
    return number


def new_epoch() -> str:
    """A fresh epoch: opaque, and never equal to an earlier one in practice."""
    return secrets.token_hex(6)


@dataclass(frozen=True, slots=True)
class Entry:
    """One published message as the history holds it."""

    offset: int
    body: bytes
    #: Unix time it was published
    at: float


@dataclass(frozen=True, slots=True)
class Head:
    """Where a topic's stream is: its epoch and latest offset (0: nothing published yet)."""

    epoch: str
    offset: int


def kept(entry: Entry, latest: int, settings: TopicSettings, now: float) -> bool:
    """True if ``entry`` is part of the history: among the last ``history_size``
    offsets, and younger than ``history_ttl``."""
    return entry.offset > latest - settings.history_size and entry.at > now - settings.history_ttl


@dataclass(frozen=True, slots=True)
class Resume:
    """What a subscriber that asked to resume gets.

    Attributes:
        recovered: the ``subscribed`` frame's ``recovered``.
        after: replay every message with a greater offset (up to the live
            stream), or None to replay nothing.
    """

    recovered: bool
    after: int | None


def plan_resume(
    *,
    since: int,
    epoch: str,
    head: Head,
    first_missed: Entry | None,
    settings: TopicSettings,
    now: float,
) -> Resume:
    """Decide a ``since=OFFSET&epoch=EPOCH`` subscription.

    Args:
        since: the last offset the subscriber had.
        epoch: the epoch it had it in.
        head: the topic's position now.
        first_missed: the stored entry at offset ``since + 1``, if the history
            storage has it (None when it has not, or ``since`` is the latest).
        settings: the topic's settings.
        now: the current time.
    """
    if epoch != head.epoch or since > head.offset:
        # Another stream, or a position this stream never reached: nothing
        # the subscriber missed can be named, so nothing is replayed.
        return Resume(False, None)
    if since == head.offset:
        return Resume(True, since)  # nothing missed
    if first_missed is None or first_missed.offset != since + 1:
        return Resume(False, None)
    if not kept(first_missed, head.offset, settings, now):
        return Resume(False, None)
    # The history keeps offsets contiguously from its oldest to the latest,
    # so the first missed message kept means every later one is kept too.
    return Resume(True, since)


def plan_latest(*, head: Head, latest: Entry | None, settings: TopicSettings, now: float) -> Resume:
    """Decide a ``recover=latest`` (cache mode) subscription: the latest message, if kept."""
    if latest is None or latest.offset != head.offset or head.offset == 0:
        return Resume(False, None)
    if not kept(latest, head.offset, settings, now):
        return Resume(False, None)
    return Resume(True, head.offset - 1)


class History:
    """The kept messages of one topic, in process (the embedded default).

    Args:
        clock: the current time in seconds.
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._entries: deque[Entry] = deque()

    def __len__(self) -> int:
        return len(self._entries)

    def append(self, entries: Iterable[Entry], settings: TopicSettings) -> None:
        """Keep ``entries`` (in offset order, after every entry held) and trim."""
        if settings.history_size == 0:
            self._entries.clear()
            return
        self._entries.extend(entries)
        self.trim(settings)

    def trim(self, settings: TopicSettings) -> None:
        """Let go of what the settings no longer keep."""
        entries = self._entries
        while len(entries) > settings.history_size:
            entries.popleft()
        cutoff = self._clock() - settings.history_ttl
        while entries and entries[0].at <= cutoff:
            entries.popleft()

    def entry(self, offset: int) -> Entry | None:
        """The entry at ``offset``, if held."""
        entries = self._entries
        if not entries:
            return None
        index = offset - entries[0].offset
        if 0 <= index < len(entries):
            return entries[index]
        return None

    def latest(self) -> Entry | None:
        """The newest entry held."""
        return self._entries[-1] if self._entries else None

    def after(
        self, offset: int, limit: int, *, latest: int, settings: TopicSettings
    ) -> list[Entry]:
        """Up to ``limit`` kept entries with offsets greater than ``offset``, oldest first."""
        entries = self._entries
        if not entries:
            return []
        start = max(0, offset + 1 - entries[0].offset)
        now = self._clock()
        out: list[Entry] = []
        for index in range(start, len(entries)):
            entry = entries[index]
            if kept(entry, latest, settings, now):
                out.append(entry)
                if len(out) >= limit:
                    break
        return out


class Sequencer:
    """Offsets and epochs of every topic of one process (the embedded default).

    Without Redis the process is the deployment, so its counters are the
    sequence. A topic this process forgets (idle, see the broadcaster) starts a
    new epoch when it is next used.

    Args:
        make_epoch: the source of fresh epochs.
    """

    def __init__(self, make_epoch: Callable[[], str] = new_epoch) -> None:
        self._make_epoch = make_epoch
        self._heads: dict[str, Head] = {}

    def head(self, topic: str) -> Head:
        """The topic's position, creating its epoch on first use."""
        head = self._heads.get(topic)
        if head is None:
            head = self._heads[topic] = Head(self._make_epoch(), 0)
        return head

    def advance(self, topic: str, n: int) -> Head:
        """Take ``n`` offsets; returns the head before them (the first is ``offset + 1``)."""
        before = self.head(topic)
        self._heads[topic] = Head(before.epoch, before.offset + n)
        return before

    def forget(self, topic: str) -> None:
        """Drop the topic's position: its next use starts a new epoch."""
        self._heads.pop(topic, None)

    def known(self, topic: str) -> bool:
        """True if the topic has a position here."""
        return topic in self._heads
