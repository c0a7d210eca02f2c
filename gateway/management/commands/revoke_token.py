"""``manage.py revoke_token NAME``: revoke every standing stored token of that name.

Revoking sets ``revoked_at`` (as the admin's "Revoke" action does): the
tokens stay listed in the admin, refused everywhere. Each gateway process
closes its sockets of a revoked token with 4401 and refuses its HTTP requests
within 5 seconds (protocol 1.1: token lifetime; ``gateway.access.auth``).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from gateway.models import Token


class Command(BaseCommand):
    help = (
        "Revoke the stored token(s) named NAME: their sockets close (4401) and their "
        "HTTP requests are refused on every gateway process within 5 seconds."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the token's name, as given to issue_token")

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"].strip()
        tokens = Token.objects.filter(name=name)
        if not tokens.exists():
            # CommandError: the message on stderr and exit code 1.
            raise CommandError(f"no token named {name!r} (see the admin's token list)")
        revoked = tokens.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        if revoked == 0:
            self.stdout.write(f"every token named {name!r} was already revoked")
            return
        self.stdout.write(
            f"revoked {revoked} token{'s' if revoked != 1 else ''} named {name!r}; "
            "gateways close their sockets within 5 seconds"
        )
