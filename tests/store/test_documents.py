"""The state dir's JSON documents (store/documents.py): one policy for a file that does not
decode, whichever store it belongs to. A torn or foreign file is moved to
``quarantine/documents/`` with its reason beside it, named in a warning event, and read
as absent (the pass goes on); one of a newer version is left in place and named; a
locked update never loses a writer's change."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from controller.core.devicefaults import Measured
from controller.store.documents import write_new
from controller.store.side import measured, scale
from controller.store.statedir import StateDir

TORN = '{"version": 1, "requested_at": "2026-'

# (store, how its reader is called, the file, what the reader makes of no file); an
# activation is set aside too, but read as a request at its mtime and written back
# (tests/integration/test_damaged_side_files.py)
STORES = [
    ("restart", "read_all(state)", "restart/web.json", {}),
    ("scale", "read_all(state)", "scale/web.json", {}),
    ("inflight", "read_all(state)", "inflight/web.101.json", []),
    ("observed", "read_all(state)", "observed.json", []),
    ("measured", "read(state)", "devices/measured.json", {}),
    ("devicehealth", "read(state) == DeviceHealth()", "devices/health.json", True),
    ("gitsource", "read_history(state)", "git/history.json", []),
]


# each store's package under controller/store/ and its module there (else side/<store>)
ROOM = {"gitsource": ("sources.git", "source")}


def read_in_a_process(state: Path, store: str, call: str) -> tuple[Any, list[dict[str, Any]]]:
    """What ``store``'s reader returns (as JSON) and the events it logged, read by a
    reconcile of its own (its log lines are JSON on a pipe)."""
    package, module = ROOM.get(store, ("side", store))
    code = (
        "import json, sys; from pathlib import Path; from controller import logsetup; "
        "logsetup.configure(json=True); "
        "from controller.core.devicefaults import DeviceHealth; "
        f"from controller.store.{package} import {module} as {store}; "
        "state = Path(sys.argv[1]); "
        f"print(json.dumps({store}.{call}, default=str))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(state)], capture_output=True, text=True, check=True
    )
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    return json.loads(done.stdout), events


@pytest.mark.parametrize(("store", "call", "file", "empty"), STORES)
def test_a_torn_file_of_each_store_is_quarantined_named_and_read_as_absent(
    tmp_path: Path, store: str, call: str, file: str, empty: Any
) -> None:
    torn = tmp_path / file
    torn.parent.mkdir(parents=True, exist_ok=True)
    torn.write_text(TORN)
    value, events = read_in_a_process(tmp_path, store, call)
    assert value == empty
    assert not torn.exists()
    (moved,) = [e for e in events if e["event"] == "state file quarantined"]
    assert moved["level"] == "warning" and moved["file"] == str(torn), moved
    aside = Path(moved["moved_to"])
    assert aside.parent == StateDir(tmp_path).quarantine / "documents"
    assert aside.name.startswith(file.replace("/", "~") + ".")
    assert aside.read_text() == TORN
    reason = aside.with_name(aside.name + ".reason").read_text()
    assert reason.startswith("not a valid document: ") and moved["problem"] in reason
    value, events = read_in_a_process(tmp_path, store, call)  # gone: nothing more to say
    assert value == empty and events == []


def test_a_document_that_refuses_is_named_with_its_way_out_and_left_in_place(
    tmp_path: Path,
) -> None:
    """git/source.json holds a rollback pin: set aside and read as none, it was forgotten."""
    torn = StateDir(tmp_path).git_source
    torn.parent.mkdir(parents=True)
    torn.write_text(TORN)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; "
            "from controller.store.sources.git import source; "
            "source.read_status(Path(sys.argv[1]))",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1 and "RecordError" in done.stderr, done
    assert f"{torn}: not a valid document: " in done.stderr, done.stderr
    assert "left in place and refused" in done.stderr and "rollback REV" in done.stderr
    assert torn.read_text() == TORN and not StateDir(tmp_path).quarantine.exists()
    value, events = read_in_a_process(tmp_path, "gitsource", "peek_status(state)")
    assert value is None and torn.read_text() == TORN
    (said,) = [e for e in events if e["event"] == "state file skipped"]
    assert "left in place and refused" in said["problem"] and said["file"] == str(torn), said


def test_a_newer_version_is_left_in_place_and_named(tmp_path: Path) -> None:
    newer = tmp_path / "scale" / "web.json"
    newer.parent.mkdir()
    newer.write_text(json.dumps({"version": 2, "count": 3}))
    value, events = read_in_a_process(tmp_path, "scale", "read_all(state)")
    assert value == {} and newer.exists()
    (said,) = [e for e in events if e["event"] == "state file skipped"]
    assert said["file"] == str(newer) and "version 2" in said["problem"], said
    assert not StateDir(tmp_path).quarantine.exists()


def test_a_file_of_a_name_this_tool_never_gives_is_neither_read_nor_moved(
    tmp_path: Path,
) -> None:
    stranger = tmp_path / "scale" / "README.json"
    stranger.parent.mkdir()
    stranger.write_text("not json")
    assert scale.read_all(tmp_path) == {}
    assert stranger.exists() and not StateDir(tmp_path).quarantine.exists()


def test_a_locked_update_loses_no_writers_change(tmp_path: Path) -> None:
    at = datetime(2026, 1, 1, tzinfo=UTC)

    def note(i: int) -> None:
        measured.note(tmp_path, {f"sha256:{i}": Measured(i + 1, at, f"d{i}")})

    threads = [threading.Thread(target=note, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(measured.read(tmp_path)) == [f"sha256:{i}" for i in range(8)]


def test_a_write_where_none_is_never_replaces_a_file_put_there(tmp_path: Path) -> None:
    """``write_new`` (a torn activation's write-back) leaves a file another writer made
    first as it is, says so, and leaves no tmp file; where none is, it writes it whole."""
    path = tmp_path / "od.json"
    assert write_new(path, b'{"by": "pass"}') is True
    assert json.loads(path.read_text()) == {"by": "pass"}
    path.write_text('{"by": "gateway"}')
    assert write_new(path, b'{"by": "pass, later"}') is False
    assert json.loads(path.read_text()) == {"by": "gateway"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["od.json"]


def test_the_pass_goes_on_over_torn_documents(reconcile: Any) -> None:
    reconcile.write("web", autoscale={"min": 1, "max": 3})
    reconcile.once()
    state = StateDir(reconcile.state)
    torn = [state.activation / "web.json", state.restart / "web.json", state.scale / "web.json"]
    torn += [state.inflight / "web.101.json", state.observed]
    for path in torn:
        path.parent.mkdir(exist_ok=True)
        path.write_text(TORN)
    result = reconcile.once()
    assert result.code == 0, result
    named = {
        e["file"]
        for line in result.err.splitlines()
        if line.startswith("{") and (e := json.loads(line))["event"] == "state file quarantined"
    }
    assert named == {str(p) for p in torn}, result.err
    assert reconcile.status()["web"]["phase"] in ("Starting", "Ready")
    reconcile.down()


def test_a_folder_in_a_documents_place_is_named_not_the_tmp_file(reconcile: Any) -> None:
    """A pass that cannot rename its write over ``observed.json`` (a folder there, by hand)
    named its own hidden ``.observed.json.<thread>.<pid>.tmp``: a file nobody can find."""
    reconcile.write("alpha")
    reconcile.converge()
    pid = reconcile.record("alpha")["ref"]["pid"]
    observed = StateDir(reconcile.state).observed
    observed.unlink(missing_ok=True)
    observed.mkdir()
    (observed / "x").write_text("x")  # a pass writes it when what it saw changed
    reconcile.write("beta")
    out = reconcile.once(check=1)
    assert f"I/O error: {observed}: Is a directory" in out.err and ".tmp" not in out.err, out
    assert "A folder stands where reconcile keeps a file" in out.err, out  # not "the disk"
    assert not list(observed.parent.glob(".observed.json.*.tmp"))
    assert reconcile.record("alpha")["ref"]["pid"] == pid and reconcile.alive(pid)
    shutil.rmtree(observed)
    reconcile.converge()
    reconcile.down()


def test_a_record_that_cannot_be_written_is_named_and_its_engine_kept(reconcile: Any) -> None:
    """A folder made immutable (`chattr +i`, as an operator freezes a state dir, or a
    filesystem turned read-only under it): the pass named its own hidden tmp file
    (`.web.json.<thread>.<pid>.tmp: Operation not permitted`); the record is named now,
    and the engine it would have replaced runs on."""
    reconcile.write("web")
    reconcile.converge()
    pid = reconcile.record("web")["ref"]["pid"]
    instances = StateDir(reconcile.state).instances
    reconcile.write("web", env={"CHANGED": "1"})  # a replace: its first step is a write
    subprocess.run(["chattr", "+i", str(instances)], check=True)
    try:
        out = reconcile.once(check=1)
    finally:
        subprocess.run(["chattr", "-i", str(instances)], check=True)
    assert f"I/O error: {instances / 'web.json'}: Operation not permitted" in out.err, out
    assert ".tmp" not in out.err and reconcile.alive(pid), out
    assert reconcile.record("web")["ref"]["pid"] == pid
    reconcile.converge()
    reconcile.down()
