"""`reconcile logs` of several deployments, or of all of them, through the real CLI
(issue 25): each line behind its instance's name, as `docker compose logs` prints them;
one deployment of one replica stays unprefixed, as before."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest


@pytest.fixture
def two(reconcile: Any) -> Any:
    rc = reconcile
    rc.write("web")
    rc.write("chat", basePort=rc.port + 5)
    rc.converge()
    yield rc
    rc.down()


def test_logs_with_no_name_is_every_deployment_prefixed(two: Any) -> None:
    rc = two
    lines = rc("logs", check=0).out.splitlines()
    for name in ("chat", "web"):
        mine = [line for line in lines if line.startswith(f"{name:<4} | ")]
        assert any(f"reconcile: start {name} instance" in line for line in mine), lines
    assert all(line[:7] in {"chat | ", "web  | "} for line in lines), lines
    assert rc("logs", "web", "chat", "--tail", "1", check=0).out.count("\n") == 2  # one each
    alone = rc("logs", "web", check=0).out  # one deployment, one replica: unprefixed
    assert alone.startswith("--- ") and "web  | " not in alone
    assert rc("logs", "web", "--replica", "0", check=0).out == alone


def test_logs_follow_of_two_deployments(two: Any) -> None:
    rc = two
    follow, _ = rc.follow("web", "chat")
    for name in ("web", "chat"):
        port = rc.record(name)["port"]
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
    rc.down()  # every record goes: -f ends by itself
    out, _ = follow.communicate(timeout=30)
    assert follow.returncode == 0
    for name in ("web", "chat"):
        assert any(
            line.startswith(f"{name:<4} | ".encode()) and b"GET /v1/models" in line
            for line in out.splitlines()
        ), out


def test_logs_of_an_unknown_name_or_an_empty_state_dir(reconcile: Any) -> None:
    rc = reconcile
    assert "no deployment has a log" in rc("logs", check=1).err
    assert "no deployment named 'nope'" in rc("logs", "nope", check=1).err
    assert "no deployment named '../x'" in rc("logs", "../x", check=1).err  # never a path


def test_logs_with_no_name_shows_a_replicated_deployment_once(reconcile: Any) -> None:
    """`logs` alone listed a replicated deployment once per replica's log file (`web`
    for web.log and again for web@1.log), so every replica's lines came out twice."""
    rc = reconcile
    rc.write("web", replicas=2)
    rc.converge()
    try:
        every = rc("logs", "--tail", "1", check=0).out.splitlines()
        named = rc("logs", "web", "--tail", "1", check=0).out.splitlines()
    finally:
        rc.down()
    assert [line[:8] for line in every] == ["web   | ", "web@1 | "], every
    assert len(every) == len(named) == 2, (every, named)


def test_logs_of_an_unknown_name_lists_a_removed_deployment_apart(reconcile: Any) -> None:
    """`logs nope` listed a deployment whose manifest was removed as "known", beside the
    live ones, though the node no longer has it: its log is kept (`logs old` reads it), so
    it is named apart, as a removed deployment's kept log."""
    rc = reconcile
    rc.write("web")
    rc.write("old", basePort=rc.port + 5)
    rc.converge()
    try:
        (rc.manifests / "old.yaml").unlink()
        rc.converge()
        assert rc.record("old") is None
        said = rc("logs", "nope", check=1).err
        kept = rc("logs", "old", check=0).out
    finally:
        rc.down()
    assert "(known: web; logs kept of removed deployments: old)" in said, said
    assert "reconcile: start old instance" in kept, kept
