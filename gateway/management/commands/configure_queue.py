"""``manage.py configure_queue NAME``: create a queue or change its stored settings."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from gateway.conf import gateway_settings
from gateway.core.errors import ProtocolError
from gateway.core.leases import OVERFLOW_POLICIES, QueueSettings
from gateway.core.protocol import check_name
from gateway.models import Queue

#: Command-line option (dest) for each stored setting.
_OPTIONS = (
    "visibility_timeout",
    "max_deliveries",
    "dedup_window",
    "max_length",
    "overflow",
    "paused",
    "max_in_flight",
    "rate_limit",
    "rate_burst",
)


class Command(BaseCommand):
    help = "Create a queue or change its settings (they apply within GATEWAY_QUEUE_SETTINGS_TTL)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--visibility-timeout", type=float, help="seconds a lease lasts")
        parser.add_argument("--max-deliveries", type=int, help="0 is unlimited")
        parser.add_argument("--dedup-window", type=float, help="seconds a key is remembered")
        parser.add_argument(
            "--max-length", type=int, help="most messages visible or delayed; 0 is unlimited"
        )
        parser.add_argument(
            "--overflow",
            choices=OVERFLOW_POLICIES,
            help="what an enqueue into a full queue does (default drop_newest)",
        )
        pause = parser.add_mutually_exclusive_group()
        pause.add_argument(
            "--pause",
            dest="paused",
            action="store_const",
            const=True,
            help="lease nothing until resumed (enqueues, acks and nacks go on)",
        )
        pause.add_argument(
            "--resume", dest="paused", action="store_const", const=False, help="lease again"
        )
        parser.add_argument(
            "--max-in-flight",
            type=int,
            help="most messages leased at once, over every process; 0 is unlimited",
        )
        parser.add_argument(
            "--rate-limit", type=float, help="leases per second, over every process; 0 is none"
        )
        burst = parser.add_mutually_exclusive_group()
        burst.add_argument(
            "--rate-burst", type=int, help="most leases at once from a full token bucket (>= 1)"
        )
        burst.add_argument(
            "--default-rate-burst",
            dest="rate_burst",
            action="store_const",
            const="default",
            help="the bucket's size back to max(1, ceil(rate_limit))",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        changes = {name: options[name] for name in _OPTIONS if options[name] is not None}
        if changes.get("rate_burst") == "default":
            changes["rate_burst"] = None
        try:
            name = check_name(options["name"])
            # Checked before anything is written, with the same rules as PATCH.
            gateway_settings().default_queue.changed(changes)
        except ProtocolError as exc:
            raise CommandError(exc.detail) from exc
        defaults = gateway_settings().default_queue
        queue, _ = Queue.objects.get_or_create(name=name, defaults=_row(defaults))
        current = QueueSettings(
            queue.visibility_timeout,
            queue.max_deliveries,
            queue.dedup_window,
            queue.max_length,
            queue.overflow,  # type: ignore[arg-type]
            paused=queue.paused,
            max_in_flight=queue.max_in_flight,
            rate_limit=queue.rate_limit,
            rate_burst=queue.rate_burst,
        )
        for field, value in _row(current.changed(changes)).items():
            setattr(queue, field, value)
        # Only the settings: the token bucket's columns belong to the lease
        # transactions, which may have written them since this row was read.
        queue.save(update_fields=list(_OPTIONS))
        self.stdout.write(
            f"{queue.name}: " + " ".join(f"{field}={getattr(queue, field)}" for field in _OPTIONS)
        )


def _row(settings: QueueSettings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in _OPTIONS}
