"""The ray backend as this process holds it: each call sent to the Ray driver process.

:class:`RayProxy` is the :class:`~controller.backends.base.Backend` that ``choose``
hands out; the :class:`~controller.backends.ray.backend.RayBackend` it stands for lives
in the driver process (``driver.py`` says why), and so do its puller and its actor
handles. Each call has a deadline sized to what it waits for there; a head that is gone
makes it a :class:`~controller.errors.BackendUnavailable`. No ``ray`` import here.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from controller.backends.base import ExitStatus, Held, StartRequest
from controller.backends.ray import driver
from controller.backends.ray.onnodes import OnTheirNodes
from controller.core.devices.inventory import Inventory
from controller.core.imagepulls import ImageWait
from controller.core.manifest.specs import DeploymentSpec, Entry
from controller.core.pulls import PullView
from controller.core.state import ContainerRef, Instance, MarkedProcess, ProcessRef, Record

# Deadlines, each past what the call waits for in the driver (backend.py's timeouts), for
# a cluster that answers slowly: a head that is gone is known sooner, its GCS asked
# directly while a call waits (driver.py), so these are not what a user waits for then.
QUICK = 20.0  # what the last look saw, a log read (capped at 10 s there), a fit check
LOOK = 40.0  # a look: the actors' listing and one round of status calls (2 s)
PLACE = 120.0  # a launch: an actor placed (60 s), or killed after all (15 s)
STOP = 120.0  # an engine stopped through its actor (30 s) and the actor gone (15 s)
PULL = 60.0  # a pull actor placed on its node
FETCH = 60.0  # an image's look or pull started on its node, by a task (30 s)


def inventory(address: str) -> Inventory:
    """The live nodes' GPUs (``choose.inventory_for``), asked of this process's driver."""
    drv = driver.shared(address)
    drv.check()
    got: Inventory = drv.call(None, "inventory", (), LOOK)
    return got


class RayProxy(OnTheirNodes):
    def __init__(self, address: str, state_dir: str, owner: str) -> None:
        self._driver = driver.shared(address)
        self._key = (state_dir, owner)
        self._call("open")  # joined now: an unreachable head says so at once

    def _call(self, method: str, *args: Any, timeout: float = QUICK) -> Any:
        return self._driver.call(self._key, method, args, timeout)

    def puller(self, state_dir: Path, stall_seconds: float) -> RemotePuller:
        return RemotePuller(self, str(state_dir), stall_seconds)

    def devices(self) -> Inventory | None:
        self._driver.check()  # a pass's first call: a head gone fails it now
        got: Inventory | None = self._call("devices", timeout=LOOK)
        return got

    def unplaceable(self, spec: DeploymentSpec) -> str | None:
        got: str | None = self._call("unplaceable", spec)
        return got

    def fetching(self, spec: DeploymentSpec, starting: int = 1, ahead: int = 0) -> ImageWait | None:
        got: ImageWait | None = self._call("fetching", spec, starting, ahead, timeout=FETCH)
        return got

    def image_nodes(self, spec: DeploymentSpec) -> frozenset[str]:
        got: frozenset[str] = self._call("image_nodes", spec)
        return got

    def fetch(self, spec: DeploymentSpec) -> Held | None:
        got: Held | None = self._call("fetch", spec, timeout=FETCH)
        return got

    def prepared(self, spec: DeploymentSpec, running: Record) -> Held | None:
        got: Held | None = self._call("prepared", spec, running, timeout=FETCH)
        return got

    def launch(self, launch: StartRequest) -> Instance:
        got: Instance = self._call("launch", launch, timeout=PLACE)
        return got

    def refresh(self, records: Iterable[Record]) -> None:
        self._driver.check()
        self._call("refresh", list(records), timeout=LOOK)

    def instance_of(self, rec: Record) -> Instance | None:
        got: Instance | None = self._call("instance_of", rec)
        return got

    def container_of(self, rec: Record) -> ContainerRef | None:
        return None  # the actor reports its container with where it runs (instance_of)

    def alive(self, ref: ProcessRef | None) -> bool:
        return bool(self._call("alive", ref))

    def exit_of(self, ref: ProcessRef) -> ExitStatus | None:
        got: ExitStatus | None = self._call("exit_of", ref)
        return got

    def scan(self) -> list[MarkedProcess]:
        got: list[MarkedProcess] = self._call("scan")
        return got

    def strangers(self) -> list[MarkedProcess]:
        return []  # actors are found by the namespace, not the state dir's path

    def teardown(self, rec: Record) -> None:
        self._call("teardown", rec, timeout=rec.grace_seconds + STOP)

    def sweep(self, nonce: str | None, ref: ProcessRef | None = None) -> int:
        return int(self._call("sweep", nonce, ref, timeout=STOP))

    def kill(self, ref: ProcessRef) -> None:
        self._call("kill", ref, timeout=STOP)

    def listening_ports(self) -> frozenset[int]:
        return frozenset()  # each actor probes its own node's ports

    def port_bindable(self, port: int) -> bool:
        return True  # the actor binds on its node; the planner's port is where it starts

    def log_since(self, rec: Record, offset: int) -> tuple[bytes, int] | None:
        got: tuple[bytes, int] | None = self._call("log_since", rec, offset)
        return got

    def log_tail(self, name: str, count: int) -> list[str]:
        got: list[str] = self._call("log_tail", name, count)
        return got


class RemotePuller:
    """The backend's :class:`~controller.backends.ray.pulls.RayPuller`, in the driver."""

    def __init__(self, proxy: RayProxy, state_dir: str, stall_seconds: float) -> None:
        self._proxy = proxy
        self._made = (state_dir, stall_seconds)  # with each call: a new driver makes it too

    def _call(self, method: str, *args: Any, timeout: float = QUICK) -> Any:
        return self._proxy._call(f"puller.{method}", *self._made, *args, timeout=timeout)

    def observe(self) -> dict[str, PullView]:
        got: dict[str, PullView] = self._call("observe", timeout=LOOK)
        return got

    def settle(self) -> None:
        self._call("settle", timeout=LOOK)

    def start(self, entry: Entry, waiting: tuple[str, ...]) -> str:
        return str(self._call("start", entry, waiting, timeout=PULL))

    def model_path(self, entry: Entry) -> str | None:
        got: str | None = self._call("model_path", entry)
        return got

    def used(self, entry: Entry, at: datetime) -> None:
        self._call("used", entry, at)
