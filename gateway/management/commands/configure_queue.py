"""``manage.py configure_queue NAME``: create a queue or change its stored settings."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from gateway.conf import gateway_settings
from gateway.errors import ProtocolError
from gateway.models import Queue
from gateway.protocol import MAX_TIMEOUT, check_name


class Command(BaseCommand):
    help = "Create a queue or change its settings (they apply within GATEWAY_QUEUE_SETTINGS_TTL)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--visibility-timeout", type=float)
        parser.add_argument("--max-deliveries", type=int)
        parser.add_argument("--dedup-window", type=float)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            name = check_name(options["name"])
        except ProtocolError as exc:
            raise CommandError(exc.detail) from exc
        timeout, max_deliveries, window = (
            options["visibility_timeout"],
            options["max_deliveries"],
            options["dedup_window"],
        )
        if timeout is not None and not 0 < timeout <= MAX_TIMEOUT:
            raise CommandError(f"--visibility-timeout must be > 0 and <= {MAX_TIMEOUT:.0f}")
        if max_deliveries is not None and max_deliveries < 0:
            raise CommandError("--max-deliveries must be >= 0 (0 is unlimited)")
        if window is not None and window < 0:
            raise CommandError("--dedup-window must be >= 0")
        defaults = gateway_settings().default_queue
        queue, _ = Queue.objects.get_or_create(
            name=name,
            defaults={
                "visibility_timeout": defaults.visibility_timeout,
                "max_deliveries": defaults.max_deliveries,
                "dedup_window": defaults.dedup_window,
            },
        )
        if timeout is not None:
            queue.visibility_timeout = timeout
        if max_deliveries is not None:
            queue.max_deliveries = max_deliveries
        if window is not None:
            queue.dedup_window = window
        queue.save()
        self.stdout.write(
            f"{queue.name}: visibility_timeout={queue.visibility_timeout} "
            f"max_deliveries={queue.max_deliveries} dedup_window={queue.dedup_window}"
        )
