"""Test-wide set-up: Django settings pointed at a throw-away var/ directory, shared fixtures.

The helpers every directory uses live in :mod:`tests.support`; the fixtures
more than one directory needs (``redis_url``) are here.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

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


#: Directories whose modules share session fixtures (one 1.1 deployment per
#: backend): a parallel run keeps each of them on one worker.
SHARED_DIRECTORIES = ("tests/integration/queue11/",)

#: Rough seconds a test of each directory takes, and the factor for a test marked
#: ``slow``: only to start the longest groups first (see ``group_weights``).
SECONDS_PER_TEST = {"tests/spark/": 60.0, "tests/browser/": 20.0, "tests/integration/": 3.0}
SECONDS_PER_UNIT_TEST = 0.2
SLOW_FACTOR = 5.0


def group_of(nodeid: str) -> str:
    """The work unit of a test in a parallel run: its module (or shared directory), by backend.

    Each test module runs on one worker, so its module-scoped gateway starts
    once, as in a serial run; a directory of :data:`SHARED_DIRECTORIES` is one
    unit. Its tests on PostgreSQL (``postgres`` in the test's parameters: the
    backend fixtures' ids) are a unit of their own: they run on a gateway and
    database of their own anyway, and a long module then takes two workers,
    not one. (An ``@name`` suffix that pytest-xdist may add is ignored.)
    """
    path, _, rest = nodeid.partition("::")
    path = path.split("@", 1)[0]
    unit = next((d for d in SHARED_DIRECTORIES if path.startswith(d)), path)
    params = rest[rest.find("[") + 1 : rest.rfind("]")] if "[" in rest else ""
    return f"{unit}[postgres]" if "postgres" in params.split("-") else unit


def group_weights(items: list[pytest.Item]) -> dict[str, float]:
    """Each group's estimated seconds (:data:`SECONDS_PER_TEST`, ``slow`` tests weigh more)."""
    weights: dict[str, float] = {}
    for item in items:
        group = group_of(item.nodeid)
        cost = next(
            (s for d, s in SECONDS_PER_TEST.items() if group.startswith(d)), SECONDS_PER_UNIT_TEST
        )
        if item.get_closest_marker("slow") is not None:
            cost *= SLOW_FACTOR
        weights[group] = weights.get(group, 0.0) + cost
    return weights


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a worker of a parallel run (``make test``): the heaviest groups first.

    pytest-xdist hands the groups out in collection order (``--dist loadgroup``
    with :func:`pytest_xdist_make_scheduler`), so the longest ones start first
    and the stage does not end waiting for one that started last. Each group
    keeps its tests in their order; a run without ``-n`` is not reordered.
    """
    if not getattr(config.option, "loadgroup", False) or not hasattr(config, "workerinput"):
        return
    weights = group_weights(items)
    order = {group: rank for rank, group in enumerate(sorted(weights, key=lambda g: -weights[g]))}
    items.sort(key=lambda item: order[group_of(item.nodeid)])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: each group of :func:`group_of` on one worker, heaviest first.

    pytest-xdist's own loadgroup reads ``xdist_group`` marks through a test id
    suffix that pytest 9 no longer lets it add: every test was then a unit of
    its own, spread over all workers (each starting the module's gateway
    again). This scheduler takes the group from the test id itself.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist: untyped here
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    # The workers' collection order (heaviest group first) is the order of work.
    config.option.loadscopereorder = False
    return ModuleScheduling(config, log)
