"""Fakes for the unit tests of the pure cores: stand-ins the test drives by hand."""

from __future__ import annotations

__all__ = ["FakeClock"]


class FakeClock:
    """A clock the test moves by hand: call it for the time, ``advance`` it to move on.

    It stands where the gateway takes a ``Callable[[], float]`` clock
    (``time.time`` or ``time.monotonic`` in production), so nothing waits for
    real time to pass.
    """

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward."""
        self.now += seconds
