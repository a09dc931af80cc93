"""reconcile on the head's host of the namespace cluster: manifests, the daemon with its
gateway (reached from here over the bridge), the records, and each host's engines."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from controller.core.state import Phase, Record
from controller.store.instances.recordjson import from_json

from .rayhosts import RayHosts, base_env

GATEWAY_PORT = 8080
MARKER = b"RECONCILE_INSTANCE="
WAIT = 120.0
ENGINE = [sys.executable, "-m", "controller.demo.engine"]


class Head:
    def __init__(self, hosts: RayHosts, tmp: Path) -> None:
        self.hosts, self.net, self.tmp = hosts, hosts.net, tmp
        self.folder, self.state = tmp / "manifests", tmp / "state"
        self.folder.mkdir()
        self.address = self.net.hosts[hosts.head].address
        self.daemons: list[subprocess.Popen[bytes]] = []

    def write(self, name: str, **spec: Any) -> None:
        body: dict[str, Any] = {
            "engine": "command",
            "command": [*ENGINE, "--host", "0.0.0.0", "--port", "{port}", "--model", "{name}"],
            "devices": {"count": 1},
            "readiness": {"httpGet": {"path": "/health"}, "deadlineSeconds": 90},
            "stopGracePeriodSeconds": 2,
            **spec,
        }
        doc = {"apiVersion": "reconcile/v1", "kind": "Deployment", "metadata": {"name": name}}
        (self.folder / f"{name}.yaml").write_text(yaml.safe_dump({**doc, "spec": body}))

    def start(self) -> subprocess.Popen[bytes]:
        """The daemon (and so the gateway) on the head's host."""
        argv = [sys.executable, "-m", "controller", "--backend", "ray"]
        argv += ["--ray-address", self.hosts.address, "--resync", "1s", "-f", str(self.folder)]
        argv += ["--state-dir", str(self.state), "--insecure-listen"]
        argv += ["--listen", f"{self.address}:{GATEWAY_PORT}"]
        log = self.tmp / f"daemon-{len(self.daemons)}.log"
        proc = self.net.popen(self.hosts.head, argv, env=base_env(), log=log)
        self.daemons.append(proc)
        return proc

    def kill_daemon(self) -> None:
        proc = self.daemons[-1]
        proc.kill()
        proc.wait(30)

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in self.tmp.glob("daemon-*"))

    def records(self) -> dict[str, Record]:
        out = {}
        for path in (self.state / "instances").glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                rec = from_json(path.read_bytes())
                out[rec.name] = rec
        return out

    def wait(self, what: str, check: Callable[[dict[str, Record]], bool]) -> dict[str, Record]:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            recs = self.records()
            if check(recs):
                return recs
            time.sleep(0.2)
        raise AssertionError(f"{what}: not within {WAIT:g}s\n{self.records()}\n{self.log()}")

    def engines(self, host: str) -> list[tuple[int, str]]:
        """(pid, record name) of every engine running on ``host``."""
        found = []
        for pid in self.net.pids(host):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            for item in env:
                if item.startswith(MARKER):
                    found.append((pid, item.decode(errors="replace").split("/")[1]))
        return found

    def close(self) -> None:
        for proc in self.daemons:
            if proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(30)
        if self.state.exists():  # every replica's actor and engine, through the product
            down = [sys.executable, "-m", "controller", "down", "--backend", "ray"]
            down += ["--ray-address", self.hosts.address, "--gateway", "-q"]
            down += ["-f", str(self.folder), "--state-dir", str(self.state)]
            host = self.net.hosts[self.hosts.head]
            subprocess.run(
                ["ip", "netns", "exec", host.name, *down],
                env={**base_env(), "TMPDIR": str(host.tmp)},
                capture_output=True,
                timeout=120,
            )
        for proc in self.daemons:  # the daemon's gateway outlives it: kill what is left
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)


def ready(recs: dict[str, Record], names: list[str], away_from: str | None = None) -> bool:
    """Every record of ``names`` Ready (on a host other than ``away_from``)."""
    return all(
        n in recs and recs[n].phase is Phase.READY and recs[n].host != away_from for n in names
    )


@dataclass
class Load:
    """Requests for ``model`` back to back through the gateway, from this (the test's)
    side of the bridge; each failure kept with the time its request was sent."""

    address: str
    model: str
    ok: int = 0
    failed: list[tuple[float, str]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def one(self) -> None:
        conn = http.client.HTTPConnection(self.address, GATEWAY_PORT, timeout=30)
        body = json.dumps({"model": self.model, "prompt": "hi"})
        sent = time.monotonic()
        try:
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            answer = conn.getresponse()
            answer.read()
            if answer.status == 200:
                self.ok += 1
            else:
                self.failed.append((sent, f"HTTP {answer.status}"))
        except OSError as exc:
            self.failed.append((sent, repr(exc)))
        finally:
            conn.close()

    def run(self) -> None:
        while not self.stop.is_set():
            self.one()
            time.sleep(0.02)

    def start(self, clients: int = 2) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.run, daemon=True) for _ in range(clients)]
        for t in threads:
            t.start()
        return threads

    def finish(self, threads: list[threading.Thread]) -> None:
        self.stop.set()
        for t in threads:
            t.join(timeout=60)
