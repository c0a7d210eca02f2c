"""The socket for every URL no route takes: the handshake is refused (HTTP 403)."""

from __future__ import annotations

from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer


class UnknownSocket(AsyncWebsocketConsumer):
    """Refuses the handshake, rather than letting the router raise on an unknown path."""

    async def connect(self) -> None:
        await self.close()

    async def receive(self, text_data: str | None = None, bytes_data: Any = None) -> None:
        """Never reached: the socket is never accepted."""
