"""Test-wide set-up: Django settings pointed at a throw-away var/ directory, shared fixtures.

The helpers every directory uses live in :mod:`tests.support`; the fixtures
more than one directory needs (``redis_url``) are here.
"""

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


import pytest  # noqa: E402

from tests.support.databases import REDIS_URL, redis_unavailable  # noqa: E402


@pytest.fixture(scope="module")
def redis_url() -> str:
    """The Redis server's URL; skips (reason shown) when it does not answer.

    Needs nothing else: no PostgreSQL.
    """
    reason = redis_unavailable()
    if reason:
        pytest.skip(reason)
    return REDIS_URL
