"""A Ray node on each host of a :class:`Net`: the head (GCS, no GPU) and workers with
one fake GPU each, started by ``ray start`` inside their namespaces. Stopped by killing
the namespace's processes: ``ray stop`` would stop every Ray node on the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .netns import Net

RAY = str(Path(sys.executable).with_name("ray"))
GCS_PORT = 6380
MB = 1 << 20
START_TIMEOUT = 120.0
# Ray reads RAY_<name>. The GCS declares a node dead after `threshold` failed checks in a
# row, one per `period` after the last answer; a killed raylet refuses at once, but a
# check to a cut-off one fails only when it times out (10 s by default): 3 x (10 + 1) s
# = 33 s of a ~35 s move. With a 1 s timeout a cut link is noticed in ~6 s, as a kill,
# and the 502 one CI run of that faster move got is understood and fixed (docs/harness.md).
# The tests take 3 s: a cut link is noticed in 3 x (3 + 1) s = 12 s (Ready elsewhere in
# ~14.5 s, not ~35 s). A 1 s deadline could declare a busy raylet dead with no fault at
# all beside another worker on 2 cores; with 3 s a live raylet would have to leave three
# checks in a row unanswered for 3 s each (11 s without one answer), which no load here
# comes near (no check of a host that was not cut failed in runs beside two busy loops).
FAST_HEALTH = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "3000",
    "RAY_health_check_failure_threshold": "3",
    # A raylet declared dead while cut off exits when it learns so, once its link is back
    # (its engines with it: "the lost host's engine gone"). It hears it from a notice of
    # its own death, which did not always come, or by asking the GCS, every 60 s by
    # default: the engine outlived the heal by 14-20 s, and could by up to a minute. Here
    # it asks every second (a small RPC; only a "dead" answer has any effect).
    "RAY_raylet_liveness_self_check_interval_ms": "1000",
}
# On 2 busy cores a raylet takes longer to register than Ray's 30 s default allows.
SLOW_BOX = {"RAY_raylet_start_wait_time_s": "120"}


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECONCILE_", "RAY_"))}
    return {**env, **FAST_HEALTH, **SLOW_BOX, "RAY_USAGE_STATS_ENABLED": "0"}


class RayHosts:
    def __init__(self, net: Net, head: str, workers: Sequence[str], logs: Path) -> None:
        self.net, self.head, self.workers, self.logs = net, head, list(workers), logs
        self.address = f"{net.hosts[head].address}:{GCS_PORT}"
        self.temp = net.hosts[head].tmp / "ray"  # short: Ray's socket paths are bounded
        self.lost: set[str] = set()  # workers a test lost, revived before the next test

    def start(self) -> None:
        head = self.net.hosts[self.head]
        self._ray(
            self.head,
            "--head",
            f"--port={GCS_PORT}",
            f"--node-ip-address={head.address}",
            "--num-cpus=1",
            "--num-gpus=0",
            f"--object-store-memory={80 * MB}",
            "--include-dashboard=false",
            f"--temp-dir={self.temp}",
        ).wait(START_TIMEOUT)
        for worker in self.workers:  # one at a time: parallel starts contend for Ray's locks
            self.start_worker(worker).wait(START_TIMEOUT)
        self.wait_nodes(len(self.workers) + 1)

    def start_worker(self, name: str) -> subprocess.Popen[bytes]:
        host = self.net.hosts[name]
        return self._ray(
            name,
            f"--address={self.address}",
            f"--node-ip-address={host.address}",
            "--num-cpus=1",
            "--num-gpus=1",
            f"--object-store-memory={80 * MB}",
        )

    def lose(self, name: str) -> None:
        """The end of a test that cut off or killed a worker: its link up again (the test's
        own teardown reaches every host), and the worker revived before the next test
        (:meth:`whole`), not after the last one: the module's teardown kills it anyway."""
        self.net.heal(name)
        self.lost.add(name)

    def whole(self) -> None:
        """Every worker a test lost revived: each test starts with four nodes."""
        for name in sorted(self.lost):
            self.revive(name)
            self.lost.discard(name)

    def revive(self, name: str) -> None:
        """A worker whose node Ray declared dead (cut off, or killed) back as a new node:
        its leftovers killed, ``ray start`` again, and every host's node alive before
        the next test (it raises if not)."""
        self.net.heal(name)
        self.net.kill(name)
        self.start_worker(name).wait(START_TIMEOUT)
        self.wait_nodes(len(self.workers) + 1)

    def _ray(self, host: str, *args: str) -> subprocess.Popen[bytes]:
        return self.net.popen(
            host,
            [RAY, "start", "--disable-usage-stats", *args],
            env=base_env(),
            log=self.logs / f"ray-{host}.log",
        )

    def alive(self) -> dict[str, bool]:
        """Node address -> alive, as the GCS says (asked from the head's host)."""
        code = (
            "import json, ray, logging\n"
            f"ray.init(address={self.address!r}, logging_level=logging.ERROR,"
            " log_to_driver=False, configure_logging=False)\n"
            # pairs, not a dict: a revived node's address is also its dead one's
            "nodes = [[n['NodeManagerAddress'], n['Alive']] for n in ray.nodes()]\n"
            "print('NODES', json.dumps(nodes))\n"
        )
        host = self.net.hosts[self.head]
        out = subprocess.run(
            ["ip", "netns", "exec", host.name, sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            env={**base_env(), "TMPDIR": str(host.tmp)},
        )
        # Ray's own log lines may come on stdout too, after ours (seen while a link is cut)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("NODES ")]
        if out.returncode != 0 or not lines:
            return {}
        nodes: dict[str, bool] = {}
        for address, alive in json.loads(lines[-1].removeprefix("NODES ")):
            nodes[address] = nodes.get(address, False) or alive  # a node restarted: any alive
        return nodes

    def wait_nodes(self, count: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if sum(self.alive().values()) >= count:  # by address: a revived node counts once
                return
            time.sleep(1.0)
        logs = "\n".join(p.read_text(errors="replace")[-1500:] for p in self.logs.glob("ray-*"))
        raise AssertionError(f"the Ray cluster never had {count} live nodes:\n{logs}")
