"""A container engine's exit as a pass that did not start it sees it, on podman and docker.

The pass that ran `run` is gone (``--once`` ended); the engine exits on its own later; the
next pass (its adopter: not the `run`'s parent) reads the engine's own exit code. It read
"code unknown", because `run --rm` removes the container, and the code with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from containers.conftest import Engine, write

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
