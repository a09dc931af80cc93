"""The lifecycle through the real CLI, with real engines, files, ports and signals.

Engines are ``python -m controller.demo.engine`` (``/health``) or tiny Python scripts;
every test ends with ``reconcile down`` and the fixture fails it if anything is left.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import urllib.request
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from procs import alive, environ, wait_for, wait_gone

from controller.core.state import Phase, ProcessRef
from controller.failpoints import ENV as FAILPOINTS
from controller.store.lock import FileLock

# An engine that forks a grandchild which leaves the process group (setsid), then serves.
ESCAPING_ENGINE = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(300); os._exit(0)
    os._exit(0)
os.execvp(sys.executable, [sys.executable, "-m", "controller.demo.engine", "--port", sys.argv[1]])
"""


def get(port: int, path: str = "/health") -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        status: int = resp.status
        return status


def test_create_crash_restart_replace_delete(reconcile: Any) -> None:
    # create
    reconcile.write("web")
    reconcile.converge()
    web = reconcile.status()["web"]
    assert (web["phase"], web["ready"], web["restarts"]) == ("Ready", True, 0)
    assert get(web["port"]) == 200
    assert reconcile.pids("web") == {web["pid"]}

    # crash -> the next pass restarts it at once (the first restart is immediate)
    os.kill(web["pid"], signal.SIGKILL)
    wait_gone(web["pid"])
    reconcile.converge()
    again = reconcile.status()["web"]
    assert again["phase"] == "Ready" and again["restarts"] == 1
    assert again["pid"] != web["pid"] and again["port"] == web["port"]
    assert reconcile.pids("web") == {again["pid"]}

    # a second crash backs off 10 s: the pass records BackOff and says when
    os.kill(again["pid"], signal.SIGKILL)
    wait_gone(again["pid"])
    reconcile.once()  # BackOff is not a failure: exit 0
    backing = reconcile.status()["web"]
    assert backing["phase"] == "BackOff" and "restart in 10s" in backing["message"]
    assert backing["next_retry_at"]
    # --once is not the engine's parent: the exit is recorded, its code is not known.
    assert backing["last_exit"]["code"] is None and backing["last_exit"]["at"]
    assert backing["port"] == web["port"]  # it keeps its lease meanwhile

    # replace: a spec change stops the old engine and starts the new one
    reconcile.write("web", args=["--load-seconds", "0"])
    reconcile.converge()
    replaced = reconcile.status()["web"]
    assert replaced["phase"] == "Ready" and replaced["restarts"] == 0
    assert reconcile.pids("web") == {replaced["pid"]}
    kinds = [e["action"] for e in reconcile.events("web")]
    assert "replace" in kinds
    replace = next(e for e in reconcile.events("web") if e["action"] == "replace")
    assert replace["reason"] == "spec.args changed"

    # delete: the engine goes, then its record
    (reconcile.manifests / "web.yaml").unlink()
    reconcile.write("other")
    reconcile.once()
    assert "web" not in reconcile.status()
    assert reconcile.record("web") is None
    wait_gone(replaced["pid"])
    assert reconcile.pids("web") == set()
    reconcile.down()


def test_a_restart_shows_no_start_but_its_own_engines(reconcile: Any) -> None:
    """A crash's restart: while it is reserved (its maker killed between the spawn and
    the record, so it stays that way) status shows no start time, then the adopted new
    engine's; it showed the crashed engine's start, which the adoption kept."""
    reconcile.write("web")
    reconcile.converge()
    web = reconcile.status()["web"]
    os.kill(web["pid"], signal.SIGKILL)
    wait_gone(web["pid"])
    crashed_at = datetime.now(UTC)
    killed = reconcile("--once", env={FAILPOINTS: "executor.spawn.before_record=kill"})
    assert killed.code == -signal.SIGKILL, str(killed)
    reserved = reconcile.status()["web"]
    assert (reserved["phase"], reserved["pid"]) == ("Reserved", None), reserved
    assert reserved["started_at"] is None, reserved
    described = reconcile("describe", "web", check=0).out
    assert web["started_at"] not in described, described
    reconcile.converge()
    adopted = reconcile.status()["web"]
    assert adopted["phase"] == "Ready" and adopted["pid"] != web["pid"], adopted
    assert datetime.fromisoformat(adopted["started_at"]) >= crashed_at, (web, adopted)
    reconcile.down()


