"""node.yaml ``notify:`` (checked by the real CLI) and the notification queue on disk
(store/instances/outbox.py), with real files in a state dir."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from controller.store.instances import outbox
from controller.store.instances.outbox import Hook, Notifications, Outbox


def test_a_full_queue_drops_its_oldest_and_counts_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox, "MAX_QUEUED", 3)  # the bound, small enough to reach
    before = outbox.DROPPED.value
    hook = Hook("http://127.0.0.1:9/x", frozenset({"Failed"}))
    box = Outbox(tmp_path)
    for n in range(5):
        box.put(hook, {"event": "Failed", "message": f"m{n}"})
    left = [item.body["message"] for item in box.pending()]
    assert left == ["m2", "m3", "m4"]
    assert outbox.DROPPED.value - before == 2
    assert {item.hook for item in box.pending()} == {hook.id}
    box.remove(box.pending()[0])
    assert [item.body["message"] for item in box.pending()] == ["m3", "m4"]


def test_only_the_hooks_that_list_an_event_get_it_and_no_file_names_a_hook_url(
    tmp_path: Path,
) -> None:
    slack = Hook("https://hooks.example.com/services/T0KEN", frozenset({"Failed"}))
    other = Hook("https://other.example.com/x", frozenset({"Synced"}))
    notes = Notifications(
        tmp_path, (slack, other), node="gpu-a", source="https://u:pw@git.example.com/r.git"
    )
    notes.emit("Failed", "api Failed: engine exited 3", revision="a" * 40, deployments=["api"])
    notes.emit("Failed", "fetch https://x:pw@h.example/r?token=tk1 failed", deployments=["api"])
    items = Outbox(tmp_path).pending()
    assert [i.hook for i in items] == [slack.id, slack.id]
    assert items[1].body["message"] == "fetch https://h.example/r?token=<redacted> failed"
    body = items[0].body
    assert body["source"] == "https://git.example.com/r.git"
    assert body["revision"] == "a" * 40
    assert body["text"] == f"[gpu-a] Failed (api): api Failed: engine exited 3 at {'a' * 12}"
    on_disk = "".join(p.read_text() for p in (tmp_path / "notify").iterdir())
    assert "T0KEN" not in on_disk and "pw@" not in on_disk and "tk1" not in on_disk
    assert slack.shown == "https://hooks.example.com"


def test_the_source_state_is_told_once_per_change_of_state_or_commit_across_restarts(
    tmp_path: Path,
) -> None:
    hook = Hook("http://127.0.0.1:9/x", frozenset(outbox.SOURCE_EVENTS))

    def notes() -> Notifications:  # a new one per "process": what it remembers is on disk
        return Notifications(tmp_path, (hook,), node="n", source="s")

    notes().source_state("Synced", "1 deployment(s) Ready", "b" * 40)
    notes().source_state("Synced", "1 deployment(s) Ready", "b" * 40)
    notes().source_state("PullFailed", "could not read from remote", "b" * 40)
    notes().source_state("Synced", "1 deployment(s) Ready", "c" * 40)  # a new commit: news
    told = [(i.body["event"], i.body["revision"][0]) for i in Outbox(tmp_path).pending()]
    assert told == [("Synced", "b"), ("PullFailed", "b"), ("Synced", "c")]
    noted = json.loads((tmp_path / "notify" / "source-state.json").read_text())
    assert noted == {"state": "Synced", "revision": "c" * 40}


@pytest.mark.parametrize(
    ("item", "said"),
    [
        pytest.param(
            {"url": "http://127.0.0.1:9/x", "events": "[Faild]"},
            ["node.yaml:3: notify[0].events", "did you mean Failed?"],
            id="event-typo",
        ),
        pytest.param(
            {"url": "ftp://example.com/x", "events": "[Synced]"},
            ["node.yaml:2: notify[0].url", "http:// or https://"],
            id="not-http",
        ),
    ],
)
def test_a_bad_notify_item_is_named_with_its_file_line_and_field(
    reconcile: Any, item: dict[str, str], said: list[str]
) -> None:
    config = reconcile.tmp / "node.yaml"
    config.write_text(f"notify:\n  - url: {item['url']}\n    events: {item['events']}\n")
    result = reconcile.once("--node-config", str(config), check=1)
    for words in said:
        assert words in result.err, str(result)
    assert "Traceback" not in result.err
