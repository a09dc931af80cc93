"""The exec gate (controller/backends/local/execgate.py) on real processes: what it is told
reaches the exec whole, what no exec can take is refused before anything runs, and the
gate's own start imports nothing but what it runs (it is one interpreter start in every
engine's spawn)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.backends.local import execgate

# Each argument and the variable V, each ended by a `|` (an empty one is seen).
SHOW = 'for a in "$@"; do printf "%s|" "$a"; done; printf "V=%s|" "$V"'


def _spawned(tmp_path: Path, argv: list[str], env: dict[str, str]) -> str:
    log = tmp_path / "log"
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    noted: list[int] = []
    try:
        child = execgate.spawn(
            argv, env, before_exec=noted.append, gate_env=dict(os.environ), log_fd=fd, preexec=None
        )
    finally:
        os.close(fd)
    assert child.wait(timeout=30) == 0
    assert noted == [child.pid]  # the note named the pid the engine ran as
    return log.read_text()


def test_the_argv_and_environment_reach_the_exec_whole(tmp_path: Path) -> None:
    """An empty argument, one with spaces or `=`, a value with `=`, a name looked up on
    PATH: as given, in order."""
    argv = ["sh", "-c", SHOW, "sh", "", "a b", "x=y", "é"]
    env = {"PATH": os.environ["PATH"], "V": "p=q=r"}
    assert _spawned(tmp_path, argv, env) == "|a b|x=y|é|V=p=q=r|"


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["sh", "-c", "true", "a\0b"], {}),
        (["sh", "-c", "true"], {"V": "a\0b"}),
        (["sh", "-c", "true"], {"A=B": "c"}),
    ],
)
def test_what_no_exec_can_take_is_refused_before_anything_runs(
    tmp_path: Path, argv: list[str], env: dict[str, str]
) -> None:
    noted: list[int] = []
    with pytest.raises(OSError) as refused:
        execgate.spawn(argv, env, before_exec=noted.append, gate_env={}, log_fd=2, preexec=None)
    assert refused.value.errno == errno.EINVAL, refused.value
    assert noted == []  # no gate was started


def test_the_gate_imports_only_what_it_runs(tmp_path: Path) -> None:
    """json, subprocess, contextlib and typing were half of the gate's CPU, paid at every
    engine's spawn (benchmarks/RESULTS.md, 2026-12-07)."""
    go, told = os.pipe()
    os.close(told)  # told nothing: the gate reads end-of-file and exits
    status_read, status = os.pipe()
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-I",
                "-S",
                "-X",
                "importtime",
                execgate.__file__,
                str(go),
                str(status),
            ],
            pass_fds=(go, status),
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        for fd in (go, status_read, status):
            os.close(fd)
    assert out.returncode == execgate.NOT_TOLD, out.stderr
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert "os" in imported, out.stderr  # the premise: -X importtime lists its imports
    heavy = {"json", "subprocess", "contextlib", "typing", "re", "collections", "selectors"}
    assert not imported & heavy, sorted(imported & heavy)
