"""Leasecast's broker: the Django app, the standalone project, and its engine.

Importing this package imports nothing from Django, so ``gateway.core.protocol``
and ``gateway.errors`` (and the old name of the Python client,
``gateway.client``, now the ``leasecast`` distribution in ``clients/python/``)
work in plain Python programs.
``gateway.enqueue`` and ``gateway.aenqueue`` (``gateway.host.producer``) are
loaded on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["aenqueue", "enqueue"]


def __getattr__(name: str) -> Any:
    # PEP 562: the producer API needs Django, so it is imported only when used.
    if name in ("enqueue", "aenqueue", "enqueue_many"):
        from gateway.host import producer

        return getattr(producer, name)
    raise AttributeError(f"module 'gateway' has no attribute {name!r}")
