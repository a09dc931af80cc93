"""The git source over smart HTTP (git http-backend on loopback, Basic auth): a token in
the URL works and is never shown; a wrong token and a server that went away are
PullFailed with git's words, the engine untouched."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.git.conftest import Remote, source
from tests.git.httpgit import GitHTTP
from tests.git.test_git_notify import told
from tests.hookreceiver import Receiver

TOKEN = "tok-3141592653"
TOKEN_SEEN = f"tok-{uuid.uuid4().hex}"  # this module's own: no other test's process holds it


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
    # git's words alone left the operator guessing: a refused token is said, with where
    # the new one goes (a token expired or revoked is the usual cause)
    said = "the remote refused the credentials git sent (a wrong, expired or revoked token"
    assert said in out.err and "restart reconcile with it" in out.err, out
    seen = source(reconcile)
    assert seen["state"] == "PullFailed" and said in seen["message"], seen
    assert reconcile.alive(pid)

    http.stop()  # the server goes away
    out = reconcile("--once", *flags, check=1)
    assert "Failed to connect" in out.err or "Connection refused" in out.err, out
    assert TOKEN not in out.err, out
    seen = source(reconcile)
    assert seen["state"] == "PullFailed" and seen["applied"] == applied, seen
    assert reconcile.alive(pid) and reconcile.record("alpha")["ref"]["pid"] == pid
    reconcile("--git", url, "--git-path", "manifests", "down", check=0)


class Watched(GitHTTP):
    """Notes, at each authorised request (its git waiting for the answer), the command line
    of every process on the box that holds the token."""

    def __init__(self, root: Path, user: str, token: str, *, seen: str = TOKEN_SEEN) -> None:
        super().__init__(root, user, token)
        self.seen = seen
        self.requests = 0
        self.shown: list[str] = []

    def on_request(self) -> None:
        self.requests += 1
        for proc in psutil.process_iter(["cmdline"]):
            argv = " ".join(proc.info["cmdline"] or ())
            if self.seen in argv:
                self.shown.append(f"pid {proc.pid}: {argv}")


def test_a_url_s_token_is_on_no_command_line_while_git_fetches(
    reconcile: Any, remote: Remote
) -> None:
    """A token in the URL (node.yaml's git.url, so reconcile's own command line holds none)
    was on the command line of `git fetch` and of its git-remote-http for the whole fetch,
    which any local user reads in `ps`. git is given it through its credential helper from
    its environment: the fetch goes through, and no process's command line holds it."""
    applied = remote.deploy("alpha")
    server = Watched(remote.bare.parent, "tess", TOKEN_SEEN)
    _once_from_node_yaml(reconcile, server, server.url("remote.git", "tess", TOKEN_SEEN),
                         applied, TOKEN_SEEN)  # fmt: skip


def _once_from_node_yaml(
    reconcile: Any, server: Watched, url: str, applied: str, secret: str
) -> None:
    """A `--once` following node.yaml's git ``url`` applies ``applied``, while ``server``
    saw no git command line carrying the credential and the output never says
    ``secret``; then `down`, and the server stopped."""
    try:
        reconcile.state.mkdir(parents=True, exist_ok=True)
        (reconcile.state / "node.yaml").write_text(f"git:\n  url: {url}\n  path: manifests\n")
        node = ("--state-dir", str(reconcile.state), "--node", reconcile.node)
        out = reconcile("--once", *node, "--devices", reconcile.devices, common=False, check=0)
        assert server.requests >= 2 and server.shown == [], (server.shown, out)
        assert reconcile.record("alpha")["revision"] == applied, out
        assert secret not in out.out + out.err, out
        reconcile("down", *node, common=False, check=0)
    finally:
        server.stop()


