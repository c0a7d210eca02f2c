"""The ``leasecast`` command against a real gateway process: the flags of issue 21.6 and 21.9.

Each command runs as a program of its own (``.venv/bin/leasecast``), with
``LEASECAST_URL`` and ``LEASECAST_TOKEN`` from the environment, as a user
runs it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.clients import http, unique
from tests.support.databases import ROOT
from tests.support.gateways import GatewayProcess

LEASECAST = str(Path(sys.executable).parent / "leasecast")


def cli(gateway: GatewayProcess, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LEASECAST_URL": gateway.http, "LEASECAST_TOKEN": token}
    done = subprocess.run(
        [LEASECAST, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_subscribe_since_and_epoch_resume_after_that_offset(
    gateway: GatewayProcess, admin_token: str
) -> None:
    topic = unique("cli-resume")
    status, _ = http(
        "PATCH", f"{gateway.http}/api/topics/{topic}", admin_token, {"history_size": 10}
    )
    assert status == 200
    published = lines(cli(gateway, admin_token, "publish", topic, "1", "2", "3").stdout)
    first = published[0]
    since = ["--since", str(first["offset"]), "--epoch", first["epoch"]]
    done = cli(gateway, admin_token, "subscribe", topic, *since, "--count", "2")
    got = lines(done.stdout)
    assert [(m["body"], m["offset"], m["epoch"]) for m in got] == [
        (2, first["offset"] + 1, first["epoch"]),
        (3, first["offset"] + 2, first["epoch"]),
    ]
    assert done.stderr.startswith(f"leasecast: subscribed to {topic} at {gateway.http}")
    # A line it printed is a position too.
    again = cli(
        gateway, admin_token, "subscribe", topic, "--after", json.dumps(got[0]), "--count", "1"
    )
    assert [m["body"] for m in lines(again.stdout)] == [3]


def test_consume_reject_dead_letters_and_says_it_is_connected(
    gateway: GatewayProcess, admin_token: str
) -> None:
    queue = unique("cli-reject")
    cli(gateway, admin_token, "enqueue", queue, '{"bad": true}')
    done = cli(gateway, admin_token, "consume", queue, "--count", "1", "--reject")
    assert done.stderr.startswith(f"leasecast: consuming {queue} at {gateway.http}")
    assert [m["body"] for m in lines(done.stdout)] == [{"bad": True}]
    status, page = http(
        "GET", f"{gateway.http}/api/queues/{queue}/messages?state=dead", admin_token
    )
    assert status == 200
    assert [(m["body"], m["dead_reason"]) for m in page["messages"]] == [
        ({"bad": True}, "rejected")
    ]


def test_a_worker_killed_while_it_holds_a_message_gives_it_to_the_next(
    gateway: GatewayProcess, admin_token: str
) -> None:
    queue = unique("cli-hold")
    env = {**os.environ, "LEASECAST_URL": gateway.http, "LEASECAST_TOKEN": admin_token}
    holder = subprocess.Popen(
        [LEASECAST, "consume", queue, "--hold", "600"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stderr is not None and holder.stdout is not None
        assert holder.stderr.readline().startswith(f"leasecast: consuming {queue}")
        cli(gateway, admin_token, "enqueue", queue, '"held"')
        held = json.loads(holder.stdout.readline())
        assert (held["body"], held["deliveries"]) == ("held", 1)
        # Killed while holding it (it was printed, not acked): the gateway
        # releases the lease with the socket.
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(10)
    again = lines(cli(gateway, admin_token, "consume", queue, "--count", "1").stdout)
    assert [(m["body"], m["deliveries"]) for m in again] == [("held", 2)]
