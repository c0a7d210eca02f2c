"""The standalone service's settings with a project's own URLconf, and Django's
default request body limit (a project that never set DATA_UPLOAD_MAX_MEMORY_SIZE)."""

from __future__ import annotations

from gateway.site.settings import *  # noqa: F403

ROOT_URLCONF = "tests.apihost.urls"
DATA_UPLOAD_MAX_MEMORY_SIZE = 2_621_440  # Django's default
