"""The record store: atomic durable writes, modes, quarantine, versions, safe names."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import missing
import pytest
from disks import fill, fill_inodes, tmpfs
from fsevents import Writes
from strategies import record

from controller.core.state import (
    CANNOT_EXEC,
    NEWEST_VERSION,
    VERSION,
    ContainerRef,
    ExitInfo,
    Phase,
    ProbeConfig,
    ProcessRef,
    Record,
    UnreadExit,
)
from controller.errors import ConfigError, RecordError
from controller.store import diskspace
from controller.store.documents import write_atomic
from controller.store.instances.recordjson import RecordInvalid, from_json, record_v3, to_json
from controller.store.instances.records import RecordStore, check_name


@pytest.fixture
def store(tmp_path: Path) -> RecordStore:
    s = RecordStore(tmp_path / "state")
    s.ensure()
    return s


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_round_trip(store: RecordStore) -> None:
    rec = record("web", devices=("nvidia:0",), restarts=2)
    store.write(rec)
    assert store.read("web") == rec
    snap = store.load()
    assert snap.records == {"web": rec} and not snap.problems
    assert json.loads(store.path("web").read_text())["version"] == VERSION


def test_record_json_is_snake_case(store: RecordStore) -> None:
    store.write(record("web"))
    data = json.loads(store.path("web").read_text())
    for key in ("spec_hash", "reserved_by", "ready_deadline_at", "backoff_until", "last_exit"):
        assert key in data
    assert data["ref"]["pid"] == 100 and data["ref"]["start_time"] == 1000.0


def test_state_dir_0700_and_records_0600_whatever_the_umask(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    old = os.umask(0)
    try:
        s = RecordStore(state)
        s.ensure()
        s.write(record("web"))
    finally:
        os.umask(old)
    assert mode(state) == 0o700
    for folder in (s.instances, s.logs, s.quarantine_dir):
        assert mode(folder) == 0o700, folder
    assert mode(s.path("web")) == 0o600


def test_write_is_tmp_fsync_rename_dir_fsync(
    store: RecordStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: os.PathLike[str], dst: os.PathLike[str]) -> None:
        calls.append(("replace", f"{src} -> {dst}"))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    store.write(record("web"))
    final = str(store.path("web"))
    assert [c[0] for c in calls] == ["fsync", "replace", "fsync"], calls
    tmp = calls[0][1]
    assert Path(tmp).parent == store.instances and tmp != final  # same folder: rename is atomic
    assert calls[1][1] == f"{tmp} -> {final}"
    assert calls[2][1] == str(store.instances)  # the directory, so the rename is durable


def test_each_fsync_sees_the_step_before_it_done(
    store: RecordStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Order by what is on disk when each fsync runs, not by a call log: the file's fsync
    finds its tmp file fully written and the record not yet replaced; the directory's
    fsync finds the rename done (the new record in place, no tmp file left)."""
    old, new = record("web", restarts=1), record("web", restarts=2, message="x" * 100_000)
    store.write(old)
    final = store.path("web")
    seen: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        target = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if target == store.instances:
            assert store.read("web") == new, "the directory was synced before the rename"
            assert not [p for p in store.instances.iterdir() if p.name.endswith(".tmp")]
            seen.append("dir")
        else:
            assert target.parent == store.instances and target != final
            written = json.loads(target.read_bytes())  # a partial write is not valid JSON
            assert written == json.loads(to_json(new)), "synced before fully written"
            assert store.read("web") == old, "the record was replaced before its data was synced"
            seen.append("file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store.write(new)
    assert seen == ["file", "dir"], seen


def test_delete_syncs_the_directory_after_the_unlink(
    store: RecordStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.write(record("web"))
    seen: list[bool] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if Path(os.readlink(f"/proc/self/fd/{fd}")) == store.instances:
            seen.append(store.path("web").exists())
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    store.delete("web")
    assert seen == [False], seen  # synced once, with the record already gone


def test_failed_rename_keeps_the_old_record_and_no_tmp(
    store: RecordStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = record("web", restarts=1)
    store.write(old)

    def boom(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        store.write(record("web", restarts=2))
    monkeypatch.undo()
    assert store.read("web") == old
    files = sorted(p.name for p in store.instances.iterdir() if p.is_file())
    assert files == [".reserve", "web.json"]  # the full-disk ballast, and no tmp file


def test_readers_never_see_a_torn_record(store: RecordStore) -> None:
    big = record("web", message="x" * 200_000)
    small = record("web", message="")
    store.write(small)
    stop = threading.Event()

    def writer() -> None:
        while not stop.is_set():
            store.write(big)
            store.write(small)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(200):
            snap = store.load()
            assert not snap.problems, snap.problems
            assert snap.records["web"] in (big, small)
    finally:
        stop.set()
        thread.join()


def test_leftover_tmp_files_are_ignored(store: RecordStore) -> None:
    (store.instances / ".web.json.123.tmp").write_text("{half")
    store.write(record("web"))
    snap = store.load()
    assert list(snap.records) == ["web"] and not snap.problems


def test_tmp_files_of_dead_writers_are_swept_live_ones_kept(tmp_path: Path) -> None:
    """A writer SIGKILLed between write and rename leaves ``.<file>.<pid>.tmp``; the next
    store to open the state dir removes it, but never the tmp file of a writer that lives
    (it is about to rename it), nor anything that is not such a tmp file."""
    state = tmp_path / "state"
    RecordStore(state).ensure()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # reaped: its pid names no process (reuse within this test is negligible)
    instances, events, notes = state / "instances", state / "events", state / "spawnnotes"
    events.mkdir(exist_ok=True)
    notes.mkdir()
    left = [
        instances / f".web.json.{dead.pid}.tmp",
        state / f".node.yaml.{dead.pid}.tmp",
        events / f".web.jsonl.{dead.pid}.tmp",
        notes / f".0a1b2c3d.json.{threading.get_ident()}.{dead.pid}.tmp",  # a killed spawn's
        instances / f".web.json.{threading.get_ident()}.{dead.pid}.tmp",  # write_atomic's
    ]
    kept = [
        instances / f".api.json.{os.getpid()}.tmp",  # a live writer's
        instances / f".api.json.{threading.get_ident()}.{os.getpid()}.tmp",
        instances / f"web.json.{dead.pid}.tmp",  # not hidden: not one of ours
        instances / ".web.json.notapid.tmp",
        instances / "web.json",
    ]
    for path in (*left, *kept):
        path.write_text("{half")
    RecordStore(state).ensure()
    for path in left:
        assert not path.exists(), f"{path.name} of a dead writer was left behind"
    for path in kept:
        assert path.exists(), f"{path.name} was removed"


def test_ensure_chmods_the_state_dir_only_when_its_mode_is_wrong(tmp_path: Path) -> None:
    """Each pass ensures the state dir: its chmod 0700, done every time, was an event in
    the gateway's watch of the top folder every resync."""
    state = tmp_path / "state"
    RecordStore(state).ensure()
    with Writes(state) as writes:
        RecordStore(state).ensure()
        assert [e for e in writes.taken() if e[0] == "."] == []  # before: ('.', '', 'attrib')
    os.chmod(state, 0o755)
    RecordStore(state).ensure()
    assert stat.S_IMODE(state.stat().st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason=missing.reason("root (its check)", "run as root"))
@pytest.mark.parametrize("folder", ["instances", "events", "spawnnotes"])
def test_root_refuses_a_state_folder_another_user_may_write(tmp_path: Path, folder: str) -> None:
    """Root writes a spawn note at every spawn: its folder, as the records', must be root's
    alone (a tmp file's name is known: a planted link there would be written through)."""
    state = tmp_path / "state"
    RecordStore(state).ensure()
    (state / folder).mkdir(exist_ok=True)
    os.chmod(state / folder, 0o777)
    with pytest.raises(ConfigError) as refused:
        RecordStore(state).ensure()
    said = str(refused.value)
    assert f"state folder {state / folder} is " in said and "chmod 700" in said, said


def test_threads_writing_one_file_at_once_never_collide(tmp_path: Path) -> None:
    """The gateway writes activations from a thread pool: each writer its own tmp file."""
    path = tmp_path / "a.json"
    errors: list[BaseException] = []
    seen: list[object] = []

    def writer(n: int) -> None:
        for i in range(200):
            try:
                write_atomic(path, json.dumps({"writer": n, "i": i}).encode())
                seen.append(json.loads(path.read_bytes()))
            except (OSError, ValueError) as exc:
                errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(seen) == 600 and all(isinstance(v, dict) and "writer" in v for v in seen)
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]  # no tmp file left


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b'{"version": 1, "name": "web"', "not valid JSON"),
        (b"\x00\x00\x00", "not valid JSON"),
        (json.dumps({"version": 1, "name": "web"}).encode(), "not a valid record: owner"),
        (
            json.dumps({"version": 1, "name": "other", "owner": "o", "node": "n"}).encode(),
            "holds name 'other', file says 'web'",
        ),
    ],
    ids=["truncated", "garbage", "missing-field", "wrong-name"],
)
def test_corrupt_record_is_quarantined_with_a_reason(
    store: RecordStore, content: bytes, reason: str
) -> None:
    path = store.path("web")
    path.write_bytes(content)
    snap = store.load()
    assert "web" not in snap.records and not path.exists()
    (problem,) = snap.problems
    assert problem.name == "web" and reason in problem.message
    moved = [p for p in store.quarantine_dir.iterdir() if not p.name.endswith(".reason")]
    assert len(moved) == 1 and moved[0].read_bytes() == content  # kept as it was
    assert f"record moved to {moved[0]}" in problem.message
    why = moved[0].with_name(moved[0].name + ".reason").read_text()
    assert reason in why
    assert not store.load().problems  # reported once, then gone from instances/


