"""The public path of the django.tasks backend and of a task's helpers: ``gateway.tasks``.

- :class:`LeasecastBackend`: the ``django.tasks`` backend (:mod:`gateway.host.tasks`).
- :func:`progress`: inside a task run by ``leasecast_worker``, publish its
  progress to the topic ``task.RESULT_ID``; :func:`cancelled`: whether its
  message was cancelled (:mod:`gateway.host.task_progress`).
- :func:`cancel`: cancel a task by its result id (:mod:`gateway.host.task_cancel`).

The code is in those modules; this module only hands their public names on,
so that what users import and run keeps working.
"""

from __future__ import annotations

from gateway.host.task_cancel import cancel
from gateway.host.task_progress import cancelled, progress
from gateway.host.tasks import LeasecastBackend

__all__ = ["LeasecastBackend", "cancel", "cancelled", "progress"]
