"""Baseline (b): a bare ``websockets`` server fanning out with ``websockets.broadcast``.

No buffers, no policies, no credit: each publish is written to every
subscriber's connection at once. ``python -m bench.websockets_baseline PORT``.
Clients: ``/sub/TOPIC/`` to subscribe, ``/pub/`` to publish ``{"topic", "body"}``.
"""

from __future__ import annotations

import asyncio
import sys

import orjson
from websockets.asyncio.server import ServerConnection, broadcast, serve

topics: dict[str, set[ServerConnection]] = {}


async def handler(ws: ServerConnection) -> None:
    path = ws.request.path if ws.request else ""
    if path.startswith("/sub/"):
        topic = path.split("/")[2]
        members = topics.setdefault(topic, set())
        members.add(ws)
        try:
            await ws.wait_closed()
        finally:
            members.discard(ws)
        return
    async for text in ws:
        frame = orjson.loads(text)
        broadcast(topics.get(frame["topic"], set()), text)
        await ws.send('{"ok":true}')


async def main(port: int) -> None:
    async with serve(handler, "127.0.0.1", port, max_size=None):
        await asyncio.get_running_loop().create_future()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
