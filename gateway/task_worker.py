"""The public path of the task worker's error for an unknown task: ``gateway.task_worker``.

The code is in :mod:`gateway.host.task_worker`; this module only hands its public names on,
so that what users import and run keeps working.
"""

from __future__ import annotations

from gateway.host.task_worker import UnregisteredTask

__all__ = ["UnregisteredTask"]
