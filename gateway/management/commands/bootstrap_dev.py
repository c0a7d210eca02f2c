"""``manage.py bootstrap_dev``: on first run, an admin user and an admin token, printed once.

Every run prints where to log in and the ``export`` line that points the
``leasecast`` command and the README's ``curl`` commands at this gateway
(``LEASECAST_URL``, ``ADMIN_TOKEN``), so a gateway on another port
(``PORT=9000 make run``) is the one they talk to.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from gateway.models import Token

#: The labels of the credentials file's lines (gateway/site/demo.py and
#: dashboard/screenshots.py read them back).
LOGIN_LABEL = "admin login"
TOKEN_LABEL = "admin token"


def display_path(path: Path) -> str:
    """``path`` relative to the working directory when it is under it (``var/...``)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def read_credentials(path: Path) -> dict[str, str]:
    """The ``label: value`` lines of a credentials file (older files had more lines)."""
    found: dict[str, str] = {}
    for line in path.read_text().splitlines():
        label, sep, value = line.strip().partition(":")
        if sep and label in (LOGIN_LABEL, TOKEN_LABEL):
            found[label] = value.strip()
    return found


class Command(BaseCommand):
    help = "Create a development admin user and an admin-scope token (first run only)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--url", default="http://127.0.0.1:8000", help="where the gateway will be served"
        )
        parser.add_argument(
            "--credentials",
            type=Path,
            help="the file that keeps them (default: var/dev-credentials.txt; "
            "make demo keeps its own)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["credentials"] or settings.VAR_DIR / "dev-credentials.txt"
        url = options["url"].rstrip("/")
        user_model = get_user_model()
        # The address is printed fresh each time: the same credentials serve
        # whatever port this run uses.
        where = f"  log in at:     {url}/admin/   dashboard: {url}/dashboard/\n"
        if user_model.objects.filter(is_superuser=True).exists():
            if not path.exists():
                self.stdout.write(f"An admin user exists: log in at {url}/admin/ with it.")
                return
            found = read_credentials(path)
            login, token = found.get(LOGIN_LABEL, "?"), found.get(TOKEN_LABEL, "?")
        else:
            login = f"admin / {secrets.token_urlsafe(12)}"
            user_model.objects.create_superuser("admin", "admin@localhost", login.split(" / ")[1])
            _, token = Token.issue("dev-admin", ["admin"])
            path.parent.mkdir(parents=True, exist_ok=True)
            # Created readable by this user only, before the secret is written.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.fchmod(fd, 0o600)  # a file left from an earlier database keeps its mode
            with os.fdopen(fd, "w") as out:
                out.write(
                    "Leasecast development credentials\n"
                    f"  {LOGIN_LABEL}:   {login}\n"
                    f"  {TOKEN_LABEL}:   {token}\n"
                )
        self.stdout.write(
            f"Leasecast development credentials (kept in {display_path(path)}, "
            "readable by you only; var/ is git-ignored)\n"
            f"  {LOGIN_LABEL}:   {login}\n"
            f"  {TOKEN_LABEL}:   {token}\n"
            f"{where}"
            "Paste this line in each terminal where you use the leasecast command or curl:\n"
            f"  export LEASECAST_URL={url} ADMIN_TOKEN={token}\n"
        )
