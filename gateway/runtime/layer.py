"""One channel-layer channel per gateway process, with one receive loop.

The dashboards' exchange talks to the other processes through it (topics have
their own relay, ``gateway.topics.streams``). ``channels_redis`` hands messages for
several process-local channels through one shared receive, and a second
concurrent receive loop in one process was seen to starve, so every user of
the layer in a process shares this channel. Handlers are registered by message
type prefix (``dashboard.``). :class:`gateway.runtime.Runtime` builds it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import TimeoutError as RedisTimeout

__all__ = ["ProcessChannel"]

log = logging.getLogger("leasecast.layer")

Handler = Callable[[dict[str, Any]], Awaitable[None]]

#: How often the groups this process is in are added again (seconds). Redis
#: forgets them when it restarts without persistence, and ``channels_redis``
#: expires a membership ``group_expiry`` (a day by default) after it was added:
#: a topic whose subscribers stay connected for longer would stop being
#: relayed to this process without it.
GROUP_REFRESH = 30.0


class ProcessChannel:
    """This process's channel on a cross-process layer.

    Args:
        layer: the Channels layer (``channels_redis``).
    """

    def __init__(self, layer: Any) -> None:
        self.layer = layer
        self.name: str | None = None
        self.ready = asyncio.Event()
        self._handlers: dict[str, Handler] = {}
        self._groups: set[str] = set()
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run())
        self._refresher = loop.create_task(self._refresh_groups())

    def close(self) -> None:
        """Stop receiving."""
        self._task.cancel()
        self._refresher.cancel()

    def on(self, prefix: str, handler: Handler) -> None:
        """Call ``handler`` for messages whose type starts with ``prefix``."""
        self._handlers[prefix] = handler

    async def join(self, group: str) -> None:
        """Add this channel to ``group`` (again after a Redis restart)."""
        await self.ready.wait()
        self._groups.add(group)
        await self.layer.group_add(group, self.name)

    async def leave(self, group: str) -> None:
        """Remove this channel from ``group``."""
        await self.ready.wait()
        self._groups.discard(group)
        await self.layer.group_discard(group, self.name)

    async def _refresh_groups(self) -> None:
        await self.ready.wait()
        while True:
            await asyncio.sleep(GROUP_REFRESH)
            await self._rejoin()

    async def _rejoin(self) -> None:
        for group in list(self._groups):
            try:
                await self.layer.group_add(group, self.name)
            except Exception as exc:
                log.warning("rejoining %s failed: %s", group, exc)

    async def _run(self) -> None:
        self.name = await self.layer.new_channel("leasecast.process.")
        self.ready.set()
        backoff = 0.1
        while True:
            try:
                message = await self.layer.receive(self.name)
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except RedisTimeout:
                continue  # an idle blocking read timed out: nothing was lost
            except Exception as exc:  # Redis restarting: keep trying
                log.warning("process channel receive failed (%s); retrying", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                await self._rejoin()  # a restarted Redis forgot them
                continue
            for prefix, handler in self._handlers.items():
                if message["type"].startswith(prefix):
                    try:
                        await handler(message)
                    except Exception:
                        log.exception("handling %s failed", message["type"])
                    break