def test_unknown_version_is_an_error_that_says_how_to_recover(store: RecordStore) -> None:
    path = store.path("web")
    data = {"version": 99, "name": "web", "devices": ["nvidia:0"], "port": 8000}
    path.write_text(json.dumps(data))
    snap = store.load()
    assert "web" not in snap.records
    (problem,) = snap.problems
    assert "has version 99; this reconcile understands versions 1, 2, 3, 4" in problem.message
    assert "Run the reconcile that wrote it, or stop its engine and move the file away" in (
        problem.message
    )
    assert problem.devices == ("nvidia:0",) and problem.ports == (8000,)  # still leased
    assert path.exists()  # never silently reset or moved
    assert not any(store.quarantine_dir.iterdir())


def test_missing_version_is_unknown_too(store: RecordStore) -> None:
    store.path("web").write_text(json.dumps({"name": "web"}))
    (problem,) = store.load().problems
    assert "has version None" in problem.message


@pytest.mark.parametrize(
    "name", ["../etc", "a/b", "", ".", "..", "A", "x" * 64, "web\0", "/abs"], ids=repr
)
def test_no_unsafe_name_becomes_a_path(store: RecordStore, name: str) -> None:
    """Invariant 9: names reach the file system only as DNS-1123 labels."""
    with pytest.raises(RecordError, match="refusing unsafe deployment name"):
        check_name(name)
    with pytest.raises(RecordError):
        store.path(name)
    with pytest.raises(RecordError):
        store.log_path(name)


