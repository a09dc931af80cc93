"""The CLI as a user runs it from a clone: `python -m controller`, no RECONCILE_* env."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import warmcli

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run one command; bad input must never reach the user as a traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILE_")}
    # forked warm where it can be, as the fixture's calls (tests/warmcli.py)
    done = warmcli.run_or_cold(
        [sys.executable, "-m", "controller", *args], env=env, cwd=REPO, timeout=60
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done
