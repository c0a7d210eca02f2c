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


#: Directories whose modules share session fixtures (one Spark session; one 1.1
#: deployment per backend): a parallel run keeps each of them on one worker.
SHARED_DIRECTORIES = ("tests/spark/", "tests/integration/queue11/")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Group the tests for pytest-xdist's ``--dist loadgroup`` (``make test``).

    Each test module is a group of its own, run whole by one worker, so its
    module-scoped gateway starts once, as in a serial run; a directory of
    :data:`SHARED_DIRECTORIES` is one group. A test that names its own
    ``xdist_group`` keeps it. Without ``-n`` the marks change nothing.
    """
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            path = item.nodeid.split("::", 1)[0]
            group = next((d for d in SHARED_DIRECTORIES if path.startswith(d)), path)
            item.add_marker(pytest.mark.xdist_group(group))