def test_delete_is_idempotent(store: RecordStore) -> None:
    store.write(record("web"))
    store.delete("web")
    store.delete("web")
    assert store.read("web") is None


def test_load_without_state_dir(tmp_path: Path) -> None:
    snap = RecordStore(tmp_path / "nowhere").load()
    assert not snap.records and not snap.problems


def test_write_atomic_replaces_in_place(tmp_path: Path) -> None:
    path = tmp_path / "f"
    write_atomic(path, b"one")
    write_atomic(path, b"two")
    assert path.read_bytes() == b"two" and mode(path) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_pending_record_holds_nothing() -> None:
    assert not record("web", phase=Phase.PENDING).holds
    assert not record("web", phase=Phase.FAILED).holds
    assert record("web", phase=Phase.RESERVED).holds
    assert record("web", phase=Phase.TERMINATING).holds


NOW = datetime(2026, 12, 1, 11, 0, 0, 123456, tzinfo=UTC)


AT = NOW.isoformat()


def full_record() -> Record:
    """A record with every kind of field set: nested values, tuples, datetimes, None."""
    return Record(
        name="web",
        owner="o",
        node="n",
        stored_spec={"engine": "command", "args": ["a", 1]},
        activation="OnDemand",
        idle_timeout=30.0,
        ready_deadline_seconds=120.0,
        models=("web", "org/web-7b"),
        device_count=1,
        ref=ProcessRef(pid=42, start_time=1.5, start_ticks=7, boot_id="b"),
        extra_ports=(8001, 8002),
        devices=("nvidia:0",),
        device_uuids=("GPU-1", None),
        phase=Phase.BACKOFF,
        probe=ProbeConfig(http=(("/health", None), ("/v1/models", "ok")), period_seconds=0.5),
        started_at=NOW,
        last_exit=ExitInfo(code=3, at=NOW, reason="boom"),
        unread_exit=UnreadExit(
            nonce="n0",
            container=ContainerRef(runtime="docker", id="c0", image="engine:1"),
            exit=ExitInfo(at=NOW, reason="run said none"),
        ),
        labels={"team": "search"},
    )


