"""``manage.py issue_token NAME --scope SCOPE ...``: prints the token alone on the last line."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from gateway.core.errors import Invalid
from gateway.core.scopes import parse_scope
from gateway.models import Token


class Command(BaseCommand):
    help = "Issue an API token. Only its hash is stored: the token is shown once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="who the token is for (shown in the admin and logs)")
        parser.add_argument(
            "--scope",
            action="append",
            required=True,
            help="admin, or ACTION:PATTERN with ACTION in enqueue, consume, publish, subscribe",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        scopes: list[str] = options["scope"]
        for scope in scopes:
            try:
                parse_scope(scope)
            except Invalid as exc:
                raise CommandError(exc.detail) from exc
        name = options["name"].strip()
        if not name:
            raise CommandError("the token needs a name")
        token, secret = Token.issue(name, scopes)
        self.stderr.write(f"issued token {token.pk} {name!r} with scopes {' '.join(scopes)}")
        self.stdout.write(secret)
