"""Staged enqueue over HTTP (what the Spark sink uses): stage, commit once, abort."""

from __future__ import annotations

from typing import Any

from tests.support.clients import Socket, ahttp, unique
from tests.support.gateways import GatewayProcess


async def test_stage_commit_is_atomic_idempotent_and_wakes_workers(
    gateway: GatewayProcess, admin_token: str
) -> None:
    q, txn = unique(), f"query-{unique('t')}-batch-7"
    base = f"{gateway.http}/api/transactions/{txn}"
    async with await Socket.open(f"{gateway.ws}/ws/queues/{q}/?prefetch=100", admin_token) as w:
        for partition, bodies in ((0, [1, 2]), (1, [3]), (1, [3, 4])):  # partition 1 retried
            status, reply = await ahttp(
                "PUT",
                f"{base}/partitions/{partition}",
                admin_token,
                {"queue": q, "messages": [{"body": b} for b in bodies]},
            )
            assert status == 200 and reply["state"] == "staged", reply
        await w.quiet(0.3)  # staged: invisible to workers
        status, stats = await ahttp("GET", f"{gateway.http}/api/queues/{q}", admin_token)
        assert stats["visible"] == 0
        status, reply = await ahttp("POST", f"{base}/commit", admin_token)
        assert (status, reply) == (200, {"committed": 4, "already": False})
        got = await w.deliveries(4)
        assert [d["body"] for d in got] == [1, 2, 3, 4]
        status, reply = await ahttp("POST", f"{base}/commit", admin_token)
        assert (status, reply) == (200, {"committed": 4, "already": True})
        status, reply = await ahttp(
            "PUT", f"{base}/partitions/0", admin_token, {"queue": q, "messages": [{"body": 9}]}
        )
        assert reply["already"] is True
        await w.quiet(0.3)  # the replay enqueued nothing


async def test_abort_and_bad_requests(gateway: GatewayProcess, admin_token: str) -> None:
    q, txn = unique(), f"q-{unique('t')}-b1"
    base = f"{gateway.http}/api/transactions/{txn}"
    await ahttp("PUT", f"{base}/partitions/0", admin_token, {"queue": q, "messages": [{"body": 1}]})
    status, reply = await ahttp("POST", f"{base}/abort", admin_token)
    assert (status, reply) == (200, {"aborted": 1, "already": False})
    status, reply = await ahttp("POST", f"{base}/commit", admin_token)
    assert status == 400 and reply["error"] == "invalid"
    status, reply = await ahttp(
        "PUT",
        f"{gateway.http}/api/transactions/bad%20name/partitions/0",
        admin_token,
        {"queue": q, "messages": []},
    )
    assert status in (400, 404)
    status, reply = await ahttp(
        "PUT", f"{base}-2/partitions/0", admin_token, {"queue": q, "messages": [{"delay": -1}]}
    )
    assert status == 400 and "messages[0]" in reply["detail"]
    narrow = gateway.issue_token("consume:x", name="no-enqueue")
    status, reply = await ahttp("POST", f"{base}-3/commit", narrow)
    assert status == 403


async def test_commit_of_listed_partitions_discards_other_staging(
    gateway: GatewayProcess, admin_token: str
) -> None:
    """A batch replayed with another split commits only what the replay staged."""
    q, txn = unique(), f"query-{unique('t')}-batch-3"
    base = f"{gateway.http}/api/transactions/{txn}"
    # The first attempt staged partitions 0 and 1, then the job died.
    for partition, bodies in ((0, [1, 2]), (1, [3, 4])):
        await ahttp(
            "PUT",
            f"{base}/partitions/{partition}",
            admin_token,
            {"queue": q, "messages": [{"body": b} for b in bodies]},
        )
    # The replay split the same rows into partitions 0 and 2.
    for partition, bodies in ((0, [1, 2, 3]), (2, [4])):
        await ahttp(
            "PUT",
            f"{base}/partitions/{partition}",
            admin_token,
            {"queue": q, "messages": [{"body": b} for b in bodies]},
        )
    status, reply = await ahttp("POST", f"{base}/commit", admin_token, {"partitions": "0"})
    assert status == 400 and reply["error"] == "bad_frame"
    status, reply = await ahttp("POST", f"{base}/commit", admin_token, {"partitions": [0, 2]})
    assert (status, reply) == (200, {"committed": 4, "already": False})
    status, stats = await ahttp("GET", f"{gateway.http}/api/queues/{q}", admin_token)
    assert stats["visible"] == 4  # not 6: partition 1 of the first attempt was discarded
    status, reply = await ahttp("POST", f"{base}/commit", admin_token, {"partitions": [0, 1, 2]})
    assert (status, reply) == (200, {"committed": 4, "already": True})


