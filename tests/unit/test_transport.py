"""A socket's writability (gateway.server.transport): frames pending, and the transport's room."""

from __future__ import annotations

from typing import Any, cast

import pytest
from twisted.internet.abstract import FileDescriptor

from gateway.server.transport import (
    TRANSPORT_EXTENSION,
    SocketWindow,
    TransportFlow,
    transport_flow,
)


class Recorder:
    """What a socket's ``writable_changed`` was told, in order."""

    def __init__(self) -> None:
        self.told: list[bool] = []

    def __call__(self, writable: bool) -> None:
        self.told.append(writable)


def test_a_socket_is_full_at_high_and_writable_again_at_half() -> None:
    told = Recorder()
    window = SocketWindow(told, high=4)
    for _ in range(3):
        window.queued()
    assert window.writable and told.told == []
    window.queued()  # the fourth frame pending
    assert not window.writable and told.told == [False]
    window.queued()
    window.sent()
    window.sent()
    assert not window.writable  # 3 pending: still over half
    window.sent()
    assert window.writable and told.told == [False, True]  # 2 pending
    window.sent()
    window.sent()
    assert window.pending == 0 and told.told == [False, True]


def test_a_paused_transport_makes_the_socket_full_until_it_resumes() -> None:
    told = Recorder()
    window = SocketWindow(told, high=4)
    window.queued()
    window.transport_changed(True)
    assert not window.writable and not window.transport_ready.is_set()
    window.sent()  # nothing pending, but the transport has no room
    assert not window.writable
    window.transport_changed(False)
    assert window.writable and window.transport_ready.is_set()
    assert told.told == [False, True]


def test_a_transport_that_resumes_with_frames_piled_up_waits_for_them() -> None:
    told = Recorder()
    window = SocketWindow(told, high=4)
    window.transport_changed(True)
    for _ in range(5):
        window.queued()  # the writer holds them while the transport is paused
    window.transport_changed(False)
    assert not window.writable  # 5 pending
    for _ in range(3):
        window.sent()
    assert window.writable and told.told == [False, True]


def test_high_must_be_positive() -> None:
    with pytest.raises(ValueError):
        SocketWindow(Recorder(), high=0)


class SlowDescriptor(FileDescriptor):
    """Twisted's real write buffering and producer calls over a "kernel" that takes
    ``room`` bytes per write attempt; no reactor (writing is driven by hand)."""

    def __init__(self) -> None:
        super().__init__(reactor=cast(Any, object()))
        self.connected = True
        self.room = 0
        self.written = bytearray()

    def startWriting(self) -> None:
        pass

    def stopWriting(self) -> None:
        pass

    def writeSomeData(self, data: bytes) -> int:
        n = min(self.room, len(data))
        self.written += data[:n]
        return n


class PreviousProducer:
    """The producer registered before (daphne's HTTP channel): it must keep its calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def pauseProducing(self) -> None:
        self.calls.append("pause")

    def resumeProducing(self) -> None:
        self.calls.append("resume")

    def stopProducing(self) -> None:
        self.calls.append("stop")


def test_the_flow_follows_twisteds_write_buffer_and_keeps_the_previous_producer() -> None:
    transport = SlowDescriptor()
    previous = PreviousProducer()
    transport.registerProducer(cast(Any, previous), True)
    flow = TransportFlow(transport)
    assert id(transport.producer) == id(flow)  # in place of the previous one
    told = Recorder()
    flow.listen(told)
    transport.write(b"x" * 1000)
    assert told.told == [] and not flow.paused
    transport.write(b"x" * transport.bufferSize)  # over the high-water mark
    assert flow.paused and told.told == [True]
    transport.write(b"x")  # Twisted tells again on every write: heard once
    assert told.told == [True]
    transport.room = 10**9
    transport.doWrite()  # the kernel took it all
    assert not flow.paused and told.told == [True, False]
    assert len(transport.written) == 1001 + transport.bufferSize
    assert previous.calls == ["pause", "pause", "resume"]
    late = Recorder()
    transport.write(b"x" * (transport.bufferSize + 1))
    flow.listen(late)  # a listener that comes while paused is told at once
    assert late.told == [True]
    flow.stopProducing()
    assert not flow.paused and previous.calls[-1] == "stop"


def test_the_flow_is_found_in_the_scope_only_when_there() -> None:
    flow = TransportFlow(SlowDescriptor())
    scope: dict[str, Any] = {"type": "websocket", "extensions": {TRANSPORT_EXTENSION: flow}}
    assert transport_flow(scope) is flow
    assert transport_flow({"type": "websocket"}) is None
    assert transport_flow({"type": "websocket", "extensions": None}) is None
