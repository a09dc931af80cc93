"""verify.allowedSigners: commits signed with ssh keys made by ssh-keygen; an unsigned
commit, or one signed by a key not listed, is Unverified and never applied."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tests.git.conftest import Remote, run_git, source

GIT = ("--git-path", "manifests")


def keypair(folder: Path, name: str) -> Path:
    key = folder / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)],
        check=True,
        timeout=60,
    )
    return key


def signed_commit(remote: Remote, key: Path | None, files: dict[str, str], message: str) -> str:
    """A commit signed with ``key`` (None: unsigned), pushed."""
    for rel, text in files.items():
        (remote.work / rel).parent.mkdir(parents=True, exist_ok=True)
        (remote.work / rel).write_text(text)
    run_git(remote.work, "add", "-A")
    sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key}.pub"] if key else []
    run_git(remote.work, *sign, "commit", "-q", *(["-S"] if key else []), "-m", message)
    run_git(remote.work, "push", "-q", "--force", "origin", "HEAD:main")
    return run_git(remote.work, "rev-parse", "HEAD")


def test_only_commits_signed_by_an_allowed_key_are_applied(
    reconcile: Any, remote: Remote, tmp_path: Path
) -> None:
    trusted, stranger = keypair(tmp_path, "trusted"), keypair(tmp_path, "stranger")
    signers = tmp_path / "allowed_signers"
    signers.write_text(f"tess@example.com {(trusted.with_suffix('.pub')).read_text()}")
    reconcile.state.mkdir(parents=True, exist_ok=True)
    (reconcile.state / "node.yaml").write_text(
        f"git:\n  url: {remote.url}\n  path: manifests\n  verify: {{allowedSigners: {signers}}}\n"
    )
    manifest = reconcile.dump_yaml(reconcile.deployment("alpha", basePort=reconcile.port))
    good = signed_commit(remote, trusted, {"manifests/alpha.yaml": manifest}, "signed")
    reconcile.converge("--git", remote.url)
    assert reconcile.record("alpha")["revision"] == good

    # Why, in words: git's own for a stranger's key, and for no signature (where
    # verify-commit says nothing) that there is none, not "git -c exited 1".
    for key, name, why in (
        (None, "unsigned", "it carries no signature"),
        (stranger, "signed by a stranger", "No principal matched."),
    ):
        bad = signed_commit(remote, key, {"README": f"{name}\n"}, name)
        out = reconcile("--once", "--git", remote.url, check=1)
        said = f"commit {bad[:12]} is not signed by a key in {signers}: "
        assert said in out.err and why in out.err and "exited" not in out.err, out
        seen = source(reconcile)
        assert seen["state"] == "Unverified" and seen["fetched"] == bad, seen
        assert seen["applied"] == good and bad[:12] in seen["message"], seen
        assert reconcile.record("alpha")["revision"] == good  # never applied

    # A signers file gone: said as such ("not signed by a key in it: it carries no
    # signature" was untrue of a signed commit, and named no way on)
    signers.rename(tmp_path / "moved_away")
    signed = signed_commit(remote, trusted, {"README": "signed, no signers\n"}, "signed")
    out = reconcile("--once", "--git", remote.url, check=1)
    said = f"commit {signed[:12]} cannot be verified: the allowed signers file {signers}"
    assert said in out.err and "git.verify.allowedSigners" in out.err, out
    assert source(reconcile)["state"] == "Unverified"
    assert reconcile.record("alpha")["revision"] == good  # never applied
    (tmp_path / "moved_away").rename(signers)

    fixed = signed_commit(remote, trusted, {"README": "signed again\n"}, "signed again")
    reconcile.converge("--git", remote.url)
    assert source(reconcile)["state"] == "Synced" and reconcile.record("alpha")["revision"] == fixed
    reconcile("--git", remote.url, "down", check=0)
