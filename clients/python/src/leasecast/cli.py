"""``leasecast``: enqueue, consume, publish, subscribe and inspect from a shell.

.. code-block:: sh

    export LEASECAST_URL=http://127.0.0.1:8000 LEASECAST_TOKEN=lc_...
    leasecast enqueue emails '{"to": "ada@example.com"}' --key signup-42
    leasecast enqueue orders '{"step": 2}' --group order-7 --priority 5 --ttl 3600
    seq 3 | leasecast enqueue emails -          # one JSON body per line of stdin
    leasecast consume emails --count 10         # print each delivery as JSON, ack it
    leasecast consume emails --hold 60          # hold each lease a minute (kill it meanwhile)
    leasecast consume emails --reject           # dead-letter each delivery instead
    leasecast stats emails
    leasecast publish prices '{"EURUSD": 1.09}'
    leasecast subscribe prices --count 5
    leasecast subscribe prices --since 42 --epoch 3f1c...   # resume after offset 42
    leasecast subscribe prices --after "$LINE"  # resume after a line publish/subscribe printed

Long-running commands say on stderr when they are connected; stdout carries
JSON lines only.

Exit codes: 0 done, 1 the gateway refused or could not be reached (the error
is printed), 2 bad usage (missing token, a body that is not JSON, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import quote

from leasecast.api import http_get
from leasecast.errors import LeasecastError, ProtocolError
from leasecast.producer import Producer
from leasecast.subscriber import Subscriber
from leasecast.worker import Worker

__all__ = [
    "UsageError",
    "build_parser",
    "enqueue_options",
    "hold_seconds",
    "main",
    "parse_bodies",
    "positive_int",
    "resume_position",
]

# The protocol's limits (docs/protocol.md, Work queue 1.1), checked before
# connecting so a typo is a usage error; tests/unit/test_client_pure.py checks
# they equal the gateway's (gateway.core.protocol), which this package cannot import.
MAX_GROUP_LENGTH = 200
MAX_PRIORITY = 100
MAX_TTL = 31_536_000.0
MAX_OFFSET = 2**63 - 1
MAX_EPOCH_LENGTH = 64
#: ``consume --hold``: at most an hour, and the lease asked for outlasts the
#: hold by HOLD_MARGIN seconds, so the ack after it is never stale.
MAX_HOLD = 3600.0
HOLD_MARGIN = 60.0

_DESCRIPTION = "Enqueue, consume, publish, subscribe and inspect Leasecast from a shell."


class UsageError(Exception):
    """Bad arguments: exit code 2."""


def positive_int(text: str) -> int:
    """An argparse type: a whole number >= 1 (also used by ``python -m spark_feed``)."""
    # argparse turns ArgumentTypeError into a usage error (exit 2) naming the option.
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser (defaults read the environment when this is called).

    Returns:
        The parser; ``parse_args`` gives ``command`` plus that command's options.
    """
    parser = argparse.ArgumentParser(prog="leasecast", description=_DESCRIPTION)
    parser.add_argument(
        "--url",
        default=os.environ.get("LEASECAST_URL", "http://127.0.0.1:8000"),
        help="the gateway (env LEASECAST_URL, default http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--token", default=os.environ.get("LEASECAST_TOKEN"), help="API token (env LEASECAST_TOKEN)"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    enqueue = commands.add_parser("enqueue", help="enqueue messages")
    enqueue.add_argument("queue")
    enqueue.add_argument("bodies", nargs="*", help="JSON bodies; '-' reads one per line of stdin")
    enqueue.add_argument("--key", help="idempotency key (one body only)")
    enqueue.add_argument("--delay", type=float, default=0.0, help="seconds before visible")
    # Read as text and checked by enqueue_options(): a bad value is one line, exit 2.
    enqueue.add_argument(
        "--group", help="delivered one at a time, in enqueue order, with others of its group"
    )
    enqueue.add_argument(
        "--priority", help=f"-{MAX_PRIORITY}..{MAX_PRIORITY}, default 0; higher goes first"
    )
    enqueue.add_argument("--ttl", help="seconds; dead-lettered as 'expired' if not acked within it")

    consume = commands.add_parser("consume", help="print deliveries as JSON lines and ack them")
    consume.add_argument("queue")
    consume.add_argument("--prefetch", type=positive_int, default=10)
    consume.add_argument("--count", type=positive_int, help="stop after this many messages")
    # Read as text and checked by consume_options(), like enqueue's options.
    consume.add_argument(
        "--hold",
        metavar="SECONDS",
        help=f"keep each lease this long before acking (up to {MAX_HOLD:.0f}); "
        "kill the worker meanwhile and the gateway gives the message to the next one",
    )
    consume.add_argument(
        "--reject",
        action="store_true",
        help="reject each delivery instead of acking it: it is dead-lettered",
    )

    publish = commands.add_parser("publish", help="publish messages to a topic")
    publish.add_argument("topic")
    publish.add_argument("bodies", nargs="*", help="JSON bodies; '-' reads one per line of stdin")

    subscribe = commands.add_parser("subscribe", help="print a topic's messages as JSON lines")
    subscribe.add_argument("topic")
    subscribe.add_argument("--count", type=positive_int, help="stop after this many messages")
    subscribe.add_argument("--capacity", type=positive_int, default=1024)
    subscribe.add_argument(
        "--on-full", default="drop_oldest", choices=["drop_oldest", "drop_newest", "block"]
    )
    subscribe.add_argument(
        "--since", metavar="OFFSET", help="resume after this offset (needs --epoch)"
    )
    subscribe.add_argument("--epoch", help="the epoch --since belongs to")
    subscribe.add_argument(
        "--after",
        metavar="LINE",
        help="resume after a JSON line that publish or subscribe printed (its offset and epoch)",
    )

    stats = commands.add_parser("stats", help="queue counts (all queues need an admin token)")
    stats.add_argument("queue", nargs="?")
    return parser


def parse_bodies(args: Iterable[str], stdin: Iterable[str]) -> list[Any]:
    """Parse message bodies given on the command line.

    Args:
        args: JSON texts; ``-`` stands for the non-empty lines of ``stdin``,
            one JSON body per line.
        stdin: the lines to read for ``-``.

    Returns:
        The bodies, in order.

    Raises:
        UsageError: a body is not JSON (the message numbers it from 1).
    """
    texts: list[str] = []
    for arg in args:
        if arg == "-":
            texts += [line for line in stdin if line.strip()]
        else:
            texts.append(arg)
    bodies: list[Any] = []
    for index, text in enumerate(texts, 1):
        try:
            bodies.append(json.loads(text))
        except json.JSONDecodeError as exc:
            raise UsageError(f"body {index} is not JSON: {exc}") from exc
    return bodies


def enqueue_options(
    group: str | None, priority: str | None, ttl: str | None
) -> tuple[str | None, int, float | None]:
    """Check ``--group``, ``--priority`` and ``--ttl`` as the gateway would.

    Returns:
        ``(group, priority, ttl)`` for :meth:`Producer.enqueue
        <leasecast.producer.Producer.enqueue>` (priority 0 when not given).

    Raises:
        UsageError: a value the gateway would refuse, named in one line.
    """
    if group is not None and not 1 <= len(group) <= MAX_GROUP_LENGTH:
        raise UsageError(f"--group must be 1-{MAX_GROUP_LENGTH} characters (it has {len(group)})")
    number = 0
    if priority is not None:
        number = _parse(int, priority)
        if not -MAX_PRIORITY <= number <= MAX_PRIORITY:
            raise UsageError(
                f"--priority must be an integer -{MAX_PRIORITY}..{MAX_PRIORITY}, not {priority!r}"
            )
    seconds = None
    if ttl is not None:
        seconds = _parse(float, ttl)
        if not 0 < seconds <= MAX_TTL:  # also refuses nan and inf
            raise UsageError(f"--ttl must be seconds > 0 and <= {MAX_TTL:.0f}, not {ttl!r}")
    return group, number, seconds


def hold_seconds(hold: str | None, reject: bool) -> float | None:
    """Check ``consume --hold`` (and that it is not given with ``--reject``).

    Returns:
        The seconds to hold each lease, or None.

    Raises:
        UsageError: out of range, not a number, or given with ``--reject``.
    """
    if hold is None:
        return None
    if reject:
        raise UsageError("--hold and --reject do not go together")
    seconds = _parse(float, hold)
    if not 0 < seconds <= MAX_HOLD:  # also refuses nan and inf
        raise UsageError(f"--hold must be seconds > 0 and <= {MAX_HOLD:.0f}, not {hold!r}")
    return float(seconds)


def resume_position(
    since: str | None, epoch: str | None, after: str | None
) -> tuple[int | None, str | None]:
    """Check ``subscribe --since/--epoch/--after`` as the gateway would.

    Args:
        since: the last offset seen, as typed.
        epoch: the epoch it belongs to.
        after: a JSON line ``publish`` or ``subscribe`` printed, carrying both.

    Returns:
        ``(since, epoch)`` for :class:`~leasecast.subscriber.Subscriber`
        (``(None, None)``: start from the live stream).

    Raises:
        UsageError: one without the other, both forms at once, or a value the
            gateway would refuse.
    """
    if after is not None:
        if since is not None or epoch is not None:
            raise UsageError("--after or --since, not both")
        try:
            line = json.loads(after)
        except json.JSONDecodeError:
            raise UsageError("--after must be a line that publish or subscribe printed") from None
        if not isinstance(line, dict) or line.get("offset") is None or not line.get("epoch"):
            raise UsageError("--after: that line has no offset and epoch")
        since, epoch = str(line["offset"]), str(line["epoch"])
    if since is None and epoch is None:
        return None, None
    if epoch is None:
        raise UsageError("--since needs --epoch (the epoch the offset belongs to)")
    if since is None:
        raise UsageError("--epoch needs --since")
    offset = _parse(int, since)
    if not 0 <= offset <= MAX_OFFSET:  # nan compares false: refused too
        raise UsageError(f"--since must be an integer 0..2^63-1, not {since!r}")
    if not 1 <= len(epoch) <= MAX_EPOCH_LENGTH:
        raise UsageError(f"--epoch must be 1-{MAX_EPOCH_LENGTH} characters (it has {len(epoch)})")
    return int(offset), epoch


def _parse(kind: type[int] | type[float], text: str) -> Any:
    """``kind(text)``, or a value out of every range (nan) if it is not one."""
    try:
        return kind(text)
    except ValueError:
        return math.nan


async def _enqueue(ns: argparse.Namespace) -> None:
    group, priority, ttl = enqueue_options(ns.group, ns.priority, ns.ttl)
    bodies = parse_bodies(ns.bodies, sys.stdin)
    if not bodies:
        raise UsageError("no bodies: give JSON bodies as arguments or '-' for stdin")
    if ns.key is not None and len(bodies) != 1:
        raise UsageError("--key applies to exactly one body")
    options: dict[str, Any] = {"group": group, "priority": priority, "ttl": ttl}
    async with Producer(ns.url, token=ns.token) as producer:
        if len(bodies) == 1:
            results = [
                await producer.enqueue(ns.queue, bodies[0], key=ns.key, delay=ns.delay, **options)
            ]
        else:
            messages = [{"body": body, "delay": ns.delay} for body in bodies]
            results = await producer.enqueue_many(ns.queue, messages, **options)
    for result in results:
        print(json.dumps(dataclasses.asdict(result)))


async def _consume(ns: argparse.Namespace) -> None:
    hold = hold_seconds(ns.hold, ns.reject)
    done = 0
    # A held lease must outlast the hold; otherwise the queue's own timeout.
    timeout = None if hold is None else hold + HOLD_MARGIN
    worker = Worker(
        ns.url, ns.queue, token=ns.token, prefetch=ns.prefetch, visibility_timeout=timeout
    )
    async with worker:
        if ns.reject:
            ending = "each message rejected (dead-lettered)"
        elif hold is not None:
            ending = f"each message held {hold:g} s, then acked"
        else:
            ending = "each message acked"
        _connected(f"consuming {ns.queue} at {ns.url} (prefetch {ns.prefetch}, {ending})")
        async for delivery in worker:
            line = {
                "queue": delivery.queue,
                "id": delivery.id,
                "deliveries": delivery.deliveries,
                "body": delivery.body,
            }
            # Protocol 1.1: shown when the message has them.
            if delivery.group is not None:
                line["group"] = delivery.group
            if delivery.priority != 0:
                line["priority"] = delivery.priority
            # Printed (and flushed) before the ack: if the ack is lost, the
            # message comes again, which is at-least-once, never at-most-once.
            print(json.dumps(line), flush=True)
            if ns.reject:
                await delivery.reject()
            else:
                if hold is not None:
                    await asyncio.sleep(hold)
                await delivery.ack()
            done += 1
            if ns.count is not None and done >= ns.count:
                return


async def _publish(ns: argparse.Namespace) -> None:
    bodies = parse_bodies(ns.bodies, sys.stdin)
    if not bodies:
        raise UsageError("no bodies: give JSON bodies as arguments or '-' for stdin")
    async with Producer(ns.url, token=ns.token) as producer:
        for body in bodies:
            result = await producer.publish(ns.topic, body)
            # offset and epoch only from a gateway with topic history
            line = {k: v for k, v in dataclasses.asdict(result).items() if v is not None}
            print(json.dumps(line))


def _connected(what: str) -> None:
    """Say on stderr that a long-running command is connected (stdout stays JSON lines)."""
    print(f"leasecast: {what}; Ctrl-C stops", file=sys.stderr, flush=True)


async def _subscribe(ns: argparse.Namespace) -> None:
    since, epoch = resume_position(ns.since, ns.epoch, ns.after)
    done = 0
    subscriber = Subscriber(
        ns.url,
        ns.topic,
        token=ns.token,
        capacity=ns.capacity,
        on_full=ns.on_full,
        since=since,
        epoch=epoch,
    )
    async with subscriber:
        where = "" if since is None else f", resuming after offset {since} of epoch {epoch}"
        _connected(f"subscribed to {ns.topic} at {ns.url}{where}")
        async for message in subscriber:
            line = {"seq": message.seq, "body": message.body, "dropped": subscriber.dropped}
            if message.offset is not None:
                # With the epoch, the line is a position to resume from (--after).
                line["offset"] = message.offset
                if subscriber.subscribed is not None:
                    line["epoch"] = subscriber.subscribed.epoch
            print(json.dumps(line), flush=True)
            done += 1
            if ns.count is not None and done >= ns.count:
                return


def _stats(ns: argparse.Namespace) -> None:
    path = f"/api/queues/{quote(ns.queue, safe='')}" if ns.queue else "/api/stats"
    print(json.dumps(http_get(ns.url, path, ns.token), indent=2))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``leasecast`` command line.

    Args:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 done, 1 refused or unreachable, 2 bad usage.

    Raises:
        SystemExit: argparse rejected the arguments (code 2) or printed ``--help`` (0).
    """
    parser = build_parser()
    ns = parser.parse_args(argv)
    if not ns.token:
        parser.print_usage(sys.stderr)
        print("leasecast: error: no token (use --token or set LEASECAST_TOKEN)", file=sys.stderr)
        return 2
    try:
        if ns.command == "enqueue":
            asyncio.run(_enqueue(ns))
        elif ns.command == "consume":
            asyncio.run(_consume(ns))
        elif ns.command == "publish":
            asyncio.run(_publish(ns))
        elif ns.command == "subscribe":
            asyncio.run(_subscribe(ns))
        else:
            _stats(ns)
    except UsageError as exc:
        print(f"leasecast: error: {exc}", file=sys.stderr)
        return 2
    except ProtocolError as exc:
        print(f"leasecast: {exc.code}: {exc.detail}", file=sys.stderr)
        for note in getattr(exc, "__notes__", ()):
            print(f"leasecast: {note}", file=sys.stderr)
        return 1
    except LeasecastError as exc:
        print(f"leasecast: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (``leasecast consume q | head``). The delivery
        # being printed was not acked, so it comes again. Point stdout at devnull
        # so the interpreter's final flush does not print a second traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
