"""The benchmark's ``django.tasks`` task (Leasecast and django-tasks-db run the same one)."""

from __future__ import annotations

import time

try:  # Django 6.0 and later
    from django.tasks import task
except ImportError:  # Django 5.2: the django-tasks package
    from django_tasks import task  # type: ignore[no-redef]


@task()
def noop() -> float:
    """Does nothing but return the time it started (Unix seconds), kept as its result."""
    return time.time()
