"""Engines in containers, on real podman and docker (each test runs on both).

The stand-in engine is busybox's httpd in an image built by the fixtures (conftest.py).
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
import urllib.request
import uuid
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import psutil
import pytest
from containers.conftest import STANDIN, Engine, after_pulls, mistaken, write
from procs import free_ports, wait_for

from controller.backends.local.container import PullJob, exit_status
from controller.failpoints import CONTAINER_POINTS
from controller.host.containers import (
    DIGEST_LABEL,
    INSTANCE_LABEL,
    OWNER_LABEL,
    STATE_LABEL,
    Runtime,
)
from tests.daemon.conftest import Daemons

if TYPE_CHECKING:
    from conftest import Reconcile, Result


def health(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
        body: str = answer.read().decode()
        return body


def running(rc: Reconcile, name: str) -> dict[str, object]:
    record = rc.record(name)
    assert record is not None and record["phase"] == "Ready", record
    return record


def test_an_engine_runs_in_its_container_with_the_lease_and_the_marker(
    rc: Reconcile, engine: Engine
) -> None:
    write(rc, engine, "box")
    rc.converge()
    record = running(rc, "box")
    port, pid = record["port"], record["ref"]["pid"]  # type: ignore[index]
    assert health(port) == "ok\n"  # type: ignore[arg-type]
    kept = record["container"]
    assert kept["runtime"] == engine.name and kept["image"] == engine.image  # type: ignore[index]
    assert kept["digest"].startswith("sha256:")  # type: ignore[index]
    # The record's pid is the container's main process, as this host sees it.
    seen = engine.inspect(kept["id"])  # type: ignore[index]
    assert seen["State"]["Pid"] == pid
    marker = f"{rc.node}/box/{record['nonce']}"
    labels = seen["Config"]["Labels"]
    assert labels[INSTANCE_LABEL] == marker
    assert labels[STATE_LABEL] == str(rc.state.resolve())
    assert labels[OWNER_LABEL] == record["owner"]  # the set: its own pass may adopt it
    env = rc.environ(pid)  # type: ignore[arg-type]
    assert env["RECONCILE_INSTANCE"] == marker and env["PORT"] == str(port)
    assert env["RECONCILE_OWNER"] == record["owner"]
    assert env["RECONCILE_NAME"] == "box" and env["CUDA_VISIBLE_DEVICES"] == ""
    assert "HOME" not in env or env["HOME"] != os.environ.get("HOME")  # not the host's env
    # The engine's output is in the deployment's log; status and describe say the container.
    logs = rc("logs", "box", check=0)
    assert f"engine box on port {port}" in logs.out, str(logs)
    item = rc.status("box", cli=True)["box"]
    assert item["container"] == {
        "runtime": engine.name,
        "id": kept["id"],  # type: ignore[index]
        "image": engine.image,
        "digest": kept["digest"],  # type: ignore[index]
    }
    described = rc("describe", "box", check=0).out
    for shown in (engine.name, engine.image, kept["id"][:12], kept["digest"]):  # type: ignore[index]
        assert shown in described, described
    rc.down()
    assert engine.ours(rc.state) == []
    rc.wait_gone(pid)  # type: ignore[arg-type]


def test_a_value_with_a_newline_reaches_the_container_as_it_reaches_a_process(
    rc: Reconcile, engine: Engine
) -> None:
    """A PEM certificate in spec.env: no line of ``--env-file`` holds it, and it reached
    the engine as nothing at all (CERT unset) while a process got it whole. A value that
    ends in a carriage return (a Windows line's end) lost it: both runtimes read ``\r\n``
    as a line's end."""
    cert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
    sent = {"CERT": cert, "PLAIN": "a=b c", "CRLF": "token\r", "LEAD": "  y", "HASH": "#z"}
    write(rc, engine, "pem", env=sent)
    rc.converge()
    env = rc.environ(running(rc, "pem")["ref"]["pid"])  # type: ignore[index]
    assert {key: env.get(key) for key in sent} == sent
    rc.down()


def test_volumes_and_shm_size_reach_the_container(
    rc: Reconcile, engine: Engine, tmp_path: Path
) -> None:
    """``volumes`` as written (``:ro`` is read-only there) and ``shmSize`` as /dev/shm's
    size: the engine says what it sees into its log."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "hello").write_text("from the host\n")
    looks = (
        "cat /data/hello; df -k /dev/shm | tail -1; "
        "touch /data/written 2>/dev/null && echo writable || echo read-only; "
    )
    command = [*STANDIN[:3], looks + STANDIN[3]]
    spec = {"volumes": [f"{shared}:/data:ro"], "shmSize": "96Mi"}  # the default is 64M
    write(rc, engine, "mounts", command=command, container=spec)
    rc.converge()
    said = rc("logs", "mounts", check=0).out
    assert "from the host" in said, said
    assert "read-only" in said and not (shared / "written").exists(), said
    shm_kib = [line.split()[1] for line in said.splitlines() if line.rstrip().endswith("/dev/shm")]
    assert shm_kib == ["98304"], said
    rc.down()


def test_once_leaves_the_container_running_and_the_next_pass_keeps_it(
    rc: Reconcile, engine: Engine
) -> None:
    write(rc, engine, "kept")
    rc.converge()
    first = running(rc, "kept")
    rc.once()
    again = running(rc, "kept")
    assert again["ref"] == first["ref"] and again["container"] == first["container"]
    assert again["restarts"] == 0
    assert engine.ours(rc.state) == [first["container"]["id"]]  # type: ignore[index]
    rc.down()


@pytest.mark.parametrize("how", ["rm -f", "kill -9"])
def test_a_container_removed_or_killed_by_hand_is_restarted(
    rc: Reconcile, engine: Engine, how: str
) -> None:
    write(rc, engine, "hand")
    rc.converge()
    first = running(rc, "hand")
    cid, pid = first["container"]["id"], first["ref"]["pid"]  # type: ignore[index]
    if how == "rm -f":
        engine.cli("rm", "-f", cid)
    else:
        os.kill(pid, signal.SIGKILL)
    rc.wait_gone(pid)
    rc.converge()
    again = running(rc, "hand")
    assert again["restarts"] == 1 and again["container"]["id"] != cid  # type: ignore[index]
    assert health(again["port"]) == "ok\n"  # type: ignore[arg-type]
    rc.wait_for(lambda: engine.ours(rc.state) == [again["container"]["id"]])  # type: ignore[index]
    rc.down()


# The stand-in, saying a numbered tick every 0.2 s: output after its `run` was killed.
TICKER = [
    *STANDIN[:2],
    "-c",
    STANDIN[3].replace(
        "; /bin/busybox httpd",
        "; (i=0; while :; do i=$((i+1)); echo tick $i; /bin/busybox sleep 0.2; done) &"
        " /bin/busybox httpd",
    ),
]


def _read_until(out: IO[bytes], wanted: bytes, seconds: float) -> bytes:
    """What ``out`` says until ``wanted`` (or ``seconds`` pass: the assert says what came)."""
    got, deadline = bytearray(), time.monotonic() + seconds
    while wanted not in got and (left := deadline - time.monotonic()) > 0:
        if select.select([out], [], [], left)[0]:
            chunk = os.read(out.fileno(), 65536)
            if not chunk:
                break
            got += chunk
    assert wanted in got, bytes(got)
    return bytes(got)


def _ticks(text: str) -> list[int]:
    return [int(line.split()[1]) for line in text.splitlines() if line.startswith("tick ")]


def test_logs_read_the_runtime_once_the_run_client_is_killed(rc: Reconcile, engine: Engine) -> None:
    """The runtime's `run` streams the engine's output into its log file: killed (by
    hand, an OOM kill of that client alone) while the container ran on, `reconcile logs`
    stopped at that moment. It reads the runtime's log of the container from there."""
    write(rc, engine, "box", command=TICKER)
    try:
        cid = _run_client_killed(rc)
        last = max(_ticks(rc.store().log_path("box").read_text()))
        rc.wait_for(lambda: last + 3 in _ticks(engine.cli("logs", cid)), 30, "ticks past the file")
        shown = rc("logs", "box", check=0).out
        ticks = _ticks(shown)
        assert ticks == list(range(1, len(ticks) + 1)) and len(ticks) >= last + 3, shown
        assert shown.count(" reconcile: start box instance ") == 1, shown  # the marker, once
        tail = _ticks(rc("logs", "box", "--tail", "2", check=0).out)
        assert len(tail) == 2 and tail[1] == tail[0] + 1 and tail[0] >= ticks[-1] - 1, tail
        follow, _ = rc.follow("box")
        assert follow.stdout is not None
        seen = _read_until(follow.stdout, f"tick {ticks[-1] + 3}\n".encode(), 30)
        more = _ticks(seen[: seen.rindex(b"\n") + 1].decode())  # whole lines only
        assert more == list(range(more[0], more[-1] + 1)), more  # nothing twice, nothing lost
        rc.down()  # the container ends: so does the follow of its runtime's log
        follow.communicate(timeout=30)
        assert follow.returncode == 0
    finally:
        rc.down()


def _run_client_killed(rc: Reconcile) -> str:
    """``box`` (a ticker) up, then its runtime's `run` client killed once two ticks were
    logged, the container running on; its id, once the run's exit status is written."""
    rc.converge()
    rec = running(rc, "box")
    (rc_file,) = (rc.state / "run").glob("*.rc")
    shell = psutil.Process(int(rc_file.read_text().split()[1]))  # `pid N`: the run's shell
    rc.wait_for(lambda: "tick 2" in rc("logs", "box").out, 30, "two ticks")
    (client,) = shell.children()
    client.kill()  # the `run` alone: the container runs on
    rc.wait_for(lambda: exit_status(rc_file) is not None, 30, "the run's exit status")
    return str(rec["container"]["id"])  # type: ignore[index]


def test_logs_say_when_the_runtimes_log_cannot_be_read(
    rc: Reconcile, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its `run` killed while the container runs on, an engine's output is the runtime's
    to give: where the runtime's `logs` failed (its daemon down, a storage lock), `reconcile
    logs` showed the file alone, which stops at that `run`'s end (its shell's `Killed`
    last), exit 0 and not a word: as if the engine had said nothing since (a containers
    trial). It says so now, in the runtime's words; the file is still shown, and holds no
    `Killed` of that shell's (the engine was not killed)."""
    write(rc, engine, "box", command=TICKER)
    try:
        cid = _run_client_killed(rc)
        written = rc.store().log_path("box").read_text()
        # the engine was not killed: its log says nothing of it (the `run`'s shell said
        # `Killed` there, before it wrote the status waited for above)
        assert "Killed" not in written, written
        last = max(_ticks(written))
        rc.wait_for(lambda: last + 3 in _ticks(engine.cli("logs", cid)), 30, "ticks past the file")
        words = "cannot connect to the container runtime"
        count = mistaken(engine, tmp_path, monkeypatch, f"logs {cid}", words, times=1)
        path = f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"
        shown = rc("logs", "box", check=0, env={"PATH": path})
        assert count.read_text().strip() == "1", shown  # the runtime was asked, and failed
        assert " reconcile: start box instance " in shown.out and "tick 2" in shown.out, shown
        said = f"reconcile: box: `{engine.name} logs {cid}`: Error: {cid}: {words}: "
        assert said in shown.err and "is not shown (the log file stops there)" in shown.err, shown
        again = rc("logs", "box", check=0, env={"PATH": path})  # the runtime answers now
        assert max(_ticks(shown.out)) == last, shown  # the file's alone
        assert again.err == "" and last + 3 in _ticks(again.out), again
    finally:
        rc.down()


def test_once_says_the_restart_pulls_when_its_image_was_removed_meanwhile(
    rc: Reconcile, engine: Engine
) -> None:
    """The image removed by hand, then its container: the pass's restart waits for the
    image's pull (Pulling), and `--once` says so. It said the round before's view instead
    (``BackOff: engine exited …; restart now``), which no record held by then."""
    image = f"127.0.0.1:{free_ports()}/reconcile-test/engine:removed"  # nothing listens there
    engine.cli("tag", engine.image, image)
    try:
        write(rc, engine, "removed", container={"image": image})
        rc.converge()
        pid = running(rc, "removed")["ref"]["pid"]
        engine.cli("rmi", image)  # the tag alone: the stand-in's own still names the image
        os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]
        rc.wait_gone(pid)  # type: ignore[arg-type]
        done = rc.once(check=None)
        record = rc.record("removed")
        assert record is not None and record["phase"] == "Pulling", record
        said = [line for line in done.err.splitlines() if line.startswith("removed: ")]
        assert said == [f"removed: Pulling: {record['message']}"], done
        after_pulls(rc)
        rc.down()
    finally:
        engine.cli("rmi", image, check=False)


def until_pull_failed(rc: Reconcile, name: str) -> dict[str, Any]:
    """Passes until ``name``'s record says its image's pull failed (it ends between them)."""

    def failed() -> dict[str, Any] | None:
        rc.once(check=None)
        record = rc.record(name)
        if record is not None and "cannot pull image" in record["message"]:
            return record
        after_pulls(rc)
        return None

    found: dict[str, Any] = wait_for(failed, timeout=90, what=f"{name}'s pull to fail")
    return found


def test_an_image_built_here_without_a_tag_says_how_to_run_it(
    rc: Reconcile, engine: Engine
) -> None:
    """``podman build -t mine``: no tag, so pullPolicy defaults to Always (Kubernetes'),
    and the pull fails where no registry has the image. The runtime's words named only the
    registry; the message says the image is here and what to set."""
    image = f"localhost/reconcile-test/built-here-{uuid.uuid4().hex[:8]}"  # :latest
    engine.cli("tag", engine.image, image)
    try:
        write(rc, engine, "mine", container={"image": image})
        record = until_pull_failed(rc, "mine")
        assert record["phase"] == "BackOff", record
        hint = "it is on this node, but pullPolicy defaults to Always for `:latest` or no tag"
        assert hint in record["message"], record["message"]
        assert "set pullPolicy: IfNotPresent" in record["message"], record["message"]
        write(rc, engine, "mine", container={"image": image, "pullPolicy": "IfNotPresent"})
        rc.converge()
        assert running(rc, "mine")["container"]["image"] == image  # type: ignore[index]
        rc.down()
    finally:
        engine.cli("rmi", image, check=False)


def test_once_says_the_retry_of_a_failed_pull_pulls(rc: Reconcile, engine: Engine) -> None:
    """A pull that failed backs off holding nothing; once the back-off is over the pass
    pulls again (Pulling), and `--once` says so, not the failure it read before."""
    image = f"127.0.0.1:{free_ports()}/reconcile-test/engine:nowhere"  # nothing listens there
    write(rc, engine, "retried", container={"image": image})
    record = until_pull_failed(rc, "retried")
    assert record["phase"] == "BackOff" and record["port"] is None, record
    rc.end_backoff("retried")  # over now: its length is tests/core's
    done = rc.once(check=None)
    record = rc.record("retried")
    assert record is not None and record["phase"] == "Pulling", record
    said = [line for line in done.err.splitlines() if line.startswith("retried: ")]
    assert said == [f"retried: Pulling: {record['message']}"], done
    after_pulls(rc)
    rc.down()


def test_replicas_each_get_a_container_and_down_removes_them_all(
    rc: Reconcile, engine: Engine
) -> None:
    write(rc, engine, "pool", replicas=2)
    rc.converge()
    records = [running(rc, name) for name in ("pool", "pool@1")]
    ids = sorted(r["container"]["id"] for r in records)  # type: ignore[index]
    assert sorted(engine.ours(rc.state)) == ids
    assert {health(r["port"]) for r in records} == {"ok\n"}  # type: ignore[arg-type]
    rc.down()
    assert engine.ours(rc.state) == []


def test_a_changed_spec_rolls_to_a_new_container(rc: Reconcile, engine: Engine) -> None:
    write(rc, engine, "roll", strategy="RollingUpdate")
    rc.converge()
    old = running(rc, "roll")
    write(rc, engine, "roll", strategy="RollingUpdate", env={"WAVE": "2"})
    rc.converge()
    new = running(rc, "roll")
    assert new["container"]["id"] != old["container"]["id"]  # type: ignore[index]
    assert rc.environ(new["ref"]["pid"])["WAVE"] == "2"  # type: ignore[index]
    rc.wait_for(lambda: engine.ours(rc.state) == [new["container"]["id"]])  # type: ignore[index]
    rc.down()


def test_pull_policy_never_and_no_image_names_the_image(rc: Reconcile, engine: Engine) -> None:
    """Pending, naming the image, said once: a pass spent all its rounds starting it again
    (five `pending` events a pass, each with its image looks: a daemon's passes took
    seconds and its journal filled with the same line every 5 s)."""
    missing = "localhost/reconcile-test/absent:1"
    write(rc, engine, "never", container={"image": missing, "pullPolicy": "Never"})
    rc.once(check=1)
    record = rc.record("never")
    assert record is not None and record["phase"] == "Pending", record
    assert missing in record["message"] and "pullPolicy is Never" in record["message"]
    assert record["port"] is None, record  # it holds nothing while it waits
    rc.once(check=1)  # the same verdict: no news
    said = [e for e in rc.events("never") if e.get("outcome") == "pending"]
    assert len(said) == 1, rc.events("never")
    assert engine.ours(rc.state) == []
    # Nothing ran, so the log says nothing: each pass wrote a `start` line there.
    assert not (rc.state / "instances" / "logs" / "never.log").exists()
    rc.down()


def test_plan_exits_1_where_pull_policy_never_finds_no_image(rc: Reconcile, engine: Engine) -> None:
    """`plan` exits 1 where `--once` would: a start, or a Ready engine's new spec, whose
    image the node lacks and pullPolicy Never will not pull. The pass leaves the start
    Pending and keeps the running engine (exit 1), but `plan` exited 2 (changes pending),
    so `reconcile plan && reconcile --once` went on into a failing pass (a containers
    trial)."""
    write(rc, engine, "kept")
    rc.converge()
    missing = "localhost/reconcile-test/absent:1"
    never = {"image": missing, "pullPolicy": "Never"}
    fresh = write(rc, engine, "fresh", container=never)
    planned = rc("plan", check=1)
    assert f"image {missing} is not on this node and pullPolicy is Never" in planned.out, planned
    rc.once(check=1)  # as planned
    rc("down", "fresh")
    fresh.unlink()
    write(rc, engine, "kept", container=never)
    planned = rc("plan", check=1)
    assert "it would not start now (pull-image: image " in planned.out, planned
    serving = rc.record("kept")
    done = rc.once(check=1)  # as planned: the engine serves on
    assert "the running engine is kept" in done.err, done
    assert rc.record("kept")["ref"] == serving["ref"]  # type: ignore[index]
    rc("plan", check=1)  # and again, with the kept engine's record
    rc.down()


def _pull_ended(rc: Reconcile, engine: Engine, name: str) -> tuple[str, PullJob]:
    """``name`` on an image from a registry nobody serves: Pulling, then its pull ended
    (failed); the image and its pull job."""
    image = f"127.0.0.1:{free_ports(1)}/reconcile-test/absent:1"  # nothing listens there
    write(rc, engine, name, container={"image": image})
    rc.once()  # a pull on its way is no failure
    assert rc.record(name)["phase"] == "Pulling"
    job = PullJob.of(rc.state, engine.name, image)
    wait_for(lambda: job.exists() and not job.running(), timeout=90, what="the pull's end")
    return image, job


def test_pull_policy_never_set_after_a_failed_pull_says_never_at_once(
    rc: Reconcile, engine: Engine
) -> None:
    """A pull that failed (a registry nobody serves), then the manifest edited to
    `pullPolicy: Never` before the next pass: the start of the new spec found the old
    spec's ended pull and backed off with its error, so `status` said "cannot pull" of a
    spec that never pulls until the back-off ended. The record says the new spec's
    word at once: the image is not on this node and Never will not pull it."""
    image, job = _pull_ended(rc, engine, "edited")
    write(rc, engine, "edited", container={"image": image, "pullPolicy": "Never"})
    rc.once(check=1)
    record = rc.record("edited")
    assert record["phase"] == "Pending", record
    assert record["message"].startswith(f"image {image} is not on this node and pullPolicy "
                                        "is Never"), record["message"]  # fmt: skip
    assert "cannot pull" not in record["message"] and not job.exists(), record
    rc.down()


def test_an_ended_pull_of_an_image_no_spec_names_is_forgotten(
    rc: Reconcile, engine: Engine
) -> None:
    """A pull is read (and forgotten) by the next start of its image; the manifest's
    image edited before that start left the ended pull's files in `<state>/images/` for
    good. A pass forgets an ended pull that no manifest of it and no record names; another
    set's pass keeps it while this set's record is Pulling for it."""
    _, job = _pull_ended(rc, engine, "edited")
    other = rc.tmp / "other-set"
    rc.write("bystander", folder=other, basePort=rc.port + 5)  # a process: no image
    rc.once("-f", str(other))
    assert job.exists() and job.log.exists()  # "edited"'s record names it: its set's
    write(rc, engine, "edited")  # the image every other test runs
    rc.once()
    assert rc.record("edited")["phase"] == "Ready"
    assert not job.exists() and not job.log.exists()
    assert [p.name for p in (rc.state / "images").iterdir()] == []
    rc.down()
    rc.down("-f", str(other))


def test_a_run_the_runtime_refuses_is_named_in_its_words_and_leaves_no_container(
    rc: Reconcile, engine: Engine
) -> None:
    """The image is there but its engine cannot start: a program the image lacks (a wrong
    ``spec.executable``). The runtime's ``run`` ends before any main process; the record
    says why in the runtime's own words, no engine runs, and the start left no container.
    The next pass tries again after the back-off."""
    write(rc, engine, "absent", command=["/bin/no-such-engine", "--port", "{port}"])
    rc.once(check=None)
    record = rc.record("absent")
    assert record is not None and record["phase"] in ("BackOff", "Failed"), record
    assert f"{engine.name} run:" in record["message"], record["message"]
    assert "/bin/no-such-engine" in record["message"], record["message"]
    # The runtime names the path alone; where it comes from and what to set are ours.
    hint = f"/bin/no-such-engine is not in image {engine.image}: set spec.command[0] to"
    assert hint in record["message"], record["message"]
    assert record["ref"] is None, record
    rc.wait_for(lambda: engine.ours(rc.state) == [])
    rc.down()


def test_a_run_refused_with_126_for_another_cause_is_not_said_a_missing_program(
    rc: Reconcile, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A README trial: runc not allowed to set the rlimits (a sandbox's podman without
    `default_ulimits = []`) makes `run` exit 126, and the record said "/bin/busybox is not
    executable in image ...: set spec.command[0] ...", a wrong next move; the runtime's
    words stand alone now."""
    words = ("runc create failed: unable to start container process: error during container"
             " init: error setting rlimits for ready process: error setting rlimit type 7:"
             " operation not permitted: OCI permission denied")  # fmt: skip
    mistaken(engine, tmp_path, monkeypatch, "run --cidfile", words, times=1, code=126)
    write(rc, engine, "limited")
    path = f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"
    done = rc("--once", check=None, env={"PATH": path})
    assert (tmp_path / "run---cidfile.count").exists(), done
    record = rc.record("limited")
    assert record is not None and "error setting rlimits" in record["message"], record
    assert "not executable" not in record["message"], record["message"]
    assert "spec.command[0]" not in record["message"], record["message"]
    rc.down()


def test_an_engine_that_exits_is_judged_by_its_restart_policy_with_its_code(
    rc: Reconcile, engine: Engine
) -> None:
    """A container's exit is its engine's: ``quick`` exits before its main process can be
    seen (its start has removed it), ``later`` once it has run a while. Under
    ``restartPolicy: Never`` each runs once and is Failed with the code it exited with
    (the `run`'s status is its container's): podman ran ``quick`` twice, calling its
    engine's output the runtime's words, and the code was lost on both runtimes."""
    write(rc, engine, "quick", command=["/bin/busybox", "sh", "-c", "echo bye; exit 3"],
          restartPolicy="Never")  # fmt: skip
    write(rc, engine, "later", command=["/bin/busybox", "sh", "-c", "sleep 1; exit 4"],
          restartPolicy="Never", basePort=rc.port + 2)  # fmt: skip
    waited = rc("--once", "--wait", "--timeout", "60s", check=1)
    for name, code in (("quick", 3), ("later", 4)):
        record = rc.record(name)
        assert record is not None and record["phase"] == "Failed", (record, waited)
        assert record["last_exit"]["code"] == code and record["restarts"] == 0, record
        assert f"exited with code {code}" in record["message"], record
        assert "restartPolicy Never" in record["message"], record
        actions = [e.get("action") for e in rc.events(name)]
        assert "restart" not in actions and actions.count("fail") == 1, rc.events(name)
    assert f"{engine.name} run:" not in rc.record("quick")["message"]
    rc.wait_for(lambda: engine.ours(rc.state) == [])
    rc.down()


def test_an_engine_that_exits_at_once_crash_loops_as_a_process_does(
    rc: Reconcile, engine: Engine
) -> None:
    """A container whose engine exits before its main process is seen, under
    ``restartPolicy: Always``: its first restart is at once and counted, then it backs off,
    and `--once` exits 1 naming the crash loop, as for a process. It was BackOff for 10 s
    with 0 restarts and `--once` exited 0 (cron heard of it a pass late, `status` showed
    one restart fewer than it had run)."""
    write(rc, engine, "crashing", command=["/bin/busybox", "sh", "-c", "echo bye; exit 3"])
    looped: Result | None = None
    # One pass, or three where a run was seen before it ended (the pass then ends with it
    # Starting, and the next finds it gone): never the 10 s the old back-off waited.
    for _ in range(3):
        done = rc.once(check=None)
        record = rc.record("crashing")
        assert record is not None, done
        if record["phase"] == "BackOff" and record["restarts"] >= 1:
            looped = done
            break
    assert looped is not None, (record, rc.events("crashing"))
    assert looped.code == 1 and "crashing is crash-looping" in looped.err, looped
    assert record["restarts"] == 1, record
    assert record["message"].endswith("; restart in 10s"), record["message"]
    actions = [e.get("action") for e in rc.events("crashing")]
    assert actions.count("restart") == 1, rc.events("crashing")
    rc.wait_for(lambda: engine.ours(rc.state) == [])
    rc.down()


def test_a_runtime_that_does_not_answer_is_named_not_the_disk(
    reconcile: Reconcile, docker: Engine
) -> None:
    """`down` while docker's daemon cannot be reached: the runtime's words and the next
    move (it said "I/O error: docker rm …: Cannot connect … running?. Fix the disk or
    permissions"); the record stays, and a `down` that reaches it removes the container."""
    reconcile.env.update(docker.env)
    write(reconcile, docker, "unreached")
    reconcile.converge()
    cid = running(reconcile, "unreached")["container"]["id"]  # type: ignore[index]
    cut = reconcile("down", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"}, check=1)
    assert "Cannot connect to the Docker daemon" in cut.err, cut
    assert "the container runtime must answer" in cut.err and "disk" not in cut.err, cut
    assert reconcile.record("unreached") is not None and docker.ours(reconcile.state) == [cid]
    reconcile.down()
    assert docker.ours(reconcile.state) == []


def test_a_runtime_that_does_not_answer_holds_up_no_other_deployment(
    reconcile: Reconcile, docker: Engine
) -> None:
    """docker's daemon unreachable while its engine is dead (a stopping daemon stops its
    containers): the pass ended at the dead container's `rm` ("the container runtime must
    answer", exit 1), every pass, so while docker was down nothing else was started,
    restarted or marked Ready, and `status` kept calling the dead engine Ready. Now that
    record backs off in docker's words, the other deployments go on, and once docker
    answers the engine runs again."""
    rc = reconcile
    rc.env.update(docker.env)
    write(rc, docker, "boxed")
    rc.converge()
    pid = running(rc, "boxed")["ref"]["pid"]  # type: ignore[index]
    os.kill(pid, signal.SIGKILL)
    rc.wait_gone(pid)
    rc.write("plain", basePort=rc.port + 5)  # a process, new in this pass
    cut = rc("--once", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"}, check=None)
    assert "must answer" not in cut.err, cut
    plain = rc.record("plain")
    assert plain is not None and plain["phase"] in ("Starting", "Ready"), (plain, cut)
    boxed = rc.record("boxed")
    assert boxed is not None and boxed["phase"] == "BackOff", (boxed, cut)
    assert "Cannot connect to the Docker daemon" in boxed["message"], boxed
    rc.end_backoff("boxed")  # docker answering again is what counts: not the back-off's length
    rc.converge(timeout="60s")
    assert running(rc, "boxed")["ref"]["pid"] != pid  # type: ignore[index]
    rc.down()
    assert docker.ours(rc.state) == []


def test_a_start_the_runtime_refused_says_so_in_the_log(
    reconcile: Reconcile, docker: Engine
) -> None:
    """docker's daemon unreachable: nothing starts, and the engine's log said it did (its
    `start` line, then nothing: read as an engine that started and said nothing). Now the
    line after it says the start failed, in docker's words."""
    rc = reconcile
    write(rc, docker, "refused")
    cut = rc("--once", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"}, check=None)
    record = rc.record("refused")
    assert record is not None and record["phase"] == "BackOff", (record, cut)
    lines = rc.store().log_path("refused").read_text().splitlines()
    assert lines[0].startswith("--- ") and " reconcile: start refused " in lines[0], lines
    last = lines[-1]
    assert " reconcile: not started: " in last and not last.startswith("--- "), lines
    assert "Cannot connect to the Docker daemon" in last, lines
    assert docker.ours(rc.state) == []


def test_an_instance_gone_takes_its_run_folder_with_it(
    reconcile: Reconcile, podman: Engine
) -> None:
    """Each instance's runtime dir (`run/<name>/`) stayed in the state dir after its
    deployment was removed and after `down`, empty, one per name ever run. It goes with
    its instance's last record now; another deployment's stays while that one runs."""
    rc = reconcile
    rc.env.update(podman.env)
    write(rc, podman, "gone")
    write(rc, podman, "kept", basePort=rc.port + 5)
    rc.converge()
    runs = rc.state / "run"
    assert (runs / "gone").is_dir() and (runs / "kept").is_dir()
    (rc.manifests / "gone.yaml").unlink()
    rc.converge()
    assert rc.record("gone") is None and not (runs / "gone").exists()
    assert (runs / "kept").is_dir() and running(rc, "kept")
    rc.down()
    assert not (runs / "kept").exists(), sorted(p.name for p in runs.iterdir())
    assert podman.ours(rc.state) == []


def test_an_image_tag_that_does_not_pull_stops_nothing(rc: Reconcile, engine: Engine) -> None:
    """A Recreate to an image not on the node pulls it first, the running engine serving
    meanwhile: a tag's typo stops nothing (it stopped the engine, then failed to pull).
    The failure is said, and the tag set back changes nothing."""
    write(rc, engine, "tagged")
    rc.converge()
    old = running(rc, "tagged")
    typo = "localhost/reconcile-test/absent:404"
    write(rc, engine, "tagged", container={"image": typo})

    def said() -> tuple[str, Result] | None:
        done = rc.once(check=None)
        kept = [e for e in rc.events("tagged") if e.get("outcome") == "waiting"]
        failed = kept and "cannot pull" in kept[-1]["error"]
        if not failed:
            after_pulls(rc)
        return (kept[-1]["error"], done) if failed else None

    why, done = wait_for(said, timeout=90, what="the replacement's pull to fail")
    assert f"cannot pull image {typo}" in why and "the running engine is kept" in why, why
    # cron hears of it: the manifest's spec does not run, though the old one serves on
    assert done.code == 1 and f"error: tagged: {why}" in done.err, done
    kept = running(rc, "tagged")
    assert kept["ref"] == old["ref"] and health(kept["port"]) == "ok\n", kept  # type: ignore[arg-type]
    assert not [e for e in rc.events("tagged") if e.get("action") == "replace" and
                e.get("outcome") != "waiting"]  # fmt: skip
    # pullPolicy: Never set since: the failed pull was the old spec's, Never's word is said
    write(rc, engine, "tagged", container={"image": typo, "pullPolicy": "Never"})
    never = rc.once(check=1)
    assert f"image {typo} is not on this node and pullPolicy is Never" in never.err, never
    assert "cannot pull" not in never.err, never
    write(rc, engine, "tagged")  # the tag set back: nothing to replace
    assert "In sync" in rc("plan", check=0).out
    rc.down()


def test_status_says_the_old_spec_serves_while_the_new_image_does_not_pull(
    rc: Reconcile, engine: Engine
) -> None:
    """A Recreate whose new image does not pull keeps its engine serving and `--once` exits
    1 naming it, but `status` and `describe` said Ready with no message: the edited spec did
    not run and neither said so. Both say it now (as a model pull's failure is said), until
    the spec runs (a containers trial's finding)."""
    write(rc, engine, "held")
    rc.converge()
    typo = "localhost/reconcile-test/absent:404"
    write(rc, engine, "held", container={"image": typo})

    def held() -> dict[str, Any] | None:
        rc.once(check=None)
        item: dict[str, Any] = json.loads(rc("status", "held", "-o", "json", check=0).out)[0]
        if item["conditions"]:
            return item
        after_pulls(rc)
        return None

    item = wait_for(held, timeout=90, what="status to say the new image did not pull")
    assert item["phase"] == "Ready" and item["message"] == "", item
    [why] = item["conditions"]
    assert why.startswith(f"cannot pull image {typo}: ") and "engine is kept" in why, why
    assert f"cannot pull image {typo}: " in rc("status", check=0).out
    described = rc("describe", "held", check=0).out
    assert f"Conditions:   cannot pull image {typo}: " in described, described
    write(rc, engine, "held")  # set back: the running engine is the spec's again
    rc.once()
    assert json.loads(rc("status", "held", "-o", "json", check=0).out)[0]["conditions"] == []
    rc.down()


def test_the_new_image_s_condition_stays_while_its_pull_is_tried_again(
    rc: Reconcile, engine: Engine
) -> None:
    """The condition of a Recreate whose new image did not pull went away while each
    retry's pull ran (30 s on) and came back when it failed: it stays, saying so, until a
    pull brings the image or the spec changes (a containers trial's finding)."""
    write(rc, engine, "again")
    rc.converge()
    typo = "localhost/reconcile-test/absent:404"
    write(rc, engine, "again", container={"image": typo})

    def conditions() -> list[str]:
        rc.once(check=None)
        item: dict[str, Any] = json.loads(rc("status", "again", "-o", "json", check=0).out)[0]
        assert item["phase"] == "Ready", item
        said: list[str] = item["conditions"]
        return said

    def failed() -> list[str] | None:
        after_pulls(rc)
        return conditions() or None

    wait_for(failed, timeout=90, what="status to say the new image did not pull")
    job = PullJob.of(rc.state, engine.name, typo)
    ended = job.log.stat().st_mtime - 60  # the retry is due (PREPULL_RETRY: 30 s)
    os.utime(job.log, (ended, ended))
    [retrying] = conditions()  # the pass that pulls again
    assert retrying.startswith(f"cannot pull image {typo}: "), retrying
    assert retrying.endswith("; pulling it again"), retrying
    [after] = conditions()  # the next one: its pull runs or failed again
    assert after.startswith(f"cannot pull image {typo}: "), after
    write(rc, engine, "again")  # set back: the running engine is the spec's again
    rc.once()
    assert conditions() == []
    after_pulls(rc)
    rc.down()


def test_a_roll_whose_image_is_not_here_says_it_pulls_first(rc: Reconcile, engine: Engine) -> None:
    """`plan` and the `roll` event said the new instance took a port ("no devices, port
    N") while it held nothing during its image's pull: they say the pull comes first and
    what it takes once pulled (a containers trial's finding)."""
    write(rc, engine, "wave", strategy="RollingUpdate")
    rc.converge()
    typo = "localhost/reconcile-test/absent:404"
    write(rc, engine, "wave", strategy="RollingUpdate", container={"image": typo})
    first = f"wave@next beside the old: pulling image {typo} ({engine.name}) first; "
    planned = rc("plan", check=None).out
    assert f"{first}once pulled it takes no devices, port " in planned, planned
    rc.once(check=None)
    rolls = [e["reason"] for e in rc.events("wave") if e.get("action") == "roll"]
    assert rolls and all(first in why for why in rolls), rolls
    after_pulls(rc)
    rc.down()


def test_a_container_the_runtime_briefly_calls_gone_is_removed_all_the_same(
    rc: Reconcile, engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """podman 4.3 says "no such container" of one it holds while images sharing its layers
    are imported or removed. Believed at once, a removal could return with the container
    still there: an engine left running past its `down`. Here the first `rm -f` finds
    "none" (quietly, as `-f` does) and the next two inspects "no such container": the
    container is removed all the same."""
    name = f"reconcile-test-{uuid.uuid4().hex[:8]}"
    label = f"{STATE_LABEL}={rc.state.resolve()}"  # the rc fixture's leak check sees it
    engine.cli("run", "-d", "--name", name, "--label", label, engine.image,
               "/bin/busybox", "sleep", "300")  # fmt: skip
    rms = mistaken(engine, tmp_path / "rm", monkeypatch, "rm -f", "", times=1, code=0)
    looks = mistaken(engine, tmp_path / "looks", monkeypatch, "container inspect",
                     "no such container")  # fmt: skip
    Runtime(engine.name).remove(name, grace=0)
    assert engine.ours(rc.state) == []
    assert rms.read_text().strip() == "2" and looks.read_text().strip() == "3"


def test_a_runtime_missing_on_the_node_is_named_with_the_next_move(
    rc: Reconcile, engine: Engine, tmp_path: Path
) -> None:
    """A manifest names a runtime this node lacks (here: a PATH without it): the record
    says so and what to do, no traceback, no engine; it backs off as any failed start."""
    write(rc, engine, "elsewhere")
    bare = tmp_path / "bin"  # a PATH with no container runtime on it
    bare.mkdir()
    done = rc("--once", check=None, env={"PATH": str(bare)})
    assert "Traceback" not in done.err, done
    record = rc.record("elsewhere")
    assert record is not None and record["phase"] != "Ready", record
    said = record["message"]
    assert f"{engine.name} is not installed on this node" in said, said
    assert "spec.container.runtime" in said, said
    assert record["phase"] == "BackOff" and record["ref"] is None, record  # retried later
    rc.down()


KILL_AT = sorted(
    {
        "executor.spawn.before_exec",
        *CONTAINER_POINTS,
        "executor.spawn.before_record",
        "executor.spawn.after_record",
    }
)


@pytest.mark.parametrize("point", KILL_AT)
def test_a_sigkill_while_starting_leaves_no_container_without_a_record(
    rc: Reconcile, engine: Engine, point: str
) -> None:
    """Invariant 3 for containers: the next pass adopts or removes; never two."""
    write(rc, engine, "crash")
    killed = rc("--once", check=None, env={"RECONCILE_FAILPOINTS": f"{point}=kill"})
    assert killed.code == -signal.SIGKILL, str(killed)
    rc.converge()
    record = running(rc, "crash")
    rc.wait_for(lambda: len(engine.ours(rc.state)) == 1, what="one container")
    [cid] = engine.ours(rc.state)
    seen = engine.inspect(cid)
    assert seen["State"]["Pid"] == record["ref"]["pid"]  # type: ignore[index]
    # An adopted container is recorded as one its pass started (its labels say the rest).
    kept = record["container"]
    assert kept is not None and kept["id"] == cid, record
    assert kept["runtime"] == engine.name and kept["image"] == engine.image, kept
    assert kept["digest"].startswith("sha256:"), kept  # type: ignore[index]
    assert rc.status("crash", cli=True)["crash"]["container"] == kept
    rc.down()
    assert engine.ours(rc.state) == []


@pytest.mark.parametrize("point", ["executor.stop.after_terminating", "executor.stop.after_delete"])
def test_a_sigkill_while_stopping_leaves_no_container_behind(
    rc: Reconcile, engine: Engine, point: str
) -> None:
    """Invariant 3 for containers, the other way: a `down` killed mid-stop, then again."""
    write(rc, engine, "going")
    rc.converge()
    killed = rc("down", check=None, env={"RECONCILE_FAILPOINTS": f"{point}=kill"})
    assert killed.code == -signal.SIGKILL, str(killed)
    rc.down()
    rc.wait_for(lambda: engine.ours(rc.state) == [], what="no container")
    assert rc.pids("going") == set()


def _image_id(engine: Engine, image: str) -> str:
    found = engine.cli("image", "inspect", "--format", "{{.Id}}", image).strip()
    return found if found.startswith("sha256:") else f"sha256:{found}"


def test_a_daemon_that_remembers_an_image_still_sees_its_tag_moved(
    rc: Reconcile, engine: Engine
) -> None:
    """The daemon remembers an image's digest between starts (no `image inspect` before
    a run) and looks again once the container runs: a tag moved meanwhile gets a
    container of the new image, labelled and recorded with its digest."""
    tag = engine.build(f"localhost/reconcile-test/moving:{uuid.uuid4().hex[:10]}")
    first = _image_id(engine, tag)
    engine.images.append(first)  # untagged below: removed at the session's end too
    daemon = Daemons(rc)
    try:
        running = daemon()
        write(rc, engine, "mover", container={"image": tag})
        record = running.wait(lambda: _ready(rc, "mover"), "mover Ready")
        assert _image_id(engine, engine.inspect(record["container"]["id"])["Image"]) == first
        engine.build(tag, extra=b"another image")  # the same tag, another image
        second = _image_id(engine, tag)
        assert second != first
        os.kill(record["ref"]["pid"], signal.SIGKILL)  # the daemon starts it again

        def restarted() -> dict[str, Any] | None:
            now = _ready(rc, "mover")
            return now if now and now["container"]["id"] != record["container"]["id"] else None

        again = running.wait(restarted, "mover running again", timeout=90)
        digest = again["container"]["digest"]
        assert digest != record["container"]["digest"], again  # the new image's
        seen = engine.inspect(again["container"]["id"])
        assert _image_id(engine, seen["Image"]) == second
        assert seen["Config"]["Labels"][DIGEST_LABEL] == digest
        assert running.stop() == 0
    finally:
        daemon.kill_all()
    rc.down()


def test_a_daemon_that_remembers_an_image_pulls_it_again_once_removed(
    rc: Reconcile, engine: Engine
) -> None:
    """The image removed by hand, then its container: the daemon's restart ran the image
    it remembered, and the runtime's "image not known" was a failed restart (a longer
    back-off). The restart looks again and pulls, as a first start does."""
    image = f"127.0.0.1:{free_ports()}/reconcile-test/engine:forgotten"  # nothing listens
    engine.cli("tag", engine.image, image)
    daemon = Daemons(rc)
    try:
        running = daemon()
        write(rc, engine, "forgot", container={"image": image})
        record = running.wait(lambda: _ready(rc, "forgot"), "forgot Ready")
        engine.cli("rmi", image)  # the tag alone: the stand-in's own still names the image
        os.kill(record["ref"]["pid"], signal.SIGKILL)  # the daemon starts it again

        def pull_failed() -> dict[str, Any] | None:
            now = rc.record("forgot")
            return now if now is not None and "cannot pull image" in now["message"] else None

        running.wait(pull_failed, "the restart's pull to fail", timeout=90)
        spawns = [e for e in rc.events("forgot") if e.get("reason") == "spawn"]
        assert spawns == [], spawns  # no `run` of an image that is not there
        assert running.stop() == 0
    finally:
        daemon.kill_all()
        engine.cli("rmi", image, check=False)
    after_pulls(rc)
    rc.down()


def _ready(rc: Reconcile, name: str) -> dict[str, Any] | None:
    record: dict[str, Any] | None = rc.record(name)
    return record if record is not None and record["phase"] == "Ready" else None


def test_a_torn_records_container_is_spared_by_another_set_and_reaped_by_its_own(
    rc: Reconcile, engine: Engine
) -> None:
    """Its environment names its set (`RECONCILE_OWNER`): another set's pass leaves it
    running; its own set's pass, its manifest deleted meanwhile, removes it (once taken
    for another set's, it ran on with no record, forever)."""
    write(rc, engine, "box")
    rc.converge()
    pid = running(rc, "box")["ref"]["pid"]  # type: ignore[index]
    rc.record_path("box").write_text("{")  # torn
    other = rc.tmp / "other"
    other.mkdir()
    rc.write("batch", folder=other, basePort=rc.port + 5)
    rc("-f", str(other), "--once", check=1)  # exit 1: the torn record, said
    assert rc.alive(pid) and len(engine.ours(rc.state)) == 1  # type: ignore[arg-type]
    rc.write("keep", basePort=rc.port + 10)  # the folder is not emptied: it may prune
    (rc.manifests / "box.yaml").unlink()
    rc.once(check=None)
    rc.wait_gone(pid)  # type: ignore[arg-type]
    rc.wait_for(lambda: engine.ours(rc.state) == [], what="the container removed")
    rc.down()
    rc.down("-f", str(other))


def test_an_env_file_a_killed_start_left_is_removed_but_not_another_sets(
    rc: Reconcile, engine: Engine
) -> None:
    """`run/<container>.env` holds spec.env's values: a start SIGKILLed before `run`
    returned left its own for good. `down`, or the next pass, removes it; another set's
    stays."""
    write(rc, engine, "kept", env={"TOKEN": "not-for-disk"})
    runs = rc.state / "run"
    runs.mkdir(parents=True, exist_ok=True)
    foreign = runs / "reconcile-theirs-0123456789abcdef.env"
    foreign.write_text("RECONCILE_OWNER=another-set\nTOKEN=theirs\n")
    kill = {"RECONCILE_FAILPOINTS": "container.run.before_wait=kill"}
    for then in (rc.down, rc.converge):
        killed = rc("--once", check=None, env=kill)
        assert killed.code == -signal.SIGKILL, str(killed)
        [left] = [p for p in runs.glob("*.env") if p != foreign]  # the old code kept it
        assert "TOKEN=not-for-disk" in left.read_text()
        # The killed pass's `run` goes on: its container is there before `then` looks.
        rc.wait_for(lambda: len(engine.ours(rc.state)) == 1, what="the killed start's container")
        then()
        assert sorted(runs.glob("*.env")) == [foreign], then
    running(rc, "kept")
    rc.down()
    assert foreign.read_text() == "RECONCILE_OWNER=another-set\nTOKEN=theirs\n"


def test_a_command_in_a_container_without_an_image_names_the_field(
    rc: Reconcile, engine: Engine
) -> None:
    """Engine 'command' has no pinned image: a container with none stopped every pass with
    a KeyError traceback (the recipe's image looked up), the deployment beside it too. It
    is the manifest's error now, at its line, with the field to set."""
    rc.write("noimage", container={"runtime": engine.name}, command=STANDIN)
    write(rc, engine, "beside", basePort=rc.port + 5)
    said = rc.once(check=1)  # the fixture fails on a traceback
    expected = (
        f"{rc.manifests / 'noimage.yaml'}:5: spec: engine 'command' has no pinned image: set "
        "spec.container.image to an image that holds spec.command[0]"
    )
    assert expected in said.err, str(said)
    assert rc.status("noimage")["noimage"]["phase"] == "Pending"
    beside = rc.record("beside")
    assert beside is not None and beside["phase"] in ("Starting", "Ready"), beside
    rc.down()
