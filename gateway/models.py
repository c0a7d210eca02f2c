"""Durable state: queues, messages, idempotency keys and tokens.

The hot path (``gateway.store``) reads and writes these tables with raw SQL,
in batches, on its own thread; the ORM serves the admin, the management
commands and the tests. Times are Unix seconds in float columns, so the same
SQL compares them on SQLite and PostgreSQL.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models

from gateway.core.leases import (
    DEAD_REASONS,
    DEFAULT_QUEUE_SETTINGS,
    OVERFLOW_POLICIES,
    MessageState,
    StoredState,
    observed_state,
)

_DEFAULTS = DEFAULT_QUEUE_SETTINGS
#: Queue and topic names (the protocol's: Authentication).
_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,200}")


def _check_name(name: str, what: str) -> None:
    """Refuse a name the protocol cannot address (the admin's forms call this)."""
    if _NAME_RE.fullmatch(name or "") is None:
        raise ValidationError(
            {"name": f"A {what} name is 1-200 characters of A-Z, a-z, 0-9, '.', '_' and '-'."}
        )


def _now() -> float:
    return time.time()


class Queue(models.Model):
    """A work queue and its settings (protocol: Work queue, defaults)."""

    name = models.CharField(max_length=200, unique=True)
    visibility_timeout = models.FloatField(
        default=_DEFAULTS.visibility_timeout,
        help_text="Seconds a lease lasts unless the worker asks otherwise.",
    )
    max_deliveries = models.PositiveIntegerField(
        default=_DEFAULTS.max_deliveries,
        help_text="Deliveries before a message is dead-lettered; 0 is unlimited.",
    )
    dedup_window = models.FloatField(
        default=_DEFAULTS.dedup_window,
        help_text="Seconds an idempotency key is remembered, acked or not.",
    )
    max_length = models.PositiveIntegerField(
        default=_DEFAULTS.max_length,
        help_text="Most messages visible or delayed (in flight not counted); 0 is unlimited.",
    )
    overflow = models.CharField(
        max_length=12,
        default=_DEFAULTS.overflow,
        choices=[(p, p) for p in OVERFLOW_POLICIES],
        help_text="When an enqueue would exceed max_length: refuse it (drop_newest), "
        "dead-letter the oldest (drop_oldest), or wait up to GATEWAY_BLOCK_WAIT (block).",
    )
    # Control (protocol 1.2: Pause, Concurrency and rate limits). The lease
    # statement reads these in its own transaction (gateway.store.leasing).
    # Database defaults too, so raw INSERTs that do not name them still work.
    paused = models.BooleanField(
        default=False,
        db_default=False,
        help_text="A paused queue accepts enqueues, acks and nacks but leases nothing.",
    )
    max_in_flight = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="Most messages leased at once, over every process; 0 is unlimited.",
    )
    rate_limit = models.FloatField(
        default=0.0,
        db_default=0.0,
        help_text="Leases per second over every process (token bucket); 0 is none.",
    )
    rate_burst = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Bucket size (most leases at once); empty is max(1, ceil(rate_limit)).",
    )
    #: the token bucket's state: tokens left as of ``rate_refilled_at``
    rate_tokens = models.FloatField(default=0.0, db_default=0.0, editable=False)
    rate_refilled_at = models.FloatField(default=0.0, db_default=0.0, editable=False)
    created_at = models.FloatField(default=_now)

    class Meta:
        db_table = "leasecast_queue"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Only names the protocol can use (workers, producers and scopes name them)."""
        _check_name(self.name, "queue")


class Topic(models.Model):
    """A broadcast topic's stored settings (protocol 1.1: Topics: history, offsets and resume).

    A topic needs no row to be used: one without a row has the defaults
    (no history). Offsets and epochs are not stored here; they live with the
    history (Redis, or the process), see ``gateway.topics``.
    """

    name = models.CharField(max_length=200, unique=True)
    history_size = models.PositiveIntegerField(
        default=0,
        help_text="Messages kept for resume and GET .../history; 0 keeps none.",
    )
    history_ttl = models.FloatField(
        default=300.0,
        help_text="Seconds a message stays in the history.",
    )
    presence = models.BooleanField(
        default=False,
        help_text="Its subscribers are listed by GET .../presence and told of joins and leaves.",
    )
    created_at = models.FloatField(default=_now)

    class Meta:
        db_table = "leasecast_topic"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Only names the protocol can use (subscribers, publishers and scopes name them)."""
        _check_name(self.name, "topic")


