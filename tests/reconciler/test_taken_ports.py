"""A leased port that another process binds before the engine is started.

The lease bind-probes its port under the placement lock; the spawn comes later, outside
it (after a wait for GPU memory, say). A foreign process binding the port in between
once got the engine spawned onto it, to die of "address in use" and be counted as a
crash. The launch probes again: nothing is started there, the start is placed again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import strategies
import yaml
from procs import free_ports, kill_marked, listen

from controller.backends.base import Instance, StartRequest
from controller.backends.choose import inventory_for, open_backend
from controller.core.actions import Start
from controller.core.state import Phase, Record
from controller.reconciler.leases import Lease
from controller.reconciler.run import Reconciler, count_kept
from controller.store.config.node import Config
from controller.store.instances import records

ENGINE = [sys.executable, "-m", "controller.demo.engine", "--port", "{port}"]


def _config(tmp_path: Path, base: int) -> Config:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    doc = {
        "apiVersion": "reconcile/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"engine": "command", "command": ENGINE, "basePort": base,
                 "stopGracePeriodSeconds": 1},
    }  # fmt: skip
    (manifests / "web.yaml").write_text(yaml.safe_dump(doc))
    return Config(
        manifests=(manifests,),
        state_dir=tmp_path / "state",
        node=f"t-{uuid.uuid4().hex[:12]}",
        devices="nvidia:0",
        owner="taken-ports-test",
    )


def test_a_port_bound_after_the_lease_is_never_spawned_onto(tmp_path: Path) -> None:
    base = free_ports()
    config = _config(tmp_path, base)
    store = records.RecordStore(config.state_dir)
    reconciler = Reconciler(config, open_backend(config, store), inventory_for(config), store=store)
    launcher = reconciler.executor.launcher
    leased = launcher.reserve
    foreign: list[socket.socket] = []

    def then_taken(starts: Sequence[Start]) -> list[tuple[Start, Lease | Record]]:
        """The reservation, then a foreign listener on its port (the first one only)."""
        out = leased(starts)
        for _, taken in out:
            if isinstance(taken, Lease) and not foreign:
                assert taken.record.port is not None
                foreign.append(listen(taken.record.port))
        return out

    launcher.reserve = then_taken
    try:
        result = reconciler.run_pass()
        web = result.records["web"]
        assert foreign and web.port == base + 1, web
        assert web.phase in (Phase.STARTING, Phase.READY) and web.restarts == 0, web
        lines = (config.state_dir / "events" / "web.jsonl").read_text().splitlines()
        events = [json.loads(line) for line in lines]
        said = [e for e in events if f"port {base} was taken" in e.get("error", "")]
        assert said and "another port" in said[0]["error"], events
        actions = [e["action"] for e in events]
        assert actions.count("start") == 2 and "fail" not in actions, events
        with socket.create_connection(("127.0.0.1", base), timeout=5):
            pass  # the foreign listener is untouched
    finally:
        for sock in foreign:
            sock.close()
        reconciler.down()
        kill_marked(f"{config.node}/")


@pytest.mark.parametrize(
    ("phase", "port", "changed", "kept"),
    [
        (Phase.PENDING, None, False, 3),  # a port move's Pending record: its count goes on
        (Phase.PULLING, None, False, 3),  # a restart by way of its image's pull
        (Phase.PENDING, None, True, 0),  # the spec changed meanwhile: a new template, from 0
        (Phase.PULLING, None, True, 0),
        (Phase.BACKOFF, 8000, False, 0),  # not waiting to be placed: nothing carried
        # its image's pull failed, its lease given back: this placement is its restart
        (Phase.BACKOFF, None, False, 4),
        (Phase.BACKOFF, None, True, 0),
    ],
    ids=[
        "pending",
        "pulling",
        "pending-new-spec",
        "pulling-new-spec",
        "backoff",
        "unleased-backoff",
        "unleased-backoff-new-spec",
    ],
)
def test_a_placement_takes_up_the_count_of_the_same_spec_only(
    phase: Phase, port: int | None, changed: bool, kept: int
) -> None:
    current = strategies.record("web", phase=phase, restarts=3, port=port)
    spec = strategies.entry("web", env={"NEW": "1"}) if changed else strategies.entry("web")
    taken = strategies.record("web", spec=spec, phase=Phase.PENDING, restarts=0, port=None)
    placed = count_kept(current, taken)
    assert isinstance(placed, Record) and placed.restarts == kept, placed


def test_a_moved_record_waiting_for_room_keeps_its_count(tmp_path: Path) -> None:
    """A port move leaves the record Pending with its count; when the next round finds
    no room (a Hold, with its own reason), the count went back to 0 with the rewrite."""
    config = _config(tmp_path, free_ports())
    doc = yaml.safe_load((config.manifests[0] / "web.yaml").read_text())
    doc["spec"]["devices"] = {"count": 2}  # the node has one: it waits for room
    (config.manifests[0] / "web.yaml").write_text(yaml.safe_dump(doc))
    store = records.RecordStore(config.state_dir)
    reconciler = Reconciler(config, open_backend(config, store), inventory_for(config), store=store)
    try:
        waiting = reconciler.run_pass().records["web"]
        assert waiting.phase is Phase.PENDING and waiting.restarts == 0, waiting
        moved = (
            "port 1 was taken by another process after it was chosen: placing it on another port"
        )
        store.write(replace(waiting, message=moved, restarts=3))
        again = reconciler.run_pass().records["web"]
        assert again.phase is Phase.PENDING and again.message != moved, again
        assert again.restarts == 3, again
    finally:
        reconciler.down()
        kill_marked(f"{config.node}/")


def test_a_probe_answered_by_another_process_is_not_the_engine_ready(tmp_path: Path) -> None:
    """A port taken after the launch's bind probe: the engine cannot listen there (it
    dies of "address in use", or never binds), while the TCP probe reaches the other
    process's listener. That once marked the engine Ready: the gateway routed to a
    stranger, and the next pass found the "Ready" engine dead (tests/harness/test_soak).
    The probe's answer counts only from a listener a process of the instance holds."""
    config = _config(tmp_path, free_ports())
    doc = yaml.safe_load((config.manifests[0] / "web.yaml").read_text())
    doc["spec"]["command"] = [sys.executable, "-c", "import time; time.sleep(120)"]
    doc["spec"]["readiness"] = {"tcpSocket": {}, "deadlineSeconds": 1, "periodSeconds": 0.2}
    (config.manifests[0] / "web.yaml").write_text(yaml.safe_dump(doc))
    store = records.RecordStore(config.state_dir)
    reconciler = Reconciler(config, open_backend(config, store), inventory_for(config), store=store)
    backend = reconciler.executor.launcher.backend
    launch = backend.launch
    foreign: list[socket.socket] = []

    def then_taken(request: StartRequest) -> Instance:
        """The engine spawned, then its port bound by another process (this one)."""
        where = launch(request)
        if not foreign and where.port is not None:
            foreign.append(listen(where.port))
        return where

    backend.launch = then_taken  # type: ignore[method-assign]
    try:
        web = reconciler.run_pass().records["web"]
        assert foreign, web
        assert web.phase is Phase.STARTING and web.ready_at is None, web
        journal = config.state_dir / "events" / "web.jsonl"
        deadline = time.monotonic() + 60
        while '"fail"' not in journal.read_text() and time.monotonic() < deadline:
            reconciler.run_pass()  # until its readiness deadline
        events = [json.loads(line) for line in journal.read_text().splitlines()]
        failed = [e for e in events if e["action"] == "fail"]
        assert "ready" not in [e["action"] for e in events], events
        stranger = f"its listener is another process's (pid {os.getpid()}), not this engine's"
        assert failed and stranger in failed[0]["reason"], events
    finally:
        for sock in foreign:
            sock.close()
        reconciler.down()
        kill_marked(f"{config.node}/")


