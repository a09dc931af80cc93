"""A container engine's exit as a pass that did not start it sees it, on podman and docker.

The pass that ran `run` is gone (``--once`` ended); the engine exits on its own later; the
next pass (its adopter: not the `run`'s parent) reads the engine's own exit code. It read
"code unknown", because `run --rm` removes the container, and the code with it.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from containers.conftest import STANDIN, Engine, write
from procs import free_ports
from strategies import entry

from controller.backends.base import ExitStatus, StartRequest
from controller.backends.local.container import exit_file, exit_status
from controller.backends.local.runtime import EXIT_FILE_WAIT, LocalBackend
from controller.core.render import render
from controller.core.state import Record
from controller.store.instances.records import RecordStore

if TYPE_CHECKING:
    from conftest import Reconcile

# The stand-in engine, which exits with code 7 once /flag/stop exists (the test's folder).
EXITS_7 = [
    "/bin/busybox",
    "sh",
    "-c",
    "/bin/busybox httpd -f -p {host}:{port} -h /www & "
    "until [ -e /flag/stop ]; do /bin/busybox sleep 0.05; done; exit 7",
]


def test_an_engine_that_exits_under_an_adopting_pass_is_reported_with_its_code(
    rc: Reconcile, engine: Engine, tmp_path: Path
) -> None:
    flag = tmp_path / "flag"
    flag.mkdir()
    write(rc, engine, "coded", command=EXITS_7, restartPolicy="Never",
          container={"volumes": [f"{flag}:/flag"]})  # fmt: skip
    rc.converge()
    record = rc.record("coded")
    assert record is not None and record["phase"] == "Ready", record
    pid = record["ref"]["pid"]
    (flag / "stop").touch()
    rc.wait_gone(pid)
    refreshed = rc("status", "--refresh", check=None)  # a look: it reads, consumes nothing
    assert "exited with code 7" in refreshed.out, refreshed
    rc.once(check=None)
    record = rc.record("coded")
    assert record is not None and record["phase"] == "Failed", record
    assert record["last_exit"]["code"] == 7, record
    assert "exited with code 7" in record["message"], record
    fails = [e for e in rc.events("coded") if e.get("action") == "fail"]
    assert [e.get("exit_code") for e in fails] == [7], rc.events("coded")
    described = rc("describe", "coded", check=0)
    assert "Last exit:    exited with code 7" in described.out, described
    rc.wait_for(lambda: engine.ours(rc.state) == [])
    rc.down()
    assert sorted((rc.state / "run").glob("reconcile-*")) == []


def test_a_stopped_engine_leaves_no_exit_file_behind(rc: Reconcile, engine: Engine) -> None:
    """`down` stops the container; its `run` then ends and says its status: nothing of
    it is left in the state dir (nor a container: the fixture checks)."""
    write(rc, engine, "stopped")
    rc.converge()
    rc.once()  # the adopting pass: not the `run`'s parent
    rc.down()
    assert sorted((rc.state / "run").glob("reconcile-*")) == []


def _waiting_shell(rc_file: Path) -> int:
    """The pid of the shell that runs a container's `run` and writes ``rc_file``."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0] == b"/bin/sh" and str(rc_file).encode() in argv:
            return int(proc.name)
    raise AssertionError(f"no shell writes {rc_file}")


