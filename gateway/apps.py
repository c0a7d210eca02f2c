"""The ``gateway`` Django app: Leasecast's models, migrations and commands."""

from __future__ import annotations

from django.apps import AppConfig


class GatewayConfig(AppConfig):
    """Leasecast's app. Its migrations use 64-bit ids whatever the host project's
    ``DEFAULT_AUTO_FIELD``, so adding it to a project never asks for a migration."""

    name = "gateway"
    verbose_name = "Leasecast"
    default_auto_field = "django.db.models.BigAutoField"
