"""The public path of the django.tasks backend: ``gateway.tasks``.

The code is in :mod:`gateway.host.tasks`; this module only hands its public names on,
so that what users import and run keeps working.
"""

from __future__ import annotations

from gateway.host.tasks import LeasecastBackend

__all__ = ["LeasecastBackend"]