def test_a_token_given_as_the_url_s_user_is_on_no_command_line_while_git_fetches(
    reconcile: Any, remote: Remote
) -> None:
    """`https://TOKEN@host/ops.git` (a token as the user, no password) kept the token in the
    URL on the command line of git and its git-remote-http, which any local user reads in
    `ps`. The user goes through the credential helper as `user:token@` does."""
    applied = remote.deploy("alpha")
    token = f"tok-{uuid.uuid4().hex}"
    server = Watched(remote.bare.parent, token, "", seen=token)
    _once_from_node_yaml(reconcile, server, f"http://{token}@127.0.0.1:{server.port}/remote.git",
                         applied, token)  # fmt: skip


def test_a_url_s_user_alone_still_asks_the_user_s_credential_helper_for_that_user(
    reconcile: Any, remote: Remote, http: GitHTTP
) -> None:
    """A URL naming its user alone (Bitbucket's do), the password in the user's own
    credential helper: the user leaves git's command line, and the helper is still asked
    for that user (git's `credential.username`, in its environment), not for the host's
    first entry, another user's."""
    applied = remote.deploy("alpha")
    store = reconcile.tmp / "git-credentials"
    where = f"127.0.0.1:{http.port}"
    store.write_text(f"http://other:wrong@{where}\nhttp://tess:{TOKEN}@{where}\n")
    store.chmod(0o600)
    config = reconcile.tmp / "gitconfig"
    config.write_text(f"[credential]\n\thelper = store --file={store}\n")
    env = {"GIT_CONFIG_GLOBAL": str(config)}
    flags = ("--git", f"http://tess@{where}/remote.git", "--git-path", "manifests")
    out = reconcile("--once", "--wait", "--timeout", "30s", *flags, check=0, env=env, timeout=60)
    assert reconcile.record("alpha")["revision"] == applied, out
    reconcile(*flags, "down", check=0, env=env)


def test_a_git_url_written_wrong_in_node_yaml_is_said_without_its_token(reconcile: Any) -> None:
    """`url: x: https://tess:TOKEN@host/ops.git` (a YAML syntax error), or `url: {x: ...}`
    (a mapping), was refused with a hint that quoted what was written, the token with it,
    in `--once`'s error and every read verb's warning: errors land in cron mails and
    journals. The quote keeps the URL, its password redacted."""
    reconcile.state.mkdir(parents=True, exist_ok=True)
    url = f"http://tess:{TOKEN}@127.0.0.1:9/remote.git"
    node = ("--state-dir", str(reconcile.state), "--node", reconcile.node)
    for written, said in ((f"x: {url}", "invalid YAML"), (f"{{x: {url}}}", "git.url: Input")):
        (reconcile.state / "node.yaml").write_text(f"git:\n  url: {written}\n")
        out = reconcile("--once", *node, common=False, check=1)
        assert f"node.yaml:2: {said}" in out.err and "x: http://tess:<redacted>@" in out.err, out
        assert TOKEN not in out.err, out
        status = reconcile("status", *node, common=False, check=None)
        assert "node.yaml:2" in status.err and TOKEN not in status.out + status.err, status


def test_a_run_without_the_url_s_token_says_it_is_not_kept(
    reconcile: Any, remote: Remote, http: GitHTTP
) -> None:
    """The state dir keeps the URL without its token, so a `--once` from cron with no
    `--git` (the state dir "remembers its source") asked git for a user it did not have,
    and said only git's `could not read Username ... terminal prompts disabled`: the
    run a minute before had worked. It names why and the next move."""
    remote.deploy("alpha")
    url = http.url("remote.git", "tess", TOKEN)
    reconcile.converge("--git", url, "--git-path", "manifests")
    node = ("--state-dir", str(reconcile.state), "--node", reconcile.node)
    out = reconcile("--once", *node, "--devices", reconcile.devices, common=False, check=1)
    assert "could not read Username" in out.err, out
    said = "reconcile keeps no password given in a URL: give the same --git URL again"
    assert said in out.err and "credential helper" in out.err and TOKEN not in out.err, out
    assert said in source(reconcile)["message"]
    reconcile("--git", url, "--git-path", "manifests", "down", check=0)