def test_no_capacity_says_who_holds_the_devices(reconcile: Any) -> None:
    reconcile.devices = "nvidia:0"
    reconcile.write("a", devices={"count": 1, "kind": "nvidia"})
    reconcile.converge()
    reconcile.write("b", devices={"count": 1, "kind": "nvidia"})
    result = reconcile.once(check=1)  # Pending: cron should hear about it
    b = reconcile.status()["b"]
    assert b["phase"] == "Pending" and b["pid"] is None and b["port"] is None
    assert b["devices"] == []
    expected = "no capacity: needs 1 nvidia device, 0 free — held by a [nvidia:0]"
    assert expected in b["message"]
    assert f"b: Pending: {expected}" in result.err
    assert reconcile.pids("b") == set()

    # capacity comes back when a goes: b starts in the same pass
    (reconcile.manifests / "a.yaml").unlink()
    reconcile.converge()
    assert reconcile.status()["b"]["devices"] == ["nvidia:0"]
    reconcile.down()


def test_exact_port_taken_by_a_foreign_listener(reconcile: Any) -> None:
    port = reconcile.port
    foreign = reconcile.spawn(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    )
    wait_for(lambda: not reconcile.bindable(port), what="the foreign listener")
    reconcile.write("web", port=port, basePort=None)
    reconcile.once(check=1)
    web = reconcile.status()["web"]
    assert web["phase"] == "Pending"
    # who holds it, so the next move is clear (the CLI reads this node's /proc)
    held = f"port {port} is in use by pid {foreign.pid} ({sys.executable} -m http.server "
    assert web["message"].startswith(held), web["message"]
    assert web["message"].endswith("): free it or choose another port"), web["message"]
    assert foreign.poll() is None and get(port, "/") == 200  # untouched, still serving
    assert reconcile.pids() == set()

    foreign.kill()
    foreign.wait()
    reconcile.converge()
    assert reconcile.status()["web"]["port"] == port
    reconcile.down()


def test_a_recorded_pid_now_held_by_an_unrelated_process(reconcile: Any) -> None:
    """The record's pid was reused by a stranger (a session leader): it must survive."""
    reconcile.write("web")
    reconcile.converge()
    web = reconcile.status()["web"]
    stranger = reconcile.spawn(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
    )
    store = reconcile.store()
    rec = store.read("web")
    os.kill(web["pid"], signal.SIGKILL)  # the engine died ...
    wait_gone(web["pid"])
    fake = ProcessRef(pid=stranger.pid, start_time=rec.ref.start_time)  # ... its pid "reused"
    store.write(replace(rec, ref=fake))

    reconcile.converge()  # dead (start time differs): restarted, never signalled
    assert stranger.poll() is None
    restarted = reconcile.status()["web"]
    assert restarted["pid"] not in (stranger.pid, web["pid"]) and restarted["restarts"] == 1

    store.write(replace(store.read("web"), ref=fake))
    reconcile.down()  # teardown of that record: still never the stranger
    assert stranger.poll() is None and alive(stranger.pid)
    wait_gone(restarted["pid"])  # the real engine, found by its marker, is gone


def test_a_grandchild_that_left_the_group_is_torn_down(reconcile: Any) -> None:
    reconcile.write(
        "web", command=[sys.executable, "-c", ESCAPING_ENGINE, "{port}"], stopGracePeriodSeconds=1
    )
    reconcile.converge()
    web = reconcile.status()["web"]

    def both() -> set[int] | None:
        pids: set[int] = reconcile.pids("web")
        return pids if len(pids) == 2 else None

    family = wait_for(both, what="the engine and its escaped grandchild")
    (escaped,) = family - {web["pid"]}
    assert os.getpgid(escaped) != os.getpgid(web["pid"])
    reconcile.down()
    for pid in family:
        wait_gone(pid, timeout=1)  # down returns only once nothing of it is left
    assert reconcile.status() == {}


