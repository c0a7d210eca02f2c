"""One typed view of the ``GATEWAY_*`` settings (see gateway/site/settings.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from django.conf import settings

from gateway.core.leases import QueueSettings
from gateway.core.protocol import Limits
from gateway.core.ratelimit import RateLimits

__all__ = ["GatewaySettings", "gateway_settings"]


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """The gateway's knobs, with the protocol's defaults."""

    # -- sizes
    max_body_bytes: int = 256 * 1024
    max_frame_bytes: int = 8 * 1024 * 1024
    # -- store
    batch_max_ops: int = 4000
    max_backlog: int = 100_000
    queue_settings_ttl: float = 2.0
    #: seconds a ``block`` queue or topic makes its producer wait for room
    block_wait: float = 10.0
    #: seconds after which a topic with no subscriber and no publish is forgotten
    topic_idle: float = 300.0
    #: topics with no subscriber a process keeps counters for; beyond it the
    #: least recently published are forgotten at once (ever-new names)
    topic_limit: int = 10_000
    # -- process
    #: allocations between two collections of the garbage collector's youngest
    #: generation in the standalone service (Python's default is 700); 0 leaves
    #: Python's settings alone
    gc_threshold: int = 10_000
    #: the Redis that several gateway processes share (topic offsets, history
    #: and relay: gateway.topics.streams); empty: one process, topics in memory
    redis_url: str = ""
    #: prefix of every Redis key Leasecast writes
    redis_prefix: str = "leasecast"
    #: messages a topic's Redis stream keeps at least, history or not, so a
    #: process that falls behind can catch up before it counts a loss
    topic_relay_window: int = 10_000
    # -- auth
    token_cache_ttl: float = 5.0
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "[::1]")
    #: HS256 key of signed tokens (gateway.tokens); empty: signed tokens are refused
    signing_key: str = field(default="", repr=False)  # never in a log line
    #: the longest a signed token may still live when used, seconds; 0: no maximum
    signing_max_ttl: float = 86400.0
    #: the ``aud`` and ``iss`` a signed token must carry; empty: not looked at
    signing_audience: str = ""
    signing_issuer: str = ""
    #: seconds between this process's checks that its sockets' stored tokens still stand
    token_check_interval: float = 2.0
    # -- per-token limits (off by default)
    token_limits: RateLimits = field(default_factory=RateLimits)
    # -- queue defaults (protocol: Work queue)
    default_queue: QueueSettings = field(default_factory=QueueSettings)
    # -- serving
    serve_static: bool = True
    #: GET /metrics without a token (GATEWAY_METRICS_PUBLIC=1)
    metrics_public: bool = False
    # -- django.tasks results (gateway.tasks): seconds a finished result is kept
    task_result_retention: float = 7 * 24 * 3600.0
    # -- dashboard: seconds a queue's oldest visible message may wait before
    # the dashboard's alerts panel lists the queue
    dashboard_oldest_alert: float = 60.0

    @property
    def limits(self) -> Limits:
        """The parser's size limits."""
        return Limits(max_body_bytes=self.max_body_bytes)


def _setting(name: str, default: Any) -> Any:
    """A ``GATEWAY_*`` Django setting, or the default when a host project leaves it out."""
    return getattr(settings, name, default)


@cache
def gateway_settings() -> GatewaySettings:
    """Read the settings once per process.

    Every ``GATEWAY_*`` setting is optional: a Django project that adds
    Leasecast to ``INSTALLED_APPS`` gets the defaults here (the standalone
    service's ``gateway/site/settings.py`` reads them from the environment).
    """
    d = GatewaySettings()
    queue = d.default_queue
    return GatewaySettings(
        max_body_bytes=_setting("GATEWAY_MAX_BODY_BYTES", d.max_body_bytes),
        max_frame_bytes=_setting("GATEWAY_MAX_FRAME_BYTES", d.max_frame_bytes),
        batch_max_ops=_setting("GATEWAY_BATCH_MAX_OPS", d.batch_max_ops),
        max_backlog=_setting("GATEWAY_MAX_BACKLOG", d.max_backlog),
        queue_settings_ttl=_setting("GATEWAY_QUEUE_SETTINGS_TTL", d.queue_settings_ttl),
        block_wait=_setting("GATEWAY_BLOCK_WAIT", d.block_wait),
        topic_idle=_setting("GATEWAY_TOPIC_IDLE", d.topic_idle),
        topic_limit=_setting("GATEWAY_TOPIC_LIMIT", d.topic_limit),
        gc_threshold=_setting("GATEWAY_GC_THRESHOLD", d.gc_threshold),
        redis_url=_setting("REDIS_URL", d.redis_url) or "",
        redis_prefix=_setting("GATEWAY_REDIS_PREFIX", d.redis_prefix),
        topic_relay_window=_setting("GATEWAY_TOPIC_RELAY_WINDOW", d.topic_relay_window),
        token_cache_ttl=_setting("GATEWAY_TOKEN_CACHE_TTL", d.token_cache_ttl),
        allowed_origins=tuple(_setting("GATEWAY_ALLOWED_ORIGINS", d.allowed_origins)),
        allowed_hosts=tuple(settings.ALLOWED_HOSTS),
        signing_key=_setting("GATEWAY_SIGNING_KEY", d.signing_key) or "",
        signing_max_ttl=float(_setting("GATEWAY_SIGNING_MAX_TTL", d.signing_max_ttl)),
        signing_audience=_setting("GATEWAY_SIGNING_AUDIENCE", d.signing_audience) or "",
        signing_issuer=_setting("GATEWAY_SIGNING_ISSUER", d.signing_issuer) or "",
        token_check_interval=_setting("GATEWAY_TOKEN_CHECK_INTERVAL", d.token_check_interval),
        token_limits=RateLimits(
            max_sockets=_setting("GATEWAY_TOKEN_MAX_SOCKETS", d.token_limits.max_sockets),
            rate=_setting("GATEWAY_TOKEN_RATE", d.token_limits.rate),
            burst=_setting("GATEWAY_TOKEN_BURST", d.token_limits.burst),
        ),
        default_queue=QueueSettings(
            visibility_timeout=_setting(
                "GATEWAY_DEFAULT_VISIBILITY_TIMEOUT", queue.visibility_timeout
            ),
            max_deliveries=_setting("GATEWAY_DEFAULT_MAX_DELIVERIES", queue.max_deliveries),
            dedup_window=_setting("GATEWAY_DEFAULT_DEDUP_WINDOW", queue.dedup_window),
        ),
        serve_static=_setting("GATEWAY_SERVE_STATIC", d.serve_static),
        metrics_public=bool(_setting("GATEWAY_METRICS_PUBLIC", d.metrics_public)),
        task_result_retention=_setting("GATEWAY_TASK_RESULT_RETENTION", d.task_result_retention),
        # Also read from the environment here, so the standalone service takes it
        # without a line in gateway/site/settings.py.
        dashboard_oldest_alert=float(
            _setting(
                "GATEWAY_DASHBOARD_OLDEST_ALERT",
                os.environ.get("GATEWAY_DASHBOARD_OLDEST_ALERT", d.dashboard_oldest_alert),
            )
        ),
    )
