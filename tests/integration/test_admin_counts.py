"""The admin's queue list counts messages by state in the database.

``dashboard.admin.with_counts`` replaces a loop over every message row of
each listed queue; it must agree with :func:`gateway.core.leases.observed_state`
(the one definition of a message's protocol state) on every kind of row,
on SQLite and PostgreSQL, with one query for the whole list.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

from dashboard.admin import with_counts
from gateway.core.leases import MessageState, StoredState, observed_state
from gateway.models import Message, Queue
from tests.support.databases import database, django_alias


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def alias(request: pytest.FixtureRequest) -> Iterator[str]:
    """A Django alias of this process on a freshly migrated database of each kind."""
    with (
        database(request.param, prefix="admin-counts-") as (env, _),
        django_alias(env, "counts") as name,
    ):
        yield name


def test_counts_agree_with_observed_state_row_by_row(alias: str) -> None:
    now = time.time()
    rng = random.Random(7)
    expected: dict[str, dict[MessageState, int]] = {}
    names = [f"counted-{i}" for i in range(4)] + ["counted-empty"]
    for name in names:
        queue = Queue.objects.using(alias).create(name=name)
        tally = dict.fromkeys(MessageState, 0)
        if name != "counted-empty":
            for _ in range(40):
                stored = rng.choice(list(StoredState))
                visible_at = now + rng.choice([-60.0, -1.0, 30.0, 600.0])
                Message.objects.using(alias).create(
                    queue=queue, body="{}", state=stored, visible_at=visible_at
                )
                tally[observed_state(stored, visible_at, now)] += 1
        expected[name] = tally

    with CaptureQueriesContext(connections[alias]) as queries:
        rows = list(with_counts(Queue.objects.using(alias).filter(name__in=names), now))
    assert len(queries) == 1  # the whole list in one grouped query

    assert sorted(q.name for q in rows) == sorted(names)
    for q in rows:
        want = expected[q.name]
        got = (q.n_visible, q.n_in_flight, q.n_dead)  # type: ignore[attr-defined]
        assert got == (
            want[MessageState.VISIBLE],
            want[MessageState.IN_FLIGHT],
            want[MessageState.DEAD],
        ), q.name
    empty = next(q for q in rows if q.name == "counted-empty")
    assert (empty.n_visible, empty.n_in_flight, empty.n_dead) == (0, 0, 0)  # type: ignore[attr-defined]
