"""docs/clients.md "Any other language: the raw protocol": its example runs as written."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from tests.support.clients import Socket, ahttp
from tests.support.docs import doc_block, run_example
from tests.support.gateways import GatewayProcess


def test_raw_protocol_example_runs_against_a_live_gateway_twice_in_a_row(
    gateway: GatewayProcess,
) -> None:
    for _ in range(2):
        output = run_example(gateway, "Any other language: the raw protocol", "raw-example")
        lines = output.splitlines()
        assert re.fullmatch(r"enqueued \d+ duplicate False", lines[0]), lines
        assert lines[1] == "working on hi delivery 1", lines
        assert lines[-1] == "prices [101, 102, 103]", lines
        assert "messages were lost" not in output


async def test_raw_protocol_example_resumes_from_a_saved_position(
    gateway: GatewayProcess, admin_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example's ``subscribe`` reconnects with since/epoch and gets what it missed."""
    status, _ = await ahttp(
        "PATCH", f"{gateway.http}/api/topics/ticks", admin_token, {"history_size": 100}
    )
    assert status == 200
    monkeypatch.setenv("LEASECAST_URL", gateway.http)
    monkeypatch.setenv("LEASECAST_TOKEN", admin_token)
    code = doc_block("Any other language: the raw protocol", "python")
    example: dict[str, Any] = {}
    exec(code.replace("asyncio.run(main())", ""), example)  # the definitions only

    async def publish(bodies: list[int]) -> None:
        async with await Socket.open(f"{gateway.ws}/ws/produce/", admin_token) as producer:
            for body in bodies:
                await producer.request({"op": "publish", "topic": "ticks", "body": body})

    position: dict[str, Any] = {}
    ready = asyncio.Event()
    reader = asyncio.create_task(example["subscribe"]("ticks", 2, position, ready))
    await ready.wait()
    await publish([1, 2])
    assert await reader == [1, 2]
    assert position["epoch"] and position["offset"] is not None

    await publish([3, 4, 5])  # while nobody listens
    again = await example["subscribe"]("ticks", 3, position, asyncio.Event())
    assert again == [3, 4, 5]
