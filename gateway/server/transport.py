"""Transport backpressure: a socket whose transport is full stops draining its buffer.

design decision 14. A subscriber that grants credit and then stops reading its
TCP socket must cost the gateway its own buffer capacity plus a bounded
transport window, and no more; its ``on_full`` policy then applies as for any
slow subscriber (``block`` subscribers get 4008). Two pieces give each socket
a *writability* that the broadcaster obeys (``Dispatcher.pause``/``resume``):

- :class:`SocketWindow`, per socket, under every server: the socket is
  writable while fewer than :data:`OUTBOX_FRAMES` frames are queued or being
  sent, and (under daphne) its transport is not paused. Under uvicorn this
  is enough: its ``send`` waits for the transport (websockets' ``drain()``),
  so frames a stalled client does not read pile up in the outbox, where they
  are counted.
- :class:`TransportFlow`, under daphne (``python -m gateway.serve``): daphne's
  ``send`` returns once Twisted has queued the frame, however full its write
  buffer, so the outbox alone never fills. A streaming producer registered on
  the connection's Twisted transport is told ``pauseProducing()`` when the
  write buffer passes its high-water mark (64 KiB) and ``resumeProducing()``
  once it has drained; the socket finds it in its ASGI scope under
  ``scope["extensions"]["leasecast.transport"]`` (:func:`transport_flow`),
  put there by the server class :func:`with_transport_flow` makes.

daphne runs Twisted's asyncio reactor on the event loop of the consumers, so
the producer's callbacks run on the loop thread and may touch asyncio objects
directly.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

__all__ = [
    "OUTBOX_FRAMES",
    "STREAM_PREFIXES",
    "TRANSPORT_EXTENSION",
    "SocketWindow",
    "TransportFlow",
    "transport_flow",
    "with_transport_flow",
]

#: Frames a socket may have queued or being sent before it counts as full: a
#: few, so a keeping-up subscriber always has the next frame ready while one
#: is on the wire, and a stalled one holds at most these beyond its buffer.
OUTBOX_FRAMES = 4

#: The key of a connection's :class:`TransportFlow` in ``scope["extensions"]``.
TRANSPORT_EXTENSION = "leasecast.transport"

#: HTTP paths whose responses stream for long (server-sent events): their
#: requests get a :class:`TransportFlow` too, under daphne.
STREAM_PREFIXES = ("/sse/",)


class SocketWindow:
    """Whether one socket takes more frames now, and the callback told when that changes.

    Args:
        on_change: called with the new writability each time it changes.
        high: frames pending (queued or being sent) at which the socket is full;
            it is writable again once no more than ``high // 2`` are pending.
    """

    def __init__(self, on_change: Callable[[bool], None], *, high: int = OUTBOX_FRAMES) -> None:
        if high < 1:
            raise ValueError("high must be >= 1")
        self._on_change = on_change
        self._high = high
        self._low = high // 2
        #: frames queued and not yet handed to the server
        self.pending = 0
        #: the transport's write buffer is full (daphne; never set under uvicorn)
        self.transport_paused = False
        #: set while the transport is not paused: the writer waits on it
        self.transport_ready = asyncio.Event()
        self.transport_ready.set()
        self._writable = True

    @property
    def writable(self) -> bool:
        """The socket takes more frames: its buffer may be drained into it."""
        return self._writable

    def queued(self) -> None:
        """One more frame is in the outbox."""
        self.pending += 1
        if self._writable and self.pending >= self._high:
            self._set(False)

    def sent(self) -> None:
        """One frame left the outbox for the server."""
        self.pending -= 1
        if not self._writable and self.pending <= self._low and not self.transport_paused:
            self._set(True)

    def transport_changed(self, paused: bool) -> None:
        """The transport's write buffer filled (``paused``) or drained."""
        self.transport_paused = paused
        if paused:
            self.transport_ready.clear()
            if self._writable:
                self._set(False)
        else:
            self.transport_ready.set()
            if not self._writable and self.pending <= self._low:
                self._set(True)

    def _set(self, writable: bool) -> None:
        self._writable = writable
        self._on_change(writable)


