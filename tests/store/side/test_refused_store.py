"""``<state>/refused.json``: a refusal keeps its ``since`` while it is refused again, a
clear takes its subject alone, and a stopping gateway clears only what it said."""

from __future__ import annotations

from pathlib import Path

from controller.store.side import refused


def test_since_is_kept_and_clears_take_their_own(tmp_path: Path) -> None:
    refused.refuse(tmp_path, refused.API_KEYS, "keys:2: bad", "gateway pid 1", gateway="a")
    (first,) = refused.peek(tmp_path)
    refused.refuse(tmp_path, refused.API_KEYS, "keys:3: worse", "gateway pid 1", gateway="a")
    refused.refuse(tmp_path, refused.NODE_CONFIG, "node.yaml:1: x", "daemon pid 2")
    again, node = refused.peek(tmp_path)
    assert (again.since, again.why) == (first.since, "keys:3: worse") and again.at >= first.at
    assert node.subject == refused.NODE_CONFIG and node.gateway is None
    refused.clear(tmp_path, refused.API_KEYS, gateway="b")  # another gateway stopping
    assert [r.subject for r in refused.peek(tmp_path)] == [refused.API_KEYS, refused.NODE_CONFIG]
    refused.clear(tmp_path, refused.API_KEYS, gateway="a")
    assert [r.subject for r in refused.peek(tmp_path)] == [refused.NODE_CONFIG]
    refused.clear(tmp_path, refused.NODE_CONFIG)
    assert refused.peek(tmp_path) == []
    assert "fix it and SIGHUP the daemon again" in node.said()
