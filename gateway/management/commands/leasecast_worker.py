"""``manage.py leasecast_worker``: run ``django.tasks`` tasks from Leasecast queues.

.. code-block:: text

    python manage.py leasecast_worker [--queue Q ...] [--concurrency N]
        [--url URL] [--token TOKEN] [--grace SECONDS]

A thin shell around :class:`gateway.host.task_worker.TaskWorker` (see there and
docs/tasks.md, The worker). The gateway and the token come from the options,
else ``LEASECAST_URL`` / ``LEASECAST_TOKEN`` in the Django settings or the
environment. Without ``--queue`` it consumes every queue named in the
``QUEUES`` of the project's ``LeasecastBackend`` entries of ``TASKS``, else
``default``. It runs only the tasks of the installed apps' ``tasks`` modules
and of the ``LEASECAST_TASK_MODULES`` setting (:class:`~gateway.host.task_worker.TaskRegistry`);
one of those that cannot be imported stops it at start. SIGTERM or SIGINT
stops it gracefully (exit 0).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from gateway.conf import client_setting
from gateway.core.errors import LeasecastError
from gateway.core.protocol import NAME_RE
from gateway.host.task_worker import DEFAULT_CONCURRENCY, DEFAULT_GRACE, TaskWorker, log

#: ``LEASECAST_URL`` when neither the option, the settings nor the environment set it.
DEFAULT_URL = "http://127.0.0.1:8000"


def _default_queues() -> list[str]:
    """The ``QUEUES`` of every ``LeasecastBackend`` in ``TASKS``, else ``["default"]``."""
    queues: list[str] = []
    for config in (getattr(settings, "TASKS", None) or {}).values():
        if str(config.get("BACKEND", "")).endswith("LeasecastBackend"):
            queues.extend(config.get("QUEUES") or [])
    return list(dict.fromkeys(queues)) or ["default"]


def _positive_int(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 1000:
        raise ValueError(text)
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise ValueError(text)
    return value


class Command(BaseCommand):
    help = "Run django.tasks tasks enqueued through gateway.tasks.LeasecastBackend."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--queue",
            action="append",
            dest="queues",
            metavar="Q",
            help="a queue to consume (repeatable; default: the QUEUES of the "
            "LeasecastBackend in TASKS, else 'default')",
        )
        parser.add_argument(
            "--concurrency",
            type=_positive_int,
            default=DEFAULT_CONCURRENCY,
            metavar="N",
            help=f"tasks at once across queues, 1-1000 (default {DEFAULT_CONCURRENCY})",
        )
        parser.add_argument(
            "--url", help=f"the gateway (default LEASECAST_URL, else {DEFAULT_URL})"
        )
        parser.add_argument(
            "--token", help="API token with consume scopes (default LEASECAST_TOKEN)"
        )
        parser.add_argument(
            "--grace",
            type=_seconds,
            default=DEFAULT_GRACE,
            metavar="SECONDS",
            help=f"after SIGTERM, how long running tasks may finish (default {DEFAULT_GRACE:g})",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        url = options["url"] or client_setting("LEASECAST_URL") or DEFAULT_URL
        token = options["token"] or client_setting("LEASECAST_TOKEN")
        if not token:
            raise CommandError("no token: use --token, or set LEASECAST_TOKEN")
        queues = options["queues"] or _default_queues()
        for queue in queues:
            if NAME_RE.fullmatch(queue) is None:
                raise CommandError(f"{queue!r} is not a queue name (1-200 of [A-Za-z0-9._-])")
        _log_to_console(options["verbosity"])
        try:
            worker = TaskWorker(
                url,
                token=token,
                queues=queues,
                concurrency=options["concurrency"],
                grace=options["grace"],
            )
        except ImproperlyConfigured as exc:  # the task registry's modules
            raise CommandError(str(exc)) from exc
        try:
            asyncio.run(worker.run())
        except LeasecastError as exc:
            raise CommandError(f"the worker stopped: {exc}") from exc
        if worker.abandoned:
            # Their threads cannot be interrupted and would keep the interpreter
            # alive; their leases are released already, so leave now.
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


def _log_to_console(verbosity: int) -> None:
    """One line per task on ``leasecast.worker``, even in a project without LOGGING for it."""
    if verbosity >= 2:
        log.setLevel(logging.DEBUG)
    elif verbosity == 0:
        log.setLevel(logging.WARNING)
    elif log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)
    if not log.hasHandlers():
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        log.addHandler(handler)