class Message(models.Model):
    """One message of a work queue. Acked messages are deleted.

    ``state`` and ``visible_at`` together give the protocol state; see the
    table in ``gateway.core.leases``.
    """

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, db_index=False)
    body = models.TextField(help_text="The body as canonical JSON text.")
    key = models.CharField(max_length=512, null=True, blank=True)
    state = models.SmallIntegerField(
        choices=[(s.value, s.name.lower()) for s in StoredState], default=StoredState.READY
    )
    visible_at = models.FloatField()
    deliveries = models.PositiveIntegerField(default=0)
    lease_token = models.BigIntegerField(null=True, blank=True)
    enqueued_at = models.FloatField(default=_now)
    group = models.CharField(max_length=200, null=True, blank=True)
    priority = models.SmallIntegerField(default=0)
    #: when the message's ``ttl`` runs out (None: never)
    expires_at = models.FloatField(null=True, blank=True)
    dead_reason = models.CharField(
        max_length=16, null=True, blank=True, choices=[(r, r) for r in DEAD_REASONS]
    )
    #: when the current (or last) lease began: an ack observes the lease's
    #: length (``leasecast_queue_lease_seconds``)
    leased_at = models.FloatField(null=True, blank=True)

    class Meta:
        db_table = "leasecast_message"
        indexes = [
            # Ready messages in delivery order: the head of the queue.
            models.Index(
                "queue",
                models.F("priority").desc(),
                "id",
                name="lc_msg_ready_prio",
                condition=models.Q(state=StoredState.READY),
            ),
            # A group's messages in enqueue order: its head and what waits
            # behind it (gateway.store.groups).
            models.Index(
                fields=["queue", "group", "id"],
                name="lc_msg_group",
                condition=models.Q(group__isnull=False),
            ),
            # Messages with a ttl still to run out, by expiry (dead-lettering
            # clears ``expires_at``, so dead messages leave this index).
            models.Index(
                fields=["queue", "expires_at"],
                name="lc_msg_expiry",
                condition=models.Q(expires_at__isnull=False),
            ),
            # Leased and delayed messages by the time they come due.
            models.Index(
                fields=["queue", "visible_at"],
                name="lc_msg_timed",
                condition=models.Q(state__in=[StoredState.LEASED, StoredState.DELAYED]),
            ),
            models.Index(
                fields=["queue", "id"],
                name="lc_msg_dead",
                condition=models.Q(state=StoredState.DEAD),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.queue_id}/{self.pk}"

    @property
    def protocol_state(self) -> MessageState:
        """The state the protocol names, as of now."""
        return observed_state(StoredState(self.state), self.visible_at, time.time())


class DedupKey(models.Model):
    """An idempotency key seen on a queue, kept for the queue's dedup window."""

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, db_index=False)
    key = models.CharField(max_length=512)
    msg_id = models.BigIntegerField()
    expires_at = models.FloatField()

    class Meta:
        db_table = "leasecast_dedup"
        constraints = [
            models.UniqueConstraint(fields=["queue", "key"], name="lc_dedup_queue_key"),
        ]
        indexes = [models.Index(fields=["expires_at"], name="lc_dedup_expiry")]


def hash_token(token: str) -> str:
    """The stored form of a token: its SHA-256 (tokens are random, so no salt is needed)."""
    return hashlib.sha256(token.encode()).hexdigest()


class Token(models.Model):
    """An API token. Only its hash is stored (protocol: Authentication)."""

    name = models.CharField(max_length=200)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "leasecast_token"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @classmethod
    def issue(
        cls, name: str, scopes: list[str], *, using: str | None = None, **extra: Any
    ) -> tuple[Token, str]:
        """Create a token (on the database alias ``using``, else the default);
        returns the row and the secret, which is shown only once."""
        secret = "lc_" + secrets.token_urlsafe(32)
        token = cls.objects.db_manager(using).create(
            name=name, token_hash=hash_token(secret), scopes=scopes, **extra
        )
        return token, secret


class StagedMessage(models.Model):
    """A message staged under a transaction (the Spark sink): invisible until committed."""

    txn = models.CharField(max_length=200)
    partition = models.IntegerField()
    position = models.IntegerField()
    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, db_index=False)
    body = models.TextField()
    key = models.CharField(max_length=512, null=True, blank=True)
    delay = models.FloatField(default=0.0)
    group = models.CharField(max_length=200, null=True, blank=True)
    priority = models.SmallIntegerField(default=0)
    ttl = models.FloatField(null=True, blank=True)
    staged_at = models.FloatField(default=_now)

    class Meta:
        db_table = "leasecast_staged"
        indexes = [
            models.Index(fields=["txn", "partition", "position"], name="lc_staged_txn"),
            models.Index(fields=["staged_at"], name="lc_staged_age"),
        ]


class Transaction(models.Model):
    """A staging transaction: open, with its owner; then committed or aborted, remembered
    so a replay changes nothing."""

    name = models.CharField(max_length=200, unique=True)
    state = models.CharField(
        max_length=10,
        choices=[("open", "open"), ("committed", "committed"), ("aborted", "aborted")],
    )
    messages = models.IntegerField(default=0)
    finished_at = models.FloatField(default=_now)  # while open: when it was opened
    #: the principal that first staged into it, the only one that may stage,
    #: commit or abort it (gateway.store.staging); null: finished before owners were kept
    owner = models.CharField(max_length=300, null=True, blank=True)

    class Meta:
        db_table = "leasecast_transaction"


