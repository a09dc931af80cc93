"""A container engine's stop in the daemon, on real podman and docker: deferred as a
process's (README "The daemon"), so a slow one holds up nothing else."""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Any

from containers.conftest import STANDIN, Engine, write

from tests.daemon.conftest import Daemons

if TYPE_CHECKING:
    from conftest import Reconcile

# The stand-in, deaf to SIGTERM (vLLM takes 10-30 s to act on it): only a SIGKILL ends it.
STUBBORN = [*STANDIN[:3], STANDIN[3].replace('trap "exit 0" TERM', 'trap "" TERM')]
LONG_GRACE = 300  # seconds: never over while the test waits (it ends the engine itself)
RESTART_WAIT = 90.0  # seconds for a crashed engine's new container, on a loaded host


def _ready(rc: Reconcile, name: str) -> dict[str, Any] | None:
    record: dict[str, Any] | None = rc.record(name)
    return record if record is not None and record["phase"] == "Ready" else None


def _phase(rc: Reconcile, name: str) -> str | None:
    record = rc.record(name)
    return None if record is None else str(record["phase"])


def test_a_containers_slow_stop_does_not_hold_up_a_crash_restart(
    rc: Reconcile, engine: Engine
) -> None:
    """The daemon's pass waited out a container engine's whole grace period in the
    runtime's `stop` (a process's stop is deferred): another engine's crash meanwhile was
    not restarted, and `status` said it Ready. Now the runtime's kill sends the stop
    signal, the record stays Terminating (holding what it holds), and the stop is finished
    once the container's main process is gone."""
    write(rc, engine, "stubborn", command=STUBBORN, stopGracePeriodSeconds=LONG_GRACE)
    write(rc, engine, "steady")
    daemons = Daemons(rc)
    try:
        d = daemons()
        stubborn = d.wait(lambda: _ready(rc, "stubborn"), "stubborn Ready")
        steady = d.wait(lambda: _ready(rc, "steady"), "steady Ready")
        (rc.manifests / "stubborn.yaml").unlink()
        d.wait(lambda: _phase(rc, "stubborn") == "Terminating", "stubborn Terminating")
        os.kill(steady["ref"]["pid"], signal.SIGKILL)  # a crash while the stop's grace runs

        def restarted() -> dict[str, Any] | None:
            now = _ready(rc, "steady")
            return now if now and now["container"]["id"] != steady["container"]["id"] else None

        again = d.wait(restarted, "steady restarted", timeout=RESTART_WAIT)
        # Restarted while the stop's grace ran: before, the pass waited it out first.
        assert _phase(rc, "stubborn") == "Terminating", rc.events("stubborn")
        stubborn_id = stubborn["container"]["id"]
        assert engine.inspect(stubborn_id)["State"]["Running"], "TERM ended the stubborn one"
        engine.cli("kill", stubborn_id)  # SIGKILL by hand: its group is gone, the stop ends
        d.wait(lambda: rc.record("stubborn") is None, "stubborn's stop finished")
        d.wait(lambda: engine.ours(rc.state) == [again["container"]["id"]], "its removal")
        assert d.stop() == 0, d.tail()
    finally:
        daemons.kill_all()
    rc.down()


# The stand-in, saying so when it acts on its stop signal.
SAYS_STOPPED = [
    *STANDIN[:3],
    STANDIN[3].replace('trap "exit 0" TERM', 'trap "echo stopped cleanly; exit 0" TERM'),
]


def test_a_grace_under_half_a_second_still_sends_the_stop_signal(
    rc: Reconcile, engine: Engine
) -> None:
    """The runtimes' `stop -t` takes whole seconds: the grace was rounded, so 0.2 s was
    `-t 0`, with which podman sends SIGKILL alone (docker SIGTERM, then SIGKILL at once):
    the engine never acted on its stop signal. Rounded up now, as a process's grace is
    never cut short."""
    write(rc, engine, "brief", command=SAYS_STOPPED, stopGracePeriodSeconds=0.2)
    rc.converge()
    assert _phase(rc, "brief") == "Ready", rc.events("brief")
    assert rc.down().code == 0
    log = rc.state / "instances" / "logs" / "brief.log"
    # A line of its own: the log's `start` line quotes the command, the trap's words too.
    said = lambda: "stopped cleanly" in log.read_text().splitlines()  # noqa: E731
    rc.wait_for(said, timeout=10, what="its TERM trap's words")


def test_the_runtimes_own_stop_gives_the_specs_grace(rc: Reconcile, engine: Engine) -> None:
    """`docker stop` by hand, or the docker daemon's shutdown, stops a container with its
    own stop timeout: the runtime's default 10 s, not the spec's grace (vLLM's 30 s
    SIGKILLed at 10). The container carries the spec's grace, rounded up, as its own."""
    write(rc, engine, "graceful", stopGracePeriodSeconds=42.5)
    rc.converge()
    record = rc.record("graceful")
    assert record is not None and record["phase"] == "Ready", rc.events("graceful")
    assert engine.inspect(record["container"]["id"])["Config"]["StopTimeout"] == 43
    rc.down()


def test_a_terminating_containers_gpu_goes_to_no_one_until_it_is_gone(
    rc: Reconcile, engine: Engine
) -> None:
    """The deferred stop keeps the record's GPU while the container runs on (deaf to
    SIGTERM): a deployment that needs it waits Pending, naming the holder, and starts
    once the container is gone. Never two engines on one GPU."""
    rc.devices = "nvidia:0"
    write(rc, engine, "old", command=STUBBORN, stopGracePeriodSeconds=LONG_GRACE,
          devices={"count": 1})  # fmt: skip
    daemons = Daemons(rc)
    try:
        d = daemons("--allow-empty")  # its one manifest goes: prune it
        old = d.wait(lambda: _ready(rc, "old"), "old Ready")
        (rc.manifests / "old.yaml").unlink()
        d.wait(lambda: _phase(rc, "old") == "Terminating", "old Terminating")
        write(rc, engine, "new", devices={"count": 1})
        d.wait(lambda: _phase(rc, "new") == "Pending", "new waits for the GPU")
        assert rc.status("old")["old"]["devices"] == ["nvidia:0"]
        # named as what its stop makes room for (the preemption trial's wording: it said
        # "held by old", and `plan` "no capacity: remove a manifest")
        said = rc.status("new")["new"]["message"]
        assert said.startswith("waiting for old to stop, which makes room"), said
        engine.cli("kill", old["container"]["id"])  # SIGKILL by hand: the stop ends
        new = d.wait(lambda: _ready(rc, "new"), "new Ready once old is gone", RESTART_WAIT)
        assert rc.record("old") is None and new["devices"] == ["nvidia:0"]
        assert engine.ours(rc.state) == [new["container"]["id"]]
        assert d.stop() == 0, d.tail()
    finally:
        daemons.kill_all()
    rc.down()
