"""The event journal: append-only JSON lines, bounded, a torn last line skipped, never guessed.

Real files in a tmp dir; the torn write is made the way a crash makes it (bytes without
their newline at the end of the file).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.store.instances import events
from controller.store.instances.events import Journal


def test_round_trip_in_order_with_extras(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.append("web", "start", "devices nvidia:0 port 8000", "spawned pid 42", pid=42)
    journal.append("web", "fail", "engine exited with code 137", "BackOff", exit_code=137)
    got = journal.read("web")
    assert [e["action"] for e in got] == ["start", "fail"]
    assert got[0]["pid"] == 42 and got[1]["exit_code"] == 137
    assert all(e["time"].endswith("+00:00") for e in got)
    assert journal.read("web", last=1) == got[-1:]
    assert journal.read("web", last=0) == []
    assert journal.read("never") == []
    assert oct(journal.path("web").stat().st_mode & 0o777) == "0o600"


def test_a_torn_last_line_is_skipped_and_never_glued_to_the_next(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.append("web", "start", "r", "spawned")
    with open(journal.path("web"), "ab") as f:
        f.write(b'{"time": "2026-01-01T00:00:00+00:00", "action": "rea')  # crash mid-append
    assert [e["action"] for e in journal.read("web")] == ["start"]

    journal.append("web", "ready", "GET /health -> 2xx", "ready after 1.0s")
    assert [e["action"] for e in journal.read("web")] == ["start", "ready"]
    lines = journal.path("web").read_bytes().split(b"\n")
    assert lines[1].startswith(b'{"time": "2026-01-01') and lines[-1] == b""  # kept, skipped


def test_a_complete_object_without_its_newline_is_not_trusted(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.folder.mkdir(parents=True)
    journal.path("web").write_bytes(b'{"action": "start"}\n{"action": "half"}')
    assert [e["action"] for e in journal.read("web")] == ["start"]


def test_garbage_and_non_objects_are_skipped(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.folder.mkdir(parents=True)
    junk = b'{"action": "a"}\nnot json\n[1, 2]\n\xff\xfe\n{"action": "b"}\n'
    journal.path("web").write_bytes(junk)
    assert [e["action"] for e in journal.read("web")] == ["a", "b"]


def test_bounded_keeps_the_newest_whole_lines(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    for i in range(2000):
        journal.append("web", "restart", f"back-off over (restart {i})", "spawned", n=i)
        assert journal.path("web").stat().st_size <= events.MAX_BYTES
    data = journal.path("web").read_bytes()
    assert data.endswith(b"\n")
    got = journal.read("web")
    assert len(got) == len(data.split(b"\n")) - 1  # every kept line parses
    numbers = [e["n"] for e in got]
    assert numbers[-1] == 1999 and numbers == list(range(numbers[0], 2000))


def test_one_huge_event_is_clipped_not_allowed_to_crowd_out_the_rest(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.append("web", "start", "r", "spawned")
    journal.append("web", "fail", "x" * 500_000, "BackOff", log_tail=[f"l{i}" for i in range(99)])
    got = journal.read("web")
    assert [e["action"] for e in got] == ["start", "fail"]
    assert len(got[1]["reason"]) == events.MAX_FIELD
    assert got[1]["log_tail"] == [f"l{i}" for i in range(99 - events.MAX_ITEMS, 99)]


@pytest.mark.parametrize("name", ["../escape", "UPPER", "a/b", ""])
def test_names_never_reach_outside_the_events_folder(tmp_path: Path, name: str) -> None:
    from controller.errors import RecordError

    with pytest.raises(RecordError):
        Journal(tmp_path).append(name, "start", "r", "o")
    assert not any(p.suffix == ".jsonl" for p in tmp_path.rglob("*"))


def test_values_that_json_cannot_spell_are_stringified(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.append("web", "start", "r", "o", where=tmp_path)
    assert journal.read("web")[0]["where"] == str(tmp_path)
    json.loads(journal.path("web").read_text())  # one line, one object


def test_read_by_name_gives_the_deployment_now_under_it(tmp_path: Path) -> None:
    """A `removed` event ends a deployment's history: read by name, a journal gives the
    later deployment of that name its own events, the removed one's while it is the last
    (its removal with them), and the whole file with ``history``."""
    journal = Journal(tmp_path)
    journal.append("web", "start", "r", "spawned")
    journal.append("web", "stop", "manifest removed", "stopped; record dropped")
    journal.append("web", events.REMOVED, "manifest removed", events.REMOVED_OUTCOME)
    first = ["start", "stop", events.REMOVED]
    assert [e["action"] for e in journal.read("web")] == first
    journal.append("web", "start", "r", "spawned")
    journal.append("web", "ready", "GET /health -> 2xx", "ready after 1.0s")
    assert [e["action"] for e in journal.read("web")] == ["start", "ready"]
    assert [e["action"] for e in journal.read("web", last=1)] == ["ready"]
    journal.append("web", events.REMOVED, "manifest removed", events.REMOVED_OUTCOME)
    assert [e["action"] for e in journal.read("web")] == ["start", "ready", events.REMOVED]
    whole = [e["action"] for e in journal.read("web", history=True)]
    assert whole == [*first, "start", "ready", events.REMOVED]
