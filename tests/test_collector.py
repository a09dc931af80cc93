"""The collector policy: off while a command starts, back on for whatever runs long."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SLEEPER = """\
apiVersion: reconcile/v1
kind: Deployment
metadata: {name: nap}
spec: {engine: command, command: [sleep, "60"]}
"""
# The console script's entry() runs the command; once it has exited, what the collector does.
PROBE = (
    "import atexit, gc, sys; "
    "atexit.register(lambda: print(gc.isenabled(), gc.get_freeze_count() > 0)); "
    "sys.argv[0] = 'reconcile'; from controller.cli.main import entry; entry()"
)


def _common(tmp_path: Path) -> list[str]:
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "m" / "nap.yaml").write_text(SLEEPER)
    return ["-q", "-f", f"{tmp_path}/m", "--state-dir", f"{tmp_path}/s", "--node", "gc"]


@pytest.mark.parametrize(
    ("verb", "after"),
    [(["--once"], "False True"), (["--once", "--wait", "--timeout", "30s"], "True True")],
    ids=["one-shot: off to the end, frozen at exit", "--wait: back on, start-up frozen"],
)
def test_the_collector_comes_back_for_what_runs_long(
    tmp_path: Path, verb: list[str], after: str
) -> None:
    common = _common(tmp_path)
    try:
        out = subprocess.run(
            [sys.executable, "-c", PROBE, *verb, *common],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == after.split()
    finally:
        subprocess.run([sys.executable, "-m", "controller", "down", *common], timeout=60)


def test_the_command_line_entry_exits_with_the_command_s_code(tmp_path: Path) -> None:
    """`python -m controller` goes through entry(): its exit code is the command's."""
    (tmp_path / "bad.yaml").write_text("apiVersion: [\n")
    out = subprocess.run(
        [sys.executable, "-m", "controller", "validate", "-f", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1 and "bad.yaml:2" in out.stderr, out.stderr
