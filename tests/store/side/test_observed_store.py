"""``<state>/observed.json``: a pass that sees what the last one saw rewrites nothing in
the state dir's top folder (the gateway watches it for ``drain.json``); its time goes to
``heartbeat/observed-at.json`` and every reader sees it."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from fsevents import Writes

from controller.store.side import observed

AT = datetime(2026, 12, 7, 6, 0, tzinfo=UTC)


def test_an_unchanged_note_writes_its_time_alone_out_of_the_top_folder(tmp_path: Path) -> None:
    first = observed.Seen(node="n", owner="o", at=AT)
    other = observed.Seen(node="n", owner="cron", at=AT, prune_blocked="folder empty")
    observed.note(tmp_path, first)
    observed.note(tmp_path, other)
    later = replace(first, at=AT + timedelta(seconds=5))
    with Writes(tmp_path) as writes:
        observed.note(tmp_path, later)
        top = [e for e in writes.taken() if e[0] == "."]
    assert top == []  # before: observed.json's tmp file made, written, renamed over it
    assert observed.read_all(tmp_path) == [later, other]
    assert observed.peek_all(tmp_path) == [later, other]  # status, describe, the page
    changed = replace(later, at=AT + timedelta(seconds=10), skipped="1 deployment skipped")
    observed.note(tmp_path, changed)  # a note that changed: written, in its place
    assert observed.read_all(tmp_path) == [changed, other]
    assert [s.owner for s in observed.peek_all(tmp_path)] == ["o", "cron"]


def test_a_lost_heartbeat_reads_as_the_notes_own_time(tmp_path: Path) -> None:
    seen = observed.Seen(node="n", owner="o", at=AT)
    observed.note(tmp_path, seen)
    observed.note(tmp_path, replace(seen, at=AT + timedelta(seconds=5)))
    (tmp_path / "heartbeat" / "observed-at.json").unlink()
    assert observed.read_all(tmp_path) == [seen]


def test_the_heartbeat_counts_while_it_follows_the_note_whatever_the_clock_did(
    tmp_path: Path,
) -> None:
    seen = observed.Seen(node="n", owner="o", at=AT)
    observed.note(tmp_path, seen)
    stepped_back = replace(seen, at=AT - timedelta(hours=1))  # the wall clock set back
    observed.note(tmp_path, stepped_back)
    assert observed.peek_all(tmp_path) == [stepped_back]  # the last pass, not the note's
    # An older reconcile (a downgrade) rewrites observed.json alone: its note is newer.
    older = replace(seen, at=AT - timedelta(minutes=30))
    entry = {"node": "n", "owner": "o", "at": older.at.isoformat(), "prune_blocked": None}
    (tmp_path / "observed.json").write_text(json.dumps([entry]))
    assert observed.peek_all(tmp_path) == [older]
