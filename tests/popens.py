"""Which test left a child process unreaped.

A ``subprocess.Popen`` dropped while its child still runs prints, at some later garbage
collection, ``ResourceWarning: subprocess N is still running``: far from the test that
started it (fresh-clone runs printed it at a worker's exit). tests/conftest.py installs
:func:`track`: each Popen remembers the test that made it, and one still running when it
is dropped, or when the worker's session ends, is named with its command line.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from typing import Any

_ATTR = "_reconcile_test"


def _test_now() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "(outside a test)")


def _say(popen: subprocess.Popen[Any], when: str) -> None:
    made_by = getattr(popen, _ATTR, "(unknown)")
    print(
        f"\nUNREAPED {when}: pid {popen.pid} {popen.args!r} started by {made_by}",
        file=sys.__stderr__,
    )


def track() -> None:
    """Tag every Popen with the test that made it; name the ones dropped while running."""
    original_init = subprocess.Popen.__init__
    original_del = subprocess.Popen.__del__

    def __init__(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        setattr(self, _ATTR, _test_now())
        original_init(self, *args, **kwargs)

    def __del__(self: subprocess.Popen[Any]) -> None:
        if getattr(self, "_child_created", False) and self.poll() is None:
            _say(self, f"when dropped (during {_test_now()})")
        original_del(self)

    subprocess.Popen.__init__ = __init__  # type: ignore[method-assign]
    subprocess.Popen.__del__ = __del__  # type: ignore[method-assign]


def report_running() -> list[str]:
    """Name every Popen object still alive with a running child (at a session's end)."""
    running = [
        obj for obj in gc.get_objects() if isinstance(obj, subprocess.Popen) and obj.poll() is None
    ]
    for popen in running:
        _say(popen, "at the session's end")
    return [getattr(p, _ATTR, "(unknown)") for p in running]
