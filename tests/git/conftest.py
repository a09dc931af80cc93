"""A real git remote for the git-source tests: a bare repository in the test's temp dir
(``file://``), a working clone the test commits in and pushes from, and the daemon with
``--git`` (its log read as JSON lines, as tests/daemon does).
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import warmcli

WAIT = 30.0
IDENTITY = {
    "GIT_AUTHOR_NAME": "Tess Ter",
    "GIT_AUTHOR_EMAIL": "tess@example.com",
    "GIT_COMMITTER_NAME": "Tess Ter",
    "GIT_COMMITTER_EMAIL": "tess@example.com",
}


def run_git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    import os

    proc = subprocess.run(
        ["git", "-c", "init.defaultBranch=main", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **IDENTITY, **(env or {})},
    )
    assert proc.returncode == 0, f"git {' '.join(args)}: {proc.stderr}"
    return proc.stdout.strip()


class Remote:
    """``bare`` is the remote; ``work`` a clone where the test commits and pushes."""

    def __init__(self, root: Path, rc: Any) -> None:
        self.rc = rc
        self.bare = root / "remote.git"
        self.work = root / "work"
        root.mkdir(exist_ok=True)
        run_git(root, "init", "--quiet", "--bare", str(self.bare))
        run_git(root, "init", "--quiet", str(self.work))
        run_git(self.work, "checkout", "-q", "-b", "main")
        run_git(self.work, "remote", "add", "origin", str(self.bare))

    @property
    def url(self) -> str:
        return f"file://{self.bare}"

    def owner(self, path: str = "manifests") -> str:
        return f"git:{self.url}#{path}"

    def deploy(self, name: str, message: str = "", **spec: Any) -> str:
        """Commit manifests/<name>.yaml (a demo Deployment) and push; the new commit."""
        spec.setdefault("basePort", self.rc.port)
        text = self.rc.dump_yaml(self.rc.deployment(name, **spec))
        return self.commit({f"manifests/{name}.yaml": text}, message or f"deploy {name}")

    def commit(self, files: dict[str, str | None], message: str, push: bool = True) -> str:
        for rel, text in files.items():
            path = self.work / rel
            if text is None:
                path.unlink()
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        run_git(self.work, "add", "-A")
        run_git(self.work, "commit", "-q", "--allow-empty", "-m", message)
        if push:
            run_git(self.work, "push", "-q", "--force", "origin", "HEAD:main")
        return run_git(self.work, "rev-parse", "HEAD")


@pytest.fixture
def remote(tmp_path: Path, reconcile: Any) -> Remote:
    return Remote(tmp_path / "git", reconcile)


class GitDaemon:
    def __init__(self, proc: subprocess.Popen[bytes] | warmcli.Started, log: Path, rc: Any) -> None:
        self.proc, self.log, self.rc = proc, log, rc

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text().splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if isinstance(item, dict):
                out.append(item)
        return out

    def wait(self, predicate: Any, what: str, timeout: float = WAIT) -> Any:
        def check() -> Any:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.tail()}")
            return predicate()

        try:
            return self.rc.wait_for(check, timeout=timeout, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- daemon log\n{self.tail()}") from None

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text().splitlines()[-n:])

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=WAIT)


@pytest.fixture
def git_daemon(reconcile: Any) -> Iterator[Any]:
    """``git_daemon(url, *flags)``: the daemon following ``url``; killed at teardown."""
    started: list[GitDaemon] = []

    def start(*args: str, env: dict[str, str] | None = None) -> GitDaemon:
        log = reconcile.tmp / f"daemon-{len(started)}.log"
        with open(log, "wb") as err:
            proc = reconcile.daemon(
                "-v", "--resync", "1h", *args, stderr=err, env={**reconcile.env, **(env or {})}
            )
        daemon = GitDaemon(proc, log, reconcile)
        started.append(daemon)
        return daemon

    yield start
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(timeout=WAIT)


def source(rc: Any) -> dict[str, Any]:
    """``reconcile source -o json`` (exit 0)."""
    item: dict[str, Any] = rc("source", "-o", "json", check=0).json()
    return item


# The gateway under test (tests/gateway's fixture): the daemon with --listen.
from tests.gateway.conftest import gateway  # noqa: E402,F401
