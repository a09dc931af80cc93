"""The git source over smart HTTP (git http-backend on loopback, Basic auth): a token in
the URL works and is never shown; a wrong token and a server that went away are
PullFailed with git's words, the engine untouched."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.git.conftest import Remote, source
from tests.git.httpgit import GitHTTP

TOKEN = "tok-3141592653"


@pytest.fixture
def http(remote: Remote) -> Iterator[GitHTTP]:
    server = GitHTTP(remote.bare.parent, "tess", TOKEN)
    yield server
    server.stop()


def test_over_http_with_a_token_then_a_wrong_token_then_no_server(
    reconcile: Any, remote: Remote, http: GitHTTP
) -> None:
    applied = remote.deploy("alpha")
    url = http.url("remote.git", "tess", TOKEN)
    flags = ("--git", url, "--git-path", "manifests")
    reconcile.converge(*flags)
    pid = reconcile.record("alpha")["ref"]["pid"]
    seen = source(reconcile)
    assert seen["applied"] == applied and TOKEN not in str(seen), seen
    assert TOKEN not in reconcile.record("alpha")["owner"]
    assert TOKEN not in reconcile("status", check=0).out

    wrong = http.url("remote.git", "tess", "wrong-token")
    out = reconcile("--once", "--git", wrong, "--git-path", "manifests", check=1)
    assert "Authentication failed" in out.err and "wrong-token" not in out.err, out
    assert source(reconcile)["state"] == "PullFailed" and reconcile.alive(pid)

    http.stop()  # the server goes away
    out = reconcile("--once", *flags, check=1)
    assert "Failed to connect" in out.err or "Connection refused" in out.err, out
    assert TOKEN not in out.err, out
    seen = source(reconcile)
    assert seen["state"] == "PullFailed" and seen["applied"] == applied, seen
    assert reconcile.alive(pid) and reconcile.record("alpha")["ref"]["pid"] == pid
    reconcile("--git", url, "--git-path", "manifests", "down", check=0)
