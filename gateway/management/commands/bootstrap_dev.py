"""``manage.py bootstrap_dev``: on first run, an admin user and an admin token, printed once."""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from gateway.models import Token


class Command(BaseCommand):
    help = "Create a development admin user and an admin-scope token (first run only)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--url", default="http://127.0.0.1:8000", help="where the gateway will be served"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        marker = settings.VAR_DIR / "dev-credentials.txt"
        url = options["url"].rstrip("/")
        user_model = get_user_model()
        # The address is printed fresh each time: the same credentials serve
        # whatever port this run uses.
        where = f"  log in at:     {url}/admin/   dashboard: {url}/dashboard/\n"
        if user_model.objects.filter(is_superuser=True).exists():
            if marker.exists():
                self.stdout.write(marker.read_text() + where)
            else:
                self.stdout.write(f"An admin user exists: log in at {url}/admin/ with it.")
            return
        password = secrets.token_urlsafe(12)
        user_model.objects.create_superuser("admin", "admin@localhost", password)
        _, token = Token.issue("dev-admin", ["admin"])
        text = (
            "Leasecast development credentials (kept in this git-ignored file)\n"
            f"  admin login:   admin / {password}\n"
            f"  admin token:   {token}\n"
            f"  export LEASECAST_TOKEN={token}\n"
        )
        marker.write_text(text)
        marker.chmod(0o600)
        self.stdout.write(text + where)
