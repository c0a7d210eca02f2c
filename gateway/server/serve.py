"""``python -m gateway.serve``: daphne, with Leasecast's WebSocket frame limit.

This is ``daphne gateway.asgi:application`` plus two settings daphne's
command line cannot give:

- its frame and message limits default to ``GATEWAY_MAX_FRAME_BYTES``;
- a frame over the limit is answered with close code 1009, as the protocol
  says (section Errors). daphne's WebSocket library would otherwise drop the
  TCP connection without a close frame, and it refuses 1009 as a close code
  from the application, so only the transport can send it.

Under both servers an HTTP request body over ``GATEWAY_MAX_REQUEST_BYTES``
is answered 413 as it arrives, before the application sees the request
(gateway/server/limits.py).

No token reaches a log line: ``?token=`` values, bearer secrets and
token-shaped strings are redacted in every log record and in daphne's access
log (gateway/server/redact.py).

Any daphne option may follow, e.g. ``python -m gateway.serve -b 0.0.0.0 -p 8000``.

On SIGTERM the process drains instead of dropping everything: it stops
accepting, closes every WebSocket with 1001 and waits (at most
``GATEWAY_SHUTDOWN_GRACE`` seconds) for the consumers to finish their
disconnect, which releases a worker's leases (gateway/server/shutdown.py).

``python -m gateway.serve --server uvicorn`` runs uvicorn instead (it must be
installed: it is in the ``dev`` extra) with the same limits: message size
``GATEWAY_MAX_FRAME_BYTES`` (uvicorn closes an oversized message with 1009
itself), heartbeats every ``GATEWAY_PING_INTERVAL`` seconds with
``GATEWAY_PING_TIMEOUT``, no socket age limit (uvicorn has none), graceful
shutdown within ``GATEWAY_SHUTDOWN_GRACE`` (the gateway's sockets are closed
with 1001 first, as under daphne; uvicorn's own would be 1012). ``-b HOST``
and ``-p PORT`` work for both; other options go to the server unchanged (see
docs/operations.md, Choosing the server).
"""

from __future__ import annotations

import math
import sys
from typing import Any

from gateway.conf import environ_settings
from gateway.core.wire import CloseCode
from gateway.server.limits import raise_file_limit
from gateway.server.options import shutdown_grace
from gateway.server.redact import install_log_redaction, redacting_access_log

SERVERS = ("daphne", "uvicorn")


def _closing_websocket_factory() -> type:
    """daphne's WebSocket factory, failing a protocol violation with a close frame.

    Built on first use: importing daphne installs Twisted's asyncio reactor,
    which a uvicorn process does not need.
    """
    from daphne import server as daphne_server

    class _ClosingWebSocketFactory(daphne_server.WebSocketFactory):  # type: ignore[misc]
        def setProtocolOptions(self, **options: Any) -> None:
            # Fail a protocol violation (an oversized frame) with a close frame
            # carrying its code (1009), not by dropping the connection.
            options["failByDrop"] = False
            super().setProtocolOptions(**options)

    return _ClosingWebSocketFactory


def split_server(argv: list[str]) -> tuple[str, list[str]]:
    """The ``--server`` chosen (daphne unless given) and the other arguments."""
    server = "daphne"
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--server":
            server = next(args, "")
        elif arg.startswith("--server="):
            server = arg.partition("=")[2]
        else:
            rest.append(arg)
    if server not in SERVERS:
        raise SystemExit(f"gateway.serve: --server must be one of {', '.join(SERVERS)}")
    return server, rest


def _number(value: float) -> str:
    """A setting on a server's command line: ``20``, not ``20.0`` (daphne takes whole seconds)."""
    return str(int(value)) if value == int(value) else str(value)


def _has(argv: list[str], *names: str) -> bool:
    return any(a == n or a.startswith(n + "=") for a in argv for n in names)


def _has_app(argv: list[str]) -> bool:
    return any(":" in a and not a.startswith("-") and "." in a for a in argv)


