"""docs/clients.md "Python": its example runs as written, against a live gateway.

The code block is run as a program of its own with only the environment the
section names (``LEASECAST_URL``, ``LEASECAST_TOKEN``) and a token with exactly
the scopes it lists.
"""

from __future__ import annotations

from tests.support.docs import run_example
from tests.support.gateways import GatewayProcess


def test_python_example_runs_against_a_live_gateway_twice_in_a_row(
    gateway: GatewayProcess,
) -> None:
    output = run_example(gateway, "Python", "python-example")
    assert output.splitlines() == [
        "enqueued 3 duplicates 0",
        "sending to user0@example.com delivery 1",
        "sending to user1@example.com delivery 1",
        "sending to user2@example.com delivery 1",
        "prices [101, 102, 103]",
    ]
    # Run again within the dedup window: the keys are duplicates, nothing new
    # is enqueued, and the program must not wait for jobs that are not coming.
    again = run_example(gateway, "Python", "python-example")
    assert again.splitlines() == ["enqueued 3 duplicates 3", "prices [101, 102, 103]"]
