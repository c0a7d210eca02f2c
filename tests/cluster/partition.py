"""Network partitions between the hosts of a deployment (tests/cluster/netns.py).

A partition between two groups of hosts makes every packet from one group to
the other vanish, silently, in both directions, as a switch that stopped
forwarding between them would: nothing is refused, nothing is answered, an
open TCP connection just stops hearing from its peer, and a new one times
out. Every other pair of hosts still talks.

It is made with what iproute2 alone can do (the namespaces need it anyway):
each host of one group gets a permanent neighbour entry for each host of the
other that names a hardware address no interface has. The host then sends
its packets for that address to nobody (the bridge floods them, every port
drops them), and, the entries being made on both sides, the answers go
nowhere either. A permanent entry is never replaced by an ARP answer, so
the cut holds until :meth:`Partition.heal` deletes the entries; the hosts
then resolve each other again and their open connections carry on (TCP
retransmits what was lost).

Why not the usual tools: this machine's kernel has no ``netem`` queueing
discipline and no ``gact`` action (``tc ... action drop`` fails), and
nftables/iptables are not installed; a route (``blackhole``, ``prohibit``)
would refuse packets at once with an error, which is not what a partition
looks like to a program.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from tests.cluster.netns import Host

__all__ = ["NOWHERE", "Partition", "partitioned"]

#: A locally administered unicast hardware address that no interface of a deployment has.
NOWHERE = "02:00:00:00:de:ad"


def _neigh(host: Host, *args: str, check: bool = True) -> None:
    subprocess.run(
        ["ip", "-n", host.ns, "neigh", *args, "dev", "eth0"],
        capture_output=True,
        text=True,
        timeout=20,
        check=check,
    )


class Partition:
    """A cut between ``side`` and ``other``: no packet between them, either way.

    Attributes:
        cut_at: ``time.time()`` when the cut was made (None before).
        healed_at: ``time.time()`` when it was healed (None before).
    """

    def __init__(self, side: Iterable[Host], other: Iterable[Host]) -> None:
        self.side = list(side)
        self.other = list(other)
        if {h.name for h in self.side} & {h.name for h in self.other}:
            raise ValueError("a host cannot be cut from itself")
        self.cut_at: float | None = None
        self.healed_at: float | None = None

    def __repr__(self) -> str:
        side, other = (",".join(h.name for h in hosts) for hosts in (self.side, self.other))
        return f"Partition({side} | {other})"

    def _pairs(self) -> Iterator[tuple[Host, Host]]:
        for a in self.side:
            for b in self.other:
                yield a, b
                yield b, a

    def cut(self) -> None:
        """Stop every packet between the two sides (both directions)."""
        for host, peer in self._pairs():
            _neigh(host, "replace", peer.address, "lladdr", NOWHERE, "nud", "permanent")
        self.cut_at = time.time()

    def heal(self) -> None:
        """Let the two sides talk again (idempotent): the hosts resolve each other anew."""
        if self.cut_at is None or self.healed_at is not None:
            return
        for host, peer in self._pairs():
            _neigh(host, "del", peer.address, check=False)
        self.healed_at = time.time()


@contextmanager
def partitioned(side: Iterable[Host], other: Iterable[Host]) -> Iterator[Partition]:
    """A :class:`Partition` cut for the block and healed after it, whatever happens."""
    partition = Partition(side, other)
    partition.cut()
    try:
        yield partition
    finally:
        partition.heal()
