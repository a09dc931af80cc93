"""POST /hooks/git on a real gateway in front of a real daemon following a bare repository:
a signed hook fetches at once while --interval is an hour; anything unsigned is 401."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

from tests.git.conftest import Remote, source

SECRET = "s3cret-hook"


def node_yaml(rc: Any, remote: Remote, secret: Path) -> None:
    rc.state.mkdir(parents=True, exist_ok=True)
    (rc.state / "node.yaml").write_text(
        f"git:\n  url: {remote.url}\n  path: manifests\n  interval: 1h\n"
        f"  webhookSecretFile: {secret}\n"
    )


def secret_file(rc: Any, mode: int = 0o600) -> Path:
    path = rc.tmp / "hook.secret"
    path.write_text(SECRET + "\n")  # the newline is no part of the secret
    path.chmod(mode)
    return path


def github(body: bytes, secret: str = SECRET) -> dict[str, str]:
    sig = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Hub-Signature-256": f"sha256={sig}", "X-GitHub-Event": "push"}


def revision_is(rc: Any, name: str, sha: str) -> bool:
    rec = rc.record(name)
    return bool(rec and rec.get("revision") == sha and rec.get("phase") == "Ready")


def test_a_signed_hook_applies_a_push_at_once_while_the_interval_is_an_hour(
    reconcile: Any, remote: Remote, gateway: Any
) -> None:
    first = remote.deploy("alpha")
    node_yaml(reconcile, remote, secret_file(reconcile))
    g = gateway("--interval", "1h", "--git", remote.url)
    reconcile.wait_for(lambda: revision_is(reconcile, "alpha", first), 30, "first commit Ready")
    second = remote.deploy("alpha", command=reconcile.demo_command(load_seconds="0.1"))
    body = json.dumps({"ref": "refs/heads/main", "after": second}).encode()

    assert g.request("POST", "/hooks/git", body).status == 401  # unsigned
    assert g.request("POST", "/hooks/git", body, github(body, "wrong")).status == 401
    assert g.request("POST", "/hooks/git", body, {"X-Gitlab-Token": "wrong"}).status == 401
    assert not revision_is(reconcile, "alpha", second)

    answer = g.request("POST", "/hooks/git", body, github(body))
    assert answer.status == 202, answer
    reconcile.wait_for(lambda: revision_is(reconcile, "alpha", second), 30, "the pushed commit")
    seen = source(reconcile)
    assert seen["applied"] == second and seen["state"] == "Synced", seen
    events = reconcile.events("alpha")
    assert any(e.get("revision") == second and e["action"] == "start" for e in events), events

    third = remote.commit({"README": "gitlab\n"}, "a commit GitLab tells of")
    answer = g.request("POST", "/hooks/git", b"{}", {"X-Gitlab-Token": SECRET})
    assert answer.status == 202, answer
    reconcile.wait_for(lambda: source(reconcile)["applied"] == third, 30, "the GitLab push")
    finish(reconcile, g, remote)


def test_a_secret_file_others_can_read_is_refused(
    reconcile: Any, remote: Remote, gateway: Any
) -> None:
    remote.deploy("alpha")
    node_yaml(reconcile, remote, secret_file(reconcile, 0o644))
    g = gateway("--interval", "1h", "--git", remote.url)
    known = reconcile.state / "git" / "source.json"  # the first pass names the secret file
    reconcile.wait_for(known.exists, 30, "the source remembered")
    body = b"{}"
    assert g.request("POST", "/hooks/git", body, github(body)).status == 401
    assert "chmod 600" in g.text()
    assert not (reconcile.state / "git" / "fetch-now").exists()
    finish(reconcile, g, remote)


def finish(rc: Any, g: Any, remote: Remote) -> None:
    assert g.stop() == 0, g.text()[-3000:]
    rc("--git", remote.url, "--git-path", "manifests", "down", "--gateway", check=0)