class TaskRecord(models.Model):
    """A ``django.tasks`` task enqueued through :class:`gateway.tasks.LeasecastBackend`.

    The task itself travels as a queue message (``message_id``); this row is
    its result. It is written in the enqueuer's transaction, and its outcome
    in the worker's ack (or nack) transaction, so a result never disagrees
    with the queue. While the message waits or is leased the stored status
    stays READY; :meth:`gateway.tasks.LeasecastBackend.get_result` reports
    RUNNING for a task whose message is in flight.
    """

    id = models.CharField(max_length=64, primary_key=True)
    backend = models.CharField(max_length=100)
    task_path = models.CharField(max_length=400, help_text="Module path of the task function.")
    queue = models.CharField(max_length=200)
    priority = models.SmallIntegerField(default=0)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    status = models.CharField(
        max_length=12,
        default="READY",
        choices=[(s, s.lower()) for s in ("READY", "RUNNING", "FAILED", "SUCCESSFUL")],
    )
    message_id = models.BigIntegerField(null=True, blank=True)
    enqueued_at = models.FloatField(default=_now)
    run_after = models.FloatField(null=True, blank=True)
    started_at = models.FloatField(null=True, blank=True)
    finished_at = models.FloatField(null=True, blank=True)
    last_attempted_at = models.FloatField(null=True, blank=True)
    return_value = models.JSONField(null=True, blank=True)
    errors = models.JSONField(default=list, help_text="Every failed attempt's error.")
    worker_ids = models.JSONField(default=list, help_text="The worker of every attempt.")

    class Meta:
        db_table = "leasecast_task"
        indexes = [
            models.Index(fields=["message_id"], name="lc_task_message"),
            models.Index(fields=["finished_at"], name="lc_task_finished"),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} {self.id}"


class QueueCounter(models.Model):
    """A deployment-wide running total of one queue (``GET /metrics``, gateway.runtime.metrics).

    The store adds to these in the same transaction that moves the messages
    (one statement per transaction), so they count every enqueue path once,
    whichever process or connection committed it, and survive restarts.
    ``name`` is enqueued, delivered, redelivered, acked or dead_lettered;
    ``label`` is the dead reason for dead_lettered, else empty. Each
    process writes its own ``shard`` so two processes' commits do not
    queue up on one row; the total is the sum over shards.
    """

    queue = models.ForeignKey(Queue, on_delete=models.CASCADE, db_index=False)
    name = models.CharField(max_length=32)
    label = models.CharField(max_length=32, default="", blank=True)
    shard = models.PositiveSmallIntegerField(default=0)
    value = models.BigIntegerField(default=0)

    class Meta:
        db_table = "leasecast_queue_counter"
        constraints = [
            models.UniqueConstraint(
                fields=["queue", "name", "label", "shard"], name="lc_counter_key"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.queue_id} {self.name} {self.label} {self.shard}"


class Schedule(models.Model):
    """A schedule: one message to ``queue`` at every tick (protocol 1.2: Schedules).

    Exactly one of ``cron`` (five fields, wall time in ``timezone``) and
    ``every`` (seconds, aligned on the Unix epoch) is set; the rules are in
    ``gateway.core.schedule_ticks``. Every gateway process fires the ticks
    (``gateway.engine.schedules``): a tick moves ``last_tick`` forward with a
    compare-and-set in the transaction of its enqueue, so one message results
    whatever the number of processes.
    """

    name = models.CharField(max_length=200, unique=True)
    queue = models.CharField(max_length=200, help_text="The queue each tick enqueues to.")
    body = models.TextField(default="null", help_text="The message body as JSON text.")
    cron = models.CharField(
        max_length=200,
        null=True,
        blank=True,
        help_text="Five fields: minute, hour, day of month, month, day of week.",
    )
    every = models.FloatField(
        null=True, blank=True, help_text="Seconds between ticks (>= 1), aligned on the epoch."
    )
    timezone = models.CharField(
        max_length=64, default="UTC", help_text="IANA timezone of the cron expression."
    )
    enabled = models.BooleanField(default=True)
    group = models.CharField(max_length=200, null=True, blank=True)
    priority = models.SmallIntegerField(default=0)
    ttl = models.FloatField(null=True, blank=True)
    #: the most recent tick fired, Unix seconds
    last_tick = models.FloatField(null=True, blank=True, editable=False)
    #: messages enqueued by this schedule (a tick whose key was a duplicate is not counted)
    fired = models.BigIntegerField(default=0, editable=False)
    #: ticks before this time are not this schedule's: it was created, enabled
    #: or given another rule then (so it does not fire a tick that came before)
    active_since = models.FloatField(default=_now, editable=False)
    #: kept by the ``LEASECAST_SCHEDULES`` setting: changed and deleted with it
    managed = models.BooleanField(default=False, editable=False)
    #: for a ``LEASECAST_SCHEDULES`` task: the tasks backend alias; ``body`` is
    #: then the task's message without its result id, made at each tick
    task_backend = models.CharField(max_length=100, null=True, blank=True, editable=False)
    created_at = models.FloatField(default=_now, editable=False)
    updated_at = models.FloatField(default=_now, editable=False)

    class Meta:
        db_table = "leasecast_schedule"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """Only names the protocol can use (URLs and idempotency keys carry them)."""
        _check_name(self.name, "schedule")
