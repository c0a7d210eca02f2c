"""The benchmark's Django settings: the gateway's, plus ``TASKS``.

``BENCH_TASK_BACKEND`` picks the backend: ``leasecast`` (the default,
``gateway.tasks.LeasecastBackend``) or ``db`` (``django_tasks_db``, the
database backend of django-tasks, with its app installed). The database is
the gateway's (``GATEWAY_SQLITE_PATH`` or ``DATABASE_URL``).
"""

from __future__ import annotations

import os

from gateway.site.settings import *  # noqa: F403
from gateway.site.settings import INSTALLED_APPS as _GATEWAY_APPS

if os.environ.get("BENCH_TASK_BACKEND", "leasecast") == "db":
    INSTALLED_APPS = [*_GATEWAY_APPS, "django_tasks_db"]
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend", "QUEUES": []}}
else:
    # QUEUES empty: any queue name (each run uses a queue of its own).
    TASKS = {"default": {"BACKEND": "gateway.tasks.LeasecastBackend", "QUEUES": []}}
    # The worker runs only registered tasks: the task is in jobs, no app's tasks module.
    LEASECAST_TASK_MODULES = ["bench.tasksite.jobs"]
