"""The state dir's side files (activation/, restart/, scale/, events/) when they are
torn or a folder is a file: named at warning level (a torn one quarantined, as
store/documents.py does for every document) and the pass goes on, or the CLI fails at
once naming the file. Never silence, never a wait, never a false message."""

from __future__ import annotations

import json
from typing import Any

import pytest

AUTOSCALED = {"autoscale": {"min": 1, "max": 3}}


def skipped(err: str, event: str = "state file skipped") -> dict[str, str]:
    """The ``event`` warnings of a CLI's JSON log lines: file -> problem."""
    out = {}
    for line in err.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and item.get("event") == event:
            assert item["level"] == "warning", item
            out[item["file"]] = item["problem"]
    return out


@pytest.mark.parametrize("folder", ["activation", "restart", "scale"])
def test_a_torn_side_file_is_named_and_quarantined_by_the_pass(reconcile: Any, folder: str) -> None:
    reconcile.write("web", **AUTOSCALED)
    reconcile.once()
    torn = reconcile.state / folder / "web.json"
    torn.parent.mkdir(exist_ok=True)
    torn.write_text('{"requested_at": "2026-')
    result = reconcile("plan", check=None)  # a read verb: named, left where it is
    assert "left in place" in skipped(result.err).get(str(torn), ""), result.err
    assert torn.read_text() == '{"requested_at": "2026-'
    result = reconcile.once()  # the pass sets it aside and goes on without it
    quarantined = skipped(result.err, "state file quarantined")
    assert "not a valid document" in quarantined.get(str(torn), ""), result.err
    if folder == "activation":  # a request at the torn file's mtime, written back whole
        assert "last_request_at" in json.loads(torn.read_text())
    else:
        assert not torn.exists()
    reconcile.down()


def test_an_events_folder_that_is_a_file(reconcile: Any) -> None:
    reconcile.state.mkdir()
    events = reconcile.state / "events"
    events.write_text("")
    reconcile.write("web")
    result = reconcile.once()  # the engines start: a journal is history, not a condition
    assert f"{events} is not a folder" in skipped(result.err)[str(events / "web.jsonl")]
    assert reconcile.status()["web"]["phase"] in ("Starting", "Ready")
    shown = reconcile("events", "web", check=1)
    assert shown.err.startswith(f"reconcile: {events} is not a folder"), str(shown)
    assert "Move it away" in shown.err and "no such deployment" not in shown.err
    assert reconcile.down().out.strip() == "stopped web"


def test_a_restart_folder_that_is_a_file(reconcile: Any) -> None:
    reconcile.write("web")
    reconcile.converge()
    folder = reconcile.state / "restart"
    folder.write_text("")
    result = reconcile("restart", "web", check=1)
    assert result.err.startswith(f"reconcile: {folder} is not a folder"), str(result)
    assert "restart of web requested" not in result.out
    reconcile.down()


def test_a_scale_folder_that_is_a_file(reconcile: Any) -> None:
    reconcile.state.mkdir()
    folder = reconcile.state / "scale"
    folder.write_text("")
    reconcile.write("web", **AUTOSCALED)
    result = reconcile.once()
    assert f"{folder} is not a folder" in skipped(result.err)[str(folder)], result.err
    assert reconcile.status()["web"]["phase"] in ("Starting", "Ready")
    reconcile.down()
