"""The Python client of Leasecast: no Django needed, built on ``websockets``.

- :class:`Worker`: consume a queue (async iteration over :class:`Delivery`).
- :class:`Producer`: enqueue, one message or many, and publish.
- :class:`Subscriber`: receive a broadcast topic (async iteration over :class:`Message`).
- ``leasecast``: the console script (``gateway.client.cli``).
"""

from __future__ import annotations

from gateway.client.producer import Producer
from gateway.client.subscriber import Message, Subscriber
from gateway.client.worker import Delivery, Worker

__all__ = ["Delivery", "Message", "Producer", "Subscriber", "Worker"]
