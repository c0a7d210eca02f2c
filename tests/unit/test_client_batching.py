"""The client's pure cores: coalescing, ``acked_many`` splitting, JWT expiry, resume positions.

No socket here: :class:`~leasecast.batching.Coalescer` runs on the test's
event loop with a flush function that records what it was given.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from leasecast.batching import Coalescer, Pending, split_acked_many
from leasecast.results import Subscribed
from leasecast.subscriber import ResumePosition, is_gap
from leasecast.tokens import TokenSource, jwt_expiry, refresh_delay, seconds_left

from tests.support.tokens import unsigned


class Recorder:
    """A flush function that records each batch and answers each item doubled."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, list[int]]] = []

    async def __call__(self, key: str, batch: list[Pending[int, int]]) -> None:
        self.batches.append((key, [p.item for p in batch]))
        for pending in batch:
            if pending.item < 0:
                pending.fail(ValueError(f"negative {pending.item}"))
            else:
                pending.settle(pending.item * 2)


# -- coalescing ----------------------------------------------------------------


async def test_requests_of_one_iteration_share_a_flush_per_key() -> None:
    flush = Recorder()
    coalescer: Coalescer[str, int, int] = Coalescer(flush)
    futures = [coalescer.submit("a", 1), coalescer.submit("b", 2), coalescer.submit("a", 3)]
    assert flush.batches == []  # nothing is sent inside the iteration that asked
    assert await asyncio.gather(*futures) == [2, 4, 6]
    assert flush.batches == [("a", [1, 3]), ("b", [2])]


async def test_concurrent_tasks_coalesce_and_each_gets_its_own_answer() -> None:
    flush = Recorder()
    coalescer: Coalescer[str, int, int] = Coalescer(flush)

    async def ask(n: int) -> int:
        return await coalescer.submit("q", n)

    results = await asyncio.gather(*(ask(n) for n in (1, -2, 3)), return_exceptions=True)
    assert results[0] == 2 and results[2] == 6
    assert isinstance(results[1], ValueError)
    assert flush.batches == [("q", [1, -2, 3])]


async def test_a_lone_request_is_not_held_back_for_company() -> None:
    flush = Recorder()
    coalescer: Coalescer[str, int, int] = Coalescer(flush)
    future = coalescer.submit("q", 5)
    # One pass of the loop is all it waits: the flush has run after it.
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert future.done() and future.result() == 10
    later = coalescer.submit("q", 6)  # a later iteration: a batch of its own
    assert await later == 12
    assert flush.batches == [("q", [5]), ("q", [6])]


async def test_a_failing_flush_fails_what_it_left_unsettled() -> None:
    async def broken(key: str, batch: list[Pending[int, int]]) -> None:
        batch[0].settle(0)
        raise ConnectionError("socket closed")

    coalescer: Coalescer[str, int, int] = Coalescer(broken)
    first, second = coalescer.submit("q", 1), coalescer.submit("q", 2)
    assert await first == 0
    with pytest.raises(ConnectionError):
        await second


async def test_a_request_given_up_before_the_flush_is_not_sent() -> None:
    flush = Recorder()
    coalescer: Coalescer[str, int, int] = Coalescer(flush)
    kept, dropped = coalescer.submit("q", 1), coalescer.submit("q", 2)
    dropped.cancel()
    assert await kept == 2
    assert flush.batches == [("q", [1])]
    await coalescer.drain()


def test_acked_many_is_split_into_acked_and_not_acked() -> None:
    receipts = ["r1", "r2", "r3", "r4"]
    acked, rest = split_acked_many(receipts, {"op": "acked_many", "acked": 3, "stale": ["r2"]})
    assert (acked, rest) == (["r1", "r3", "r4"], ["r2"])
    assert split_acked_many(["r1"], {"acked": 0, "stale": ["r1"]}) == ([], ["r1"])
    with pytest.raises(ValueError, match="says 4 acked"):
        split_acked_many(receipts, {"acked": 4, "stale": ["r2"]})


