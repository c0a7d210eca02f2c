"""Test-wide set-up: Django settings pointed at a throw-away var/ directory."""

from __future__ import annotations

import os
import tempfile

# Before Django is imported anywhere: the tests' SQLite file, secret key and
# credentials live in a temporary directory, never in the developer's var/.
_VAR = tempfile.mkdtemp(prefix="leasecast-tests-")
os.environ["GATEWAY_VAR_DIR"] = _VAR
os.environ.pop("DATABASE_URL", None)
os.environ.pop("REDIS_URL", None)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")

import django  # noqa: E402

django.setup()
