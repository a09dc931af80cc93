"""Hosts made of network namespaces: each its own address on one bridge, as machines
on one switch. Root only; everything made here is torn down by :meth:`Net.close`.

A host's processes are found by ``ip netns pids`` (the pid namespace is shared, so
a kill from here reaches them); a partition is its veth link set down, and the host
is whole again when it is set up.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Each host's TCP retransmits at least once a second (the kernel backs off to 120 s by
# default), so after a heal the first retransmission crosses within a second: after a
# ~40 s cut the back-off had reached 13-26 s, and what a cut-off raylet must hear (that
# it was declared dead) waited that long. Retries scaled to match, so a connection still
# outlives any cut here as with the defaults (15 tries 1 s apart give up after ~14 s; 120,
# after ~2 min). Linux >= 6.15; an older kernel keeps its defaults (the heal is slower).
TCP = {"net.ipv4.tcp_rto_max_ms": "1000", "net.ipv4.tcp_retries2": "120"}


class Unavailable(Exception):
    """Namespaces cannot be made here (not root, no ``ip``, a kernel without netns)."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@dataclass(frozen=True)
class Host:
    name: str  # the namespace
    address: str
    veth: str  # the bridge's end, in the root namespace
    tmp: Path  # its own TMPDIR: engines' run dirs and logs are per host, as on machines


class Net:
    """A bridge in the root namespace (holding ``gateway_address``) and ``names`` hosts."""

    def __init__(self, names: Sequence[str], tmp: Path) -> None:
        if os.geteuid() != 0:
            raise Unavailable("network namespaces need root (run the tests as root, as CI does)")
        tag = uuid.uuid4().hex[:6]
        self.bridge = f"rcb{tag}"
        self.subnet = f"10.{random.randrange(200, 250)}.{random.randrange(1, 250)}"
        self.address = f"{self.subnet}.254"  # this (the test's) side of the switch
        self.hosts: dict[str, Host] = {}
        self._made: list[str] = []
        try:
            ip("link", "add", self.bridge, "type", "bridge")
        except (OSError, subprocess.CalledProcessError) as exc:
            raise Unavailable(f"cannot make a bridge: {_why(exc)}") from exc
        try:
            ip("addr", "add", f"{self.address}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for i, name in enumerate(names, start=1):
                self.hosts[name] = self._host(f"rc{tag}-{name}", i, tmp / name)
        except (OSError, subprocess.CalledProcessError) as exc:
            self.close()
            raise Unavailable(f"cannot make a network namespace: {_why(exc)}") from exc
        if Path("/proc/sys/net/ipv4/tcp_rto_max_ms").exists():
            try:  # a failure here is an error, not a skip
                for host in self.hosts.values():
                    settings = [f"{key}={value}" for key, value in TCP.items()]
                    ip("netns", "exec", host.name, "sysctl", "-q", "-w", *settings)
            except BaseException:
                self.close()
                raise

    def _host(self, ns: str, index: int, tmp: Path) -> Host:
        ip("netns", "add", ns)
        self._made.append(ns)
        outer, inner = f"{ns[:9]}o{index}", f"{ns[:9]}i{index}"
        ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        ip("link", "set", inner, "netns", ns)
        ip("link", "set", outer, "master", self.bridge)
        ip("link", "set", outer, "up")
        address = f"{self.subnet}.{index}"
        inside = ("netns", "exec", ns, "ip")
        ip(*inside, "addr", "add", f"{address}/24", "dev", inner)
        ip(*inside, "link", "set", inner, "up")
        ip(*inside, "link", "set", "lo", "up")
        tmp.mkdir(parents=True, exist_ok=True)
        return Host(name=ns, address=address, veth=outer, tmp=tmp)

    # -- running things on a host ----------------------------------------------------

    def popen(
        self, host: str, argv: Sequence[str], *, env: Mapping[str, str], log: Path
    ) -> subprocess.Popen[bytes]:
        h = self.hosts[host]
        with open(log, "ab") as out:
            return subprocess.Popen(
                ["ip", "netns", "exec", h.name, *argv],
                env={**env, "TMPDIR": str(h.tmp)},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def pids(self, host: str) -> list[int]:
        out = ip("netns", "pids", self.hosts[host].name, check=False).stdout
        return [int(p) for p in out.split() if p.isdigit()]

    # -- faults ----------------------------------------------------------------------

    def partition(self, host: str) -> None:
        ip("link", "set", self.hosts[host].veth, "down")

    def heal(self, host: str) -> None:
        ip("link", "set", self.hosts[host].veth, "up")

    def kill(self, host: str, timeout: float = 10.0) -> None:
        """SIGKILL every process of the host, until none is left (a machine's power cut)."""
        deadline = time.monotonic() + timeout
        while (pids := self.pids(host)) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)

    # -- teardown --------------------------------------------------------------------

    def close(self) -> list[str]:
        """Kill every process of every host, delete the namespaces and the bridge;
        returns what could not be removed (empty: all gone)."""
        left = []
        for name in list(self.hosts):
            self.kill(name)
            if self.pids(name):
                left.append(f"processes in {name}: {self.pids(name)}")
        for ns in self._made:
            if ip("netns", "del", ns, check=False).returncode != 0:
                left.append(f"namespace {ns}")
        ip("link", "del", self.bridge, check=False)  # the veths went with their namespaces
        self._made.clear()
        return left


def _why(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        return (exc.stderr or "").strip() or str(exc)
    return str(exc)
