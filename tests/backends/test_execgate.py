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


def test_a_program_the_exec_would_not_find_or_run_is_said_before_any_start(
    tmp_path: Path,
) -> None:
    """`plan`'s check: the program looked for as the gate's execvpe will, on the PATH the
    engine is given, with the words its exec would fail with (real files, no exec)."""
    found, empty = tmp_path / "found", tmp_path / "empty"
    found.mkdir()
    empty.mkdir()
    program = found / "engine"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    assert execgate.unrunnable("engine", {"PATH": f"{empty}:{found}"}) is None
    nowhere = execgate.unrunnable("engine", {"PATH": str(empty)})
    assert nowhere == os.strerror(errno.ENOENT)
    assert execgate.unrunnable(str(program), {"PATH": str(empty)}) is None  # a path: as is
    program.chmod(0o644)
    denied = os.strerror(errno.EACCES)  # root too: exec needs an x bit, and none is set
    assert execgate.unrunnable(str(program), {}) == denied
    assert execgate.unrunnable("engine", {"PATH": str(found)}) == denied
    # Another working directory's: not judged from here.
    assert execgate.unrunnable("./engine", {}) is None
    assert execgate.unrunnable("engine", {"PATH": f"bin:{empty}"}) is None


def test_an_exec_that_fails_is_told_from_a_spawn_refused(tmp_path: Path) -> None:
    """The exec's own failure is ExecRefused (the launcher records it as such); what no
    exec can take is refused before any gate runs, as a plain OSError."""
    with pytest.raises(execgate.ExecRefused) as refused:
        _spawned(tmp_path, [str(tmp_path / "no-such-engine")], {})
    assert refused.value.errno == errno.ENOENT
    with pytest.raises(OSError) as wired:
        _spawned(tmp_path, ["sh", "a\0b"], {})
    assert not isinstance(wired.value, execgate.ExecRefused)
