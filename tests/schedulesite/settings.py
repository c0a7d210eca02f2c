"""The tests' schedule site: the task site, with ``LEASECAST_SCHEDULES`` from the environment.

``SCHEDULESITE_SCHEDULES`` holds the setting as JSON, so one test can run
gateways (and ``manage.py sync_schedules``) with different entries.
"""

from __future__ import annotations

import json
import os

from tests.tasksite.settings import *  # noqa: F403

LEASECAST_SCHEDULES = json.loads(os.environ.get("SCHEDULESITE_SCHEDULES", "{}"))
