"""The tests' task site: the gateway's settings, and TASKS on LeasecastBackend."""

from __future__ import annotations

import os

from gateway.site.settings import *  # noqa: F403
from gateway.site.settings import INSTALLED_APPS

# An app, so that its ``tasks`` module is in the workers' registry (the
# worker runs only the tasks of the installed apps' ``tasks`` modules and of
# LEASECAST_TASK_MODULES; ``unimportable`` and ``side_effect`` are neither).
INSTALLED_APPS = [*INSTALLED_APPS, "tests.tasksite"]
# More task modules for a test's worker (space-separated), none by default.
LEASECAST_TASK_MODULES = os.environ.get("TASKSITE_TASK_MODULES", "").split()

# QUEUES empty: any queue name (each test uses queues of its own).
TASKS = {"default": {"BACKEND": "gateway.tasks.LeasecastBackend", "QUEUES": []}}
