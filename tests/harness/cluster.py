"""A node of its own for the harness: a state dir, manifest sets, the real CLI, cleanup.

Every engine the harness runs is ``tiny_engine.py`` (listens on $PORT, exits on
SIGTERM, starts in milliseconds) so hundreds of passes fit in a CI minute. The
node name is unique per cluster; teardown kills whatever still carries its marker.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import procs
import warmcli
import yaml
from procs import alive, free_ports

PYTHON = sys.executable
ENGINE = Path(__file__).with_name("tiny_engine.py")
MARKER = "RECONCILE_INSTANCE"
CLI_TIMEOUT = 90.0


@dataclass
class Run:
    """A finished CLI call."""

    args: list[str]
    code: int
    out: str
    err: str
    seconds: float

    def __str__(self) -> str:
        return (
            f"reconcile {' '.join(self.args)} -> exit {self.code} in {self.seconds:.2f}s\n"
            f"--- stdout\n{self.out[-3000:]}\n--- stderr\n{self.err[-3000:]}"
        )


# -- processes -----------------------------------------------------------------------


@dataclass(frozen=True)
class Marked:
    """A live process carrying ``RECONCILE_INSTANCE=<node>/<name>/<nonce>``."""

    pid: int
    name: str
    nonce: str
    env: dict[str, str]


def start_time(pid: int) -> float | None:
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def marked(node: str) -> list[Marked]:
    """Every live process of ``node``, from /proc/*/environ."""
    needle = f"{MARKER}={node}/".encode()
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            data = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        if needle not in data or not alive(int(entry.name)):
            continue
        pairs = (item.split(b"=", 1) for item in data.split(b"\0") if b"=" in item)
        env = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}
        _, name, nonce = (env.get(MARKER, "") + "//").split("/")[:3]
        out.append(Marked(int(entry.name), name, nonce, env))
    return out


def kill_marked(node: str, timeout: float = 10.0) -> dict[int, str]:
    """SIGKILL every process of ``node`` until none is left; pid -> command line."""
    return procs.kill_marked(f"{node}/", timeout)


# -- the cluster ---------------------------------------------------------------------


class Cluster:
    """One node: ``sets`` manifest folders (one owner each) sharing one state dir."""

    def __init__(self, tmp: Path, *, sets: Sequence[str] = ("a",), devices: int = 4) -> None:
        self.tmp = tmp
        self.node = f"h-{uuid.uuid4().hex[:10]}"
        self.state = tmp / "state"
        self.sets = {s: tmp / f"set-{s}" for s in sets}
        for folder in self.sets.values():
            folder.mkdir(parents=True, exist_ok=True)
        self.devices = ",".join(f"nvidia:{i}" for i in range(devices))
        self.base_port = free_ports(48)
        self.faults = tmp / "faults.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILE_")}
        self.helpers: list[subprocess.Popen[bytes]] = []

    def owner(self, set_: str) -> str:
        return str(self.sets[set_].absolute())

    # -- manifests -----------------------------------------------------------------

    def manifest(self, name: str, *, version: int = 0, **spec: Any) -> dict[str, Any]:
        body: dict[str, Any] = {
            "engine": "command",
            "command": [PYTHON, "-S", "-I", str(ENGINE)],
            "env": {"VERSION": str(version)},
            "devices": {"count": 1},
            "basePort": self.base_port,
            "readiness": {"tcpSocket": {}, "deadlineSeconds": 30, "periodSeconds": 0.2},
            "stopGracePeriodSeconds": 1,
        }
        body.update(spec)
        return {
            "apiVersion": "reconcile/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": body,
        }

    def write(self, name: str, set_: str = "a", *, version: int = 0, **spec: Any) -> Path:
        path = self.sets[set_] / f"{name}.yaml"
        text = yaml.safe_dump(self.manifest(name, version=version, **spec), sort_keys=False)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # the way an editor or git saves: never half a file
        return path

    def remove(self, name: str, set_: str = "a") -> None:
        (self.sets[set_] / f"{name}.yaml").unlink()

    def replicas(self, name: str, set_: str = "a") -> int:
        """The ``spec.replicas`` a set's manifest of ``name`` declares (default 1)."""
        doc = yaml.safe_load((self.sets[set_] / f"{name}.yaml").read_text())
        return int(doc["spec"].get("replicas", 1))

    def declared(self) -> dict[str, set[str]]:
        """The names each set's folder declares (one deployment per file, named by it)."""
        return {s: {p.stem for p in folder.glob("*.yaml")} for s, folder in self.sets.items()}

    # -- the CLI -------------------------------------------------------------------

    def argv(self, *args: str, set_: str = "a") -> list[str]:
        quiet = [] if "-v" in args else ["-q"]
        return [
            PYTHON,
            "-m",
            "controller",
            *args,
            *quiet,
            "--state-dir",
            str(self.state),
            "--node",
            self.node,
            "--devices",
            self.devices,
            "-f",
            str(self.sets[set_]),
        ]

    def _env(self, failpoints: str | None, env: Mapping[str, str] | None) -> dict[str, str]:
        out = {**self.env, **(env or {})}
        if failpoints:
            out["RECONCILE_FAILPOINTS"] = failpoints
            out["RECONCILE_FAILPOINTS_LOG"] = str(self.faults)
        return out

    def run(
        self,
        *args: str,
        set_: str = "a",
        failpoints: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = CLI_TIMEOUT,
        cold: bool = False,
    ) -> Run:
        """One CLI call, forked warm (tests/warmcli.py: the imports were most of a call's
        time) unless ``cold`` or its environment is read at the start (failpoints,
        faketime). Past ``timeout`` the call is SIGKILLed either way (TimeoutExpired)."""
        began = time.monotonic()
        argv, full_env = self.argv(*args, set_=set_), self._env(failpoints, env)
        proc = warmcli.run_or_cold(
            argv, env=full_env, cwd=self.tmp, timeout=timeout, cold=cold, new_session=True
        )
        took = time.monotonic() - began
        return Run([*args, "-f", set_], proc.returncode, proc.stdout, proc.stderr, took)

    def once(self, set_: str = "a", **kwargs: Any) -> Run:
        return self.run("--once", set_=set_, **kwargs)

    def heal(self) -> list[Run]:
        """One recovery pass per manifest set."""
        return [self.once(s) for s in self.sets]

    def start(
        self, *args: str, set_: str = "a", failpoints: str | None = None
    ) -> subprocess.Popen[bytes]:
        """The CLI in the background (to be killed); reaped at teardown."""
        err = self.tmp / f"background-{len(self.helpers)}.err"
        with open(err, "wb") as f:
            proc = subprocess.Popen(
                self.argv(*args, set_=set_),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=f,
                cwd=self.tmp,
                env=self._env(failpoints, None),
                start_new_session=True,
            )
        self.helpers.append(proc)
        return proc

    def stderr(self, proc: subprocess.Popen[bytes]) -> str:
        """What a background CLI wrote to stderr so far."""
        err = self.tmp / f"background-{self.helpers.index(proc)}.err"
        return err.read_text(errors="replace")

    def fired(self) -> list[str]:
        """Failpoints that fired so far (``name action`` each)."""
        try:
            lines = self.faults.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [" ".join(line.split()[:2]) for line in lines]

    # -- teardown --------------------------------------------------------------------

    def close(self) -> dict[int, str]:
        """Stop helpers, take every set down, then kill anything still marked."""
        for proc in self.helpers:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            proc.wait(timeout=30)
        for set_ in self.sets:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.run("down", set_=set_)
        # A daemon's gateway process outlives it by design: this cluster's go with it.
        procs.kill_marked(f"{self.node}/", marker=procs.GATEWAY_MARKER)
        left = kill_marked(self.node)
        # A pass killed between an engine cgroup's making and its note left it empty;
        # a teardown removes such a one only a minute on (runtime.CGROUP_SETTLE).
        procs.kill_cgroups(self.state)
        return left
