"""``GET /api/topics/TOPIC/presence``: who is subscribed to a topic (protocol 1.2: Presence).

Every subscription of the topic on every gateway process (subscriber sockets,
multiplexed subscriptions and event streams), while the topic's ``presence``
setting is on; with it off the answer is 400 ``invalid``.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from consumers.http import _json, api
from gateway.core.errors import Invalid
from gateway.core.protocol import check_name
from gateway.core.scopes import Principal
from gateway.runtime import current_runtime

__all__ = ["topic_presence"]


@api("GET")
async def topic_presence(request: HttpRequest, principal: Principal, topic: str) -> HttpResponse:
    """``{"topic", "count", "clients": [{"client", "user", "info"}, ...]}``.

    Scope ``subscribe`` on the topic, or an operator's (``admin``; a staff
    session with the view permission).
    """
    check_name(topic, "topic")
    principal.require_operator("view_queue", "subscribe", topic)
    broadcaster = current_runtime().broadcaster
    settings = await broadcaster.settings.get(topic)
    if not settings.presence:
        raise Invalid(
            f"topic {topic!r} has no presence: turn its presence setting on "
            '(PATCH /api/topics/TOPIC {"presence": true})'
        )
    members = await broadcaster.presence.members(topic)
    clients = sorted((m.as_json() for m in members), key=lambda c: (c["user"], c["client"]))
    return _json({"topic": topic, "count": len(clients), "clients": clients})