def test_a_start_killed_before_its_status_costs_no_wait(
    reconcile: Reconcile, podman: Engine
) -> None:
    """The shell that runs `run` (and writes its status to the exit file as it ends)
    killed with it, then the engine gone: the next pass waited the whole 10 s for a
    status no one would write. The file names its shell: a shell gone is no status
    coming, seen at once, and the runtime's events say the code."""
    rc = reconcile
    rc.env.update(podman.env)
    write(rc, podman, "orphaned")
    rc.converge()
    record = rc.record("orphaned")
    assert record is not None and record["phase"] == "Ready", record
    pid, cid = record["ref"]["pid"], record["container"]["id"]
    rc_file = exit_file(str(rc.state.resolve()), "orphaned", record["nonce"])
    shell = _waiting_shell(rc_file)
    os.killpg(shell, signal.SIGKILL)  # the shell and its `run`: a session of their own
    rc.wait_gone(shell)
    podman.cli("rm", "-f", cid)  # the engine ends with its container
    rc.wait_gone(pid)
    assert rc_file.exists() and exit_status(rc_file) is None  # no status will come
    backend = LocalBackend(rc.state, rc.node)
    stored = RecordStore(rc.state).read("orphaned")
    assert stored is not None and stored.ref is not None
    backend.refresh([stored])
    began = time.monotonic()
    # The runtime's word: `rm -f` stopped it with TERM, which the stand-in traps (exit 0).
    assert backend.exit_of(stored.ref) == ExitStatus(0, None)
    took = time.monotonic() - began
    assert took < EXIT_FILE_WAIT / 2, f"the pass waited {took:.1f} s for a dead start"
    rc.converge()  # restarted as a crashed engine is
    record = rc.record("orphaned")
    assert record is not None and record["ref"]["pid"] != pid, record
    [fail] = [e["reason"] for e in rc.events("orphaned") if e.get("action") == "fail"]
    assert fail.startswith("engine exited with code 0"), fail
    rc.down()
    assert podman.ours(rc.state) == []


def test_a_run_killed_by_a_signal_is_not_its_engines_exit(
    rc: Reconcile, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shell that runs `run` killed by a signal (`pkill docker` by hand) while its
    engine serves, then the engine gone: the backend that started it said the engine
    `exited with code -9`, the shell's own death, which restartPolicy then judged. No one
    said how the engine ended: its code is unknown (a containers trial's finding)."""
    for key, value in engine.env.items():
        monkeypatch.setenv(key, value)
    backend = LocalBackend(rc.state, rc.node, container_runtime=engine.name)
    container = {"image": engine.image, "runtime": engine.name}
    deployment = entry("killed", engine="command", command=STANDIN, container=container)
    port = free_ports(1)
    rendered = render(deployment, devices=(), port=port)
    record = Record(name="killed", owner="test", node=rc.node, nonce="n1", port=port)
    log = rc.state / "killed.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    request = StartRequest(entry=deployment, record=record, rendered=rendered, log_path=log)
    instance = backend.launch(request)
    assert instance.ref is not None and instance.container is not None
    shell = _waiting_shell(exit_file(str(rc.state.resolve()), "killed", "n1"))
    os.killpg(shell, signal.SIGKILL)  # the shell and its `run`: a session of their own
    rc.wait_gone(shell)
    assert backend.alive(instance.ref)  # the engine serves on without them
    engine.cli("rm", "-f", instance.container.id)
    rc.wait_gone(instance.ref.pid)
    assert backend.exit_of(instance.ref) is None  # unknown, not the shell's -9


def test_an_engine_whose_run_lost_its_stream_is_reported_with_its_code(
    rc: Reconcile, engine: Engine, tmp_path: Path
) -> None:
    """The `run` that streams a Ready engine's container ended without its code (killed
    by hand; docker's daemon SIGKILLed under it ends it with 125, its own), the engine
    ran on, then exited with code 7. The next pass said `exited (code unknown: its
    container's `run` said none)`: `run --rm` had the container removed, its code with
    it. The runtime's events keep it: the pass reads it there, and `describe` says it."""
    flag = tmp_path / "flag"
    flag.mkdir()
    write(rc, engine, "lost", command=EXITS_7, restartPolicy="Never",
          container={"volumes": [f"{flag}:/flag"]})  # fmt: skip
    rc.converge()
    record = rc.record("lost")
    assert record is not None and record["phase"] == "Ready", record
    pid = record["ref"]["pid"]
    shell = _waiting_shell(exit_file(str(rc.state.resolve()), "lost", record["nonce"]))
    os.killpg(shell, signal.SIGKILL)  # the shell and its `run`: a session of their own
    rc.wait_gone(shell)
    assert os.path.exists(f"/proc/{pid}")  # the engine serves on without them
    (flag / "stop").touch()
    rc.wait_gone(pid)
    rc.once(check=None)
    record = rc.record("lost")
    assert record is not None and record["phase"] == "Failed", record
    assert record["last_exit"]["code"] == 7, record
    described = rc("describe", "lost", check=0)
    assert "Last exit:    exited with code 7" in described.out, described
    rc.down()
