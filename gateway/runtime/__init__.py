"""The runtime of one gateway process: builds, wires, owns and shuts down its parts.

design decision 13. A gateway process has one work-queue engine, one
broadcaster (with the shared topic streams when several processes share a
Redis), one process channel on the Channels layer (for the dashboards'
exchange), one metrics registry, one per-token limiter and one watch for
revoked tokens. :class:`Runtime` builds them on the process's event loop,
hands each the others it needs through its constructor, and closes them
together; nothing else in the gateway keeps a module-level instance.

Parts of the layers above are registered, not imported: the site registers
the dashboard's live exchange with :func:`add_part`, and each runtime builds
the registered parts after its own and closes them first.

Consumers and views reach it with :func:`current_runtime` (the runtime of
the running loop: under daphne or uvicorn, the process's one loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import connections

from gateway.access.auth import RevocationWatch
from gateway.conf import GatewaySettings, gateway_settings
from gateway.core.ratelimit import TokenLimiter
from gateway.engine import PROCESS_NAME, Engine, django_store
from gateway.engine.committer import Committer
from gateway.engine.notify import start_listener, start_local_listener
from gateway.engine.schedules import Scheduler
from gateway.engine.wal import WalCheckpointer
from gateway.runtime.layer import ProcessChannel
from gateway.runtime.metrics import ProcessMetrics
from gateway.runtime.task_topics import TaskAwareTopicSettings
from gateway.topics.broadcast import Broadcaster
from gateway.topics.settings import TopicSettingsCache
from gateway.topics.streams import RedisTopics

if TYPE_CHECKING:
    from gateway.store import Store

__all__ = [
    "Runtime",
    "add_part",
    "close_sockets",
    "count_from_thread",
    "current_runtime",
    "publish_from_thread",
    "wake_from_thread",
]

T = TypeVar("T")
#: Builds a part of a runtime from the runtime (the dashboard's exchange).
PartFactory = Callable[["Runtime"], Any]


class Runtime:
    """Every long-lived part of one gateway process, built on its event loop.

    Args:
        conf: the gateway's settings.
        make_store: opens the work-queue store (a connection of its own).
        parts: builders of the parts of the layers above (default: those
            registered with :func:`add_part`).
    """

    def __init__(
        self,
        conf: GatewaySettings | None = None,
        *,
        make_store: Callable[[], Store] = django_store,
        parts: Iterable[PartFactory] | None = None,
    ) -> None:
        self.conf = conf = conf or gateway_settings()
        self.loop = asyncio.get_running_loop()
        self.process = PROCESS_NAME
        # -- the figures every part counts into (shared through Redis, if any)
        self.metrics = ProcessMetrics.for_settings(conf.redis_url, conf.redis_prefix)
        self.metrics.start()
        # -- the work queue
        self.engine = _build_engine(conf, make_store, self.loop, self.metrics)
        # -- schedules: every process fires their ticks, none leads (gateway.engine.schedules)
        self.schedules = Scheduler(
            make_store,
            on_wake=self.engine.wake_all,
            on_counted=self.metrics.registry.queue_counted,
            block_wait=conf.block_wait,
        )
        # -- per-token limits, and the watch that closes revoked tokens' sockets
        self.limiter = TokenLimiter(conf.token_limits, time.monotonic)
        self.revocations = RevocationWatch(conf.token_check_interval)
        # -- topics: settings, the shared streams (several processes), the broadcaster
        # (task topics keep their history by rule: gateway.runtime.task_topics)
        self.topic_settings: TopicSettingsCache = TaskAwareTopicSettings(conf.queue_settings_ttl)
        self.streams: RedisTopics | None = None
        if conf.redis_url:
            self.streams = RedisTopics(
                conf.redis_url,
                settings=self.topic_settings,
                prefix=conf.redis_prefix,
                window=conf.topic_relay_window,
            )
        self.broadcaster = Broadcaster(
            settings=self.topic_settings,
            shared=self.streams,
            meter=self.metrics.registry,
            block_wait=conf.block_wait,
            topic_idle=conf.topic_idle,
            topic_limit=conf.topic_limit,
        )
        if self.streams is not None:
            self.streams.start(
                self.broadcaster.deliver_read,
                self.broadcaster.restart_topic,
                self.broadcaster.epoch_of,
            )
        # -- the other processes (the dashboards' exchange)
        layer = get_channel_layer()
        cross = layer is not None and not isinstance(layer, InMemoryChannelLayer)
        self.channel = ProcessChannel(layer) if cross else None
        # -- the parts of the layers above, last: they may use all of the above
        self._parts: dict[type, Any] = {}
        for build in _part_factories.values() if parts is None else parts:
            part = build(self)
            self._parts[type(part)] = part

    def part(self, kind: type[T]) -> T:
        """This runtime's part of type ``kind`` (the dashboard's exchange).

        Raises:
            LookupError: no part of that type was registered (:func:`add_part`).
        """
        found = self._parts.get(kind)
        if found is None:
            raise LookupError(f"this process runs no {kind.__name__}: the site registers it")
        return found  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        """Stop every part (tests, and a process shutting down)."""
        for part in reversed(list(self._parts.values())):
            part.close()
        self._parts.clear()
        self.revocations.stop()
        self.broadcaster.close()
        if self.streams is not None:
            await self.streams.close()
        if self.channel is not None:
            self.channel.close()
        await self.schedules.aclose()
        self.engine.close()
        self.metrics.close()
        if _runtimes.get(self.loop) is self:
            del _runtimes[self.loop]


def _build_engine(
    conf: GatewaySettings,
    make_store: Callable[[], Store],
    loop: asyncio.AbstractEventLoop,
    metrics: ProcessMetrics,
) -> Engine:
    holder: list[Engine] = []
    committer = Committer(
        make_store,
        batch_max_ops=conf.batch_max_ops,
        max_backlog=conf.max_backlog,
        on_wake=lambda queues: holder[0].wake_all(queues),
        on_counted=metrics.registry.queue_counted,
        result_retention=conf.task_result_retention,
    )
    engine = Engine(committer, block_wait=conf.block_wait)
    holder.append(engine)

    # A cancelled lease may be held by a socket of this process (protocol 1.2: Cancel).
    def cancelled(queue: str, msg_id: str, receipt: str) -> None:
        engine.cancels.tell(queue, msg_id, receipt)

    if connections["default"].vendor == "postgresql":
        engine.listener = start_listener(engine.wake_all, PROCESS_NAME, loop, cancelled)
    else:
        # Enqueues committed by other processes on this SQLite file
        # (gateway.host.producer, admin actions) arrive as datagrams.
        engine.local_listener = loop.create_task(start_local_listener(engine.wake_all, cancelled))
        # The store's connections leave the log's checkpoints to this thread.
        engine.checkpointer = WalCheckpointer().start()
    return engine


_runtimes: dict[asyncio.AbstractEventLoop, Runtime] = {}
_part_factories: dict[str, PartFactory] = {}


def add_part(name: str, build: PartFactory) -> None:
    """Have every runtime built from now on build a part with ``build``.

    The site calls it for the dashboard's live exchange (the layers below
    never import the dashboard). The part needs a ``close()``, called when
    the runtime closes. Registering ``name`` again replaces its builder.
    """
    _part_factories[name] = build


def current_runtime() -> Runtime:
    """The runtime of the running event loop, built on first use."""
    loop = asyncio.get_running_loop()
    runtime = _runtimes.get(loop)
    if runtime is None:
        runtime = _runtimes[loop] = Runtime()
    return runtime


def wake_from_thread(queues: Iterable[str]) -> None:
    """Wake the pumps of ``queues`` from a synchronous thread (an admin action).

    The change was committed through another connection, so this process's
    pumps would not notice it; other gateway processes hear of it through
    the NOTIFY the action sends on PostgreSQL.
    """
    names = list(queues)
    for loop, runtime in list(_runtimes.items()):
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(runtime.engine.wake_all, names)


def publish_from_thread(topic: str, body: bytes) -> bool:
    """Publish ``body`` (JSON) to ``topic`` from a synchronous thread through this
    process's runtime, if it serves the gateway (a task's cancel publishes its
    outcome so). Returns False, publishing nothing, if it does not."""
    for loop, runtime in list(_runtimes.items()):
        if loop.is_closed():
            continue

        def publish(runtime: Runtime = runtime) -> None:
            done = runtime.broadcaster.publish(topic, [body])
            done.add_done_callback(lambda f: f.cancelled() or f.exception())

        with contextlib.suppress(RuntimeError):  # closed meanwhile
            loop.call_soon_threadsafe(publish)
            return True
    return False


def count_from_thread(counted: Mapping[tuple[str, str, str], int]) -> None:
    """Add what a transaction on Django's connection committed to queue
    counters to this process's runtimes' figures (the dashboard's rates)."""
    for runtime in list(_runtimes.values()):
        runtime.metrics.registry.queue_counted(counted)


async def close_sockets(code: int, *, wait: float) -> None:
    """Close every socket of the running loop's gateway with ``code``, and wait up
    to ``wait`` seconds for them to go (a server shutting down: protocol, Errors)."""
    runtime = _runtimes.get(asyncio.get_running_loop())
    if runtime is None:
        return
    sockets = runtime.engine.sockets
    for socket in list(sockets):
        socket.push_close(code)
    deadline = time.monotonic() + wait
    while sockets and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
