"""Separate hosts on one machine: network namespaces on a bridge of their own.

A :class:`Network` is a namespace holding a bridge (the "switch") and one
namespace per :class:`Host`, each joined to the bridge by a veth pair and
given its own address in :data:`SUBNET`. The switch lives in a namespace
too, so the machine's own namespace has no route to the hosts: nothing of
theirs reaches a real network, and two runs of the tests (each with its own
names) never see each other, even with the same addresses.

A host's processes are started with ``ip netns exec`` (so their sockets are
the host's); the test process itself reaches a host from inside a namespace
with :meth:`Host.call`, which runs a function on a thread that has joined the
host's network namespace (``setns(2)`` is per thread), so a socket it opens
belongs to that host and can then be used by the event loop.

Everything is torn down by :meth:`Network.close` (every process of every
host is killed, then the namespaces are deleted), whatever the test did;
namespaces left by a run that was itself killed are swept by the next one
(:func:`sweep_stale`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["SUBNET", "Host", "Network", "netns_unavailable", "sweep_stale"]

T = TypeVar("T")

#: The hosts' private range: it exists only inside the namespaces made here.
SUBNET = "10.231.0"
#: Namespace names of this suite: ``lcc<pid of the test run>-<id>-<host>``.
_PREFIX = "lcc"
_NAME = re.compile(rf"^{_PREFIX}(\d+)-")
_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20, check=check)


def netns_unavailable() -> str | None:
    """Why namespaces cannot be made here (not root, no ``ip``, not permitted), or None."""
    if os.geteuid() != 0:
        return "separate hosts need network namespaces, which need root"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2) to make network namespaces with"
    probe = f"{_PREFIX}{os.getpid()}-probe{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed here: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace(ns: str) -> None:
    """SIGKILL every process in namespace ``ns`` until none is left, then delete it."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        listed = _ip("netns", "pids", ns, check=False)
        pids = [int(p) for p in listed.stdout.split()] if listed.returncode == 0 else []
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    _ip("netns", "del", ns, check=False)


def sweep_stale() -> list[str]:
    """Delete this suite's namespaces whose test run is gone (it was killed); returns them."""
    listed = _ip("netns", "list", check=False).stdout.split("\n")
    swept = []
    for line in listed:
        name = line.split(" ", 1)[0]
        match = _NAME.match(name)
        if match and not _alive(int(match.group(1))):
            _kill_namespace(name)
            swept.append(name)
    return swept


class Host:
    """One host: a network namespace with an address on the network's bridge."""

    def __init__(self, name: str, ns: str, address: str) -> None:
        self.name = name
        self.ns = ns
        self.address = address
        self.processes: list[subprocess.Popen[bytes]] = []

    def __repr__(self) -> str:
        return f"Host({self.name} {self.address})"

    def command(self, argv: Sequence[str], user: str | None = None) -> list[str]:
        """``argv`` run in this host's namespace (as ``user``, if given)."""
        prefix = ["ip", "netns", "exec", self.ns]
        if user is not None:
            # setpriv execs (runuser would fork and keep a parent in between).
            prefix += ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"]
        return [*prefix, *argv]

    def popen(
        self,
        argv: Sequence[str],
        log: Path,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        user: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` on this host, its output appended to ``log``."""
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                self.command(argv, user), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd
            )
        self.processes.append(proc)
        return proc

    def run(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        user: str | None = None,
        timeout: float = 120,
    ) -> str:
        """Run ``argv`` on this host to the end; returns its stdout.

        Raises:
            RuntimeError: it failed (its output is in the message).
        """
        done = subprocess.run(
            self.command(argv, user),
            capture_output=True,
            text=True,
            env=env,
            cwd=cwd,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{self.name}: {' '.join(argv)} failed ({done.returncode}):\n"
                f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            )
        return done.stdout

    def call(self, fn: Callable[[], T], timeout: float = 60) -> T:
        """``fn()`` on a thread inside this host's network namespace; its result or exception."""
        outcome: dict[str, Any] = {}

        def inside() -> None:
            try:
                fd = os.open(f"/run/netns/{self.ns}", os.O_RDONLY)
                try:
                    if _libc.setns(fd, _CLONE_NEWNET) != 0:
                        err = ctypes.get_errno()
                        raise OSError(err, f"setns into {self.ns}: {os.strerror(err)}")
                finally:
                    os.close(fd)
                outcome["value"] = fn()
            except BaseException as exc:
                outcome["error"] = exc

        # A thread of its own, which ends with the call: no other code of the
        # process ever runs in the host's namespace by accident.
        thread = threading.Thread(target=inside, name=f"in-{self.name}", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"{self.name}: call did not finish within {timeout} s")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]  # type: ignore[no-any-return]

    def pids(self) -> list[int]:
        """Every process running in this host's namespace."""
        listed = _ip("netns", "pids", self.ns, check=False)
        return [int(p) for p in listed.stdout.split()]

    def kill_all(self) -> None:
        """``kill -9`` of everything on the host (a host that died); its address stays."""
        deadline = time.monotonic() + 20
        while self.pids() and time.monotonic() < deadline:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        for proc in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5)


class Network:
    """A bridge and hosts on it, each in a network namespace; :meth:`close` removes all."""

    def __init__(self) -> None:
        sweep_stale()
        self.prefix = f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:4]}"
        self.switch = f"{self.prefix}-switch"
        self.hosts: dict[str, Host] = {}
        self._closed = False
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
        except BaseException:
            self.close()
            raise

    def add(self, name: str, octet: int) -> Host:
        """A new host ``name`` at ``SUBNET.octet``, its ``eth0`` on the bridge."""
        ns = f"{self.prefix}-{name}"
        host = Host(name, ns, f"{SUBNET}.{octet}")
        self.hosts[name] = host
        port = f"p{octet}"  # the host's end in the switch's namespace
        _ip("netns", "add", ns)
        _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns",
            self.switch)  # fmt: skip
        _ip("-n", self.switch, "link", "set", port, "master", "br0")
        _ip("-n", self.switch, "link", "set", port, "up")
        _ip("-n", ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        return host

    def close(self) -> None:
        """Kill every process of every host and delete every namespace (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for host in self.hosts.values():
            _kill_namespace(host.ns)
            for proc in host.processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        _kill_namespace(self.switch)

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
