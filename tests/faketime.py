"""libfaketime for tests that step a real daemon's wall clock (docs/design.md, "Clock steps").

Only the processes started with :func:`env` (and their children) see the step; the
kernel's clocks, the monotonic and boot clocks included, are left alone, as NTP leaves them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import missing

FAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1")
# libfaketime 0.9.10 answers EINVAL to clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME),
# which Python 3.11's time.sleep calls: this shim, preloaded first, makes the real call
# (the monotonic clock is not faked here).
SHIM = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
int clock_nanosleep(clockid_t c, int flags, const struct timespec *t, struct timespec *r) {
    return syscall(SYS_clock_nanosleep, c, flags, t, r) == 0 ? 0 : errno;
}
"""


def preload(folder: Path) -> str:
    """``LD_PRELOAD`` for a stepped clock: the shim (built in ``folder``), then libfaketime."""
    if not FAKETIME.exists():
        missing.skip(f"libfaketime ({FAKETIME})", "apt-get install faketime libfaketime")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        missing.skip("a C compiler for the clock_nanosleep shim", "apt-get install gcc")
    (folder / "shim.c").write_text(SHIM)
    shim = folder / "shim.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(shim), str(folder / "shim.c")], check=True)
    return f"{shim}:{FAKETIME}"


def env(preloaded: str, clock: Path) -> dict[str, str]:
    """The environment of a process whose wall clock is ``clock``'s offset (``+0``, ``-1h``:
    write the file to step it)."""
    clock.write_text("+0\n")
    return {
        "LD_PRELOAD": preloaded,
        "FAKETIME_TIMESTAMP_FILE": str(clock),
        # The file is re-read at every call (a cache timed on the faked clock outlives a
        # step back: the next step was never read).
        "FAKETIME_NO_CACHE": "1",
        # Timers, and the boot clock, keep real time: only the wall clock steps.
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "NO_FAKE_STAT": "1",  # file times stay real
    }
