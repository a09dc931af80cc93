"""A sopsFile in a followed repository (DESIGN.md "Secrets", "Following git"): the real
``sops`` and an ``age-keygen`` key, a bare repository over file:// as the remote."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from envfrom.agekey import make_key

from tests.git.conftest import Remote, run_git, source
from tests.git.test_git_notify import told
from tests.hookreceiver import Receiver


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


def test_a_degraded_source_whose_fix_is_on_the_node_says_so_not_push(
    reconcile: Any, remote: Remote, tmp_path: Path
) -> None:
    """The source's Degraded message told every error's reader to "fix it and push",
    though an envFrom file others can read wants `chmod 600` on the node and a sopsFile
    the node's age key file is missing for wants that key on the node: no push fixes
    either. Those say to fix it on this node; an error in the repository still says push."""
    git = ("--git", remote.url, "--git-path", "manifests")

    def degraded(*words: str) -> str:
        reconcile("--once", *git, check=1)
        said: dict[str, Any] = reconcile("source", "-o", "json", check=0).json()
        assert said["state"] == "Degraded", said
        assert all(w in said["message"] for w in words), said
        return str(said["message"])

    on_node = "fix it on this node, as it says (nothing to push"
    env = tmp_path / "node" / "web.env"
    env.parent.mkdir()
    env.write_text("API_KEY=on-the-node\n")
    env.chmod(0o644)
    web = reconcile.deployment("web", basePort=reconcile.port, envFrom=[{"file": str(env)}])
    remote.commit({"manifests/web.yaml": reconcile.dump_yaml(web)}, "web, its key on the node")
    said = degraded(f"`chmod 600 {env}`", on_node)
    assert "and push" not in said, said

    key = make_key(tmp_path / "keys")
    key.encrypt("API_KEY=in-the-repo\n", remote.work / "manifests" / "secrets" / "web.env")
    reconcile.env["SOPS_AGE_KEY_FILE"] = str(tmp_path / "keys" / "lost.agekey")
    web = reconcile.deployment(
        "web", basePort=reconcile.port, envFrom=[{"sopsFile": "secrets/web.env"}]
    )
    run_git(remote.work, "add", "-A")
    remote.commit({"manifests/web.yaml": reconcile.dump_yaml(web)}, "web, its key encrypted")
    said = degraded("lost.agekey does not exist on this node", on_node)
    assert "and push" not in said, said

    run_git(remote.work, "rm", "-q", "manifests/secrets/web.env")
    remote.commit({}, "the encrypted file left out")  # the repository's to fix: push
    degraded("sopsFile secrets/web.env does not exist beside the manifest", "fix it and push")
    reconcile(*git, "down", check=0)


@pytest.fixture
def hook(reconcile: Any) -> Iterator[Receiver]:
    receiver = Receiver(reconcile.port + 15).start()
    yield receiver
    receiver.stop()


def test_a_cron_run_without_the_daemon_s_age_key_notifies_no_degraded(
    reconcile: Any, remote: Remote, tmp_path: Path, git_daemon: Any, hook: Receiver
) -> None:
    """The daemon has SOPS_AGE_KEY_FILE (its unit's Environment=); a cron `--once` beside
    it, whose crontab lacks it, noted its failure to decrypt in the source's state: the
    node notified Degraded, then Synced at the daemon's next pass, at every cron run. The
    run says why it failed (exit 1); the source's state stays the daemon's."""
    key = make_key(tmp_path / "keys")
    key.encrypt("API_KEY=cron-never-sees-it\n", remote.work / "manifests" / "secrets" / "w.env")
    web = reconcile.deployment(
        "web", basePort=reconcile.port, envFrom=[{"sopsFile": "secrets/w.env"}]
    )
    run_git(remote.work, "add", "-A")
    applied = remote.commit({"manifests/web.yaml": reconcile.dump_yaml(web)}, "web, keyed")
    reconcile.state.mkdir(parents=True, exist_ok=True)
    (reconcile.state / "node.yaml").write_text(
        f"notify:\n  - url: http://127.0.0.1:{hook.port}/reconcile\n"
        "    events: [Synced, Degraded]\n"
    )
    git = ("--git", remote.url, "--git-path", "manifests")
    d = git_daemon(*git, "--interval", "1h", env={"SOPS_AGE_KEY_FILE": str(key.file)})
    d.wait(lambda: told(hook, "Synced"), "the daemon's Synced posted")

    reconcile.env.pop("SOPS_AGE_KEY_FILE", None)  # cron's environment
    out = reconcile("--once", *git, check=1)  # it posts what its pass queued before exit
    assert "no age key of this node opens it: set SOPS_AGE_KEY_FILE" in out.err, out
    assert "cron-never-sees-it" not in out.out + out.err, out
    seen = source(reconcile)
    assert seen["state"] == "Synced" and seen["applied"] == applied, seen
    assert told(hook, "Degraded") == [] and len(told(hook, "Synced")) == 1, hook.accepted
    assert d.stop() == 0
    reconcile(*git, "down", check=0)


def test_a_rollback_dry_run_without_the_age_key_plans_a_sops_file_deployment(
    reconcile: Any, remote: Remote, tmp_path: Path
) -> None:
    """`rollback --dry-run` shares `plan`'s preview: without the node's age key (a shell
    without the unit's environment) its sopsFile deployment was spec invalid (exit 1). It
    plans it as if its values were unchanged, naming the file once, and reads nothing."""
    rc, git = reconcile, ("--git", remote.url, "--git-path", "manifests")
    key = make_key(tmp_path / "keys")
    rc.env["SOPS_AGE_KEY_FILE"] = str(key.file)
    rc.env["XDG_CONFIG_HOME"] = str(tmp_path / "config")  # no keys.txt of the box's user
    key.encrypt("API_KEY=never-shown\n", remote.work / "manifests" / "secrets" / "api.env")
    item = {"sopsFile": "secrets/api.env"}
    good = remote.deploy("web", envFrom=[item])
    rc.converge(*git)
    remote.deploy("web", envFrom=[item], env={"MODE": "two"})
    rc.converge(*git)

    del rc.env["SOPS_AGE_KEY_FILE"]
    dry = rc("rollback", good, "--dry-run", check=0)
    assert dry.out.count("sopsFile secrets/api.env") == 1, dry
    assert "(web): its values were not read here (SOPS_AGE_KEY_FILE is unset)" in dry.out
    changed = [line for line in dry.out.splitlines() if " web " in line]
    assert changed and "spec.env.MODE changed" in changed[0] and "envFrom" not in changed[0], dry
    assert "never-shown" not in dry.out + dry.err and "error:" not in dry.out, dry
    rc.env["SOPS_AGE_KEY_FILE"] = str(key.file)
    rc(*git, "down", check=0)


def test_an_empty_or_folder_age_key_variable_is_said_as_such_and_plan_notes_it(
    reconcile: Any, remote: Remote, tmp_path: Path
) -> None:
    """SOPS_AGE_KEY_FILE set to nothing (a unit's `Environment=SOPS_AGE_KEY_FILE=`, a CI
    job's secret a fork's pull request is not given) was "the age key file
    SOPS_AGE_KEY_FILE= does not exist on this node", and `plan` exited 1 on it where an
    unset variable gives a note and exit 0; a folder there was "does not exist" too. An
    empty one is no key, said so; a folder is named a folder; the engine runs on."""
    rc, git = reconcile, ("--git", remote.url, "--git-path", "manifests")
    key = make_key(tmp_path / "keys")
    rc.env["SOPS_AGE_KEY_FILE"] = str(key.file)
    rc.env["XDG_CONFIG_HOME"] = str(tmp_path / "config")  # no keys.txt of the box's user
    key.encrypt("API_KEY=never-shown\n", remote.work / "manifests" / "secrets" / "api.env")
    remote.deploy("web", envFrom=[{"sopsFile": "secrets/api.env"}])
    rc.converge(*git)
    before = rc.record("web")

    rc.env["SOPS_AGE_KEY_FILE"] = ""
    plan = rc("plan", *git, check=0)
    assert "(web): its values were not read here (SOPS_AGE_KEY_FILE is empty)" in plan.out, plan
    assert "does not exist" not in plan.out + plan.err and "In sync" in plan.out, plan
    once = rc("--once", *git, check=1)
    assert "no age key of this node opens it (SOPS_AGE_KEY_FILE is empty" in once.err, once
    assert "does not exist" not in once.err, once
    folder = tmp_path / "keys"
    rc.env["SOPS_AGE_KEY_FILE"] = str(folder)
    once = rc("--once", *git, check=1)
    assert f"SOPS_AGE_KEY_FILE={folder} is a folder: point" in once.err, once
    web = rc.record("web")
    assert web["ref"] == before["ref"] and rc.alive(before["ref"]["pid"]), web
    shown = plan.out + plan.err + once.out + once.err
    assert "never-shown" not in shown, shown
    rc.env["SOPS_AGE_KEY_FILE"] = str(key.file)
    rc(*git, "down", check=0)