# -- signed tokens ---------------------------------------------------------------


def test_jwt_expiry_is_read_without_a_key() -> None:
    assert jwt_expiry(unsigned({"sub": "ada", "exp": 1_900_000_000})) == 1_900_000_000.0
    assert jwt_expiry(unsigned({"sub": "ada", "exp": 1.5})) == 1.5
    # Not JWTs, or no numeric exp: a token that does not expire on its own.
    for token in (
        "lc_abcdef",
        "a.b",
        "a.!!!.c",
        unsigned({"sub": "ada"}),
        unsigned({"exp": "soon"}),
    ):
        assert jwt_expiry(token) is None, token
    assert jwt_expiry(unsigned({"exp": True})) is None
    left = seconds_left(unsigned({"exp": 1000}), now=990.0)
    assert left == 10.0


def test_refresh_comes_before_expiry_and_never_too_late() -> None:
    assert refresh_delay(3600) == 3570  # 30 s ahead of a long token
    assert refresh_delay(40) == 20  # halfway through a short one
    assert refresh_delay(10) == 5
    assert refresh_delay(-5) == 0  # already expired: at once


async def test_token_sources_plain_callable_and_async() -> None:
    assert await TokenSource("lc_x").get() == "lc_x"
    assert not TokenSource("lc_x").renewable
    calls = iter(["t1", "t2"])
    sync = TokenSource(lambda: next(calls))
    assert sync.renewable and [await sync.get(), await sync.get()] == ["t1", "t2"]

    async def fresh() -> str:
        await asyncio.sleep(0)
        return "t3"

    assert await TokenSource(fresh).get() == "t3"
    with pytest.raises(TypeError, match="not str"):
        await TokenSource(lambda: 42).get()  # type: ignore[arg-type, return-value]
    with pytest.raises(TypeError):
        TokenSource(42)  # type: ignore[arg-type]


# -- resume positions ------------------------------------------------------------


def test_a_position_resumes_only_with_offset_and_epoch() -> None:
    position = ResumePosition()
    assert position.params() == {}
    position.consumed(7)
    assert position.params() == {}  # an offset without its epoch proves nothing
    position.messages({"op": "messages", "epoch": "e1", "items": []})
    assert position.params() == {"since": 7, "epoch": "e1"}
    position.consumed(None)  # a gateway without offsets changes nothing
    assert position.offset == 7


def test_subscribed_frames_move_the_position() -> None:
    position = ResumePosition(10, "e1")
    position.subscribed(Subscribed("t", "e1", 15, recovered=True), asked=True)
    assert (position.offset, position.epoch) == (10, "e1")  # 11..15 follow
    position.subscribed(Subscribed("t", "e2", 3, recovered=False), asked=True)
    assert (position.offset, position.epoch) == (3, "e2")  # live from the latest
    fresh = ResumePosition()
    fresh.subscribed(Subscribed("t", "e9", 42, recovered=False), asked=False)
    assert fresh.params() == {"since": 42, "epoch": "e9"}


def test_only_an_unrecovered_resume_with_news_is_a_gap() -> None:
    asked = {"since": 10, "epoch": "e1"}
    assert is_gap(Subscribed("t", "e1", 12, recovered=False), asked)
    assert is_gap(Subscribed("t", "e2", 10, recovered=False), asked)  # another epoch
    assert not is_gap(Subscribed("t", "e1", 12, recovered=True), asked)
    assert not is_gap(Subscribed("t", "e1", 10, recovered=False), asked)  # nothing missed
    assert not is_gap(Subscribed("t", "e1", 12, recovered=False), {})  # nothing asked


def test_token_expiry_is_read_from_a_real_clock() -> None:
    token = unsigned({"sub": "ada", "exp": time.time() + 120})
    left = seconds_left(token)
    assert left is not None and 100 < left <= 120
