"""``manage.py sync_schedules``: make the stored schedules match ``LEASECAST_SCHEDULES``.

Every gateway process does this when it starts; the command does it now
(after a deploy that changed the setting, before the gateways restart).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from gateway.host.schedule_settings import sync_schedules


class Command(BaseCommand):
    help = "Create, change and delete the schedules kept by LEASECAST_SCHEDULES."

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            created, changed, deleted = sync_schedules()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"schedules: {created} created, {changed} changed, {deleted} deleted")
