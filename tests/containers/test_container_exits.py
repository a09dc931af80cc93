"""A container engine's exit as a pass that did not start it sees it, on podman and docker.

The pass that ran `run` is gone (``--once`` ended); the engine exits on its own later; the
next pass (its adopter: not the `run`'s parent) reads the engine's own exit code. It read
"code unknown", because `run --rm` removes the container, and the code with it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from containers.conftest import (
    DOCKERD_START,
    PODMAN_CONF,
    STANDIN,
    Engine,
    _unmount_under,
    write,
)
from procs import free_ports, wait_for
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


# The stand-in engine, which exits with code 7 when it is asked to stop (TERM).
STOPS_7 = [
    "/bin/busybox",
    "sh",
    "-c",
    'trap "exit 7" TERM; /bin/busybox httpd -f -p {host}:{port} -h /www & wait',
]
CONTAINERD_CONF = """\
version = 2
root = "{root}/containerd"
state = "{root}/containerd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{root}/containerd.sock"
[ttrpc]
  address = "{root}/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
"""


class OwnDocker:
    """A docker daemon of one test's own, to be SIGKILLed and restarted (the session's
    serves other tests): its socket, data and exec roots in a tmp folder, and beside it
    a containerd of its own (as a host's systemd runs one), which the kill leaves running
    with the containers (a dockerd's own containerd dies with it, and a restart under
    load timed out starting it again)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rdk", dir="/tmp"))  # short: sockets there
        conf = self.root / "containerd.toml"
        conf.write_text(CONTAINERD_CONF.format(root=self.root))
        self.containerd = _spawn(["containerd", "--config", str(conf)], self.root / "ctd.log")
        self.engine = Engine("docker", {"DOCKER_HOST": f"unix://{self.root}/docker.sock"})
        self.daemon: subprocess.Popen[bytes] | None = None
        address = str(self.root / "containerd.sock")
        wait_for(lambda: _answers(["ctr", "--address", address, "version"], {}),
                 timeout=DOCKERD_START, what="containerd")  # fmt: skip
        self.start()

    def start(self) -> None:
        root = self.root
        argv = ["dockerd", "-H", f"unix://{root}/docker.sock", "--data-root", f"{root}/data",
                "--exec-root", f"{root}/exec", "--pidfile", f"{root}/dockerd.pid",
                "--containerd", f"{root}/containerd.sock",
                "--bridge=none", "--iptables=false", "--ip6tables=false"]  # fmt: skip
        self.daemon = daemon = _spawn(argv, root / "dockerd.log")
        wait_for(lambda: daemon.poll() is not None or _answers(["docker", "version"],
                 self.engine.env), timeout=DOCKERD_START, what="dockerd")  # fmt: skip
        assert daemon.poll() is None, (root / "dockerd.log").read_text(errors="replace")[-2000:]

    def kill(self) -> None:
        assert self.daemon is not None
        self.daemon.kill()
        self.daemon.wait(timeout=30)

    def close(self) -> None:
        for proc in (self.daemon, self.containerd):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        for pid in _serving(str(self.root)):  # a shim whose container outlived the test
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _unmount_under(self.root)
        shutil.rmtree(self.root)


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _answers(argv: list[str], env: dict[str, str]) -> bool:
    try:
        done = subprocess.run(argv, capture_output=True, env={**os.environ, **env}, timeout=10)
    except subprocess.TimeoutExpired:  # a daemon starting on a busy host: asked again
        return False
    return done.returncode == 0


def _serving(root: str) -> list[int]:
    """The processes whose command line names ``root`` (containerd's shims)."""
    pids = []
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and root.encode() in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
    return pids


@pytest.fixture
def own_docker() -> Iterator[OwnDocker]:
    docker = OwnDocker()
    try:
        docker.engine.image = docker.engine.build("localhost/reconcile-test/engine:own")
        yield docker
    finally:
        docker.close()


def test_an_engine_stopped_by_a_restarted_dockerd_is_reported_with_its_code(
    reconcile: Reconcile, own_docker: OwnDocker
) -> None:
    """dockerd SIGKILLed under a Ready engine: its `run` lost its stream (125: no code of
    the engine's) and the engine ran on; the restarted dockerd stopped it (TERM: exit 7).
    The next pass said `exited (code unknown: ...)`, `run --rm` having removed the
    container, its code with it: it reads the code from docker's events."""
    rc, engine = reconcile, own_docker.engine
    rc.env.update(engine.env)
    write(rc, engine, "coded", command=STOPS_7, restartPolicy="Never")
    rc.converge()
    record = rc.record("coded")
    assert record is not None and record["phase"] == "Ready", record
    pid = record["ref"]["pid"]
    rc_file = exit_file(str(rc.state.resolve()), "coded", record["nonce"])
    own_docker.kill()
    rc.wait_for(lambda: exit_status(rc_file) is not None, timeout=30, what="the `run` ended")
    assert exit_status(rc_file) == 125 and os.path.exists(f"/proc/{pid}")  # it runs on
    own_docker.start()  # which stops the containers it finds running
    rc.wait_gone(pid, timeout=60)
    rc.once(check=None)
    record = rc.record("coded")
    assert record is not None and record["phase"] == "Failed", record
    assert record["last_exit"]["code"] == 7, record
    described = rc("describe", "coded", check=0)
    assert "Last exit:    exited with code 7" in described.out, described
    rc.down()
    assert engine.ours(rc.state) == []


# The stand-in engine, which exits with code 3 once /flag/stop exists (the test's folder).
EXITS_3 = [*EXITS_7[:-1], EXITS_7[-1].replace("exit 7", "exit 3")]


def _ready_then_dockerd_killed(
    rc: Reconcile, own_docker: OwnDocker, name: str, tmp_path: Path, policy: str = "Never"
) -> tuple[int, str, Path, Path]:
    """Deployment ``name`` (exits 3 once its flag folder holds `stop`) Ready on a
    private dockerd, then dockerd SIGKILLed and its `run` ended: the engine's pid, its
    container, its exit file and its flag folder."""
    engine = own_docker.engine
    rc.env.update(engine.env)
    flag = tmp_path / "flag"
    flag.mkdir()
    write(rc, engine, name, command=EXITS_3, restartPolicy=policy,
          container={"volumes": [f"{flag}:/flag"]})  # fmt: skip
    rc.converge()
    record = rc.record(name)
    assert record is not None and record["phase"] == "Ready", record
    pid, cid = record["ref"]["pid"], record["container"]["id"]
    rc_file = exit_file(str(rc.state.resolve()), name, record["nonce"])
    own_docker.kill()
    rc.wait_for(lambda: exit_status(rc_file) is not None, timeout=30, what="the `run` ended")
    return pid, cid, rc_file, flag


def test_an_engine_that_exits_while_dockerd_is_down_is_reported_with_its_code(
    reconcile: Reconcile, own_docker: OwnDocker, tmp_path: Path
) -> None:
    """dockerd SIGKILLed under a Ready engine (its `run` lost its stream: 125), the engine
    exits with code 3 while dockerd is down: no `die` event is ever said. `run --rm` had
    the restarted dockerd remove the container, its code with it: `code unknown`. The
    container stays until the pass has read its State (code 3), then it is removed."""
    rc, engine = reconcile, own_docker.engine
    pid, cid, rc_file, flag = _ready_then_dockerd_killed(rc, own_docker, "coded", tmp_path)
    assert exit_status(rc_file) == 125 and os.path.exists(f"/proc/{pid}")  # it runs on
    (flag / "stop").touch()
    rc.wait_gone(pid, timeout=60)  # ended while dockerd is down
    own_docker.start()
    looked = rc("status", "--refresh", check=None)  # a look: it removes nothing
    assert "exited with code 3" in looked.out, looked
    assert engine.inspect(cid)["State"]["ExitCode"] == 3  # kept: no `--rm`
    assert engine.ours(rc.state) == [cid]
    rc.once(check=None)
    record = rc.record("coded")
    assert record is not None and record["phase"] == "Failed", record
    assert record["last_exit"]["code"] == 3, record
    described = rc("describe", "coded", check=0)
    assert "Last exit:    exited with code 3" in described.out, described
    assert engine.ours(rc.state) == []  # read, then removed by the pass's teardown
    rc.down()
    assert engine.ours(rc.state) == []
    assert sorted((rc.state / "run").glob("reconcile-*")) == []


def test_an_exit_read_while_dockerd_was_down_is_read_again_once_it_answers(
    reconcile: Reconcile, own_docker: OwnDocker, tmp_path: Path
) -> None:
    """The engine ended and the pass ran while dockerd was down (a daemon's pass sees the
    end at once): its code unknown then, and its container's removal refused. The exit
    file is kept; the next pass, dockerd back, reads the container's State into the
    record (code 3) and removes it; nothing is left."""
    rc, engine = reconcile, own_docker.engine
    pid, cid, rc_file, flag = _ready_then_dockerd_killed(rc, own_docker, "kept", tmp_path)
    (flag / "stop").touch()
    rc.wait_gone(pid, timeout=60)
    rc.once(check=None)  # dockerd down: no code to read, no container removed
    record = rc.record("kept")
    assert record is not None and record["phase"] == "Failed", record
    assert record["last_exit"]["code"] is None, record
    assert rc_file.exists()  # kept: the container it names is still to remove
    own_docker.start()
    assert engine.ours(rc.state) == [cid]
    rc.once(check=None)
    record = rc.record("kept")
    assert record is not None and record["phase"] == "Failed", record
    assert record["last_exit"]["code"] == 3, record
    assert "exited with code 3" in record["message"], record
    described = rc("describe", "kept", check=0)
    assert "Last exit:    exited with code 3" in described.out, described
    assert engine.ours(rc.state) == [] and not rc_file.exists()  # read, then removed
    rc.once(check=None)  # told once: a later pass has nothing more to say
    assert _exits_read(rc, "kept") == [(3, False)], rc.events("kept")
    rc.down()
    assert engine.ours(rc.state) == []
    assert sorted((rc.state / "run").glob("reconcile-*")) == []


def _exits_read(rc: Reconcile, name: str) -> list[tuple[int, bool]]:
    """The journal's corrections of a `code unknown`: (code, OOMKilled) of each."""
    said = [e for e in rc.events(name) if e.get("action") == "exit"]
    return [(e["exit_code"], e["oom_killed"]) for e in said]


def test_a_run_restarted_before_dockerd_answered_is_read_as_the_last_exit(
    reconcile: Reconcile, own_docker: OwnDocker, tmp_path: Path
) -> None:
    """The engine ended (code 3) while dockerd was down: its pass said `code unknown` and
    could not remove the container. Its restart came before any pass read that code, and
    the restart's new nonce left the old container to be removed, unread, as one no
    record names: its code was lost for good. The record keeps that run until dockerd
    answers; then its code is the last exit (Kubernetes' lastState), the journal says it
    once, and the old container is removed."""
    rc, engine = reconcile, own_docker.engine
    pid, cid, rc_file, flag = _ready_then_dockerd_killed(
        rc, own_docker, "again", tmp_path, policy="Always"
    )
    (flag / "stop").touch()
    rc.wait_gone(pid, timeout=60)
    rc.once(check=None)  # dockerd down: the code unknown, the container kept
    record = rc.record("again")
    assert record is not None and record["phase"] == "BackOff", record
    assert record["last_exit"]["code"] is None and rc_file.exists(), record
    (flag / "stop").unlink()  # the next run serves
    own_docker.start()
    rc.converge(timeout="120s")  # the restart (after a back-off), the old run read
    record = rc.record("again")
    assert record is not None and record["phase"] == "Ready", record
    # 2 where that pass restarted it at once, dockerd still down (its spawn failed)
    assert record["restarts"] in (1, 2) and record["container"]["id"] != cid, record
    assert record["last_exit"]["code"] == 3, record
    assert "unread_exit" not in record and record["version"] == 3, record  # none left
    assert _exits_read(rc, "again") == [(3, False)], rc.events("again")
    assert engine.ours(rc.state) == [record["container"]["id"]]  # the old one read, removed
    assert not rc_file.exists()
    rc.down()
    assert engine.ours(rc.state) == []
    assert sorted((rc.state / "run").glob("reconcile-*")) == []


def test_a_container_no_record_names_is_removed_once_it_ended(
    rc: Reconcile, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash of ours between an engine's end and its teardown, its record lost
    meanwhile: the container, ended, is no one's to read. The pass that finds its exit
    file with no record naming it removes it (never leaked), and not one that runs."""
    manifest = write(rc, engine, "lost")
    rc.converge()
    record = rc.record("lost")
    assert record is not None and record["phase"] == "Ready", record
    cid = record["container"]["id"]
    rc_file = exit_file(str(rc.state.resolve()), "lost", record["nonce"])
    manifest.unlink()
    RecordStore(rc.state).delete("lost")  # the record lost: its engine an orphan now
    for key, value in engine.env.items():  # this process asks the runtime too
        monkeypatch.setenv(key, value)
    backend = LocalBackend(rc.state, rc.node)
    assert backend.drop_unused_env_files(list) == 0  # it runs: kept, and its exit file
    assert engine.ours(rc.state) == [cid] and rc_file.exists()
    engine.cli("stop", "-t", "0", cid)  # it ends: no pass reads it
    assert engine.inspect(cid)["State"]["Status"] in ("exited", "stopped")  # podman's both
    assert backend.drop_unused_env_files(list) == 1
    assert engine.ours(rc.state) == [] and not rc_file.exists()
    rc.down()


def test_an_engine_whose_end_no_event_says_is_reported_with_its_code(
    reconcile: Reconcile, podman: Engine, tmp_path: Path
) -> None:
    """podman keeping no events (``events_logger = "none"``; or past those it keeps), the
    `run` of a Ready engine killed, then the engine exits with code 3: `run --rm` had
    conmon remove the container, its code with it, and no event said it: `code
    unknown`. The container stays until the pass has read its State, then it is removed."""
    conf = tmp_path / "containers.conf"
    conf.write_text(PODMAN_CONF + 'events_logger = "none"\n')
    engine = Engine("podman", {"CONTAINERS_CONF": str(conf)}, image=podman.image)
    rc = reconcile
    rc.env.update(engine.env)
    flag = tmp_path / "flag"
    flag.mkdir()
    write(rc, engine, "silent", command=EXITS_3, restartPolicy="Never",
          container={"volumes": [f"{flag}:/flag"]})  # fmt: skip
    rc.converge()
    record = rc.record("silent")
    assert record is not None and record["phase"] == "Ready", record
    pid = record["ref"]["pid"]
    shell = _waiting_shell(exit_file(str(rc.state.resolve()), "silent", record["nonce"]))
    os.killpg(shell, signal.SIGKILL)  # the shell and its `run`: a session of their own
    rc.wait_gone(shell, timeout=60)
    (flag / "stop").touch()
    rc.wait_gone(pid, timeout=60)
    rc.once(check=None)
    record = rc.record("silent")
    assert record is not None and record["phase"] == "Failed", record
    assert record["last_exit"]["code"] == 3, record
    described = rc("describe", "silent", check=0)
    assert "Last exit:    exited with code 3" in described.out, described
    assert engine.ours(rc.state) == []  # read, then removed by the pass's teardown
    rc.down()
    assert engine.ours(rc.state) == []
    assert sorted((rc.state / "run").glob("reconcile-*")) == []


# The stand-in engine, which fills its memory once /flag/eat exists (the test's folder).
EATS = [
    "/bin/busybox",
    "sh",
    "-c",
    "/bin/busybox httpd -f -p {host}:{port} -h /www & "
    "until [ -e /flag/eat ]; do /bin/busybox sleep 0.05; done; "
    'x=$(/bin/busybox head -c 512m /dev/zero | /bin/busybox tr "\\0" a); exit 0',
]


def test_an_engine_the_oom_killer_ended_is_named_oomkilled(
    reconcile: Reconcile, docker: Engine, tmp_path: Path
) -> None:
    """A container engine over its memory limit (`docker update --memory` here: the
    spec sets none) is ended by the kernel's OOM killer: its `run` says 137 alone, a code
    any SIGKILL gives. The runtime's State says OOMKilled, and the pass names it so."""
    rc = reconcile
    rc.env.update(docker.env)
    flag = tmp_path / "flag"
    flag.mkdir()
    write(rc, docker, "eater", command=EATS, restartPolicy="Never",
          container={"volumes": [f"{flag}:/flag"]})  # fmt: skip
    rc.converge()
    record = rc.record("eater")
    assert record is not None and record["phase"] == "Ready", record
    pid, cid = record["ref"]["pid"], record["container"]["id"]
    docker.cli("update", "--memory", "32m", "--memory-swap", "32m", cid)
    (flag / "eat").touch()
    rc.wait_gone(pid, timeout=60)
    # dockerd takes the kernel's OOM event and the exit as they come: its word first.
    rc.wait_for(lambda: docker.inspect(cid)["State"]["OOMKilled"] is True, timeout=30,
                what="docker's OOMKilled")  # fmt: skip
    rc.once(check=None)
    record = rc.record("eater")
    assert record is not None and record["phase"] == "Failed", record
    assert record["last_exit"]["code"] == 137, record
    assert record["last_exit"]["reason"] == "OOMKilled", record
    described = rc("describe", "eater", check=0)
    said = "Last exit:    exited with code 137 (OOMKilled: out of memory)"
    assert said in described.out, described
    rc.down()
    assert docker.ours(rc.state) == []