def test_deleting_a_record_by_hand_never_gives_two_engines(reconcile: Any) -> None:
    reconcile.write("web", port=reconcile.port, basePort=None)
    reconcile.converge()
    first = reconcile.status()["web"]
    reconcile.record_path("web").unlink()
    reconcile.converge()  # the orphan is reaped (its marker has no record), one new engine
    second = reconcile.status()["web"]
    wait_gone(first["pid"])
    assert reconcile.pids("web") == {second["pid"]}
    assert second["port"] == first["port"]
    reap = [e for e in reconcile.events("web") if e["action"] == "reap"]
    assert reap and "have no record" in reap[0]["reason"]
    reconcile.down()


# The demo engine holding pages it wrote: the kernel frees them at exit after the
# process's environment is gone from /proc and before its sockets close (exit_mm runs
# before exit_files), the window in which a sweep's scan saw no marker any more.
HEAVY = (
    "import sys; ballast = bytearray(b'x') * (256 << 20); "
    "from controller.demo.engine import main; sys.exit(main(sys.argv[1:]))"
)


def test_a_reaped_orphans_port_is_free_when_the_same_pass_starts_its_successor(
    reconcile: Any,
) -> None:
    """A record deleted by hand: the pass reaps its engine, then starts a new one on the
    same exact port; its port check ran while the reaped engine still held it ("pending:
    port in use", then a start a pass later)."""
    command = [sys.executable, "-c", HEAVY, "--port", "{port}", "--model", "{name}"]
    reconcile.write("web", command=command, port=reconcile.port, basePort=None)
    reconcile.converge()
    first = reconcile.status()["web"]
    reconcile.record_path("web").unlink()
    reconcile.once()  # one pass: the reap, then the start
    events = reconcile.events("web")
    reaped = max(i for i, e in enumerate(events) if e["action"] == "reap")
    after = events[reaped + 1 :]
    assert [e for e in after if "in use" in str(e)] == [], after
    assert reconcile.record("web")["phase"] in ("Starting", "Ready"), reconcile.record("web")
    wait_gone(first["pid"])
    reconcile.down()


def test_the_engine_environment(reconcile: Any) -> None:
    reconcile.devices = "nvidia:0,nvidia:1,amd:0"
    reconcile.write("gpu", devices={"count": 1, "kind": "nvidia", "candidates": ["1"]})
    reconcile.write("none", env={"HOME": "/nowhere"})
    reconcile.write("rocm", devices={"count": 1, "kind": "amd"})
    reconcile.converge()
    status = reconcile.status()
    envs = {name: environ(item["pid"]) for name, item in status.items()}
    for name, item in status.items():
        env = envs[name]
        record = reconcile.record(name)
        assert env["PORT"] == str(item["port"])
        assert env["RECONCILE_NAME"] == name
        assert env["RECONCILE_INSTANCE"] == f"{reconcile.node}/{name}/{record['nonce']}"
    assert envs["gpu"]["CUDA_VISIBLE_DEVICES"] == "1"
    assert envs["none"]["CUDA_VISIBLE_DEVICES"] == ""  # no device: every GPU hidden
    assert envs["none"]["HOME"] == "/nowhere"  # other spec env passes through
    assert envs["rocm"]["HIP_VISIBLE_DEVICES"] == envs["rocm"]["ROCR_VISIBLE_DEVICES"] == "0"
    assert "CUDA_VISIBLE_DEVICES" not in envs["rocm"]
    for name in ("gpu", "none"):  # an nvidia or device-less engine sees no AMD variables
        assert not {"HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"} & set(envs[name]), name
    reconcile.down()