def test_a_record_round_trips_through_json() -> None:
    rec = full_record()
    again = from_json(to_json(rec))
    assert again == rec and again.probe.http[1] == ("/v1/models", "ok")
    assert isinstance(again.extra_ports, tuple) and again.phase is Phase.BACKOFF
    assert list(json.loads(to_json(rec))) == [f.name for f in dataclasses.fields(Record)]


def test_only_a_record_holding_an_unread_exit_is_written_as_version_4() -> None:
    """``unread_exit`` came after version 3, whose readers (the releases before it) refuse
    an unknown field: as ``"unread_exit": null`` in every record it had them quarantine
    every record after a downgrade. A record without one is a version-3 file as before;
    one holding it is version 4, which those releases leave in place as newer."""
    plain = dataclasses.replace(full_record(), unread_exit=None)
    doc = json.loads(to_json(plain))
    assert doc["version"] == VERSION == 3 and "unread_exit" not in doc
    assert record_v3(doc) == plain  # what the release before reads it as
    held = json.loads(to_json(full_record()))
    assert held["version"] == NEWEST_VERSION == 4 and held["unread_exit"]["nonce"] == "n0"
    assert from_json(json.dumps(held)) == full_record()
    with pytest.raises(RecordInvalid, match="unread_exit: unknown field"):
        from_json(json.dumps({**held, "version": 3}))  # version 3 never wrote one


def test_a_start_that_could_not_exec_is_a_version_3_record_that_says_so() -> None:
    """An exec that failed is said by the last exit's reason (a string the release before
    reads as any other), no new field: the record stays a version-3 file it reads as is,
    and ``exec_failed`` (what --once and plan exit 1 on) reads it, in BackOff only."""
    failed = dataclasses.replace(
        full_record(),
        unread_exit=None,
        ref=None,
        last_exit=ExitInfo(code=127, at=NOW, reason=CANNOT_EXEC),
    )
    doc = json.loads(to_json(failed))
    assert doc["version"] == VERSION == 3 and doc["last_exit"]["reason"] == "CannotExec"
    assert record_v3(doc) == failed and from_json(json.dumps(doc)).exec_failed
    assert str(failed.last_exit) == "its program could not be exec'd (exit code 127): no engine ran"
    assert not dataclasses.replace(failed, phase=Phase.STARTING).exec_failed
    assert not full_record().exec_failed  # an exit of its own: a crash, not this


def test_reads_what_earlier_releases_wrote() -> None:
    """Datetimes with a Z (pydantic wrote them so), integral floats as ints, and fields
    added later missing: those take the dataclass's default."""
    old = json.loads(to_json(full_record()))
    old["started_at"] = "2026-12-01T11:00:00.123456Z"
    old["grace_seconds"] = 30
    for later in ("priority", "memory", "labels", "idle_since", "device_uuids"):
        del old[later]
    rec = from_json(json.dumps(old))
    assert rec.started_at == NOW and rec.grace_seconds == 30.0
    assert (rec.priority, rec.memory, rec.labels, rec.device_uuids) == (0, None, {}, ())


