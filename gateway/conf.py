"""One typed view of the ``GATEWAY_*`` settings (see gateway/settings.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache

from django.conf import settings

from gateway.leases import QueueSettings
from gateway.protocol import Limits
from gateway.ratelimit import RateLimits

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
    # -- auth
    token_cache_ttl: float = 5.0
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "[::1]")
    # -- per-token limits (off by default)
    token_limits: RateLimits = field(default_factory=RateLimits)
    # -- queue defaults (protocol: Work queue)
    default_queue: QueueSettings = field(default_factory=QueueSettings)

    @property
    def limits(self) -> Limits:
        """The parser's size limits."""
        return Limits(max_body_bytes=self.max_body_bytes)


@cache
def gateway_settings() -> GatewaySettings:
    """Read the settings once per process."""
    return GatewaySettings(
        max_body_bytes=settings.GATEWAY_MAX_BODY_BYTES,
        max_frame_bytes=settings.GATEWAY_MAX_FRAME_BYTES,
        batch_max_ops=settings.GATEWAY_BATCH_MAX_OPS,
        max_backlog=settings.GATEWAY_MAX_BACKLOG,
        queue_settings_ttl=settings.GATEWAY_QUEUE_SETTINGS_TTL,
        block_wait=settings.GATEWAY_BLOCK_WAIT,
        token_cache_ttl=settings.GATEWAY_TOKEN_CACHE_TTL,
        allowed_origins=tuple(settings.GATEWAY_ALLOWED_ORIGINS),
        allowed_hosts=tuple(settings.ALLOWED_HOSTS),
        token_limits=RateLimits(
            max_sockets=settings.GATEWAY_TOKEN_MAX_SOCKETS,
            rate=settings.GATEWAY_TOKEN_RATE,
            burst=settings.GATEWAY_TOKEN_BURST,
        ),
        default_queue=QueueSettings(
            visibility_timeout=settings.GATEWAY_DEFAULT_VISIBILITY_TIMEOUT,
            max_deliveries=settings.GATEWAY_DEFAULT_MAX_DELIVERIES,
            dedup_window=settings.GATEWAY_DEFAULT_DEDUP_WINDOW,
        ),
    )
