"""`reconcile plan` shows what a start runs: for a container, the runtime's whole `run`.

The plan's argv is the one the pass then gives the runtime (the `run` client's own
command line, read from /proc), its nonce aside (each start draws its own) and its
secrets hidden as every other output hides them; env values never, only their names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from containers.conftest import STANDIN, Engine, write

from controller.reconciler.planned import PLANNED_NONCE
from controller.redact import redact_args

if TYPE_CHECKING:
    from conftest import Reconcile

SECRET = "hunter2-not-for-plan"


def _run_client(container: str) -> list[str]:
    """The argv of the `run` that started ``container`` (its waiting shell's "$@")."""
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode().split("\0")[:-1]
        except (OSError, ValueError):  # gone meanwhile, or not a process
            continue
        if argv[:2] == ["/bin/sh", "-c"] and container in argv:
            return argv[5:]  # /bin/sh -c SCRIPT sh RC_FILE, then the runtime's argv
    raise AssertionError(f"no `run` client of {container} found")


def test_plan_shows_the_runtimes_whole_run_which_the_pass_then_runs(
    rc: Reconcile, engine: Engine
) -> None:
    command = [*STANDIN, "--api-key", SECRET]  # the shell's $0 and $1: not read
    write(rc, engine, "boxed", command=command, env={"GREETING": "hello"}, basePort=rc.port)
    doc = rc("plan", "-o", "json", check=2).json()
    (change,) = doc["changes"]
    assert change["change"] == "create", doc
    argv, env = change["runs"]["argv"], change["runs"]["env"]
    assert argv[:3] == [engine.name, "run", "--cidfile"] and engine.image in argv, argv
    assert argv[-2:] == ["--api-key", "<redacted>"], argv
    assert "GREETING" in env and SECRET not in json.dumps(doc) and "hello" not in json.dumps(doc)
    text = rc("plan", check=2).out
    assert f"      runs: {engine.name} run --cidfile " in text and SECRET not in text, text
    assert "      env: " in text and "GREETING" in text, text

    rc.once()
    record = rc.record("boxed")
    assert record is not None and record["phase"] in ("Starting", "Ready"), record
    nonce = record["nonce"]
    ran = redact_args(_run_client(f"reconcile-boxed-{nonce}"))
    assert [a.replace(PLANNED_NONCE, nonce) for a in argv] == ran
    rc.down()


def test_plan_shows_a_replaces_new_run_which_the_pass_then_runs(
    rc: Reconcile, engine: Engine
) -> None:
    """A changed command replaces the container: `plan` shows the new engine's whole
    `run` (built as its launch builds it, secrets hidden) where it said only `replace`."""
    write(rc, engine, "boxed", command=[*STANDIN], basePort=rc.port)
    rc.once()
    write(rc, engine, "boxed", command=[*STANDIN, "--api-key", SECRET], basePort=rc.port)
    doc = rc("plan", "-o", "json", check=2).json()
    (change,) = doc["changes"]
    assert change["change"] == "replace" and SECRET not in json.dumps(doc), doc
    argv = change["runs"]["argv"]
    assert argv[:3] == [engine.name, "run", "--cidfile"] and engine.image in argv, argv
    assert argv[-2:] == ["--api-key", "<redacted>"], argv
    assert change["placed"].endswith(f"if placed now: port {rc.port}, devices none"), change

    rc.once()
    record = rc.record("boxed")
    assert record is not None and record["phase"] in ("Starting", "Ready"), record
    nonce = record["nonce"]
    ran = redact_args(_run_client(f"reconcile-boxed-{nonce}"))
    assert [a.replace(PLANNED_NONCE, nonce) for a in argv] == ran
    rc.down()
