"""A damaged ``<state>/git/source.json`` (a disk that lied, a hand edit, a folder in its
place): it holds the rollback pin, so it is refused, named with the way out, and left
in place; it was set aside and read as none, and the next pass forgot the pin and
applied the newest commit, replacing the engine the operator had rolled back to."""

from __future__ import annotations

import json
import shutil
from typing import Any

from controller.store.statedir import StateDir
from tests.git.conftest import Remote, source
from tests.git.test_rollback import node_only

GIT = ("--git-path", "manifests")


def _pinned(reconcile: Any, remote: Remote) -> tuple[str, int]:
    """alpha rolled back to its first commit (pinned) and Ready: (that commit, its pid)."""
    good = remote.deploy("alpha")
    reconcile.converge("--git", remote.url, *GIT)
    remote.deploy("alpha", command=reconcile.demo_command(load_seconds="0.1"))
    reconcile.converge("--git", remote.url, *GIT)
    reconcile("rollback", good, check=0)
    node_only(reconcile, "--once", "--wait", "--timeout", "30s")
    record = reconcile.record("alpha")
    assert record["revision"] == good and record["phase"] == "Ready", record
    return good, record["ref"]["pid"]


def _refused(out: Any, file: str) -> None:
    assert f"{file}: " in out.err and "left in place and refused" in out.err, out
    assert "reconcile rollback REV" in out.err and "Traceback" not in out.err, out


def test_a_damaged_source_file_is_refused_and_its_pin_kept(reconcile: Any, remote: Remote) -> None:
    good, pid = _pinned(reconcile, remote)
    state = StateDir(reconcile.state)
    whole = state.git_source.read_bytes()
    wrong_type = json.dumps({**json.loads(whole), "pinned": 5})
    for damage in ('{"url": "file:', "", "[]", "{}", wrong_type):
        state.git_source.write_text(damage)
        _refused(reconcile("--once", "--git", remote.url, *GIT, check=1), str(state.git_source))
        _refused(node_only(reconcile, "--once", check=1), str(state.git_source))
        said = node_only(reconcile, "source", check=1)
        _refused(said, str(state.git_source))
        assert damage != "{}" or "not a valid document: no url, branch, tag, path" in said.err
        assert damage != wrong_type or "pinned: 5, not str | None" in said.err, said
        table = node_only(reconcile, "status")  # a read verb: the engines, the file named
        assert "\nalpha " in table.out and str(state.git_source) in table.err, table
        history = node_only(reconcile, "history", "-o", "json").json()  # where it sends one
        assert [h["revision"] for h in history][-1] == good, history
        assert state.git_source.read_text() == damage  # never set aside
        record = reconcile.record("alpha")
        assert record["ref"]["pid"] == pid and record["revision"] == good, record
        assert reconcile.alive(pid)
    state.git_source.unlink()
    state.git_source.mkdir()  # a folder in its place: refused alike
    _refused(reconcile("--once", "--git", remote.url, *GIT, check=1), str(state.git_source))
    assert reconcile.record("alpha")["ref"]["pid"] == pid
    shutil.rmtree(state.git_source)
    state.git_source.write_bytes(whole)  # restored: the pin holds
    node_only(reconcile, "--once")
    seen = source(reconcile)
    assert seen["state"] == "Pinned" and seen["pinned"] == good, seen
    assert reconcile.record("alpha")["ref"]["pid"] == pid
    node_only(reconcile, "down")


def test_the_daemon_refuses_a_damaged_source_file_and_keeps_running(
    reconcile: Any, remote: Remote, git_daemon: Any
) -> None:
    good, pid = _pinned(reconcile, remote)
    state = StateDir(reconcile.state)
    whole = state.git_source.read_bytes()
    state.git_source.write_text('{"url": "file:')
    d = git_daemon("--git", remote.url, *GIT, "--interval", "1h")
    said = d.wait(
        lambda: [e for e in d.lines() if str(state.git_source) in str(e.get("error", ""))],
        "the pass refused, the file named",
    )
    assert "left in place and refused" in said[0]["error"], said
    assert "Traceback" not in d.log.read_text()
    assert reconcile.record("alpha")["ref"]["pid"] == pid and reconcile.alive(pid)
    assert reconcile.record("alpha")["revision"] == good
    assert state.git_source.read_text() == '{"url": "file:'
    assert d.stop() == 0
    state.git_source.write_bytes(whole)
    assert source(reconcile)["pinned"] == good
    node_only(reconcile, "down")
