"""The Python client of Leasecast: no Django needed, built on ``websockets`` and ``orjson``.

- :class:`Worker`: consume a queue (async iteration over :class:`Delivery`).
- :class:`Producer`: enqueue, one message or many, and publish.
- :class:`HttpWorker`: consume a queue over plain HTTP (lease, ack, nack,
  reject, extend; synchronous, standard library only), for programs that
  cannot hold a socket open.
- :class:`Subscriber`: receive a broadcast topic (async iteration over
  :class:`Message`), resuming from its offset after a reconnect.
- :class:`Multiplexer`: many topics on one socket (``/ws/``), each a
  :class:`Subscription` with its own credit, policy and resume; presence.
- Results are dataclasses: :class:`EnqueueResult`, :class:`PublishResult`,
  :class:`Subscribed`.
- Errors: :mod:`leasecast.errors` (the gateway shares the same tree); close
  codes: :class:`CloseCode` (:mod:`leasecast.close_codes`, shared too).
- Helpers for code of your own: :func:`http_get` reads a JSON document of
  the gateway's HTTP API with a token (:mod:`leasecast.api`);
  :func:`backoff_delays` yields the jittered, capped exponential delays the
  clients reconnect after.
- ``leasecast``: the console script (:mod:`leasecast.cli`).
"""

from __future__ import annotations

from leasecast.api import http_get
from leasecast.close_codes import CloseCode
from leasecast.http_worker import HttpDelivery, HttpWorker
from leasecast.link import backoff_delays
from leasecast.multiplex import Multiplexer, Subscription
from leasecast.producer import Producer
from leasecast.results import EnqueueResult, PublishResult, Subscribed
from leasecast.subscriber import Message, Subscriber
from leasecast.worker import Delivery, Worker

__all__ = [
    "CloseCode",
    "Delivery",
    "EnqueueResult",
    "HttpDelivery",
    "HttpWorker",
    "Message",
    "Multiplexer",
    "Producer",
    "PublishResult",
    "Subscribed",
    "Subscriber",
    "Subscription",
    "Worker",
    "backoff_delays",
    "http_get",
]
