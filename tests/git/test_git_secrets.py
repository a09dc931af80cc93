"""A sopsFile in a followed repository (DESIGN.md "Secrets", "Following git"): the real
``sops`` and an ``age-keygen`` key, a bare repository over file:// as the remote."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from envfrom.agekey import make_key

from tests.git.conftest import Remote, run_git


def test_a_sops_file_symlink_may_stay_in_the_folder_but_never_leave_it(
    reconcile: Any, remote: Remote, tmp_path: Path
) -> None:
    """`..` was refused, yet a symlink in the repository to a file outside the checkout was
    followed: the node decrypted a file the repository does not hold. A link that stays in
    the manifest's folder is followed; one that leaves it is refused as `..` is, the
    running engine left as it was."""
    key = make_key(tmp_path / "keys")
    reconcile.env["SOPS_AGE_KEY_FILE"] = str(key.file)
    secrets = remote.work / "manifests" / "secrets"
    key.encrypt("API_KEY=inside\n", secrets / "v2.env")
    os.symlink("v2.env", secrets / "current.env")
    text = reconcile.dump_yaml(
        reconcile.deployment(
            "web", basePort=reconcile.port, envFrom=[{"sopsFile": "secrets/current.env"}]
        )
    )
    remote.commit({"manifests/web.yaml": text}, "web, its key through a link inside")
    reconcile.converge("--git", remote.url, "--git-path", "manifests")
    before = reconcile.record("web")
    assert before["phase"] == "Ready", before

    outside = key.encrypt("API_KEY=outside\n", tmp_path / "elsewhere" / "api.env")
    (secrets / "current.env").unlink()
    os.symlink(outside, secrets / "current.env")
    run_git(remote.work, "add", "-A")
    remote.commit({}, "the link now leaves the repository")
    out = reconcile("--once", "--git", remote.url, "--git-path", "manifests", check=1)
    refused = "sopsFile secrets/current.env leaves the manifests folder"
    assert "manifests/web.yaml:" in out.err and refused in out.err, out
    web = reconcile.record("web")
    assert refused in web["message"] and web["ref"] == before["ref"], web
    assert reconcile.alive(before["ref"]["pid"]) and web["spec_hash"] == before["spec_hash"]
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)