def test_spec_env_setting_what_reconcile_sets_is_refused_everywhere(reconcile: Any) -> None:
    """`env: {PORT: ...}` or `CUDA_VISIBLE_DEVICES` was silently replaced: now validate
    and --once refuse it naming the file, line and key, and a running engine whose
    manifest gains one keeps running with its spec invalid (invariant 4) in status and
    describe."""
    reconcile.write("web")
    reconcile.converge()
    pid = reconcile.status()["web"]["pid"]
    path = reconcile.write("web", env={"HF_HOME": "/x", "PORT": "9000"})
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "PORT:" in text)
    where = f"{path}:{line}: spec.env.PORT: reconcile sets PORT to the port it reserved"
    assert where in reconcile("validate", check=1).err
    once = reconcile.once(check=1)
    assert where in once.err, str(once)
    item = reconcile.status("web", cli=True)["web"]
    assert item["pid"] == pid and alive(pid), item  # the engine it ran keeps running
    assert item["spec_valid"] is False and "spec.env.PORT" in item["message"], item
    assert "spec.env.PORT: reconcile sets PORT" in reconcile("describe", "web", check=0).out
    reconcile.write("web", env={"CUDA_VISIBLE_DEVICES": "0"})
    assert "spec.env.CUDA_VISIBLE_DEVICES: reconcile sets" in reconcile.once(check=1).err
    reconcile.down()


def test_inherited_visibility_variables_are_scrubbed(reconcile: Any) -> None:
    reconcile.env["CUDA_VISIBLE_DEVICES"] = "0,1,2,3"
    reconcile.env["HIP_VISIBLE_DEVICES"] = "0"
    reconcile.write("web")
    reconcile.converge()
    env = environ(reconcile.status()["web"]["pid"])
    assert env["CUDA_VISIBLE_DEVICES"] == "" and "HIP_VISIBLE_DEVICES" not in env
    reconcile.down()