@pytest.fixture
def hook(reconcile: Any) -> Iterator[Receiver]:
    receiver = Receiver(reconcile.port + 15).start()
    yield receiver
    receiver.stop()


def _notify(reconcile: Any, hook: Receiver) -> None:
    reconcile.state.mkdir(parents=True, exist_ok=True)
    (reconcile.state / "node.yaml").write_text(
        f"notify:\n  - url: http://127.0.0.1:{hook.port}/reconcile\n"
        "    events: [Synced, PullFailed]\n"
    )


def test_a_cron_run_without_the_token_leaves_the_daemon_s_source_state_alone(
    reconcile: Any, remote: Remote, http: GitHTTP, git_daemon: Any, hook: Receiver
) -> None:
    """A daemon follows the repository with a token in its URL (kept in its memory, never
    on disk); a cron `--once --git URL` beside it without the token wrote its failed fetch
    into the shared source.json, so the node said PullFailed, then Synced at the daemon's
    next fetch, at every cron run. The daemon owns the source's fetch state (as one Argo CD
    controller owns an app's sync status): the run says why it could not fetch, and keeps
    nothing of it."""
    _notify(reconcile, hook)
    applied = remote.deploy("alpha")
    url = http.url("remote.git", "tess", TOKEN)
    d = git_daemon("--git", url, "--git-path", "manifests", "--interval", "1h")
    synced = d.wait(lambda: told(hook, "Synced"), "the daemon's Synced posted")
    assert synced[0]["revision"] == applied, synced

    out = reconcile("--once", "--git", http.url("remote.git"), "--git-path", "manifests", check=1)
    assert "could not read Username" in out.err and TOKEN not in out.err, out
    assert f"the daemon (pid {d.proc.pid})" in out.err and "not kept" in out.err, out
    seen = source(reconcile)
    assert seen["state"] == "Synced" and seen["applied"] == applied, seen
    assert told(hook, "PullFailed") == [] and len(told(hook, "Synced")) == 1, hook.accepted
    assert d.stop() == 0
    reconcile("--git", url, "--git-path", "manifests", "down", check=0)


def test_a_cron_run_with_the_token_beside_a_daemon_without_it_lifts_no_failure(
    reconcile: Any, remote: Remote, http: GitHTTP, git_daemon: Any, hook: Receiver
) -> None:
    """The reverse: the daemon's fetches fail (its URL has no token), a cron run's with
    the token succeeds: its success cleared the daemon's failure (Synced posted), and the
    daemon's next try set it again (PullFailed): a flap. The run applies the commit it
    fetched; the source stays PullFailed, the daemon's words, until the daemon fetches.
    The run exits 1 on it, as `--once` does on PullFailed (DESIGN, Following git), naming
    the daemon's failure and the next move: it exited 0 and said nothing, so cron mailed
    nothing while `status`, `source` and the notification said PullFailed. A run whose
    own fetch fails too says its own failure (exit 1), as beside a daemon that fetches."""
    _notify(reconcile, hook)
    applied = remote.deploy("alpha")
    d = git_daemon("--git", http.url("remote.git"), "--git-path", "manifests", "--interval", "1h")
    d.wait(lambda: told(hook, "PullFailed"), "the daemon's PullFailed posted")

    url = http.url("remote.git", "tess", TOKEN)
    for wait in ((), ("--wait", "--timeout", "30s")):
        out = reconcile("--once", *wait, "--git", url, "--git-path", "manifests", check=1)
        said = f"error: git: the daemon (pid {d.proc.pid}) on this state dir cannot fetch"
        assert said in out.err and "could not read Username" in out.err, out
        assert "restart the daemon" in out.err and TOKEN not in out.err, out
    # Both fail: the run's own failure, as beside a daemon whose fetches go through.
    out = reconcile("--once", "--git", http.url("remote.git"), "--git-path", "manifests", check=1)
    assert "this run's fetch alone, not kept" in out.err and "cannot fetch" not in out.err, out
    seen = source(reconcile)
    assert seen["state"] == "PullFailed" and seen["applied"] == applied, seen
    assert "could not read Username" in seen["message"], seen
    assert told(hook, "Synced") == [], hook.accepted
    assert d.stop() == 0
    reconcile("--git", url, "--git-path", "manifests", "down", check=0)


