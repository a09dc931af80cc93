"""Identity and squatters: a record pointing at someone else's process or port, or at nothing.

The "foreign" process here is one the test starts itself, in a session of its own
(a group leader, as a reused pid often is: a shell, a daemon, a container). It
must come out of every case alive: reconcile never signals what is not its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .churn import crash
from .cluster import Cluster, alive, start_time
from .invariants import TOLERANCE, describe, read_records, violations

LISTENER = (
    "import socket,sys,time\n"
    "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(600)\n"
)


def foreign(cluster: Cluster, port: int | None = None) -> subprocess.Popen[bytes]:
    """An unrelated process (no marker), leader of its own session; killed at teardown."""
    argv = [sys.executable, "-c", LISTENER, str(port)] if port else ["sleep", "600"]
    proc = subprocess.Popen(argv, start_new_session=True, env=cluster.env)
    cluster.helpers.append(proc)
    if port:
        import time

        while not _listening(port):
            time.sleep(0.01)
    return proc


def later_foreign(cluster: Cluster, after: float) -> subprocess.Popen[bytes]:
    """A foreign process whose start time is past `after` by more than the tolerance.

    A pid is reused by a process started later; within the tolerance the record's
    (pid, start time) would name it exactly (a fast pass starts engine and squatter
    within those 50 ms). Start times come from the kernel's clock (boot time plus
    ticks), which can sit some way off `time.time()`, so the squatter's own start
    time is read and it is started again until it is late enough.
    """
    deadline = time.monotonic() + 10
    while True:
        proc = foreign(cluster)
        started = start_time(proc.pid)
        if started is not None and started - after > 2 * TOLERANCE:
            return proc
        proc.kill()
        proc.wait()
        assert time.monotonic() < deadline, "no process started past the tolerance in 10 s"
        time.sleep(TOLERANCE)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def edit(cluster: Cluster, record: str, raw: bytes | None = None, **changes: Any) -> None:
    path = cluster.state / "instances" / f"{record}.json"
    if raw is None:
        data = json.loads(path.read_text())
        data.update(changes)
        raw = json.dumps(data).encode()
    tmp = path.with_name(".edit.tmp")
    tmp.write_bytes(raw)
    os.replace(tmp, path)


def running(cluster: Cluster, name: str = "a0") -> dict[str, Any]:
    cluster.write(name)
    first = cluster.once()
    assert first.code == 0, str(first)
    rec = json.loads((cluster.state / "instances" / f"{name}.json").read_text())
    assert isinstance(rec, dict)
    return rec


def clean(run: Any) -> None:
    assert run.code in (0, 1) and "Traceback" not in run.err, str(run)


def test_pid_reuse_never_signals_the_new_owner(cluster: Cluster) -> None:
    rec = running(cluster)
    crash(cluster, "a0")
    squatter = later_foreign(cluster, rec["ref"]["start_time"])  # took the engine's pid
    edit(cluster, "a0", ref={"pid": squatter.pid, "start_time": rec["ref"]["start_time"]})
    healed = cluster.once()
    assert healed.code == 0, str(healed)
    assert squatter.poll() is None, "reconcile killed a process that reused the engine's pid"
    assert violations(cluster) == [], describe(cluster)
    edit(cluster, "a0", ref={"pid": squatter.pid, "start_time": rec["ref"]["start_time"]})
    clean(cluster.run("down"))
    assert squatter.poll() is None, "`down` killed a process that reused the engine's pid"


def leaderless_group(cluster: Cluster) -> tuple[int, int]:
    """A foreign process group whose leader has exited: (its group id, its member's pid).

    After a reboot, or a pid namespace's restart (the daemon's container restarted), a
    dead engine's recorded pid can be such a group's id: the kernel keeps a group id from
    new processes while a member lives, not from groups that formed after the engine died.
    """
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 600 >/dev/null & echo $!"],
        stdout=subprocess.PIPE,
        start_new_session=True,
        env=cluster.env,
    )
    out, _ = leader.communicate(timeout=30)  # reaped: its pid is free, its group is not
    member = int(out)
    assert os.getpgid(member) == leader.pid and not alive(leader.pid)
    return leader.pid, member


def test_a_foreign_group_at_a_dead_engines_pid_is_not_signalled(cluster: Cluster) -> None:
    rec = running(cluster)
    crash(cluster, "a0")
    group, member = leaderless_group(cluster)
    try:
        edit(cluster, "a0", ref={"pid": group, "start_time": rec["ref"]["start_time"]})
        healed = cluster.once()
        assert healed.code == 0, str(healed)
        assert alive(member), "a pass killed a foreign group at the dead engine's pid"
        assert violations(cluster) == [], describe(cluster)
        edit(cluster, "a0", ref={"pid": group, "start_time": rec["ref"]["start_time"]})
        clean(cluster.run("down"))
        assert alive(member), "`down` killed a foreign group at the dead engine's pid"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


def test_a_forged_identity_is_not_signalled(cluster: Cluster) -> None:
    """A record hand-edited to name a live foreign process exactly (pid AND start time)."""
    running(cluster)
    squatter = foreign(cluster)
    started = start_time(squatter.pid)
    edit(cluster, "a0", ref={"pid": squatter.pid, "start_time": started})
    clean(cluster.once())
    clean(cluster.run("down"))
    assert squatter.poll() is None, "reconcile signalled a process that never carried its marker"
    assert not [p for p in _marked_names(cluster)], "the real engine outlived `down`"


def _marked_names(cluster: Cluster) -> list[str]:
    from .cluster import marked

    return [p.name for p in marked(cluster.node)]


def test_a_foreign_listener_on_a_records_port(cluster: Cluster) -> None:
    """The port is re-placed (basePort scans on), never fought over or crash-looped on."""
    rec = running(cluster)
    crash(cluster, "a0")
    squatter = foreign(cluster, port=rec["port"])  # grabbed the port while the engine was down
    healed = cluster.once()
    assert healed.code == 0, str(healed)
    assert squatter.poll() is None and _listening(rec["port"])
    now = read_records(cluster.state)[0]["a0"]
    assert now.port != rec["port"], describe(cluster)
    assert violations(cluster) == [], describe(cluster)


NONSENSE: dict[str, dict[str, Any]] = {
    "not-json": {"raw": b'{"version": 1, "name": "a0", '},
    "wrong-types": {"port": "eighty", "devices": 7},
    "other-name": {"name": "a9"},
    "pid-zero": {"ref": {"pid": 0, "start_time": 0}},
    "pid-negative": {"ref": {"pid": -5, "start_time": 0}},
    "pid-huge": {"ref": {"pid": 2**40, "start_time": 0}},
    "maker-zero": {"phase": "Reserved", "ref": None, "reserved_by": {"pid": 0, "start_time": 0}},
}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(Path(tmp_path_factory.mktemp("nonsense")))
    running(cluster)
    yield cluster
    leftovers = cluster.close()
    assert not leftovers, f"engines outlived `reconcile down`: {leftovers}"


@pytest.mark.parametrize("case", sorted(NONSENSE))
def test_a_record_edited_into_nonsense(node: Cluster, case: str) -> None:
    bystander = foreign(node)
    edit(node, "a0", **NONSENSE[case])
    clean(node.once())  # one pass heals
    assert bystander.poll() is None, f"{case}: a bystander process was killed"
    assert violations(node, quarantine_ok=True) == [], f"{case}\n{describe(node)}"


def test_an_unknown_version_is_never_reset(cluster: Cluster) -> None:
    """A record from a newer reconcile: left in place, its engine left running, an error."""
    rec = running(cluster)
    edit(cluster, "a0", version=99)
    path = cluster.state / "instances" / "a0.json"
    before = path.read_bytes()
    run = cluster.once()
    assert run.code == 1 and "version 99" in run.err and "Traceback" not in run.err, str(run)
    assert path.read_bytes() == before
    assert alive(rec["ref"]["pid"]), "the engine of an unknown-version record was killed"
    edit(cluster, "a0", version=rec["version"])  # its writer is back: it takes over
    assert cluster.once().code == 0
    assert violations(cluster) == [], describe(cluster)
    assert alive(rec["ref"]["pid"])