def uvicorn_args(argv: list[str]) -> list[str]:
    """uvicorn's arguments for the gateway: Leasecast's limits, then the caller's.

    ``-b``/``--bind`` and ``-p``/``--port`` (daphne's spelling) become
    ``--host`` and ``--port``; anything else is passed on unchanged, and an
    option the caller gives wins over the default here.
    """
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in ("-b", "--bind"):
            rest += ["--host", next(args, "")]
        elif arg.startswith("--bind="):
            rest += ["--host", arg.partition("=")[2]]
        elif arg == "-p":
            rest += ["--port", next(args, "")]
        else:
            rest.append(arg)
    options = environ_settings()
    defaults = {
        # websockets' sans-I/O implementation (uvicorn's plain "websockets"
        # one is deprecated): it closes an oversized message with 1009, as
        # the protocol says, and pings.
        "--ws": "websockets-sansio",
        # Nothing in the gateway uses lifespan events; Channels' router
        # refuses them.
        "--lifespan": "off",
        "--ws-max-size": str(options.max_frame_bytes),
        "--ws-ping-interval": _number(options.ping_interval),
        "--ws-ping-timeout": _number(options.ping_timeout),
        # uvicorn takes whole seconds here.
        "--timeout-graceful-shutdown": str(math.ceil(options.shutdown_grace)),
        # Compression costs about 10% of the gateway's CPU under uvicorn for
        # frames of 100-200 bytes it does not shrink (docs/benchmarks.md,
        # Efficiency); daphne does not compress either.
        "--ws-per-message-deflate": "false",
        # uvicorn's "auto" takes uvloop whenever something installed it (a
        # benchmark baseline's dependency does): the gateway is tested and
        # measured on asyncio's own loop, so that is the default.
        "--loop": "asyncio",
    }
    args_out: list[str] = []
    for name, value in defaults.items():
        if not _has(rest, name):
            args_out += [name, value]
    args_out += rest
    if not _has_app(rest):
        args_out.insert(0, "gateway.asgi:application")
    return args_out


def daphne_args(argv: list[str]) -> list[str]:
    """daphne's arguments: ours first, so the caller's own options win."""
    options = environ_settings()
    limit = str(options.max_frame_bytes)
    args = []
    if not any(a.startswith("--websocket-max-message-size") for a in argv):
        args += ["--websocket-max-message-size", limit]
    if not any(a.startswith("--websocket-max-frame-size") for a in argv):
        args += ["--websocket-max-frame-size", limit]
    # Heartbeats: daphne pings every socket and closes one that stops
    # answering, so a vanished client leaves its topics and releases its
    # buffer and leases (GATEWAY_PING_INTERVAL / GATEWAY_PING_TIMEOUT seconds).
    if not any(a.startswith("--ping-interval") for a in argv):
        args += ["--ping-interval", _number(options.ping_interval)]
    if not any(a.startswith("--ping-timeout") for a in argv):
        args += ["--ping-timeout", _number(options.ping_timeout)]
    # daphne closes every WebSocket after 24 h by default; a worker or a
    # subscriber lives as long as its process, so no limit unless asked.
    if not any(a.startswith("--websocket_timeout") for a in argv):
        args += ["--websocket_timeout", _number(options.websocket_max_age)]
    args += argv
    if not _has_app(argv):
        args.append("gateway.asgi:application")
    return args


def _close_with_1001_on_shutdown() -> None:
    """uvicorn closes WebSockets with 1012 when it shuts down; the protocol says
    1001 (section Errors). So its shutdown first stops listening and closes the
    gateway's sockets with 1001 (up to GATEWAY_SHUTDOWN_GRACE, at most 10 s),
    then goes on as uvicorn's own: nothing is left for it to close."""
    from uvicorn.server import Server

    original = Server.shutdown

    async def shutdown(self: Server, sockets: Any = None) -> None:
        from gateway.runtime import close_sockets

        for server in self.servers:
            server.close()  # no new sockets while the open ones close
        await close_sockets(CloseCode.GOING_AWAY, wait=min(shutdown_grace(), 10.0))
        await original(self, sockets)

    Server.shutdown = shutdown  # type: ignore[method-assign]


