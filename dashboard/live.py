"""Live state for the dashboard: this process's snapshot, and the other processes'.

Every second each gateway process that runs with a cross-process channel
layer (``REDIS_URL``) sends its snapshot (sockets, topics, queue counters) to
the group ``leasecast.dashboard``; every process keeps the latest snapshot of
each peer, so a dashboard served by any process shows all of them, labelled.
Queue counts come from the shared database, once, from the serving process.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from gateway.broadcast import get_broadcaster
from gateway.engine import Engine, get_engine
from gateway.layer import get_process_channel
from gateway.store import AllStats

__all__ = ["Exchange", "get_exchange", "process_snapshot"]

log = logging.getLogger("leasecast.dashboard")

GROUP = "leasecast.dashboard"
#: Seconds between snapshots; a peer silent for STALE_AFTER is dropped from view.
INTERVAL = 1.0
STALE_AFTER = 5.0
#: Close code for a socket an operator disconnected.
CLOSE_BY_OPERATOR = 4000


def process_snapshot(engine: Engine) -> dict[str, Any]:
    """This process's live state (no database query)."""
    broadcaster = get_broadcaster()
    return {
        **engine.describe(),
        "time": time.time(),
        "slow_consumers_closed": broadcaster.slow_consumers_closed,
        "relay": broadcaster.relay_figures(),
        "counters": engine.counters,
        "topics": broadcaster.describe_topics(),
        "sockets": [socket.describe() for socket in engine.sockets],
    }


class Exchange:
    """Shares snapshots and disconnect requests between gateway processes."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.peers: dict[str, dict[str, Any]] = {}
        self.channel = get_process_channel()
        if self.channel is not None:
            self.channel.on("dashboard.", self._handle)
            loop = asyncio.get_running_loop()
            self._joining = loop.create_task(self.channel.join(GROUP))
            self._sender = loop.create_task(self._send_loop())

    async def _handle(self, message: dict[str, Any]) -> None:
        if message["type"] == "dashboard.snapshot":
            snapshot = message["snapshot"]
            if snapshot["name"] != self.engine.process:
                self.peers[snapshot["name"]] = snapshot
        elif (
            message["type"] == "dashboard.disconnect" and message["process"] == self.engine.process
        ):
            self.disconnect_local(message["socket"])

    async def _send_loop(self) -> None:
        assert self.channel is not None
        while True:
            await asyncio.sleep(INTERVAL)
            try:
                await self.channel.layer.group_send(
                    GROUP, {"type": "dashboard.snapshot", "snapshot": process_snapshot(self.engine)}
                )
            except Exception as exc:
                log.debug("dashboard exchange send failed: %s", exc)

    def processes(self) -> list[dict[str, Any]]:
        """This process's snapshot and every peer heard from recently."""
        now = time.time()
        fresh = [p for p in self.peers.values() if now - p["time"] < STALE_AFTER]
        return [process_snapshot(self.engine), *sorted(fresh, key=lambda p: p["name"])]

    def disconnect_local(self, sid: int) -> bool:
        """Close one socket of this process; True if it was found."""
        for socket in list(self.engine.sockets):
            if socket.sid == sid:
                socket.push_close(CLOSE_BY_OPERATOR)
                return True
        return False

    async def disconnect(self, process: str, sid: int) -> bool:
        """Close a socket of any process (other processes are asked over the layer)."""
        if process == self.engine.process:
            return self.disconnect_local(sid)
        if self.channel is None or process not in self.peers:
            return False
        await self.channel.layer.group_send(
            GROUP, {"type": "dashboard.disconnect", "process": process, "socket": sid}
        )
        return True

    async def queues(self) -> list[dict[str, Any]]:
        """Counts per queue from the database (shared by every process)."""
        return [stats.as_json() for stats in await self.engine.call(AllStats())]


_exchanges: dict[asyncio.AbstractEventLoop, Exchange] = {}


def get_exchange() -> Exchange:
    """The exchange of the running loop's gateway process."""
    loop = asyncio.get_running_loop()
    exchange = _exchanges.get(loop)
    if exchange is None:
        exchange = _exchanges[loop] = Exchange(get_engine())
    return exchange