def test_a_cron_wait_that_cannot_fetch_exits_1_though_all_comes_up_ready_later(
    reconcile: Any, remote: Remote, http: GitHTTP, git_daemon: Any
) -> None:
    """Beside the daemon a run's failed fetch is kept in its memory alone, and a `--once
    --wait`'s passes after the first (which fetch nothing) said none: its first pass found
    an engine killed since (the daemon restarting it), and once that was Ready the wait
    exited 0 though it never fetched. It exits 1 with its fetch's words, as `--once` does."""
    remote.deploy("alpha", command=reconcile.demo_command(load_seconds="2"))
    url = http.url("remote.git", "tess", TOKEN)
    d = git_daemon("--git", url, "--git-path", "manifests", "--interval", "1h")
    d.wait(lambda: (reconcile.record("alpha") or {}).get("phase") == "Ready", "alpha Ready")
    pid = reconcile.record("alpha")["ref"]["pid"]
    os.kill(pid, signal.SIGKILL)  # the daemon or the wait's first pass starts it again

    wait = ("--once", "--wait", "--timeout", "60s")
    out = reconcile(*wait, "--git", http.url("remote.git"), "--git-path", "manifests", check=1)
    assert "could not read Username" in out.err and "not kept" in out.err, out
    assert f"the daemon (pid {d.proc.pid})" in out.err and TOKEN not in out.err, out
    rec = reconcile.record("alpha")
    assert rec["phase"] == "Ready" and rec["ref"]["pid"] != pid, rec  # it came up again
    assert d.stop() == 0
    reconcile("--git", url, "--git-path", "manifests", "down", check=0)


def test_a_token_on_the_git_flag_is_warned_of_and_the_environment_gives_it_instead(
    reconcile: Any, remote: Remote
) -> None:
    """`reconcile --git https://USER:TOKEN@host/...` put the token on reconcile's own
    command line, which every local user reads in `ps` (git's were already kept clean).
    It is warned of once, naming the flag, never the token; the documented way, the user
    alone in the URL and the token in RECONCILE_GIT_PASSWORD, fetches with the token on
    no command line, and no engine is given the variable."""
    remote.deploy("alpha")
    token = f"tok-{uuid.uuid4().hex}"
    server = Watched(remote.bare.parent, "tess", token, seen=token)
    try:
        flagged = ("--git", server.url("remote.git", "tess", token), "--git-path", "manifests")
        out = reconcile("--once", *flagged, check=0)
        assert out.err.count("warning: --git's URL carries a credential") == 1, out
        assert "RECONCILE_GIT_PASSWORD" in out.err and token not in out.out + out.err, out

        second = remote.deploy("alpha", command=reconcile.demo_command(load_seconds="0.1"))
        server.shown.clear()
        user = (
            "--git",
            f"http://tess@127.0.0.1:{server.port}/remote.git",
            "--git-path",
            "manifests",
        )
        env = {"RECONCILE_GIT_PASSWORD": token}
        out = reconcile("--once", *user, check=0, env=env)  # the new engine started
        assert "carries a credential" not in out.err and token not in out.out + out.err, out
        assert server.shown == [], server.shown  # on no command line while git fetched
        record = reconcile.record("alpha")
        assert record["revision"] == second, out
        environ = Path(f"/proc/{record['ref']['pid']}/environ").read_bytes()
        assert token.encode() not in environ  # the engine is never given it
        reconcile(*user, "down", check=0, env=env)
    finally:
        server.stop()