def _is_http11_protocol(protocol: type, h11: type) -> bool:
    """uvicorn's h11 or httptools protocol (the request-cycle ones the head guard knows)."""
    if issubclass(protocol, h11):
        return True
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is not installed
        return False
    return issubclass(protocol, HttpToolsProtocol)


def _limit_uvicorn_requests() -> None:
    """uvicorn's loaded application refuses request bodies over
    ``GATEWAY_MAX_REQUEST_BYTES``, and its HTTP/1.1 connections keep the head
    deadline and per-address cap (gateway.server.limits), whatever the
    application the command line names."""
    from uvicorn.config import Config
    from uvicorn.protocols.http.h11_impl import H11Protocol

    from gateway.server.limits import (
        BodyLimit,
        PendingHeads,
        guarded_uvicorn_protocol,
        head_timeout,
        max_pending_per_address,
        max_request_bytes,
    )

    limit = max_request_bytes()
    head_seconds = head_timeout()
    pending = PendingHeads(max_pending_per_address())
    original = Config.load

    def load(self: Config) -> None:
        original(self)
        self.loaded_app = BodyLimit(self.loaded_app, limit)
        if _is_http11_protocol(self.http_protocol_class, H11Protocol):
            self.http_protocol_class = guarded_uvicorn_protocol(
                self.http_protocol_class, head_seconds=head_seconds, pending=pending
            )

    Config.load = load  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    """Run daphne (or ``--server uvicorn``) with Leasecast's defaults."""
    server, args = split_server(sys.argv[1:] if argv is None else argv)
    # No token reaches a log line, the servers' access logs included
    # (gateway/server/redact.py): clients may send theirs as ?token=.
    install_log_redaction()
    # Before the per-address cap's default is read from it (gateway.server.limits).
    raise_file_limit()
    if server == "uvicorn":
        try:
            from uvicorn.main import main as uvicorn_main
        except ImportError:
            raise SystemExit(
                "gateway.serve --server uvicorn: uvicorn is not installed "
                "(pip install 'uvicorn>=0.52.1', or the dev extra)"
            ) from None
        _close_with_1001_on_shutdown()
        _limit_uvicorn_requests()
        uvicorn_main.main(args=uvicorn_args(args), prog_name="python -m gateway.serve")
        return
    from daphne import cli as daphne_cli
    from daphne import server as daphne_server
    from daphne.cli import CommandLineInterface

    from gateway.server.autobahn_logs import plain_debug_arguments
    from gateway.server.limits import (
        PendingHeads,
        daphne_http_factory,
        head_timeout,
        max_pending_per_address,
        max_request_bytes,
    )
    from gateway.server.shutdown import DrainingServer
    from gateway.server.transport import with_transport_flow

    daphne_server.WebSocketFactory = _closing_websocket_factory()
    # autobahn colours the arguments of its per-frame debug lines even when
    # debug is off (gateway.server.autobahn_logs): 5-7% of the CPU.
    plain_debug_arguments()
    daphne_cli.AccessLogGenerator = redacting_access_log(daphne_cli.AccessLogGenerator)
    # Request bodies over GATEWAY_MAX_REQUEST_BYTES are refused as they
    # arrive, before the application (gateway.server.limits); each request
    # head must end within GATEWAY_REQUEST_HEAD_TIMEOUT, and one address may
    # have GATEWAY_MAX_PENDING_PER_ADDRESS connections waiting for theirs.
    daphne_server.HTTPFactory = daphne_http_factory(
        daphne_server.HTTPFactory,
        max_request_bytes(),
        head_seconds=head_timeout(),
        pending=PendingHeads(max_pending_per_address()),
    )
    cli = CommandLineInterface()
    # Each WebSocket's transport tells its socket when its write buffer is
    # full (gateway.server.transport, design decision 14).
    cli.server_class = with_transport_flow(DrainingServer)
    cli.run(daphne_args(args))


if __name__ == "__main__":
    main()
