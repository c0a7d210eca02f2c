"""``python -m gateway.serve``: daphne, with Leasecast's WebSocket frame limit.

This is ``daphne gateway.asgi:application`` plus two settings daphne's
command line cannot give:

- its frame and message limits default to ``GATEWAY_MAX_FRAME_BYTES``;
- a frame over the limit is answered with close code 1009, as the protocol
  says (section Errors). daphne's WebSocket library would otherwise drop the
  TCP connection without a close frame, and it refuses 1009 as a close code
  from the application, so only the transport can send it.

Any daphne option may follow, e.g. ``python -m gateway.serve -b 0.0.0.0 -p 8000``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from daphne import server as daphne_server
from daphne.cli import CommandLineInterface

DEFAULT_MAX_FRAME_BYTES = 8 * 1024 * 1024


class _ClosingWebSocketFactory(daphne_server.WebSocketFactory):  # type: ignore[misc]
    def setProtocolOptions(self, **options: Any) -> None:
        # Fail a protocol violation (an oversized frame) with a close frame
        # carrying its code (1009), not by dropping the connection.
        options["failByDrop"] = False
        super().setProtocolOptions(**options)


def daphne_args(argv: list[str]) -> list[str]:
    """daphne's arguments: ours first, so the caller's own options win."""
    limit = os.environ.get("GATEWAY_MAX_FRAME_BYTES", str(DEFAULT_MAX_FRAME_BYTES))
    args = []
    if not any(a.startswith("--websocket-max-message-size") for a in argv):
        args += ["--websocket-max-message-size", limit]
    if not any(a.startswith("--websocket-max-frame-size") for a in argv):
        args += ["--websocket-max-frame-size", limit]
    # Heartbeats: daphne pings every socket and closes one that stops
    # answering, so a vanished client leaves its topics and releases its
    # buffer and leases (GATEWAY_PING_INTERVAL / GATEWAY_PING_TIMEOUT seconds).
    if not any(a.startswith("--ping-interval") for a in argv):
        args += ["--ping-interval", os.environ.get("GATEWAY_PING_INTERVAL", "20")]
    if not any(a.startswith("--ping-timeout") for a in argv):
        args += ["--ping-timeout", os.environ.get("GATEWAY_PING_TIMEOUT", "30")]
    # daphne closes every WebSocket after 24 h by default; a worker or a
    # subscriber lives as long as its process, so no limit unless asked.
    if not any(a.startswith("--websocket_timeout") for a in argv):
        args += ["--websocket_timeout", os.environ.get("GATEWAY_WEBSOCKET_MAX_AGE", "-1")]
    args += argv
    if not any(":" in a and not a.startswith("-") and "." in a for a in argv):
        args.append("gateway.asgi:application")
    return args


def main(argv: list[str] | None = None) -> None:
    """Run daphne with Leasecast's defaults."""
    daphne_server.WebSocketFactory = _ClosingWebSocketFactory
    CommandLineInterface().run(daphne_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
