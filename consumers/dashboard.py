"""The dashboard socket ``/ws/dashboard/``: a live snapshot every second, staff only."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from channels.db import database_sync_to_async

from consumers.base import GatewaySocket
from dashboard.live import INTERVAL, Exchange, get_exchange
from dashboard.operations import audit
from gateway.errors import Forbidden, NotFound, ProtocolError
from gateway.protocol import ClientFrame, DisconnectFrame, encode

__all__ = ["DashboardSocket"]


class DashboardSocket(GatewaySocket):
    """Pushes ``{"op": "snapshot", ...}`` every second; takes ``disconnect`` frames."""

    kind = "dashboard"
    ops = frozenset({"disconnect"})
    exchange: Exchange

    async def open(self, params: dict[str, str]) -> None:
        if not self.principal.is_admin:
            raise Forbidden("the dashboard is for staff")
        self.exchange = get_exchange()
        self._audits: set[asyncio.Future[None]] = set()

    def opened(self) -> None:
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    def closed(self) -> None:
        self._ticker.cancel()

    async def _tick(self) -> None:
        while True:
            try:
                queues: Any = await self.exchange.queues()
            except ProtocolError as exc:
                queues = {"error": exc.detail}
            snapshot = {
                "op": "snapshot",
                "queues": queues,
                "processes": self.exchange.processes(),
            }
            self.push(orjson.dumps(snapshot, default=str).decode())
            await asyncio.sleep(INTERVAL)

    def handle(self, frame: ClientFrame) -> None:
        match frame:
            case DisconnectFrame():
                ref = frame.ref

                def done(task: asyncio.Task[bool]) -> None:
                    if task.result():
                        what = f"socket {frame.socket} on {frame.process}"
                        record = asyncio.ensure_future(
                            database_sync_to_async(audit)(
                                self.principal.user_id, what, "Disconnected from the dashboard."
                            )
                        )
                        self._audits.add(record)  # kept alive until written
                        record.add_done_callback(self._audits.discard)
                        self.push(encode({"op": "disconnected", "socket": frame.socket}, ref))
                    else:
                        err = NotFound(f"no socket {frame.socket} on {frame.process}")
                        self.push(
                            encode({"op": "error", "code": err.code, "detail": err.detail}, ref)
                        )

                task = asyncio.ensure_future(self.exchange.disconnect(frame.process, frame.socket))
                task.add_done_callback(done)
            case _:
                raise AssertionError(f"not in this socket's ops: {frame.op}")

    def describe(self) -> dict[str, Any]:
        """Dashboards are sockets too."""
        return self.identity()