# The engine's listener held by a process it started without its environment (so
# without the instance's marker), as `docker run -p`'s proxy holds a published port.
UNMARKED_LISTENER = """
import os, subprocess, sys, time
child = [sys.executable, "-S", "-I", "-c", "import socket, sys, time; s = socket.socket(); "
         "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(120)", os.environ["PORT"]]
proc = subprocess.Popen(child, env={})
open(sys.argv[1], "w").write(str(proc.pid))
time.sleep(120)
"""


def test_a_listener_the_engine_started_counts_though_unmarked(tmp_path: Path) -> None:
    """Only holders older than the engine are strangers: one it started counts."""
    config = _config(tmp_path, free_ports())
    pidfile = tmp_path / "listener.pid"
    doc = yaml.safe_load((config.manifests[0] / "web.yaml").read_text())
    doc["spec"]["command"] = [sys.executable, "-c", UNMARKED_LISTENER, str(pidfile)]
    doc["spec"]["readiness"] = {"tcpSocket": {}, "deadlineSeconds": 60, "periodSeconds": 0.2}
    (config.manifests[0] / "web.yaml").write_text(yaml.safe_dump(doc))
    store = records.RecordStore(config.state_dir)
    reconciler = Reconciler(config, open_backend(config, store), inventory_for(config), store=store)
    try:
        web = reconciler.run_pass().records["web"]
        deadline = time.monotonic() + 60
        while web.phase is Phase.STARTING and time.monotonic() < deadline:
            web = reconciler.run_pass().records["web"]  # until its listener is up
        assert web.phase is Phase.READY and web.restarts == 0, web
    finally:
        reconciler.down()
        kill_marked(f"{config.node}/")
        if pidfile.exists():  # its group went with the engine's: never left behind
            listener = int(pidfile.read_text())
            with contextlib.suppress(ProcessLookupError):
                os.kill(listener, signal.SIGKILL)
