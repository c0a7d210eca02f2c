"""The tests' task site: the gateway's settings, and TASKS on LeasecastBackend."""

from __future__ import annotations

from gateway.settings import *  # noqa: F403

# QUEUES empty: any queue name (each test uses queues of its own).
TASKS = {"default": {"BACKEND": "gateway.tasks.LeasecastBackend", "QUEUES": []}}
