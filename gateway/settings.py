"""The public path of the standalone service's Django settings: ``gateway.settings``.

The settings are in :mod:`gateway.site.settings`; ``DJANGO_SETTINGS_MODULE=gateway.settings``
(``manage.py``, ``python -m gateway.serve``) and a project's ``from gateway.settings import *``
keep working through this module.
"""

from __future__ import annotations

from gateway.site.settings import *  # noqa: F403
