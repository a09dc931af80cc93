"""The CLI as a user runs it from a clone: `python -m controller`, no RECONCILE_* env."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run one command; bad input must never reach the user as a traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILE_")}
    done = subprocess.run(
        [sys.executable, "-m", "controller", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPO,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done
