"""The dashboard socket ``/ws/dashboard/``: a live snapshot every second, and the history once.

For an ``admin`` token, a superuser, or a staff user with the permission
``gateway.view_queue``; its ``disconnect`` needs ``gateway.change_queue``
(protocol 1.2: staff is not enough). Every second ``{"op": "snapshot", ...}``
(the first at once, as in v1): queues (from the database), every process's sockets and topics, the
alerts, the history samples the page has not seen (the closed ones since
the last frame, and the one being filled), and the task each worker's leased
messages carry (``running_tasks``). Right after the first snapshot,
once, ``{"op": "history", ...}``: the last 15 minutes of rates this process
kept (``dashboard.live.RateHistory``). History comes second so that a client
of the v1 socket, which expects a snapshot first, still gets one.
"""

from __future__ import annotations

import asyncio
from typing import Any

from channels.db import database_sync_to_async
from django.db import DatabaseError

from consumers.base import GatewaySocket
from dashboard.live import INTERVAL, Exchange, alerts
from gateway.core.errors import Forbidden, NotFound, ProtocolError
from gateway.core.protocol import ClientFrame, DisconnectFrame
from gateway.core.wire import (
    encode_disconnected,
    encode_error,
    encode_history,
    encode_snapshot,
)
from gateway.host.operations import audit
from gateway.host.task_operations import tasks_of_messages

__all__ = ["DashboardSocket"]

#: Most leased messages a snapshot names the task of (``running_tasks``).
MAX_TASK_LOOKUP = 500


class DashboardSocket(GatewaySocket):
    """Pushes ``{"op": "snapshot", ...}`` every second; takes ``disconnect`` frames."""

    kind = "dashboard"
    ops = frozenset({"disconnect"})
    exchange: Exchange

    async def open(self, params: dict[str, str]) -> None:
        if not self.principal.allows("view_queue"):
            raise Forbidden(
                "the dashboard needs the 'admin' scope, a superuser, or a staff user "
                "with the permission gateway.view_queue"
            )
        self.exchange = self.runtime.part(Exchange)
        self._audits: set[asyncio.Future[None]] = set()

    def opened(self) -> None:
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    def closed(self) -> None:
        self._ticker.cancel()

    async def _tick(self) -> None:
        history = self.exchange.history
        kept = encode_history(**history.as_json())
        sent = history.samples[-1]["t"] + 1 if history.samples else 0.0
        while True:
            try:
                queues: Any = await self.exchange.queues()
            except ProtocolError as exc:
                queues = {"error": exc.detail}
            # The sampler's snapshots of this second, when it has taken one: a
            # thousand sockets are described once a second, not once per page.
            processes = self.exchange.latest or self.exchange.processes()
            fresh = history.since(sent)
            if fresh:
                sent = fresh[-1]["t"] + 1
            current = history.current()
            running = await self._running_tasks(processes)
            snapshot = encode_snapshot(
                queues=queues,
                processes=processes,
                alerts=alerts(processes, queues, self.exchange.oldest_alert),
                oldest_alert=self.exchange.oldest_alert,
                samples=[*fresh, *([current] if current else [])],
                labels=history.dropping_labels(),
                running_tasks=running,
            )
            self.push(snapshot)
            if kept:
                self.push(kept)  # once, after the first snapshot
                kept = ""
            await asyncio.sleep(INTERVAL)

    async def _running_tasks(self, processes: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
        """The task each worker's leased messages carry (the page's worker rows).

        One indexed query a second, and only while some worker holds a lease.
        """
        held = [m for p in processes for s in p.get("sockets", ()) for m in s.get("running", ())]
        if not held:
            return {}
        # One bounded query: a thousand busy workers would otherwise make an
        # IN list of 20,000 ids (the rows past it show their message ids only).
        held = held[:MAX_TASK_LOOKUP]
        try:
            found = await database_sync_to_async(tasks_of_messages)(held)
        except DatabaseError:  # no task table (a project without results): no names
            return {}
        return {str(k): v for k, v in found.items()}

    def handle(self, frame: ClientFrame) -> None:
        match frame:
            case DisconnectFrame():
                self.principal.require("change_queue")  # forbidden; the socket stays
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
                        self.push(encode_disconnected(frame.socket, ref))
                    else:
                        err = NotFound(f"no socket {frame.socket} on {frame.process}")
                        self.push(encode_error(err.code, err.detail, ref))

                task = asyncio.ensure_future(self.exchange.disconnect(frame.process, frame.socket))
                task.add_done_callback(done)
            case _:
                raise AssertionError(f"not in this socket's ops: {frame.op}")

    def describe(self) -> dict[str, Any]:
        """Dashboards are sockets too."""
        return self.identity()