async def test_a_transaction_belongs_to_the_principal_that_first_staged_into_it(
    gateway: GatewayProcess, admin_token: str
) -> None:
    """A token with ``enqueue:emails.*`` emptied a transaction staged by one with
    ``enqueue:orders.*`` (its 2 messages silently gone), and committing a name
    before its owner staged made the owner's later stage answer ``already``."""
    prefix = unique("own")
    orders = gateway.issue_token(f"enqueue:{prefix}.orders.*", name="orders")
    emails = gateway.issue_token(f"enqueue:{prefix}.emails.*", name="emails")
    q, txn = f"{prefix}.orders.new", f"{prefix}-batch-1"
    base = f"{gateway.http}/api/transactions/{txn}"
    two = {"queue": q, "messages": [{"body": 1}, {"body": 2}]}
    assert (await ahttp("PUT", f"{base}/partitions/0", orders, two))[0] == 200
    theirs = {"queue": f"{prefix}.emails.out", "messages": []}
    for method, url, body in (
        ("PUT", f"{base}/partitions/0", theirs),  # emptied partition 0 before
        ("PUT", f"{base}/partitions/1", theirs),
        ("POST", f"{base}/commit", None),
        ("POST", f"{base}/abort", None),
    ):
        status, reply = await ahttp(method, url, emails, body)
        assert (status, reply["error"]) == (403, "forbidden"), (method, url, reply)
        # Nothing about the transaction: no state, count, queue or owner's name.
        assert "orders" not in reply["detail"] and "staged" not in reply["detail"], reply
    status, reply = await ahttp("POST", f"{base}/commit", orders)
    assert (status, reply) == (200, {"committed": 2, "already": False})
    status, stats = await ahttp("GET", f"{gateway.http}/api/queues/{q}", admin_token)
    assert stats["visible"] == 2, stats
    # A name committed before its owner staged is the committer's: the owner is told.
    early = f"{gateway.http}/api/transactions/{prefix}-batch-2"
    assert (await ahttp("POST", f"{early}/commit", emails))[1]["committed"] == 0
    status, reply = await ahttp("PUT", f"{early}/partitions/0", orders, two)
    assert (status, reply["error"]) == (403, "forbidden"), reply
    # An admin token may abort anyone's transaction (and only abort it).
    stuck = f"{gateway.http}/api/transactions/{prefix}-batch-3"
    assert (await ahttp("PUT", f"{stuck}/partitions/0", orders, two))[0] == 200
    status, reply = await ahttp("POST", f"{stuck}/commit", admin_token)
    assert (status, reply["error"]) == (403, "forbidden"), reply
    status, reply = await ahttp("POST", f"{stuck}/abort", admin_token)
    assert (status, reply) == (200, {"aborted": 2, "already": False})
    status, stats = await ahttp("GET", f"{gateway.http}/api/queues/{q}", admin_token)
    assert stats["visible"] == 2, stats


async def test_the_spark_sink_says_whose_transaction_it_is_instead_of_retrying(
    gateway: GatewayProcess, admin_token: str
) -> None:
    """A query restarted with another token cannot stage into its own old
    transaction (it belongs to its first stager): the sink's error says so and
    how to clear it, rather than a bare HTTP 403 that looks worth retrying."""
    import asyncio

    import pytest

    pytest.importorskip("pyspark", reason="the Spark sink needs pyspark (the spark extra)")
    from spark_feed.sink import SinkError, _Gateway

    q, txn = unique(), f"query-{unique('t')}-batch-3"
    first = gateway.issue_token(f"enqueue:{q}", name="first")
    second = gateway.issue_token(f"enqueue:{q}", name="second")
    body = {"queue": q, "messages": [{"body": 1}]}
    path = f"/api/transactions/{txn}/partitions/0"

    def stage(token: str) -> Any:
        client = _Gateway(gateway.http, token, timeout=10)
        try:
            return client.request("PUT", path, body)
        finally:
            client.close()

    assert (await asyncio.to_thread(stage, first))["state"] == "staged"
    with pytest.raises(SinkError) as refused:
        await asyncio.to_thread(stage, second)
    message = str(refused.value)
    assert "HTTP 403" in message and "belongs to another token" in message
    assert f"/api/transactions/{txn}/abort" in message
    status, reply = await ahttp("GET", f"{gateway.http}/api/queues/{q}", admin_token)
    assert status == 200 and reply["visible"] == 0  # nothing of the second token's applied
