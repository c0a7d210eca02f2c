"""daphne's WebSocket library without colour in its debug lines: cheaper frames.

autobahn (daphne's WebSocket library) logs every read and every send at
debug level, and builds that line's arguments before the logger looks at
its level: ``hltype(self.sendData)`` inspects the method, splits its
qualified name and colours both halves with ``click.style``; ``hlval``
colours the peer and the byte count. With debug off the line is dropped,
but the arguments were paid for: 5-7% of the gateway's CPU in the task
benchmark (docs/benchmarks.md, Tasks), on every frame of every workload.

:func:`plain_debug_arguments` gives autobahn's WebSocket modules plain
versions of the two helpers: the value itself, which a debug line (if one
is ever enabled) formats without colour. Nothing else changes.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["plain_debug_arguments"]

#: autobahn's modules on the frame path that import ``hltype``/``hlval`` by name.
FRAME_MODULES = ("autobahn.websocket.protocol", "autobahn.twisted.websocket")
#: The colouring helpers swapped in each of them.
HELPERS = ("hltype", "hlval")


def _as_is(value: Any, *args: Any, **kwargs: Any) -> Any:
    """``hltype``/``hlval`` without the colour: the value, formatted only if logged."""
    return value


def plain_debug_arguments() -> list[str]:
    """Swap autobahn's colouring helpers for :func:`_as_is` in :data:`FRAME_MODULES`.

    Returns:
        The modules changed (one that is missing, or no longer has the
        helpers, is left as it is).
    """
    changed = []
    for name in FRAME_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        for helper in HELPERS:
            if callable(getattr(module, helper, None)):
                setattr(module, helper, _as_is)
                if name not in changed:
                    changed.append(name)
    return changed
