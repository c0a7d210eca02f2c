"""Baseline (a): the plain Channels way to fan out.

Every subscriber socket joins a group; each publish is one ``group_send`` to
it, so the channel layer carries one message per subscriber (the in-memory
layer here). Served by daphne: ``daphne bench.channels_baseline:application``.
Clients: ``/sub/TOPIC/`` to subscribe, ``/pub/`` to publish
``{"topic", "body"}`` frames (each answered with ``{"ok": true}``).
"""

from __future__ import annotations

import os
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gateway.settings")
django.setup()

from django.conf import settings  # noqa: E402

# The in-memory layer's default capacity (100 per channel) would drop
# messages under this load and make the baseline look lossy rather than slow.
settings.CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels.layers.InMemoryChannelLayer",
        "CONFIG": {"capacity": 1_000_000},
    }
}

import orjson  # noqa: E402
from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import re_path  # noqa: E402


class Subscriber(AsyncWebsocketConsumer):  # type: ignore[misc]
    """Joins the topic's group; sends every group message as a frame."""

    async def connect(self) -> None:
        self.group = "bench." + self.scope["url_route"]["kwargs"]["topic"]
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(self.group, self.channel_name)

    async def fanout_message(self, event: dict[str, Any]) -> None:
        await self.send(text_data=event["text"])


class Publisher(AsyncWebsocketConsumer):  # type: ignore[misc]
    """One ``group_send`` per published frame."""

    async def connect(self) -> None:
        await self.accept()

    async def receive(self, text_data: str | None = None, bytes_data: Any = None) -> None:
        frame = orjson.loads(text_data or "{}")
        await self.channel_layer.group_send(
            "bench." + frame["topic"], {"type": "fanout.message", "text": text_data}
        )
        await self.send(text_data='{"ok":true}')


application = ProtocolTypeRouter(
    {
        "websocket": URLRouter(
            [
                re_path(r"^sub/(?P<topic>[\w.-]+)/$", Subscriber.as_asgi()),
                re_path(r"^pub/$", Publisher.as_asgi()),
            ]
        )
    }
)