class TransportFlow:
    """The write-side flow of one daphne connection: a streaming producer on its transport.

    Twisted calls :meth:`pauseProducing` when the transport's write buffer is
    over its high-water mark and :meth:`resumeProducing` when it has drained;
    each is passed on to the listeners (``listener(paused)``). The producer
    registered before (daphne's HTTP channel, which stops reading the
    connection while its write buffer is full) keeps getting the same calls.

    Args:
        transport: the connection's Twisted transport (an ``IConsumer``).
    """

    def __init__(self, transport: Any) -> None:
        self.paused = False
        self._listeners: list[Callable[[bool], None]] = []
        self._previous: Any = getattr(transport, "producer", None)
        if self._previous is not None:
            transport.unregisterProducer()
        transport.registerProducer(self, True)
        self._consumer: Any = transport

    def listen(self, listener: Callable[[bool], None]) -> None:
        """Call ``listener(paused)`` on every change (now too, if paused already)."""
        self._listeners.append(listener)
        if self.paused:
            listener(True)

    # -- IPushProducer, called by Twisted on the event loop's thread

    def pauseProducing(self) -> None:
        """The transport's write buffer is full."""
        self._change(True)
        if self._previous is not None:
            self._previous.pauseProducing()

    def resumeProducing(self) -> None:
        """The transport's write buffer has drained."""
        self._change(False)
        if self._previous is not None:
            self._previous.resumeProducing()

    def stopProducing(self) -> None:
        """The connection is gone: nothing waits for room any more."""
        self._change(False)
        self._listeners.clear()
        if self._previous is not None:
            self._previous.stopProducing()
            self._previous = None

    def detach(self) -> None:
        """Stop listening and take this producer off its consumer (an event stream's
        request that ended: the connection may serve another request)."""
        self._listeners.clear()
        consumer, self._consumer = self._consumer, None
        if consumer is None or getattr(consumer, "producer", None) is not self:
            return
        if getattr(consumer, "channel", consumer) is None:
            consumer.producer = None  # a request whose connection is gone: nothing to tell
            return
        consumer.unregisterProducer()

    def _change(self, paused: bool) -> None:
        if paused == self.paused:
            return
        self.paused = paused
        for listener in list(self._listeners):
            listener(paused)


def transport_flow(scope: dict[str, Any]) -> TransportFlow | None:
    """The connection's :class:`TransportFlow`, or None (not daphne via ``gateway.serve``)."""
    flow = (scope.get("extensions") or {}).get(TRANSPORT_EXTENSION)
    return flow if isinstance(flow, TransportFlow) else None


@functools.cache
def with_transport_flow(base: type[Any]) -> type[Any]:
    """A subclass of daphne's ``Server`` class ``base`` whose WebSockets carry a
    :class:`TransportFlow` in their scope (``scope["extensions"]``).

    daphne is not imported here: importing ``daphne.server`` installs Twisted's
    asyncio reactor, which a uvicorn process must not do; the caller has it.
    """

    class FlowServer(base):  # type: ignore[misc]
        """daphne's server; each WebSocket's scope carries its transport's flow."""

        def create_application(self, protocol: Any, scope: dict[str, Any]) -> Any:
            if scope.get("type") == "websocket" and protocol.transport is not None:
                flow = TransportFlow(protocol.transport)
                scope["extensions"] = {**(scope.get("extensions") or {}), TRANSPORT_EXTENSION: flow}
            elif scope.get("type") == "http" and str(scope.get("path", "")).startswith(
                STREAM_PREFIXES
            ):
                # An event stream: the producer goes on the request, which
                # Twisted pauses while the connection's write buffer is full;
                # the stream detaches it when it ends (a kept-alive
                # connection's next request may register its own).
                flow = TransportFlow(protocol)
                scope["extensions"] = {**(scope.get("extensions") or {}), TRANSPORT_EXTENSION: flow}
            return super().create_application(protocol, scope)

    FlowServer.__name__ = FlowServer.__qualname__ = f"Flow{base.__name__}"
    return FlowServer
