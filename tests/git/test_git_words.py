"""What a remote writes reaches no terminal as itself. A fetch that fails is told in git's
own words, and part of them are the remote's (``remote: ...`` lines, an ssh helper's
stderr): a partial clone that cannot reach its promisor ended its error with a NUL, so
``grep`` called `reconcile source`'s output binary, and a hostile server's ``ESC [2J``
cleared the operator's screen from `status`'s source line; a commit's subject did the
same from `history`. They are shown escaped (``\\x1b[2J``, ``\\x00``), as an engine's are
(tests/ux/test_ux_control_chars.py).

The remote is a real repository behind a fake ``ssh`` (``GIT_SSH_COMMAND``, as
tests/git/test_git_hung_remote.py has it) that, while the test's ``noisy`` file exists,
writes control characters on its stderr and fails.
"""

from __future__ import annotations

import json
from typing import Any

from tests.git.conftest import Remote, source

GIT = ("--git-path", "manifests")
RAW = ("\x1b", "\x00", "\u202e")
SHOWN = "\\x1b[2Jwiped\\x00 \\u202eevil"


def test_a_remote_s_control_characters_are_shown_escaped(reconcile: Any, remote: Remote) -> None:
    remote.deploy("alpha", message="deploy alpha \x1b[2Jwiped \u202eevil")
    noisy = reconcile.tmp / "noisy"
    ssh = reconcile.tmp / "noisy-ssh"
    ssh.write_text(
        "#!/bin/sh\n"
        f'[ -e "{noisy}" ] || exec sh -c "$2"\n'
        "printf 'remote: \\033[2Jwiped\\000 \\342\\200\\256evil\\n' >&2\n"
        "exit 128\n"
    )
    ssh.chmod(0o755)
    reconcile.env.update({"GIT_SSH_COMMAND": str(ssh), "GIT_SSH_VARIANT": "simple"})
    url = f"ssh://node{remote.bare}"
    reconcile.converge("--git", url, *GIT)

    noisy.touch()
    views = {"--once": reconcile("--once", "--git", url, *GIT, check=1)}
    for verb in (("source",), ("status",), ("plan",), ("history",)):
        views[" ".join(verb)] = reconcile(*verb, check=None)
    for view, result in views.items():
        for text in (result.out, result.err):
            assert not [c for c in RAW if c in text], (view, text)
    assert SHOWN in views["source"].out, views["source"]
    assert SHOWN in views["--once"].err, views["--once"]
    assert "deploy alpha \\x1b[2Jwiped \\u202eevil" in views["history"].out, views["history"]
    said = source(reconcile)
    assert said["state"] == "PullFailed" and SHOWN in said["message"], said
    stored = json.loads((reconcile.state / "git" / "source.json").read_text())
    assert not [c for c in RAW if c in json.dumps(stored, ensure_ascii=False)], stored

    noisy.unlink()
    reconcile("--git", url, *GIT, "down", check=0)


def test_a_file_name_s_control_characters_are_shown_escaped(reconcile: Any, remote: Remote) -> None:
    """A file's name is whatever a push made it: one holding a terminal's escapes (a
    title set by OSC, a colour, a cleared screen) reached the operator's terminal as itself
    from `--once`, `status` (its source and `not loaded:` lines), `validate` and `plan`,
    wherever a manifest that did not load (or a record's source) was named."""
    remote.deploy("alpha")
    reconcile.converge("--git", remote.url, *GIT)
    evil = "manifests/evil\x1b]0;pwned\x07\x1b[2J\u202e.yaml"
    shown = "manifests/evil\\x1b]0;pwned\\x07\\x1b[2J\\u202e.yaml:2: invalid YAML"
    remote.commit({evil: "apiVersion: [\n"}, "a file named with escapes")
    views = {"--once": reconcile("--once", "--git", remote.url, *GIT, check=1)}
    for verb in (("status", "-o", "wide"), ("plan",), ("validate", "--git", remote.url, *GIT)):
        views[" ".join(verb)] = reconcile(*verb, check=None)
    for view, result in views.items():
        for text in (result.out, result.err):
            assert not [c for c in RAW if c in text], (view, text)
    assert shown in views["--once"].err, views["--once"]
    assert shown in views["status -o wide"].out + views["status -o wide"].err, views
    assert shown in source(reconcile)["message"]
    reconcile("--git", remote.url, *GIT, "down", check=0)