def test_a_record_that_kept_an_api_key_loads_and_is_written_without_it(
    store: RecordStore,
) -> None:
    """A release before kept the engine's API key in the record's probes (``bearer``): such
    a record loads as it was, and the next write of it holds no key (the prober finds the
    key when it probes: core/engines/apikey.py)."""
    old = json.loads(to_json(full_record()))
    old["probe"]["bearer"] = "sk-kept-before-31f7"
    old["liveness"] = {**old["probe"], "failure_threshold": 3}
    rec = from_json(json.dumps(old))
    assert rec.probe == full_record().probe and rec.liveness is not None
    assert "bearer" not in json.loads(to_json(rec))["probe"]
    store.path("web").write_text(json.dumps(old))
    loaded = store.load()
    assert list(loaded.records) == ["web"] and not loaded.problems, loaded.problems
    store.write(loaded.records["web"])
    assert b"sk-kept-before-31f7" not in store.path("web").read_bytes()


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"restarts": "2"}, "restarts: should be int, not str"),
        ({"restarts": True}, "restarts: should be int, not bool"),
        ({"phase": "Running"}, "phase: 'Running' is not one of Pending, "),
        ({"surprise": 1}, "surprise: unknown field"),
        ({"ref": {"pid": 42}}, "ref.start_time: field required"),
        ({"ref": {"pid": 42, "start_time": 1.0, "x": 1}}, "ref.x: unknown field"),
        ({"ref": {"pid": 0, "start_time": 1.0}}, "ref: pid must be in 1.."),
        ({"ref": [42]}, "ref: should be an object, not list"),
        ({"devices": "nvidia:0"}, "devices: should be a list, not str"),
        ({"devices": ["nvidia:0", 1]}, "devices.1: should be str, not int"),
        ({"started_at": "yesterday"}, "started_at: not an ISO 8601 time"),
        ({"probe": {"http": [["/health"]]}}, "probe.http.0: should be [path, contains]"),
        ({"last_exit": {"code": 1}}, "last_exit.at: field required"),
        ({"unread_exit": {"nonce": "n0", "exit": {"at": AT}}}, "unread_exit.container: field"),
        ({"labels": {"team": 1}}, "labels.team: should be str, not int"),
        ({"owner": None}, "owner: should be str, not null"),
    ],
)
def test_every_field_is_checked_and_the_problem_named(change: dict[str, Any], where: str) -> None:
    doc = {**json.loads(to_json(full_record())), **change}
    with pytest.raises(RecordInvalid) as caught:
        from_json(json.dumps(doc))
    assert where in str(caught.value)


@pytest.mark.parametrize(
    ("raw", "why"),
    [(b"[]", "(top): should be an object, not list"), (b"{", "not valid JSON")],
)
def test_from_json_refuses_what_is_no_record(raw: bytes, why: str) -> None:
    with pytest.raises(RecordInvalid, match=re.escape(why)):
        from_json(raw)


# -- version 1: the spec's facts only inside the spec document ------------------------------

# A record as the previous release (version 1) wrote it: an OnDemand Ollama deployment,
# Ready, whose spec sets no readiness (so its deadline is the recipe's 120 s).
V1_SPEC: dict[str, Any] = {
    "engine": "ollama",
    "model": "llama3",
    "executable": None,
    "command": None,
    "args": [],
    "env": {},
    "devices": {"count": 1, "kind": "nvidia", "candidates": None, "shareable": False},
    "host": "127.0.0.1",
    "port": None,
    "basePort": None,
    "readiness": None,
    "restartPolicy": "Always",
    "stopGracePeriodSeconds": 30.0,
    "activation": "OnDemand",
    "idleTimeout": 45,
    "strategy": "Recreate",
    "aliases": ["chat-small"],
    "image": None,
}
V1_RECORD: dict[str, Any] = {
    "version": 1,
    "name": "chat",
    "owner": "/srv/manifests",
    "source": "/srv/manifests/chat.yaml",
    "spec_hash": "sha256:0f",
    "spec": V1_SPEC,
    "spec_valid": True,
    "node": "gpu-a",
    "backend": "local",
    "engine": "ollama",
    "nonce": "ab12",
    "ref": {"pid": 4242, "start_time": 1764490000.12, "start_ticks": 99, "boot_id": "b"},
    "reserved_by": {"pid": 999, "start_time": 1764489990.5, "start_ticks": 9, "boot_id": "b"},
    "host": "127.0.0.1",
    "port": 8000,
    "extra_ports": [],
    "devices": ["nvidia:0"],
    "shareable": False,
    "device_uuids": [None],
    "memory": None,
    "priority": 0,
    "phase": "Ready",
    "probe": {"http": [["/", "Ollama is running"]], "tcp": False, "period_seconds": 2.0},
    "stop_signal": 15,
    "grace_seconds": 30.0,
    "restart_policy": "Always",
    "reserved_at": "2026-12-01T11:00:00+00:00",
    "started_at": "2026-12-01T11:00:00.500000+00:00",
    "ready_deadline_at": "2026-12-01T11:02:00.500000+00:00",
    "ready_at": "2026-12-01T11:00:03+00:00",
    "restarts": 0,
    "backoff_until": None,
    "last_exit": None,
    "revision": None,
    "message": "",
    "idle_since": None,
    "labels": {},
}


