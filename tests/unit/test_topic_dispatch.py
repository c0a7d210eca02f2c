"""The topics' dispatch on its own: offset order, losses, and slow ``block`` subscribers.

:class:`~gateway.topics.dispatch.Dispatch` is fed entries as the publisher
and the stream reader hand them over (out of order, with gaps the stream
trimmed), with a recording sink in place of a subscriber socket; what the
sink receives is what a socket would send.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gateway.core.fanout import Policy
from gateway.core.history import Entry
from gateway.topics.dispatch import GATHER_SECONDS, Dispatch, SubscriberSink, Unmetered
from gateway.topics.followed import Followed


class RecordingSink(SubscriberSink):
    """A subscriber socket that keeps what it is sent, and how it was closed."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.closed: str | None = None

    def push(self, frame: str) -> None:
        self.frames.append(json.loads(frame))

    def slow_consumer(self) -> None:
        self.closed = "slow_consumer"

    def stream_restarted(self) -> None:
        self.closed = "stream_restarted"

    def offsets(self) -> list[int]:
        return [item["offset"] for frame in self.frames for item in frame["items"]]


def dispatching(
    *, policy: Policy = Policy.DROP_OLDEST, capacity: int = 100, credit: int = 100
) -> tuple[Dispatch, RecordingSink, Followed]:
    """A dispatch of topic ``t`` (epoch ``e``, nothing dispatched yet) with one subscriber."""
    removed: list[int] = []
    dispatch = Dispatch(meter=Unmetered(), block_wait=0.2, unsubscribe=removed.append)
    sub = dispatch.dispatcher.subscribe("t", capacity=capacity, policy=policy, credit=credit)
    sink = dispatch.sinks[sub.sid] = RecordingSink()
    followed = dispatch.followed["t"] = Followed("e", 0)
    return dispatch, sink, followed


async def sent(dispatch: Dispatch) -> None:
    """Let the sender task run its turn."""
    for _ in range(3):
        await asyncio.sleep(0)


async def test_entries_are_dispatched_in_offset_order_each_once() -> None:
    dispatch, sink, followed = dispatching()
    try:
        await dispatch.deliver("t", [Entry(2, b"2", 0.0), Entry(3, b"3", 0.0)])
        assert followed.dispatched == 0  # offset 1 is not here yet: 2 and 3 wait for it
        await dispatch.deliver("t", [Entry(1, b"1", 0.0), Entry(2, b"2", 0.0)])
        await sent(dispatch)
        assert sink.offsets() == [1, 2, 3]
        assert [item["body"] for frame in sink.frames for item in frame["items"]] == [1, 2, 3]
        assert (followed.dispatched, followed.complete) == (3, 3)
    finally:
        dispatch.close()


async def test_offsets_the_stream_trimmed_are_counted_lost_and_told() -> None:
    dispatch, sink, followed = dispatching()
    try:
        await dispatch.deliver("t", [Entry(4, b"4", 0.0)], gone_to=3)
        await sent(dispatch)
        assert followed.dispatched == 4 and dispatch.lost == 3
        assert sink.offsets() == [4]
        assert sum(frame["dropped"] for frame in sink.frames) == 3
    finally:
        dispatch.close()


async def test_a_block_subscriber_that_stays_full_is_closed_and_delivery_goes_on() -> None:
    dispatch, sink, followed = dispatching(policy=Policy.BLOCK, capacity=1, credit=0)
    try:
        await dispatch.deliver("t", [Entry(1, b"1", 0.0), Entry(2, b"2", 0.0)])
        # The second waited for room up to the block wait; no credit came.
        assert sink.closed == "slow_consumer" and dispatch.slow_consumers_closed == 1
        assert followed.complete == 2  # the publish is confirmed all the same
    finally:
        dispatch.close()


async def test_a_burst_arriving_one_publish_at_a_time_shares_frames() -> None:
    # Ten subscribers; 200 publishes, one per pass of the event loop (as they
    # come off a publisher's socket). Sent as they come, that is 200 frames
    # of one message per subscriber; the sender lets the burst gather after
    # a thin turn, so each frame holds many.
    dispatch, first, followed = dispatching(capacity=1000, credit=1000)
    sinks = [first]
    for _ in range(9):
        sub = dispatch.dispatcher.subscribe(
            "t", capacity=1000, policy=Policy.DROP_OLDEST, credit=1000
        )
        sink = dispatch.sinks[sub.sid] = RecordingSink()
        sinks.append(sink)
    try:
        for offset in range(1, 201):
            dispatch.dispatch_now("t", followed, Entry(offset, b"1", 0.0))
            await asyncio.sleep(0)
        for _ in range(100):  # until the last gathered turn has gone
            if all(len(sink.offsets()) == 200 for sink in sinks):
                break
            await asyncio.sleep(GATHER_SECONDS)
        for sink in sinks:
            assert sink.offsets() == list(range(1, 201))
            assert len(sink.frames) <= 50, len(sink.frames)  # 4 or more a frame on average
        # A publish that finds the sender idle is not held back.
        await asyncio.sleep(GATHER_SECONDS * 5)
        dispatch.dispatch_now("t", followed, Entry(201, b"1", 0.0))
        await sent(dispatch)
        assert all(sink.offsets()[-1] == 201 for sink in sinks)
    finally:
        dispatch.close()
