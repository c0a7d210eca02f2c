"""The shop's own WebSocket, beside Leasecast's: the number of orders, once."""

from __future__ import annotations

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from orders.models import Order


class OrderCountSocket(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    async def connect(self) -> None:
        await self.accept()
        count = await database_sync_to_async(Order.objects.count)()
        await self.send_json({"orders": count})