def test_a_version_1_record_gets_its_facts_from_its_stored_spec(store: RecordStore) -> None:
    store.path("chat").write_text(json.dumps(V1_RECORD))
    snap = store.load()
    assert not snap.problems
    rec = snap.records["chat"]
    assert rec.on_demand and rec.idle_timeout == 45.0
    assert rec.ready_deadline_seconds == 120.0  # the Ollama recipe's, as the engine got it
    assert rec.ready_deadline_at is not None and rec.started_at is not None
    assert (rec.ready_deadline_at - rec.started_at).total_seconds() == rec.ready_deadline_seconds
    assert rec.models == ("chat", "llama3", "chat-small")
    assert rec.device_count == 1 and rec.stored_spec == V1_SPEC
    # Written back, it is a current record that reads back the same.
    store.write(rec)
    written = json.loads(store.path("chat").read_text())
    assert written["version"] == VERSION and "spec" not in written
    assert store.read("chat") == rec


@pytest.mark.parametrize(
    ("spec", "facts"),
    [
        (
            {**V1_SPEC, "readiness": {"deadlineSeconds": 7, "periodSeconds": 0.5}},
            {"ready_deadline_seconds": 7.0},
        ),
        (
            {"engine": "command", "command": ["serve"], "activation": "Always"},
            {"ready_deadline_seconds": 600.0, "activation": "Always", "idle_timeout": None},
        ),
        ({}, {"ready_deadline_seconds": None, "models": ("chat",), "device_count": 0}),
    ],
    ids=["spec-deadline", "older-spec-without-gateway-fields", "rejected-manifest"],
)
def test_version_1_facts_follow_what_its_spec_says(
    spec: dict[str, Any], facts: dict[str, Any]
) -> None:
    rec = from_json(json.dumps({**V1_RECORD, "spec": spec}))
    assert {k: getattr(rec, k) for k in facts} == facts


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"spec": {**V1_SPEC, "engine": "mystery"}}, "spec.engine: unknown engine 'mystery'"),
        ({"spec": {**V1_SPEC, "activation": "Sometimes"}}, "spec.activation: 'Sometimes'"),
        ({"spec": {**V1_SPEC, "aliases": [1]}}, "spec.aliases.0: should be str, not int"),
        ({"spec": "ollama"}, "spec: should be dict, not str"),
        ({"models": ["chat"]}, "models: unknown field"),  # version 2's, in a version 1 file
    ],
)
def test_a_version_1_record_is_checked_like_any_other(change: dict[str, Any], where: str) -> None:
    with pytest.raises(RecordInvalid) as caught:
        from_json(json.dumps({**V1_RECORD, **change}))
    assert where in str(caught.value)


def test_a_full_disk_gives_up_the_ballast_for_a_record_then_fails_leaving_no_tmp(
    tmp_path: Path,
) -> None:
    with tmpfs(tmp_path / "state", "16m") as state:
        store = RecordStore(state)
        store.ensure()
        assert (store.instances / ".reserve").stat().st_size == 1 << 20
        fill(state)
        store.write(record("web", restarts=3))  # the ballast's room
        assert store.read("web") == record("web", restarts=3)
        assert not (store.instances / ".reserve").exists()
        (note,) = diskspace.notes()
        assert f"the disk of {store.instances} is full" in note
        fill(state)
        with pytest.raises(OSError) as caught:  # no ballast left: the error, as it is,
            store.write(record("web", restarts=4, message="x" * 8192))
        # ... naming the file it could not write (`pass failed` and the CLI say where)
        assert caught.value.filename == str(store.instances / "web.json"), caught.value
        assert sorted(p.name for p in store.instances.iterdir() if p.is_file()) == ["web.json"]
        (state / "filler").unlink()
        store.ensure()  # room again: the ballast is taken back
        assert (store.instances / ".reserve").exists()


def test_a_disk_out_of_inodes_is_said_so_not_full(tmp_path: Path) -> None:
    """Out of inodes, the disk has free bytes (`df` shows them): "full: free some space
    there" sent the operator looking for bytes to free."""
    with tmpfs(tmp_path / "state", "16m", inodes=200) as state:
        store = RecordStore(state)
        store.ensure()
        diskspace.notes()  # none of an earlier test's
        fill_inodes(state)
        store.write(record("web", restarts=3))  # the ballast's inode
        assert store.read("web") == record("web", restarts=3)
        (note,) = diskspace.notes()
        assert f"the disk of {store.instances} has no free inode left (`df -i`)" in note, note
        assert note.endswith("; remove files there"), note
