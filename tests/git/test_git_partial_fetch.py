"""A fetch cut short mid-transfer (its limit over a link that stalls, a stop, a SIGKILL)
left git's partial pack (``objects/pack/tmp_pack_*``) in the node's checkout: git's gc
removes such files after two weeks, but the node's git runs none (``gc.auto=0``), so
every retry of a stalling fetch added another, up to the repository's size each, until
the disk the records live on was full.

The remote is a real repository reached through a fake ``ssh`` (``GIT_SSH_COMMAND``, as
tests/git/test_git_hung_remote.py does) that passes on the first bytes of
``git-upload-pack``'s answer and then goes silent while the test's ``stall`` file exists.
"""

from __future__ import annotations

import os
from typing import Any

from tests.git.conftest import Remote, source

GIT = ("--git-path", "manifests")
PASSED = 300_000  # bytes of the answer that arrive before the link stalls


def test_a_fetch_stopped_mid_transfer_leaves_no_partial_pack(
    reconcile: Any, remote: Remote
) -> None:
    # Over 100 objects (fetch.unpackLimit): git streams them into a tmp_pack as they come.
    blobs: dict[str, str | None] = {f"data/{i}.txt": os.urandom(3000).hex() for i in range(150)}
    remote.commit(blobs, "data beside the manifests")
    applied = remote.deploy("alpha")
    stall = reconcile.tmp / "stall"
    ssh = reconcile.tmp / "stalling-ssh"
    ssh.write_text(
        "#!/bin/sh\n"
        f'[ -e "{stall}" ] || exec sh -c "$2"\n'
        # dd writes each block as it comes (head -c holds a pipe's bytes in its buffer)
        f'sh -c "$2" | {{ dd bs=512 count={PASSED // 512} 2>/dev/null; exec sleep 600; }}\n'
    )
    ssh.chmod(0o755)
    reconcile.env.update({"GIT_SSH_COMMAND": str(ssh), "GIT_SSH_VARIANT": "simple"})
    url = f"ssh://node{remote.bare}"
    objects = reconcile.state / "git" / "checkout" / ".git" / "objects"

    stall.touch()
    for _ in range(2):  # each retry added one more
        out = reconcile("--once", "--git", url, *GIT, "--git-timeout", "5s", check=1)
        assert "git fetch took more than 5s (stopped)" in out.err, out
        left = sorted(p.name for p in objects.rglob("tmp_*"))
        assert left == [], left
    assert source(reconcile)["state"] == "PullFailed"

    stall.unlink()  # the link is whole again: the fetch completes, alpha runs
    reconcile.converge("--git", url, *GIT)
    assert source(reconcile)["applied"] == applied and reconcile.record("alpha") is not None
    assert sorted(p.name for p in objects.rglob("tmp_*")) == []
    reconcile("--git", url, *GIT, "down", check=0)
