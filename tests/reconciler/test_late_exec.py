"""A reservation whose maker died between its fork and its engine's exec.

A pass SIGKILLed inside its spawn, after the fork and before the child's exec, leaves
that child running: it execs the engine, marker and all, on its own, tens of ms after
the pass died (a busy host's figure). The next pass found no marker of the reservation,
released it ("no engine was spawned"), and the engine then came up with no record, on
the port a start placed anew was given: that engine died of "address in use" and the
SIGKILL soak found it in BackOff after recovery; `down` dropped such a reservation and
left its engine running with no record. Both now sweep the reservation's nonce until a
fork -> exec has surely ended (procscan.SETTLE).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import yaml
from procs import alive, environ, free_ports, kill_marked, wait_for

from controller.backends.choose import inventory_for, open_backend
from controller.core.actions import Release
from controller.core.state import Phase, ProcessRef
from controller.host.procs import identity
from controller.reconciler.run import Reconciler
from controller.store.config.node import Config
from controller.store.instances import records
from controller.store.sources.manifests import load

# Forked and not yet exec'd: the environment it shows is its maker's (no marker) until it
# is told to exec the engine, with the engine's environment.
LATE_CHILD = """
import json, os, sys
argv, env = json.loads(sys.stdin.read())
os.execve(argv[0], argv, env)
"""


def _config(tmp_path: Path, base: int) -> Config:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    doc = {
        "apiVersion": "reconcile/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "engine": "command",
            "command": [sys.executable, "-m", "controller.demo.engine", "--port", "{port}"],
            "basePort": base,
            "devices": {"count": 1},
            "stopGracePeriodSeconds": 1,
        },
    }
    (manifests / "web.yaml").write_text(yaml.safe_dump(doc))
    return Config(
        manifests=(manifests,),
        state_dir=tmp_path / "state",
        node=f"t-{uuid.uuid4().hex[:12]}",
        devices="nvidia:0",
        owner="late-exec-test",
    )


def _dead_maker() -> ProcessRef:
    """The identity a SIGKILLed pass had: its pid is no longer that process's."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)  # fmt: skip
    ref = identity(proc.pid)
    assert ref is not None and proc.stdin is not None
    proc.stdin.close()
    proc.wait()
    return ref


@dataclass
class Late:
    """A node whose one reservation's maker is dead, and the child that maker forked:
    it execs the engine (marker and all) once the first sweep of its nonce has looked."""

    reconciler: Reconciler
    store: records.RecordStore
    nonce: str
    child: subprocess.Popen[bytes]

    def ran_and_was_killed(self) -> bool:
        """The engine exec'd (its marker showed) and was SIGKILLed, not left running."""
        wait_for(
            lambda: (
                not alive(self.child.pid)
                or self.nonce in environ(self.child.pid).get("RECONCILE_INSTANCE", "")
            ),
            what="the late child to exec its engine",
        )
        return self.child.poll() == -signal.SIGKILL


@pytest.fixture
def late(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Late]:
    config = _config(tmp_path, free_ports())
    store = records.RecordStore(config.state_dir)
    reconciler = Reconciler(config, open_backend(config, store), inventory_for(config), store=store)
    entry = reconciler.desired(load(config.manifests)).entries["web"]
    lease = reconciler.maker.reservation(
        entry, devices=("nvidia:0",), port=entry.deployment.spec.base_port, extra_ports=()
    )
    store.ensure()
    store.write(replace(lease.record, reserved_by=_dead_maker()))
    assert lease.record.nonce is not None
    engine = {
        **os.environ,
        **lease.rendered.env,
        "RECONCILE_INSTANCE": f"{config.node}/web/{lease.record.nonce}",
        "RECONCILE_STATE": str(config.state_dir.resolve()),
    }
    told = json.dumps([list(lease.rendered.argv), engine]).encode()
    child = subprocess.Popen(
        [sys.executable, "-c", LATE_CHILD], stdin=subprocess.PIPE, start_new_session=True
    )
    backend = reconciler.executor.launcher.backend
    sweep = backend.sweep

    def then_exec(nonce: str | None, ref: ProcessRef | None = None) -> int:
        """A sweep, then the child's exec (after the first: it found nothing)."""
        killed = sweep(nonce, ref)
        if child.stdin is not None and not child.stdin.closed:
            child.stdin.write(told)
            child.stdin.close()
        return killed

    monkeypatch.setattr(backend, "sweep", then_exec)
    try:
        yield Late(reconciler, store, lease.record.nonce, child)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        kill_marked(f"{config.node}/")


def test_an_engine_that_execs_after_its_dead_reservation_was_looked_at_is_swept(
    late: Late,
) -> None:
    reconciler = late.reconciler
    observed, _ = reconciler.observe(probe=False)
    plan = reconciler.plan(reconciler.desired(load(reconciler.config.manifests)), observed)
    release = next(a for a in plan if isinstance(a, Release))
    assert release.nonce == late.nonce and observed.records["web"].record.phase is Phase.RESERVED

    reconciler.executor.apply(release)

    assert late.ran_and_was_killed(), "the late engine outlived its released reservation"
    assert late.store.read("web") is None


def test_down_sweeps_an_engine_that_execs_after_it_stopped_a_dead_reservation(
    late: Late,
) -> None:
    stopped, kept = late.reconciler.down(strays=True)

    assert stopped == ["web"] and kept == {}
    assert late.ran_and_was_killed(), "the late engine outlived `down`"
    assert late.store.read("web") is None
