"""WebSocket routes (protocol: Worker socket, Producer socket, Subscriber socket)."""

from __future__ import annotations

from django.urls import re_path

from consumers.dashboard import DashboardSocket
from consumers.multiplex import MultiplexSocket
from consumers.producer import ProducerSocket
from consumers.refuse import UnknownSocket
from consumers.subscriber import SubscriberSocket
from consumers.worker import WorkerSocket

websocket_urlpatterns = [
    re_path(r"^ws/queues/(?P<queue>[^/]+)/$", WorkerSocket.as_asgi()),
    re_path(r"^ws/produce/$", ProducerSocket.as_asgi()),
    re_path(r"^ws/topics/(?P<topic>[^/]+)/$", SubscriberSocket.as_asgi()),
    re_path(r"^ws/dashboard/$", DashboardSocket.as_asgi()),
    re_path(r"^ws/$", MultiplexSocket.as_asgi()),
    re_path(r"", UnknownSocket.as_asgi()),
]
