"""A reservation whose maker died between its fork and its engine's exec.

A pass SIGKILLed inside its spawn, after the fork and before the child's exec, leaves
that child running: it execs the engine, marker and all, on its own, tens of ms after
the pass died (a busy host's figure). The next pass found no marker of the reservation,
released it ("no engine was spawned"), and the engine then came up with no record, on
the port a start placed anew was given: that engine died of "address in use" and the
SIGKILL soak found it in BackOff after recovery. The release now sweeps the
reservation's nonce until a fork -> exec has surely ended (procscan.SETTLE).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import replace
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


def test_an_engine_that_execs_after_its_dead_reservation_was_looked_at_is_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = free_ports()
    config = _config(tmp_path, base)
    store = records.RecordStore(config.state_dir)
    reconciler = Reconciler(config, open_backend(config, store), inventory_for(config), store=store)
    entry = reconciler.desired(load(config.manifests)).entries["web"]
    lease = reconciler.maker.reservation(entry, devices=("nvidia:0",), port=base, extra_ports=())
    store.ensure()
    store.write(replace(lease.record, reserved_by=_dead_maker()))
    nonce = lease.record.nonce
    engine_env = {
        **os.environ,
        **lease.rendered.env,
        "RECONCILE_INSTANCE": f"{config.node}/web/{nonce}",
        "RECONCILE_STATE": str(config.state_dir.resolve()),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", LATE_CHILD], stdin=subprocess.PIPE, start_new_session=True
    )
    assert child.stdin is not None
    backend = reconciler.executor.launcher.backend
    sweep = backend.sweep

    def then_exec(swept: str | None, ref: ProcessRef | None = None) -> int:
        """The release's sweep, then the child's exec (at the first sweep: it found none)."""
        killed = sweep(swept, ref)
        if child.stdin is not None and not child.stdin.closed:
            child.stdin.write(json.dumps([list(lease.rendered.argv), engine_env]).encode())
            child.stdin.close()
        return killed

    monkeypatch.setattr(backend, "sweep", then_exec)
    try:
        observed, _ = reconciler.observe(probe=False)
        plan = reconciler.plan(reconciler.desired(load(config.manifests)), observed)
        release = next(a for a in plan if isinstance(a, Release))
        assert release.nonce == nonce and observed.records["web"].record.phase is Phase.RESERVED

        reconciler.executor.apply(release)

        # The engine exec'd (its marker shows) or is gone already: either way it ran.
        wait_for(
            lambda: (
                not alive(child.pid) or nonce in environ(child.pid).get("RECONCILE_INSTANCE", "")
            ),
            what="the late child to exec its engine",
        )
        assert child.poll() == -signal.SIGKILL, "the late engine outlived its released reservation"
        assert store.read("web") is None
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        kill_marked(f"{config.node}/")
