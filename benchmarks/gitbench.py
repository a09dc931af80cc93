"""A commit pushed to the engine exec'd, following git (issue 37), through the real daemon.

    python -m benchmarks --only git

A bare repository in a temp dir is the remote (``file://``); the daemon follows it with
``--git``. Each trial commits a changed argv for the one Deployment (so its hash changes and
the engine is replaced), pushes, and times from the push's return to the new engine's first
statement (the stand-in engine's exec log). Two ways to learn of the push:

* webhook: the daemon with ``--listen`` and ``--interval 1h``; right after the push, a POST
  /hooks/git signed like GitHub's (``X-Hub-Signature-256``) starts the fetch. Goal ≤ 1.5 s.
* polling: ``--interval 2s``, nothing else: the push lands anywhere in the interval, so
  the figure spreads over [0, 2 s] plus the apply. Goal ≤ interval + 1 s.

Each trial waits for the new engine Ready at its commit before the next push; one daemon
and state dir per mode.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import (
    HTTP_READY,
    Row,
    Workspace,
    engine_argv,
    free_port_block,
    manifest,
    p95,
    read_execs,
    reconcile_argv,
    run,
    stop,
    wait_for,
    workspace,
)

SECTION = "14. git"
NAME = "follows"
POLL_S = 2.0
WEBHOOK_GOAL_S, POLL_GOAL_S = 1.5, POLL_S + 1.0
SECRET = "bench-hook-secret"
WAIT = 60.0
IDENTITY = {
    "GIT_AUTHOR_NAME": "Bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "Bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
}


class Repo:
    """``bare`` the remote, ``work`` the clone a trial commits in and pushes from."""

    def __init__(self, root: Path, base_port: int) -> None:
        self.bare, self.work, self.base_port = root / "remote.git", root / "work", base_port
        root.mkdir()
        self._git(root, "init", "--quiet", "--bare", str(self.bare))
        self._git(root, "init", "--quiet", "-b", "main", str(self.work))
        self._git(self.work, "remote", "add", "origin", str(self.bare))

    @property
    def url(self) -> str:
        return f"file://{self.bare}"

    def push(self, version: int) -> str:
        """Commit the Deployment at ``version`` (its argv) and push; the commit's hash."""
        argv = [*engine_argv(), f"v{version}"]  # the engine ignores it: only the hash moves
        path = self.work / "manifests" / f"{NAME}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(manifest(NAME, argv, base_port=self.base_port, readiness=HTTP_READY))
        self._git(self.work, "add", "-A")
        self._git(self.work, "commit", "-q", "-m", f"{NAME} v{version}")
        self._git(self.work, "push", "-q", "origin", "HEAD:main")
        return self._git(self.work, "rev-parse", "HEAD")

    @staticmethod
    def _git(cwd: Path, *args: str) -> str:
        env = {**os.environ, **IDENTITY}
        proc = subprocess.run(
            ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
        )
        if proc.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout.strip()


def _ready_at(ws: Workspace, sha: str) -> bool:
    try:
        rec = json.loads((ws.state / "instances" / f"{NAME}.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(rec.get("phase") == "Ready" and rec.get("revision") == sha)


def _hook(port: int) -> None:
    """A push notification signed as GitHub signs it; 202 expected."""
    body = json.dumps({"ref": "refs/heads/main"}).encode()
    sig = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {"X-Hub-Signature-256": f"sha256={sig}", "X-GitHub-Event": "push"}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/hooks/git", body=body, headers=headers)
        status = conn.getresponse().status
    finally:
        conn.close()
    if status != 202:
        raise RuntimeError(f"POST /hooks/git answered {status}, not 202")


def _trials(ws: Workspace, repo: Repo, pushes: int, after_push: Callable[[], None]) -> list[float]:
    took = []
    for i in range(1, pushes + 1):
        seen = len(read_execs(ws.exec_log))
        sha = repo.push(i)
        pushed = time.time()
        after_push()
        execd = lambda seen=seen: len(read_execs(ws.exec_log)) > seen  # noqa: E731
        wait_for(execd, WAIT, f"push {i}'s engine", 0.005)
        took.append(read_execs(ws.exec_log)[seen].t - pushed)
        wait_for(lambda sha=sha: _ready_at(ws, sha), WAIT, f"push {i} Ready", 0.02)
    return took


def _node(ws: Workspace) -> list[str]:
    """The workspace's node options less ``-f``: a node follows git or reads folders."""
    common = ws.common()
    at = common.index("-f")
    return common[:at] + common[at + 2 :]


def _mode(webhook: bool, pushes: int) -> list[float]:
    with workspace("git-hook" if webhook else "git-poll") as ws:
        port = free_port_block(6, start=27000)
        repo = Repo(ws.root / "git", port)
        first = repo.push(0)
        ws.state.mkdir()
        secret = ws.root / "hook.secret"
        secret.write_text(SECRET)
        secret.chmod(0o600)
        (ws.state / "node.yaml").write_text(
            f"git:\n  url: {repo.url}\n  path: manifests\n  webhookSecretFile: {secret}\n"
        )
        interval = "1h" if webhook else f"{POLL_S:g}s"
        listen = ["--listen", str(port + 5)] if webhook else []
        argv = [*reconcile_argv(), "--resync", "1h", "--interval", interval, *listen]
        argv += ["--git", repo.url, *_node(ws)]
        with open(ws.root / "daemon.log", "wb") as log:
            daemon = subprocess.Popen(argv, env=ws.env(), stdin=subprocess.DEVNULL, stderr=log)
        try:
            wait_for(lambda: _ready_at(ws, first), WAIT, "the first commit Ready", 0.02)
            after = (lambda: _hook(port + 5)) if webhook else (lambda: None)
            return _trials(ws, repo, pushes, after)
        finally:
            stop(daemon)
            down = ["--git", repo.url, "down", *(["--gateway"] if webhook else [])]
            run([*reconcile_argv(), *down, *_node(ws)], env=ws.env())


def bench(pushes: int = 20) -> list[Row]:
    hook, poll = _mode(True, pushes), _mode(False, pushes)
    return [
        Row(
            SECTION,
            f"commit pushed to the engine exec'd: signed webhook, --interval 1h ({pushes} pushes)",
            "s",
            hook,
            goal=f"≤ {WEBHOOK_GOAL_S:g} s",
            met=p95(hook) <= WEBHOOK_GOAL_S,
        ),
        Row(
            SECTION,
            f"commit pushed to the engine exec'd: polling every {POLL_S:g} s ({pushes} pushes)",
            "s",
            poll,
            goal=f"≤ {POLL_GOAL_S:g} s",
            met=p95(poll) <= POLL_GOAL_S,
        ),
    ]


if __name__ == "__main__":  # pragma: no cover
    for row in bench():
        print(row)