def test_state_dir_0700_and_records_0600(reconcile: Any) -> None:
    reconcile.write("web")
    reconcile.env["UMASK_NOTE"] = "the CLI runs under umask 0 here"
    proc = subprocess.run(
        ["sh", "-c", 'umask 0 && exec "$@"', "sh", *reconcile.argv("--once")],
        env=reconcile.env,
        cwd=reconcile.tmp,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    mode = lambda p: oct(p.stat().st_mode & 0o777)  # noqa: E731
    assert mode(reconcile.state) == "0o700"
    assert mode(reconcile.state / "instances") == "0o700"
    assert mode(reconcile.record_path("web")) == "0o600"
    assert mode(reconcile.state / "instances" / "logs" / "web.log") == "0o600"
    assert mode(reconcile.state / "events" / "web.jsonl") == "0o600"
    reconcile.down()


def test_restart_policy_never_fails_and_releases(reconcile: Any) -> None:
    reconcile.write(
        "job",
        command=[sys.executable, "-c", "raise SystemExit(3)"],
        readiness=None,
        restartPolicy="Never",
        devices={"count": 1},
    )
    reconcile.once(check=None)
    wait_for(
        lambda: (
            reconcile.once(check=None).code == 1 and reconcile.status()["job"]["phase"] == "Failed"
        ),
        what="the job to fail",
    )
    job = reconcile.status()["job"]
    assert "restartPolicy Never" in job["message"]
    assert job["devices"] == [] and job["port"] is None  # a Failed record holds nothing
    reconcile.down()


def test_an_engine_that_exits_after_its_pass_fails_with_its_code_unknown(
    reconcile: Any, tmp_path: Path
) -> None:
    """A `--once` is its engines' parent only while it runs: an engine that exits after
    the pass's last round (`exit 4` on a loaded box) is judged by the next pass, which
    cannot read its code. restartPolicy Never still fails it, saying the code is unknown
    (test_ux_plan's wait for "code 4" waited for good there)."""
    gate = tmp_path / "gate"
    os.mkfifo(gate, 0o600)  # the engine's `read` waits on it until the test writes
    reconcile.write(
        "late",
        command=["/bin/sh", "-c", f"read line < '{gate}'; exit 4"],
        restartPolicy="Never",
    )
    reconcile.once(check=0)  # started, and still running as the pass ends
    started = reconcile.record("late")
    assert started["phase"] == "Starting", started
    with wait_for(lambda: _writer(gate), what="the engine's read") as writer:
        writer.write(b"go\n")
    wait_gone(started["ref"]["pid"])
    reconcile.once(check=1)
    failed = reconcile.record("late")
    assert failed["phase"] == "Failed", failed
    message = "engine exited (code unknown: not our child); restartPolicy Never"
    assert failed["message"] == message, failed
    reconcile.down()


def _writer(fifo: Path) -> BinaryIO | None:
    """The write end of ``fifo`` once its reader is opening it (None before: ENXIO)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno != errno.ENXIO:
            raise
        return None
    return os.fdopen(fd, "wb")


def test_readiness_deadline_fails_and_backs_off(reconcile: Any) -> None:
    reconcile.write(
        "slow",
        command=reconcile.demo_command(load_seconds="300"),
        readiness={"httpGet": {"path": "/health"}, "deadlineSeconds": 3, "periodSeconds": 0.1},
        stopGracePeriodSeconds=1,
    )
    reconcile.once()
    first = reconcile.status()["slow"]
    assert first["phase"] == "Starting"
    # A pass plans in rounds until nothing changes: on a loaded box its later round may
    # already see the deadline passed, fail the engine and restart it at once (restart 1
    # is due now). Then the next fail is the second in a row: a crash loop, exit 1.
    looped = reconcile.record("slow")["restarts"] > 0
    wait_for(
        lambda: (
            reconcile.record("slow")["ready_deadline_at"]
            and _past(reconcile.record("slow")["ready_deadline_at"])
        ),
        what="the deadline",
    )
    reconcile.once(check=1 if looped else 0)
    slow = reconcile.status()["slow"]
    assert slow["phase"] in ("BackOff", "Starting"), slow
    events = [e for e in reconcile.events("slow") if e["action"] == "fail"]
    assert events and "not ready by its readiness deadline" in events[0]["reason"]
    assert "GET /health -> 503" in events[0]["reason"]
    wait_gone(first["pid"])
    reconcile.down()


def blocked_on_a_lock(pid: int) -> bool:
    """The kernel lists a process waiting for a flock in /proc/locks as `-> FLOCK ... <pid>`."""
    with open("/proc/locks") as f:
        return any(line.split()[1] == "->" and line.split()[5] == str(pid) for line in f)


def test_a_pass_that_waited_acts_on_the_manifests_as_they_are_then(reconcile: Any) -> None:
    reconcile.write("gone")
    reconcile.store()
    other_pass = FileLock(reconcile.state / "pass.lock")
    other_pass.acquire(timeout=0)
    try:
        waiting = reconcile.popen("--once")
        wait_for(lambda: blocked_on_a_lock(waiting.pid), what="the pass to wait for the lock")
        (reconcile.manifests / "gone.yaml").unlink()
        reconcile.write("kept")
    finally:
        other_pass.release()
    assert waiting.wait(timeout=60) == 0
    assert set(reconcile.status()) == {"kept"}  # never started what was removed meanwhile
    assert reconcile.pids("gone") == set()
    reconcile.down()


def _past(iso: str) -> bool:
    from datetime import UTC, datetime

    return datetime.now(UTC) >= datetime.fromisoformat(iso)


def test_phase_names_are_the_documented_ones() -> None:
    """README's status table names every phase `status -o json` can show, and only those:
    it named eight and left out `Idle` and `Pulling`, which OnDemand and a pull show."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `phase` | string |"))
    documented = set(re.findall(r"`([A-Z]\w+)`", row.split("|")[3]))
    assert documented == {str(p) for p in Phase}
