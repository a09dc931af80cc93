"""An engine whose program could not be exec'd (a typo in `spec.command`, a recipe's binary
not installed, a file not executable): `plan` said "create" (exit 2), `--once` backed it off
and exited 0, and the next `plan` said "In sync", so a cron user saw success for an engine
that never ran. Now `plan` says before any start that the program is not where the engine's
start looks, `--once` and `plan` exit 1 while its last start could not exec, `--wait` ends
saying so, and once the program is there the next start runs it and `--once` exits 0.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

from controller.core.state import VERSION

PROGRAM = "execfail-engine"
FIELD = "spec.command[0]"  # the field that names the program, the next move's


def _install(path: Path, rc: Any) -> None:
    """A program that runs the demo engine, made executable: what an operator installs."""
    argv = " ".join(f"'{a}'" for a in rc.demo_command()[:3])
    path.write_text(f'#!/bin/sh\nexec {argv} --port "$1" --model "$2"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _searched(rc: Any, bindir: Path) -> None:
    """Every CLI call of ``rc`` looks for programs in ``bindir`` first (empty until
    installed): the engine's PATH is reconcile's own."""
    bindir.mkdir()
    rc.env["PATH"] = f"{bindir}{os.pathsep}{os.environ['PATH']}"


def _node_used(rc: Any) -> None:
    """A pass on this state dir (of an empty set, starting nothing): `plan` then judges a
    program by its own PATH, as a `--once` from here would exec it. On a state dir no pass
    used (a CI runner's) it does not: the runner's programs are not the node's."""
    empty = rc.tmp / "empty"
    empty.mkdir()
    rc("--once", "-f", str(empty), "--allow-empty", check=0)


def test_a_program_not_on_path_fails_plan_and_once_until_it_is_installed(reconcile: Any) -> None:
    rc = reconcile
    bindir = rc.tmp / "bin"
    _searched(rc, bindir)
    rc.write("typo", command=[PROGRAM, "{port}", "{name}"])
    ci = rc("plan", check=2)  # a fresh state dir: a CI plan, not judged by this PATH
    assert "a start would fail" not in ci.out and "+ typo" in ci.out, ci
    _node_used(rc)
    said = f"cannot exec '{PROGRAM}': No such file or directory: install it or correct {FIELD}"
    where = f"searched reconcile's own PATH (spec.env's PATH sets another): {bindir}{os.pathsep}"
    before = rc("plan", check=1)  # before any start: --once would exit 1
    assert f"typo: a start would fail: {said}" in before.out and where in before.out, before
    assert rc.record("typo") is None  # plan starts nothing

    once = rc.once(check=1)
    assert f"error: typo did not start: {said}" in once.err and where in once.err, once
    record = rc.record("typo")
    assert record is not None and record["phase"] == "BackOff", record
    # The previous release reads it: a version-3 record, its last exit's reason a string.
    assert record["version"] == VERSION and record["last_exit"]["reason"] == "CannotExec"
    again = rc("plan", check=1)  # not "In sync": the back-off's retry fails the same way
    assert "In sync" not in again.out and f"typo did not start: {said}" in again.out, again
    assert rc.once(check=1).code == 1  # and --once again, while it backs off

    _install(bindir / PROGRAM, rc)
    rc.end_backoff("typo")
    rc.once(check=0)  # the retry execs it
    started = rc.status("typo")["typo"]
    assert started["phase"] in ("Starting", "Ready") and started["last_exit"] is None, started
    rc.down()


def test_a_file_not_executable_fails_plan_and_once_until_it_is_made_so(reconcile: Any) -> None:
    rc = reconcile
    engine = rc.tmp / "engine.sh"
    _install(engine, rc)
    engine.chmod(0o644)
    rc.write("noexec", command=[str(engine), "{port}", "{name}"])
    _node_used(rc)
    said = f"cannot exec '{engine}': Permission denied: install it or correct {FIELD}"
    before = rc("plan", check=1)
    assert f"noexec: a start would fail: {said}" in before.out, before
    assert "searched" not in before.out  # a path: exec'd as is, no PATH searched
    once = rc.once(check=1)
    assert f"error: noexec did not start: {said}" in once.err, once
    assert "In sync" not in rc("plan", check=1).out

    engine.chmod(0o755)
    rc.end_backoff("noexec")
    rc.once(check=0)
    assert rc.status("noexec")["noexec"]["phase"] in ("Starting", "Ready")
    rc.down()


def test_a_wait_ends_on_a_program_not_found_once_the_rest_is_ready(reconcile: Any) -> None:
    """`--once --wait` waited out its whole --timeout on an engine that never ran (its
    retries fail the same way): it ends once the rest is Ready, saying why."""
    rc = reconcile
    bindir = rc.tmp / "bin"
    _searched(rc, bindir)
    rc.write("web", basePort=rc.port)
    rc.write("typo", basePort=rc.port + 1, command=[PROGRAM, "{port}", "{name}"])
    started = time.monotonic()
    result = rc("--once", "--wait", "--timeout", "5m", check=1, timeout=400)
    assert time.monotonic() - started < 240, result  # not the 5m timeout (generous: load)
    assert "timed out" not in result.err, result
    said = f"cannot progress without you: typo did not start: cannot exec '{PROGRAM}'"
    assert said in result.err, result
    assert rc.status("web")["web"]["phase"] == "Ready"
    rc.down()


def test_plan_judges_a_program_by_the_daemons_path_only_where_it_is_its_own(
    reconcile: Any,
) -> None:
    """Beside a running daemon the engines get the daemon's PATH, not the plan's shell's:
    `plan` says a program would not be found only where the two are the same (read from
    the daemon's /proc environment), and never guesses otherwise."""
    from controller.store.side.daemonset import daemon_pid

    rc = reconcile
    bindir = rc.tmp / "bin"
    _searched(rc, bindir)
    empty = rc.tmp / "empty"
    empty.mkdir()
    # A cold start (exec'd, as systemd starts it), so its /proc environment is its own.
    daemon = rc.spawn(rc.argv("-f", str(empty), "--allow-empty", "--resync", "1h"))
    rc.wait_for(lambda: daemon_pid(rc.state), timeout=120, what="the daemon's lock")
    rc.write("typo", command=[PROGRAM, "{port}", "{name}"])
    same = rc("plan", check=1)  # the daemon's PATH is this plan's: judged
    assert f"typo: a start would fail: cannot exec '{PROGRAM}'" in same.out, same
    other = {"PATH": f"{rc.tmp}{os.pathsep}{os.environ['PATH']}"}
    guessed = rc("plan", check=2, env=other)  # another PATH than the daemon's: not judged
    assert "a start would fail" not in guessed.out and "+ typo" in guessed.out, guessed
    daemon.terminate()
    assert daemon.wait(timeout=120) == 0
    assert rc.record("typo") is None  # the daemon followed another folder: nothing started
