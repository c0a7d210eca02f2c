"""One typed view of the ``GATEWAY_*`` settings, and the one place their defaults are written.

:class:`GatewaySettings` holds every knob with its default. Two readers fill it:

- :func:`gateway_settings`, inside Django: the ``GATEWAY_*`` Django settings
  (a host project may leave any out; the standalone service's
  ``gateway/site/settings.py`` reads them from the environment, taking its
  defaults from this class);
- :func:`environ_settings`, before Django starts: the serving process's own
  options (``python -m gateway.serve``: frame and request limits, heartbeats,
  the request-head deadline, the shutdown grace) from the environment.

Nothing else reads ``GATEWAY_*`` variables from the environment
(tests/unit/test_settings_source.py checks it).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings

from gateway.core.leases import QueueSettings
from gateway.core.protocol import Limits
from gateway.core.ratelimit import RateLimits

__all__ = [
    "GatewaySettings",
    "client_setting",
    "environ_settings",
    "gateway_settings",
    "var_dir",
]

#: The checkout (or installed tree) that holds ``gateway/``.
BASE_DIR = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class GatewaySettings:
    """The gateway's knobs, with the protocol's defaults."""

    # -- sizes
    #: the parser's limit, whose default the pure core holds (it parses without Django)
    max_body_bytes: int = Limits().max_body_bytes
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
    #: subscriptions one multiplexed socket (``/ws/``) may hold
    max_subscriptions: int = 1000
    #: seconds between the comment lines that keep an idle event stream
    #: (``/sse/``) open through proxies; the protocol promises at most 15
    sse_keepalive: float = 10.0
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
    # -- the serving process (python -m gateway.serve), read by environ_settings()
    #: the largest HTTP request body, refused (413) as it arrives
    max_request_bytes: int = 16 * 1024 * 1024
    #: seconds a request head may take; 0: no deadline
    request_head_timeout: float = 20.0
    #: connections one address may have waiting for their head; 0: no cap;
    #: None: a quarter of the process's file limit, between 64 and 1,024
    max_pending_per_address: int | None = None
    #: seconds between WebSocket pings, and for the answer
    ping_interval: float = 20.0
    ping_timeout: float = 30.0
    #: seconds a WebSocket may live under daphne; -1: no limit
    websocket_max_age: float = -1.0
    #: seconds a stopping process waits for its sockets to finish
    shutdown_grace: float = 30.0

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
        max_subscriptions=_setting("GATEWAY_MAX_SUBSCRIPTIONS", d.max_subscriptions),
        sse_keepalive=float(_setting("GATEWAY_SSE_KEEPALIVE", d.sse_keepalive)),
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
        dashboard_oldest_alert=float(
            _setting("GATEWAY_DASHBOARD_OLDEST_ALERT", d.dashboard_oldest_alert)
        ),
    )


def environ_settings(environ: Mapping[str, str] | None = None) -> GatewaySettings:
    """The serving process's options from the environment (``os.environ`` by default).

    Read before Django is set up (``python -m gateway.serve``); the fields it
    does not read keep their defaults. An empty variable is unset.

    Raises:
        ValueError: a variable that is not a number, or out of its range (the
            message names it).
    """
    env = os.environ if environ is None else environ
    d = GatewaySettings()
    pending = env.get("GATEWAY_MAX_PENDING_PER_ADDRESS")
    return GatewaySettings(
        max_frame_bytes=int(_number(env, "GATEWAY_MAX_FRAME_BYTES", d.max_frame_bytes, 1)),
        max_request_bytes=int(_number(env, "GATEWAY_MAX_REQUEST_BYTES", d.max_request_bytes, 1)),
        request_head_timeout=_seconds(env, "GATEWAY_REQUEST_HEAD_TIMEOUT", d.request_head_timeout),
        max_pending_per_address=(
            int(_number(env, "GATEWAY_MAX_PENDING_PER_ADDRESS", 0, 0)) if pending else None
        ),
        ping_interval=_seconds(env, "GATEWAY_PING_INTERVAL", d.ping_interval),
        ping_timeout=_seconds(env, "GATEWAY_PING_TIMEOUT", d.ping_timeout),
        websocket_max_age=_seconds(env, "GATEWAY_WEBSOCKET_MAX_AGE", d.websocket_max_age, -1),
        shutdown_grace=_seconds(env, "GATEWAY_SHUTDOWN_GRACE", d.shutdown_grace),
    )


def _number(env: Mapping[str, str], name: str, default: int, low: int) -> int:
    """``env[name]`` as a whole number >= ``low``, else ``default``."""
    value = env.get(name, "")
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: not a whole number") from None
    if number < low:
        raise ValueError(f"{name}={value!r}: must be {low} or more")
    return number


def _seconds(env: Mapping[str, str], name: str, default: float, low: float = 0) -> float:
    """``env[name]`` as a finite number of seconds >= ``low``, else ``default``."""
    value = env.get(name, "")
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: not a number of seconds") from None
    if not seconds >= low or not math.isfinite(seconds):
        raise ValueError(f"{name}={value!r}: must be {low:g} or more seconds")
    return seconds


def client_setting(name: str) -> str | None:
    """A ``LEASECAST_*`` setting of a process that talks to the gateway (the
    Django setting, else the environment variable of the same name): the
    gateway's ``LEASECAST_URL`` and ``LEASECAST_TOKEN`` for ``gateway.enqueue``
    without Leasecast installed and for the task worker, and the worker's
    ``LEASECAST_WORKER_PREFETCH_MULTIPLIER``."""
    value = getattr(settings, name, None) or os.environ.get(name)
    return str(value) if value else None


def var_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the standalone service keeps its state (``GATEWAY_VAR_DIR``, default ``var/``)."""
    env = os.environ if environ is None else environ
    return Path(env.get("GATEWAY_VAR_DIR") or BASE_DIR / "var")
