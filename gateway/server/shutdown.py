"""Graceful shutdown of a daphne process on SIGTERM (``python -m gateway.serve``).

daphne's own SIGTERM stops Twisted's reactor at once: it cancels every
application instance (so no consumer runs its disconnect: a worker's leases
stay taken until their visibility timeout) and drops every TCP connection
without a close frame (clients see 1006). Behind a load balancer a restart
should instead look like this, which :class:`DrainingServer` does:

1. **Stop accepting.** The listening sockets close at once: a new connection
   is refused, the balancer's ``/healthz`` checks fail and it sends new
   sockets to the other processes (haproxy: ``option redispatch``).
2. **Close every WebSocket with 1001** (going away, docs/protocol.md Errors).
   The client sees the code and reconnects (through the balancer, to another
   process). daphne then hands the application its ``websocket.disconnect``,
   so each consumer runs its normal disconnect: a worker's leases are
   released in the next group commit (its messages go to other workers at
   once), a subscriber leaves its topics.
   Every server-sent event stream (``/sse/``) is ended the same way: its
   response finishes, its connection closes, and the client's
   ``EventSource`` reconnects elsewhere.
3. **Wait** until every application instance has finished (HTTP requests in
   flight get their replies), at most ``GATEWAY_SHUTDOWN_GRACE`` seconds
   (default 30), then stop the reactor as daphne would. Whatever is still
   running then is cancelled, as before.

A second SIGTERM during the drain stops at once. SIGINT (Ctrl-C) is left as
daphne handles it. Nothing changes while the process is not stopping.

uvicorn needs none of this: on SIGTERM it stops accepting, closes WebSockets
with 1012 (service restart) and waits for the applications
(``--timeout-graceful-shutdown``), which ``gateway.serve --server uvicorn``
sets to the same grace.
"""

from __future__ import annotations

import logging
import signal
import time
from types import FrameType
from typing import Any

from autobahn.websocket.protocol import WebSocketProtocol as AutobahnProtocol
from daphne import server as daphne_server
from daphne.http_protocol import WebRequest
from daphne.ws_protocol import WebSocketProtocol
from twisted.internet import reactor as _reactor

from gateway.core.wire import CloseCode
from gateway.server.options import shutdown_grace
from gateway.server.transport import STREAM_PREFIXES

logger = logging.getLogger("leasecast.shutdown")
# Twisted's global reactor (daphne's asyncio reactor), untyped: its interface
# declarations do not type-check as a module attribute.
reactor: Any = _reactor


class DrainingServer(daphne_server.Server):  # type: ignore[misc]
    """daphne's server, draining on SIGTERM instead of stopping at once (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.grace = shutdown_grace()
        self.draining = False
        self._ports: list[Any] = []
        self._deadline = 0.0

    def run(self) -> None:
        if self.signal_handlers:
            reactor.callWhenRunning(self._install_sigterm)
        super().run()

    def listen_success(self, port: Any) -> None:
        # daphne keeps only the listen Deferreds, whose result is gone by now.
        self._ports.append(port)
        super().listen_success(port)

    def _install_sigterm(self) -> None:
        # Installed after Twisted's own handlers (this runs once the reactor
        # has started), so it replaces Twisted's SIGTERM only.
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        reactor.callFromThread(self.drain)

    def drain(self) -> None:
        """Stop accepting, close every WebSocket with 1001, stop once all finished."""
        if self.draining:
            logger.warning("second SIGTERM: stopping without waiting")
            reactor.stop()
            return
        self.draining = True
        self._deadline = time.monotonic() + self.grace
        for port in self._ports:
            port.stopListening()
        closed = self._close_open_sockets()
        ended = self._end_event_streams()
        logger.info(
            "SIGTERM: stopped accepting, closed %d WebSockets with %d, waiting up to %gs",
            closed,
            CloseCode.GOING_AWAY.value,
            self.grace,
        )
        if ended:
            logger.info("SIGTERM: ended %d event streams", ended)
        self._wait()

    def _close_open_sockets(self) -> int:
        """Send 1001 to every open WebSocket not yet closing; how many were sent."""
        closed = 0
        for protocol in list(self.connections):
            if (
                isinstance(protocol, WebSocketProtocol)
                and protocol.state == AutobahnProtocol.STATE_OPEN
            ):
                # autobahn's sendClose refuses 1001 from an application, so
                # the frame is sent below it; the client's reply completes
                # the closing handshake and daphne then sends the
                # application its websocket.disconnect.
                protocol.sendCloseFrame(
                    code=CloseCode.GOING_AWAY.value, reasonUtf8=b"server shutdown", isReply=False
                )
                closed += 1
        return closed

    def _end_event_streams(self) -> int:
        """End every event stream's response (``/sse/``); how many were ended.

        A stream would otherwise run until the grace is over. Its response
        ends cleanly (the client's ``EventSource`` reconnects, through the
        balancer, to another process, resuming with ``Last-Event-ID``),
        daphne hands the application its ``http.disconnect`` (the stream
        leaves its topic), and the connection closes, so the client cannot
        send its next request on it to this draining process.
        """
        ended = 0
        for protocol in list(self.connections):
            if not isinstance(protocol, WebRequest) or protocol.finished:
                continue
            if not getattr(protocol, "_response_started", False):
                continue  # its answer is still coming: waited for, as any request's
            path = protocol.path.decode("latin-1") if isinstance(protocol.path, bytes) else ""
            if not path.startswith(STREAM_PREFIXES):
                continue
            channel = protocol.channel
            protocol.finish()
            if channel is not None:
                channel.loseConnection()
            ended += 1
        return ended

    def _running(self) -> int:
        return sum(
            1
            for details in list(self.connections.values())
            if details.get("application_instance") is not None
            and not details["application_instance"].done()
        )

    def _wait(self) -> None:
        # A handshake that was under way when the listening sockets closed
        # completes during the drain: that socket is closed too (and a stream
        # that started meanwhile is ended).
        self._close_open_sockets()
        self._end_event_streams()
        running = self._running()
        if running == 0 or time.monotonic() >= self._deadline:
            if running:
                logger.warning("shutdown grace over: %d application instances cancelled", running)
            reactor.stop()
            return
        reactor.callLater(0.05, self._wait)
